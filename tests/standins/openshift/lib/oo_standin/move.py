"""``oo-admin-move``: the stand-in for broker-util/oo-admin-move.

Follows origin-server 7fd1910 (2017-07-26), cited as ``tool:LINE`` for
broker-util/oo-admin-move and ``proxy:LINE`` for
plugins/msg-broker/mcollective/lib/openshift/mcollective_application_container_proxy.rb:

- Options (tool:37-47): ``--gear_uuid/-g`` (comma-separated, moved one after
  the other), ``-i/--target_server_identity``, ``--destination_district_uuid/-u``,
  ``-p/--node_profile``, ``-t/--timeout``, ``--change_district``,
  ``--change_region``, ``--json``, ``-h``. A rejected option: usage, exit 255
  (tool:50-55); a bad timeout or no gear: "ERROR: ...", exit 1 (tool:71-81).
- Per gear: "ERROR: Gear not found: G" (tool:101-110); the URL/Login/App
  UUID/Gear UUID header (tool:125-130); a refusal prints its message; the exit
  code is 1 when any gear failed (tool:152-166, 179).
- With ``-i`` the target is taken as given (resolve_destination, proxy:2315-2399):
  ``--change_district`` and ``-u`` are ignored, nothing checks that the target
  is active, has room for active gears or is in the gear's district. It refuses
  an unreachable target ("Node execution failure (error getting facts)."), the
  same node ("Old and new servers are the same", proxy:2376-2378), another
  region without ``--change_region`` (proxy:2380-2384), another platform
  (proxy:2050-2055), an undistricted target (proxy:2063-2066) and a profile
  change for a scalable application (proxy:2071-2075). Into another district the
  gear's UID must be free there (reserve_uid, proxy:254-276 and 2157-2160), else
  the tool dies on an unrescued exception (exit 1, message on standard error).
- Without ``-i`` the broker chooses (find_available with the gear's district
  unless ``--change_district``: proxy:2330-2355), as ``placement`` does.
- The gear keeps its UID; its directory, ``.httpd.d/<uuid>_*`` and
  ``.last_access/<uuid>`` move to the target's node root (rsync then destroy,
  proxy:2401-2470 and 2284-2296).

What gearshift must check itself is recorded, not refused (unless
``GEARSHIFT_OO_MOVE_STRICT=1``): each attempt is
appended to the state's ``moves`` with ``target_active`` (the target's server
record in its district), ``target_fact_active`` (its district.info),
``same_district`` and ``uid_kept``, so a test can assert the caller only ever
moved to active nodes of the gear's own district.
"""

import json
import os
import random
import sys
import time

from . import cli
from . import node as nodes
from . import placement
from . import state as S

TOOL = "oo-admin-move"
ENV_DELAY = "GEARSHIFT_OO_MOVE_DELAY"
ENV_SEED = "GEARSHIFT_OO_SEED"
# Opt-in, not origin-server: refuse what the real tool lets through (a target
# that is inactive or in another district), so an end-to-end test fails at once.
ENV_STRICT = "GEARSHIFT_OO_MOVE_STRICT"

OPTIONS = [
    ("--gear_uuid", "-g", True),
    ("--destination_district_uuid", "-u", True),
    ("--target_server_identity", "-i", True),
    ("--node_profile", "-p", True),
    ("--timeout", "-t", True),
    ("--change_district", None, False),
    ("--change_region", None, False),
    ("--json", None, False),
    ("--help", "-h", False),
]

USAGE = """oo-admin-move (gearshift test stand-in): move gears between nodes

Options:
  --gear_uuid <uuid>[,<uuid>...]     -i|--target_server_identity <host>
  --destination_district_uuid <uuid> -p|--node_profile <profile>
  -t|--timeout <seconds>             --change_district  --change_region
  --json                             -h|--help
State file: $GEARSHIFT_OO_STATE
"""


class MoveError(Exception):
    """A NodeException or UserException: printed, the gear counts as failed."""

    def __init__(self, msg):
        super().__init__(msg)
        self.msg = msg


class Crash(Exception):
    """An exception oo-admin-move does not rescue (an OOException): exit 1."""


def find_gear(st, uuid):
    """The gear's record (the broker's database), learning unrecorded gear
    directories from the node roots; ``None`` when no node has it."""
    g = st["gears"].get(uuid)
    if g is not None:
        return g
    for host in sorted(st["nodes"]):
        root = st["nodes"][host]["root"]
        if uuid in nodes.list_gears(root):
            g = {
                "server": host,
                "uid": nodes.gear_owner(root, uuid),
                "app": nodes.read_env(root, uuid, "OPENSHIFT_APP_NAME") or uuid,
                "namespace": nodes.read_env(root, uuid, "OPENSHIFT_NAMESPACE") or "ns",
                "app_uuid": nodes.read_env(root, uuid, "OPENSHIFT_APP_UUID") or uuid,
                "login": "unknown",
                "scalable": False,
            }
            st["gears"][uuid] = g
            return g
    return None


