"""Where the PaaS broker puts a new gear: origin-server's filter and default choice.

Follows plugins/msg-broker/mcollective/lib/openshift/mcollective_application_container_proxy.rb
at origin-server 7fd1910 (cited as ``proxy:LINE``):

- ``rpc_find_all_available`` (proxy:3199-3440) asks every node that answers,
  with fact filters ``active_capacity < 100`` and ``kernel =~ platform``, plus
  ``district_active == true`` when a district is required, ``district_uuid``
  equal to the requested one (or not ``NONE`` when any district is required, or
  ``NONE`` when districts are off), and ``node_profile`` (proxy:3240-3274).
  A node listed in a district document is kept only when that server record is
  active and the district has free UIDs (or the gear already lives in it);
  a node in no district only when no district is required (proxy:3280-3305).
  The zone/region and scaled-application refinements are not modelled.
- ``select_best_fit_node_impl`` (proxy:3497-3560) is the default choice:
  districted nodes over undistricted, zoned over zoneless; with more than four
  candidates, the least consumed ones and the districts with most free UIDs;
  then a weighted random pick favouring low ``node_consumed_capacity`` (3:1).

So a node deactivated with ``oo-admin-ctl-district -c deactivate-node`` never
receives a new gear, whatever its load: that is what the tests check.
"""

import math
import random

from . import node as nodes
from . import state as S


class NodeUnavailable(Exception):
    """OpenShift::NodeUnavailableException (code 140)."""

    def __init__(self, msg):
        super().__init__(msg)
        self.msg = msg
        self.code = 140


class Incompatible(Exception):
    """OpenShift::UserException for contradictory search parameters (proxy:3218-3222)."""

    MESSAGE = "Incompatible parameters being passed for finding available node within the same district"


def _passes_fact_filters(f, platform, profile, cfg, require_specific, require_district, prefer, district_uuid):
    cap = f["active_capacity"]
    if math.isnan(cap) or not cap < 100:
        return "full"
    if f["kernel"].lower() != platform.lower():
        return "platform"
    if (require_specific or require_district) and not f["district_active"]:
        return "inactive"
    if require_specific and f["district_uuid"] != district_uuid:
        return "district"
    if not require_specific and require_district and f["district_uuid"] == "NONE":
        return "undistricted"
    if not require_specific and not require_district and not prefer and f["district_uuid"] != "NONE":
        return "districted"
    if profile and cfg["node_profile_enabled"] and f["node_profile"] != profile:
        return "profile"
    return None


def find_all_available(st, profile=None, district_uuid=None, gear_exists_in_district=False,
                       required_uid=None, platform="linux", restricted=(), why=None):
    """``rpc_find_all_available``: the candidates as ``NodeProperties`` dicts.

    ``why`` (a dict), when given, receives host -> reason for each node left out.
    Raises ``NodeUnavailable`` when a district is required and none is left.
    """
    cfg = st["config"]
    why = why if why is not None else {}
    if district_uuid == "NONE":
        district_uuid = None
    if gear_exists_in_district and (required_uid is not None or district_uuid is None):
        raise Incompatible(Incompatible.MESSAGE)
    require_specific = district_uuid is not None
    require_district = prefer = require_specific
    if not require_specific and cfg["districts_enabled"]:
        prefer = True
        require_district = bool(cfg["require_district_for_app_create"])
    if required_uid is not None:
        require_district = True
    districts = []
    if prefer:
        districts = [d for d in st["districts"].values()
                     if not (require_district and profile) or d["gear_size"] == profile]
    infos = []
    for host in sorted(st["nodes"]):
        try:
            f = nodes.facts(st["nodes"][host], host)
        except nodes.NodeUnreachable:
            why[host] = "unreachable"
            continue
        reason = _passes_fact_filters(f, platform, profile, cfg, require_specific, require_district,
                                      prefer, district_uuid)
        if reason:
            why[host] = reason
            continue
        found = False
        for d in districts:
            if required_uid is not None and required_uid not in d["available_uids"]:
                continue
            s = S.server_record(d, host)
            if s is None:
                continue
            found = True
            if not s["active"]:
                why[host] = "inactive"
            elif not (gear_exists_in_district or d["available_capacity"] > 0):
                why[host] = "district_full"
            else:
                infos.append(node_properties(host, f, d, s))
            break
        if not found:
            if require_district:
                why[host] = "undistricted"
            else:
                infos.append(node_properties(host, f))
    if not infos and require_district:
        raise NodeUnavailable("No nodes available for the specified gear size")
    return [i for i in infos if i["name"] not in restricted]


