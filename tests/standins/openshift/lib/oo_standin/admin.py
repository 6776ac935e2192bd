"""``oo-standin``: what a test harness does to the stand-in broker host besides the two tools.

    oo-standin init [--max-capacity N] [--first-uid N] [--gear-sizes a,b] [--require-district]
    oo-standin node-add HOST ROOT [--profile P] [--max-active-gears N] [--kernel K] [--unreachable]
    oo-standin node-set HOST [--reachable|--unreachable] [--unresponsive|--responsive]
    oo-standin gear-add HOST UUID [--app A] [--namespace N] [--state S] [--uid N] [--scalable]
    oo-standin gear-remove UUID
    oo-standin place [--profile P] [--app A] [--uuid U] [--pick weighted|least] [--seed N] [--json]
    oo-standin dump

``place`` creates a new gear where the PaaS broker would put it (see
``placement``) and prints the chosen node; exit 1 with the broker's message when
no node qualifies. Everything runs under the state file's lock.
"""

import argparse
import json
import os
import random
import shutil
import sys
import uuid as uuidlib

from . import node as nodes
from . import placement
from . import state as S


def _parser():
    p = argparse.ArgumentParser(prog="oo-standin")
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("init")
    a.add_argument("--first-uid", type=int, default=S.DEFAULT_CONFIG["first_uid"])
    a.add_argument("--max-capacity", type=int, default=S.DEFAULT_CONFIG["max_capacity"])
    a.add_argument("--gear-sizes", default=",".join(S.DEFAULT_CONFIG["gear_sizes"]))
    a.add_argument("--default-gear-size", default=S.DEFAULT_CONFIG["default_gear_size"])
    a.add_argument("--require-district", action="store_true")
    a = sub.add_parser("node-add")
    a.add_argument("host")
    a.add_argument("root")
    a.add_argument("--profile")
    a.add_argument("--max-active-gears", type=int)
    a.add_argument("--kernel", default="Linux")
    a.add_argument("--unreachable", action="store_true")
    a = sub.add_parser("node-set")
    a.add_argument("host")
    a.add_argument("--reachable", dest="reachable", action="store_true", default=None)
    a.add_argument("--unreachable", dest="reachable", action="store_false")
    a.add_argument("--unresponsive", dest="unresponsive", action="store_true", default=None)
    a.add_argument("--responsive", dest="unresponsive", action="store_false")
    a = sub.add_parser("gear-add")
    a.add_argument("host")
    a.add_argument("uuid")
    a.add_argument("--app", default="app")
    a.add_argument("--namespace", default="ns")
    a.add_argument("--state", default="started")
    a.add_argument("--login", default="user")
    a.add_argument("--uid", type=int)
    a.add_argument("--scalable", action="store_true")
    a = sub.add_parser("gear-remove")
    a.add_argument("uuid")
    a = sub.add_parser("place")
    a.add_argument("--profile")
    a.add_argument("--app", default="app")
    a.add_argument("--namespace", default="ns")
    a.add_argument("--login", default="user")
    a.add_argument("--uuid")
    a.add_argument("--pick", choices=["weighted", "least"], default="weighted")
    a.add_argument("--seed", type=int)
    a.add_argument("--json", action="store_true")
    sub.add_parser("dump")
    return p


def node_add(st, a):
    """Registers a node root (creating its gear base and resource limits)."""
    root = os.path.abspath(a.root)
    os.makedirs(nodes.gear_base(root), exist_ok=True)
    limits = os.path.join(root, nodes.RESOURCE_LIMITS)
    if a.profile or a.max_active_gears is not None or not os.path.exists(limits):
        nodes.write_resource_limits(root, a.profile or "small",
                                    100 if a.max_active_gears is None else a.max_active_gears)
    st["nodes"][a.host] = {"root": root, "reachable": not a.unreachable, "kernel": a.kernel}


def node_set(st, a):
    """Flips a node's reachability (MCollective) or its server record's ``unresponsive``."""
    if a.host not in st["nodes"]:
        raise SystemExit(f"oo-standin: unknown node {a.host}")
    if a.reachable is not None:
        st["nodes"][a.host]["reachable"] = a.reachable
    if a.unresponsive is not None:
        for d in S.districts_of_server(st, a.host):
            S.server_record(d, a.host)["unresponsive"] = a.unresponsive


def gear_add(st, a):
    """Creates a gear on a given node, with a UID from the node's district."""
    if a.host not in st["nodes"]:
        raise SystemExit(f"oo-standin: unknown node {a.host}")
    ds = S.districts_of_server(st, a.host)
    uid = a.uid
    if ds:
        uid = S.reserve_uid(ds[0], uid)
        if uid is None:
            raise SystemExit(f"oo-standin: no free UID {a.uid or ''} in district {ds[0]['name']}")
    elif uid is None:
        used = {g.get("uid") for g in st["gears"].values()}
        uid = next(u for u in range(1000, 1 << 20) if u not in used)
    nodes.create_gear(st["nodes"][a.host]["root"], a.uuid, uid, a.app, a.namespace, a.state)
    f = nodes.facts(st["nodes"][a.host], a.host) if st["nodes"][a.host].get("reachable", True) else {}
    st["gears"][a.uuid] = {"server": a.host, "uid": uid, "app": a.app, "namespace": a.namespace,
                           "login": a.login, "scalable": a.scalable,
                           "profile": f.get("node_profile", "small")}
    print(uid)


def gear_remove(st, a):
    """Destroys a gear: its directory, its record, its UID reservation."""
    g = st["gears"].pop(a.uuid, None)
    if g is None:
        raise SystemExit(f"oo-standin: unknown gear {a.uuid}")
    node = st["nodes"].get(g["server"])
    if node:
        shutil.rmtree(os.path.join(nodes.gear_base(node["root"]), a.uuid), ignore_errors=True)
    for d in S.districts_of_server(st, g["server"]):
        if g.get("uid") is not None:
            S.unreserve_uid(d, g["uid"])


def place(st, a):
    """Places a new gear as the PaaS broker would; returns the exit code."""
    rng = random.Random(a.seed) if a.seed is not None else None
    try:
        rec = placement.place_gear(st, a.uuid or uuidlib.uuid4().hex, a.app, a.namespace,
                                   login=a.login, profile=a.profile, pick=a.pick, rng=rng)
    except placement.NodeUnavailable as e:
        print(e.msg)
        return 1
    print(json.dumps(rec, sort_keys=True) if a.json else rec["node"])
    return 0


def main(argv):
    """Runs one subcommand; returns its exit code."""
    a = _parser().parse_args(argv)
    try:
        if a.cmd == "init":
            st = S.empty()
            st["config"].update(first_uid=a.first_uid, max_capacity=a.max_capacity,
                                gear_sizes=a.gear_sizes.split(","),
                                default_gear_size=a.default_gear_size,
                                require_district_for_app_create=a.require_district)
            with S.locked() as cur:
                cur.clear()
                cur.update(st)
            return 0
        if a.cmd == "dump":
            with S.locked(write=False) as st:
                json.dump(st, sys.stdout, indent=1, sort_keys=True)
                print()
            return 0
        with S.locked() as st:
            if a.cmd == "place":
                return place(st, a)
            {"node-add": node_add, "node-set": node_set, "gear-add": gear_add,
             "gear-remove": gear_remove}[a.cmd](st, a)
        return 0
    except S.StateError as e:
        print(f"oo-standin: {e}", file=sys.stderr)
        return 1