def _facts(st, host):
    try:
        return nodes.facts(st["nodes"].get(host), host)
    except nodes.NodeUnreachable as e:
        raise MoveError(nodes.NodeUnreachable.MESSAGE) from e


def _server_of(st, host):
    for d in S.districts_of_server(st, host):
        return S.server_record(d, host)
    return None


def resolve_target(st, uuid, g, src, o, rng):
    """resolve_destination (proxy:2315-2399) up to the region check: (target, facts)."""
    if o["target"]:
        return o["target"], _facts(st, o["target"])
    dest = o["district"]
    if not dest and not o["change_district"] and src["district_uuid"] != "NONE":
        dest = src["district_uuid"]
    same = dest is not None and dest == src["district_uuid"]
    try:
        info = placement.find_available(
            st, rng=rng, profile=o["profile"] or g.get("profile") or src["node_profile"],
            district_uuid=dest, gear_exists_in_district=same,
            required_uid=None if same else g.get("uid"))
    except placement.NodeUnavailable as e:
        raise MoveError(e.msg) from e
    except placement.Incompatible as e:
        raise MoveError(placement.Incompatible.MESSAGE) from e
    tf = _facts(st, info["name"])
    if dest and tf["district_uuid"] != dest:
        raise MoveError("No nodes available within the specified district")
    return info["name"], tf


def check_move(st, uuid, g, src_host, target, sf, tf, o, say):
    """The refusals of resolve_destination and move_gear, in their order."""
    say(f"DEBUG: Source district uuid: {sf['district_uuid']}")
    say(f"DEBUG: Destination district uuid: {tf['district_uuid']}")
    if src_host == target:
        raise MoveError(f"Error moving gear. Old and new servers are the same: {src_host}")
    ss, ts = _server_of(st, src_host), _server_of(st, target)
    if ss and ts and ss.get("region_id") != ts.get("region_id") and not o["change_region"]:
        raise MoveError(
            "Error moving gear. Old and new servers must belong to the same region, source region: "
            f"{ss.get('region_name') or ''} destination region: {ts.get('region_name') or ''}")
    if sf["kernel"].lower() != tf["kernel"].lower():
        raise MoveError("Error moving gear. Destination container platform is not the same as "
                        "the source container platform.")
    if tf["district_uuid"] == "NONE":
        raise MoveError("Error moving gear. Move gear only allowed from non-districted/districted "
                        "node to districted node.")
    if sf["node_profile"] != tf["node_profile"] and g.get("scalable"):
        raise MoveError("Error moving gear. Cannot change node profile for *scalable* app.")


def move_one(st, uuid, g, o, say, rec, rng):
    """move_gear (proxy:2026-2282) for one gear; fills ``rec`` as it learns."""
    src_host = g["server"]
    if o["change_region"] and g.get("scalable"):
        raise MoveError("Error moving gear. Cannot change region for *scalable* app.")
    sf = _facts(st, src_host)
    rec["source_district"] = sf["district_uuid"]
    target, tf = resolve_target(st, uuid, g, sf, o, rng)
    ts = _server_of(st, target)
    rec.update(target=target, target_district=tf["district_uuid"],
               same_district=tf["district_uuid"] == sf["district_uuid"],
               target_active=ts["active"] if ts else None,
               target_fact_active=tf["district_active"])
    check_move(st, uuid, g, src_host, target, sf, tf, o, say)
    if os.environ.get(ENV_STRICT) == "1" and not (rec["same_district"] and rec["target_active"]):
        raise MoveError(f"gearshift stand-in ({ENV_STRICT}=1): target {target} is "
                        + ("inactive" if rec["same_district"] else "in another district"))
    changed = tf["district_uuid"] != sf["district_uuid"]
    if changed:
        d = S.find_district(st, uuid=tf["district_uuid"])
        if d is None or S.reserve_uid(d, g.get("uid")) is None:
            raise Crash(f"uid could not be reserved in target district '{tf['district_uuid']}'.  Please "
                        "ensure the target district has available capacity or does not contain a "
                        "conflicting uid.")
    src_root, dst_root = st["nodes"][src_host]["root"], st["nodes"][target]["root"]
    try:
        nodes.move_gear_files(src_root, dst_root, uuid)
    except OSError as e:
        if changed:
            S.unreserve_uid(S.find_district(st, uuid=tf["district_uuid"]), g.get("uid"))
        raise MoveError(f"Error moving app '{g['app']}', platform 'linux', gear '{uuid}' from "
                        f"{src_host} to {target}") from e
    if changed:
        old = S.find_district(st, uuid=sf["district_uuid"])
        if old is not None and g.get("uid") is not None:
            S.unreserve_uid(old, g["uid"])
    g["server"] = target
    g["profile"] = tf["node_profile"]
    rec["uid_after"] = nodes.gear_owner(dst_root, uuid)
    rec["uid_kept"] = rec["uid_after"] == g.get("uid")
    say(f"Successfully moved gear with uuid '{uuid}' of app '{g['app']}' from '{src_host}' to '{target}'")