def node_properties(host, f, district=None, server=None):
    """controller/app/plugin_models/node_properties.rb, as a dict."""
    p = {"name": host, "node_consumed_capacity": float(f["active_capacity"]),
         "district_id": None, "district_available_capacity": None, "region_id": None, "zone_id": None}
    if district:
        p["district_id"] = district["uuid"]
        p["district_available_capacity"] = district["available_capacity"]
    if server:
        p["region_id"] = server.get("region_id")
        p["zone_id"] = server.get("zone_id")
    return p


def select_best_fit(infos, max_capacity=6000, rng=None, pick="weighted"):
    """``select_best_fit_node_impl``; ``pick="least"`` takes the least consumed (ties by name).

    Raises ``NodeUnavailable("No nodes available")`` on an empty list.
    """
    rng = rng or random.Random()
    infos = list(infos)
    if any(i["district_id"] for i in infos):
        infos = [i for i in infos if i["district_id"]]
    if any(i["zone_id"] for i in infos):
        infos = [i for i in infos if i["zone_id"]]
    if not infos:
        raise NodeUnavailable("No nodes available")
    if pick == "least":
        return min(infos, key=lambda i: (i["node_consumed_capacity"], i["name"]))
    if len(infos) > 4:
        infos.sort(key=lambda i: i["node_consumed_capacity"], reverse=True)
        avg = sum(i["node_consumed_capacity"] for i in infos) / len(infos)
        cut = avg + (1 - avg / 100)
        # Ruby's delete_if sees the length from before the call, so with more
        # than max(4, 20 %) candidates every node above the cut goes.
        if len(infos) > max(4, int(len(infos) * 0.2)):
            infos = [i for i in infos if not i["node_consumed_capacity"] > cut]
        half = sum(1 for i in infos if i["district_available_capacity"] is not None
                   and i["district_available_capacity"] < int(max_capacity / 2))
        ratio = half / len(infos)
        infos.sort(key=lambda i: i["district_available_capacity"] or 1)
        infos = infos[-max(4, int(len(infos) * max(0.8, 1 - ratio))):]
    infos.sort(key=lambda i: i["node_consumed_capacity"], reverse=True)
    n = len(infos)
    skew = math.floor(n / 2 + 0.5)  # Ruby's Float#round: halves away from zero
    total = int((n / 2) * (n - 1) + skew * n)
    pos = rng.randrange(total) if total > 0 else 0
    idx = math.floor(0.5 - skew + math.sqrt((skew - 0.5) ** 2 + 2 * pos))
    return infos[min(max(idx, 0), n - 1)]


def find_available(st, rng=None, pick="weighted", **kw):
    """``ApplicationContainerProxy.find_available`` without a placement plugin."""
    infos = find_all_available(st, **kw)
    if not infos:
        raise NodeUnavailable("No nodes available")
    return select_best_fit(infos, st["config"]["max_capacity"], rng, pick)


def place_gear(st, uuid, app, namespace, login="user", profile=None, state="started",
               pick="weighted", rng=None):
    """Creates a new gear where the broker would: chooses the node, reserves a UID
    in its district (Gear#reserve_uid), lays out the gear directory, records it.

    Returns the placement record (also appended to ``placements``).
    """
    profile = profile or st["config"]["default_gear_size"]
    why = {}
    info = find_available(st, rng=rng, pick=pick, profile=profile, why=why)
    host = info["name"]
    d = st["districts"].get(info["district_id"]) if info["district_id"] else None
    if d is not None:
        uid = S.reserve_uid(d)
        if uid is None:
            raise NodeUnavailable(f"uid could not be reserved in district '{d['uuid']}'")
    else:
        used = {g.get("uid") for g in st["gears"].values()}
        uid = next(u for u in range(1000, 1 << 20) if u not in used)
    nodes.create_gear(st["nodes"][host]["root"], uuid, uid, app, namespace, state)
    st["gears"][uuid] = {"server": host, "uid": uid, "app": app, "namespace": namespace,
                         "login": login, "profile": profile, "scalable": False}
    rec = {"gear": uuid, "node": host, "uid": uid, "district": info["district_id"],
           "profile": profile, "left_out": why, "ts": S.now_iso()}
    st["placements"].append(rec)
    return rec
