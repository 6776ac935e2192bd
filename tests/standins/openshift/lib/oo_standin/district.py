"""The ``District`` model's node operations (controller/app/models/district.rb), on the state file.

Each function raises ``OOError`` with origin-server's message (and code) where
the model raises ``OpenShift::OOException``; line numbers cite district.rb at
origin-server 7fd1910 (2017-07-26).
"""

import re

from . import node as nodes
from . import state as S


class OOError(Exception):
    """OpenShift::OOException: a message and an exit code (default 1)."""

    def __init__(self, msg, code=1):
        super().__init__(msg)
        self.msg = msg
        self.code = code


def node_facts(st, host):
    """Facts of a node, with an unreachable node as origin-server's NodeException."""
    try:
        return nodes.facts(st["nodes"].get(host), host)
    except nodes.NodeUnreachable as e:
        raise OOError(nodes.NodeUnreachable.MESSAGE, nodes.NodeUnreachable.CODE) from e


def set_district(st, host, uuid, active, first, maximum):
    """``set_district`` over MCollective: writes district.info on a node that answers.

    A node that does not answer gets no file and raises nothing: the broker's
    custom_request just collects no reply (mcollective_application_container_proxy.rb:2635-2652).
    """
    node = st["nodes"].get(host)
    if node and node.get("reachable", True):
        nodes.write_district_info(node["root"], uuid, active, first, maximum)


def check_name(name):
    """``District.check_name!`` (district.rb:24-30)."""
    if not name or not re.fullmatch(r"[\w.\-]+", name, flags=re.ASCII):
        raise OOError(f"Invalid district name '{name or ''}'")
    return name


def create_district(st, name, gear_size=None, platform="Linux"):
    """``District.create_district`` (district.rb:32-40)."""
    if not st["config"]["districts_enabled"]:
        raise OOError("District creation disabled by the platform.")
    check_name(name)
    if S.find_district(st, name=name):
        raise OOError(f"District by name {name} already exists")
    return S.new_district(st, name, gear_size, platform)


def _server(d, host):
    s = S.server_record(d, host)
    if s is None:
        raise OOError(f"Node with server identity: {host} doesn't belong to district: {d['uuid']}")
    return s


def add_node(st, d, host, region=None, zone=None):
    """``District#add_node`` (district.rb:105-148)."""
    if region:
        zones = st["config"].get("regions", {}).get(region)
        if zones is None:
            raise OOError(
                f"Region object not found, you can create new region '{region}' using oo-admin-ctl-region."
            )
        if not zone:
            raise OOError("Zone name is required when region name is specified")
        if zone not in zones:
            raise OOError(
                f"Zone object not found, you can add zone '{zone}' to region '{region}' using oo-admin-ctl-region."
            )
    elif zone:
        raise OOError("Region name is required when zone name is specified")
    # :124-126: any district, this one included.
    if S.districts_of_server(st, host):
        raise OOError(f"Node with server identity: {host} already belongs to another district")
    f = node_facts(st, host)
    # :128: the node's "capacity" fact (gears_usage_pct) > 0, i.e. any gear at all.
    if f["capacity"] > 0:
        raise OOError(f"Node with server identity: {host} already has gears on it")
    if f["node_profile"] != d["gear_size"]:
        raise OOError(
            f"Node with server identity: {host} is of node profile '{f['node_profile']}' "
            f"and needs to be '{d['gear_size']}' to add to district '{d['name']}'"
        )
    set_district(st, host, d["uuid"], True, S.first_uid(d), d["max_uid"])
    server = {"name": host, "active": True, "unresponsive": False}
    if region:
        server.update({"region_name": region, "region_id": region, "zone_name": zone, "zone_id": zone})
    d["servers"].append(server)
    d["active_servers_size"] += 1
    d["updated_at"] = S.now_iso()


def remove_node(st, d, host):
    """``District#remove_node`` (district.rb:150-176)."""
    s = _server(d, host)
    uuid = d["uuid"]
    if s["active"]:
        raise OOError(
            f"Node with server identity: {host} from district: {uuid} must be deactivated before it can be removed"
        )
    # :159-162: gears the broker's database still places on the node.
    if any(g.get("server") == host for g in st["gears"].values()):
        raise OOError(
            f"Node with server identity: {host} could not be removed from district: {uuid} "
            "because some apps in mongo are still using it."
        )
    if not s.get("unresponsive"):
        try:
            f = nodes.facts(st["nodes"].get(host), host)
        except nodes.NodeUnreachable as e:
            # :169-171: NodeException is re-raised with this text (its message already ends in ".").
            raise OOError(
                f"Error: {nodes.NodeUnreachable.MESSAGE}. Node with server identity: {host} might be "
                "unresponsive, run oo-admin-repair --removed-nodes and retry the current operation."
            ) from e
        if f["capacity"] > 0:
            raise OOError(
                f"Node with server identity: {host} could not be removed from district: {uuid} "
                "because it still has apps on it"
            )
        # :167: district.info keeps the district's UID range, uuid NONE, active false.
        set_district(st, host, "NONE", False, S.first_uid(d), d["max_uid"])
    d["servers"].remove(s)
    d["updated_at"] = S.now_iso()


def deactivate_node(st, d, host):
    """``District#deactivate_node`` (district.rb:185-199)."""
    s = _server(d, host)
    if not s["active"]:
        raise OOError(f"Node with server identity: {host} is already deactivated")
    if not s.get("unresponsive"):
        set_district(st, host, d["uuid"], False, S.first_uid(d), d["max_uid"])
    s["active"] = False
    d["active_servers_size"] -= 1
    d["updated_at"] = S.now_iso()


def activate_node(st, d, host):
    """``District#activate_node`` (district.rb:201-214)."""
    s = _server(d, host)
    if s["active"]:
        raise OOError(f"Node with server identity: {host} is already active")
    if s.get("unresponsive"):
        raise OOError(f"Node with server identity: {host} is unresponsive")
    set_district(st, host, d["uuid"], True, S.first_uid(d), d["max_uid"])
    s["active"] = True
    d["active_servers_size"] += 1
    d["updated_at"] = S.now_iso()


def delete(st, d):
    """``District#delete`` (district.rb:100-103)."""
    if d["servers"]:
        raise OOError(f"Couldn't delete district '{d['name']}' because it still contains nodes")
    del st["districts"][d["uuid"]]