def ruby_split_commas(value):
    """``value.split(',')`` as Ruby does it: trailing empty fields dropped."""
    parts = value.split(",") if value else []
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def run(st, o, argv):
    """The loop over gears (tool:92-179); returns the exit code."""
    rc = 0
    status = {}
    seed = os.environ.get(ENV_SEED)
    rng = random.Random(int(seed)) if seed else random.Random()
    for uuid in ruby_split_commas(o["gears"]):
        g = find_gear(st, uuid)
        if g is None or (g.get("scalable") and o["profile"]):
            msg = (f"ERROR: Gear not found: {uuid}" if g is None else
                   "Cannot specify 'node_profile' for a gear belonging to a scalable application.")
            if o["json"]:
                status[uuid] = {"result": False, "message": msg}
            else:
                cli.puts(msg)
            rc |= 1
            continue
        url = f"http://{g['app']}-{g['namespace']}.{st['config']['domain_suffix']}"
        app_uuid = g.get("app_uuid", uuid)
        if o["json"]:
            status[uuid] = {"login": g.get("login"), "app_uuid": app_uuid, "gear_uuid": uuid,
                            "app_name": g["app"], "app_domain": g["namespace"],
                            "destination": o["target"], "source": g["server"]}
        else:
            for line in (f"URL: {url}", f"Login: {g.get('login')}", f"App UUID: {app_uuid}",
                         f"Gear UUID: {uuid}"):
                cli.puts(line)
        say = (lambda m: None) if o["json"] else cli.puts
        rec = {"gear": uuid, "app": g["app"], "source": g["server"], "target": o["target"],
               "uid": g.get("uid"), "argv": list(argv), "ok": False, "error": None, "ts": S.now_iso()}
        st["moves"].append(rec)
        try:
            move_one(st, uuid, g, o, say, rec, rng)
            rec["ok"] = True
            if o["json"]:
                status[uuid].update(result=True, destination=g["server"])
        except MoveError as e:
            rec["error"] = e.msg
            if o["json"]:
                status[uuid].update(result=False, message=e.msg)
            else:
                cli.puts(e.msg)
            rc |= 1
        except Crash as e:
            rec["error"] = str(e)
            raise
    if o["json"]:
        cli.puts(json.dumps(status))
    return rc


def main(argv):
    """Runs the tool; returns its exit code."""
    try:
        args = cli.parse(argv, OPTIONS)
    except cli.UsageError as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        sys.stdout.write(USAGE)
        return 255
    if "--help" in args:
        sys.stdout.write(USAGE)
        return 0
    timeout = args.get("--timeout")
    if timeout is not None and not timeout.isdigit():
        cli.puts("ERROR: Timeout must be a positive integer")
        return 1
    if not args.get("--gear_uuid"):
        # GetoptLong gives "" for "--gear_uuid ''", which Ruby treats as given.
        if "--gear_uuid" not in args:
            cli.puts("ERROR: Please specify gear_uuid for moving gear")
            return 1
    o = {
        "gears": args.get("--gear_uuid"),
        "target": args.get("--target_server_identity"),
        "district": args.get("--destination_district_uuid"),
        "profile": args.get("--node_profile"),
        "change_district": "--change_district" in args,
        "change_region": "--change_region" in args,
        "json": "--json" in args,
    }
    delay = float(os.environ.get(ENV_DELAY) or 0)
    if delay > 0:
        time.sleep(delay)
    try:
        with S.locked() as st:
            rc = 1
            try:
                rc = run(st, o, argv)
            except Crash as e:
                sys.stdout.flush()
                print(f"{TOOL}: {e} (OpenShift::OOException)", file=sys.stderr)
                rc = 1
            finally:
                S.record_call(st, TOOL, argv, rc)
    except S.StateError as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 1
    return rc
