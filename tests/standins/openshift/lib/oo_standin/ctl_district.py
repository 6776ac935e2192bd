"""``oo-admin-ctl-district``: the stand-in for broker-util/oo-admin-ctl-district.

Follows origin-server 7fd1910 (2017-07-26), cited below as ``tool:LINE`` for
broker-util/oo-admin-ctl-district and ``district.rb`` for the model:

- Usage errors: an option GetoptLong rejects -> usage, exit 255 (tool:88-93);
  no option at all -> usage, 255 (tool:100-103); options without ``-c`` ->
  "Error: --command is required with any arguments", 255 (tool:120-123); an
  unknown command -> "Command must be one of: ...", 255 (tool:125-128).
- Checks after loading the broker (exit 1): an unknown profile (tool:134-137);
  district not found, or found on create (tool:140-153); ``-i`` required with
  remove/deactivate/activate (tool:154-157), ``-i`` or ``-a`` with add-node
  (tool:158-161); ``-u``/``-n`` required except for list, nodes-available and
  the node commands, which find the node's district themselves (tool:174-181).
- ``-i`` is split on ``,``, ``;``, ``:`` or whitespace (tool:107-109). Each node
  gives ``Success for node 'S'!`` in the result or ``Error for node 'S': MSG`` in
  the errors; the exit code is the last failure's code, 1 for the model's
  errors, 143 for an unreachable node (tool:183-193).
- Output (tool:331-334): the result, then "ERROR OUTPUT:" and the errors, all on
  standard output; with ``-u``/``-n`` the district's document follows the result
  (tool:318-321, printed as Ruby's pretty_inspect, approximately).
- Not implemented here: set-region, unset-region, add-capacity,
  remove-capacity, publish-uids (exit 3 with a note on standard error).
"""

import re
import sys

from . import cli
from . import district as model
from . import node as nodes
from . import state as S
from .district import OOError

TOOL = "oo-admin-ctl-district"

# tool:5, in the tool's order (it prints them joined with "|").
COMMANDS = [
    "list", "nodes-available", "create", "add-node", "set-region", "unset-region",
    "deactivate-node", "activate-node", "remove-node", "add-capacity",
    "remove-capacity", "destroy", "publish-uids",
]
NOT_IMPLEMENTED = {"set-region", "unset-region", "add-capacity", "remove-capacity", "publish-uids"}
# tool:174: commands that run without -u/-n.
WITHOUT_DISTRICT = {
    "list", "nodes-available", "publish-uids", "remove-node", "deactivate-node",
    "activate-node", "set-region", "unset-region",
}
OPTIONS = [
    ("--command", "-c", True),
    ("--uuid", "-u", True),
    ("--node_profile", "-p", True),
    ("--name", "-n", True),
    ("--server_identity", "-i", True),
    ("--available", "-a", False),
    ("--region", "-r", True),
    ("--zone", "-z", True),
    ("--size", "-s", True),
    ("--platform", "-o", True),
    ("--bypass", "-b", False),
    ("--help", "-h", False),
]

USAGE = """oo-admin-ctl-district (gearshift test stand-in): control districts

Options:
  -c|--command <%s>
  -u|--uuid <district uuid>         -n|--name <district name>
  -p|--node_profile <gear size>     -i|--server_identity <host[,host...]>
  -a|--available                    -r|--region <name>  -z|--zone <name>
  -s|--size <n>                     -o|--platform <name>
  -b|--bypass                       -h|--help
State file: $GEARSHIFT_OO_STATE
""" % "|".join(COMMANDS)


class Crash(Exception):
    """An exception the real tool does not rescue: Ruby prints it and exits 1."""


class Reply:
    """ResultIO (controller/app/models/result_io.rb): result and error text, exit code 0."""

    def __init__(self):
        self.result = ""
        self.error = ""
        self.exitcode = 0


def split_servers(value):
    """``value.split /[,;:\\s]\\s*/`` as Ruby does it (trailing empty fields dropped)."""
    parts = re.split(r"[,;:\s]\s*", value)
    while parts and parts[-1] == "":
        parts.pop()
    return parts


def sizes_display(cfg):
    """``Gear.gear_sizes_display_string`` (controller/app/models/gear.rb:89-98)."""
    return "(" + "|".join(
        s + ("(default)" if s == cfg["default_gear_size"] else "") for s in cfg["gear_sizes"]
    ) + ")"


def append_district(reply, d):
    """tool:49-52: the document with its UID list replaced by a count."""
    if d is None:
        raise Crash("undefined method `available_uids=' for nil:NilClass (NoMethodError)")
    doc = dict(d)
    doc["available_uids"] = f"<{len(d['available_uids'])} uids hidden>"
    reply.result += "\n\n" + cli.ruby_pretty_hash(doc)


def collate(reply, servers, action):
    """tool:183-193: one line per node; returns early when ``action`` says stop."""
    if servers is None:
        raise Crash("undefined method `each' for nil:NilClass (NoMethodError)")
    for host in servers:
        try:
            if action(host) == "break":
                return
            reply.result += f"Success for node '{host}'!\n"
        except OOError as e:
            reply.error += f"Error for node '{host}': {e.msg}\n"
            reply.exitcode = e.code or 1


def district_for_server(st, reply, host):
    """tool:195-200."""
    ds = S.districts_of_server(st, host)
    if not ds:
        raise OOError(f"District not found for {host}")
    if len(ds) > 1:
        reply.error += f"WARNING: {host} found in multiple districts: {','.join(d['name'] for d in ds)}\n"
    return ds[0]


def available_nodes(st):
    """tool:62-70: reachable nodes whose district_uuid fact is NONE, by profile."""
    out = {}
    for host in sorted(st["nodes"]):
        try:
            f = nodes.facts(st["nodes"][host], host)
        except nodes.NodeUnreachable:
            continue
        if f["district_uuid"] == "NONE":
            out.setdefault(f["node_profile"], []).append(host)
    return out


def cmd_add_node(st, reply, o, d):
    """tool:214-242."""
    if d is None:
        d = model.create_district(st, o["name"], o["profile"])
        o["uuid"] = d["uuid"]
        if not reply.result:
            reply.result += f"Successfully created district: {d['uuid']}\n"
    servers = o["servers"]
    if o["available"]:
        profile = o["profile"] or d["gear_size"]
        servers = available_nodes(st).get(profile, [])
        if not servers:
            reply.error += f"No available nodes for profile '{profile}'\n"
            reply.exitcode = 1

    def one(host):
        node = st["nodes"].get(host)
        kernel = node.get("kernel", "Linux") if node and node.get("reachable", True) else None
        if kernel is None:
            reply.error += "Cannot connect to node.\n"
            reply.exitcode = 1
            return "break"
        platform = d.get("platform") or "Linux"
        if kernel.lower() == platform.lower():
            model.add_node(st, d, host, o["region"], o["zone"])
        else:
            reply.result += (
                f"Cannot add a node with platform '{kernel}' to a district with platform '{platform}'"
            )
        return None

    collate(reply, servers, one)


def cmd_create(st, reply, o):
    """tool:272-281."""
    cfg = st["config"]
    if o["platform"].lower() in cfg["node_platforms"]:
        if not o["profile"]:
            cli.puts(f"node_profile not specified.  Using default: {cfg['default_gear_size']}")
        d = model.create_district(st, o["name"], o["profile"], o["platform"].lower())
        o["uuid"] = d["uuid"]
        if not reply.result:
            reply.result += f"Successfully created district: {d['uuid']}"
    else:
        reply.result += "The specified platform does not exist in the configuration file"


def cmd_destroy(st, reply, o, d):
    """tool:282-303 (the question is read from standard input unless -b)."""
    if not o["bypass"]:
        cli.puts("!!!! WARNING !!!! WARNING !!!! WARNING !!!!")
        cli.puts(f"You are about to delete the {o['uuid'] or o['name']} district.\n")
        cli.puts("This is NOT reversible, all remote data for this district will be removed.")
        sys.stdout.write("Do you want to delete this district (y/n): ")
        sys.stdout.flush()
        answer = sys.stdin.readline().strip()
        if not re.fullmatch(r"(yes|y)", answer, flags=re.IGNORECASE):
            cli.puts("\n")
            raise SystemExit(217)
    model.delete(st, d)
    if not reply.result:
        reply.result += f"Successfully deleted district: {o['uuid'] or o['name']}"


def cmd_list(st, reply, o, d):
    """tool:304-316 (``list`` or no command)."""
    if d is not None:
        append_district(reply, d)
    elif st["districts"]:
        for x in st["districts"].values():
            append_district(reply, x)
    else:
        cli.puts("No districts created yet.  Use 'oo-admin-ctl-district -c create' to create one.")


def cmd_nodes_available(st, reply, o):
    """tool:205-213."""
    avail = available_nodes(st)
    for profile, hosts in avail.items():
        if o["profile"] and profile != o["profile"]:
            continue
        reply.result += f"Nodes in profile: {profile}\n"
        for h in hosts:
            reply.result += f"\t{h}\n"
    if o["profile"] and not avail.get(o["profile"]):
        reply.result += f"No nodes in profile: {o['profile']}\n"


NODE_ACTIONS = {
    "deactivate-node": model.deactivate_node,
    "activate-node": model.activate_node,
    "remove-node": model.remove_node,
}


def dispatch(st, reply, o, d):
    """tool:202-321."""
    c = o["command"]
    if c == "nodes-available":
        cmd_nodes_available(st, reply, o)
    elif c == "add-node":
        cmd_add_node(st, reply, o, d)
    elif c in NODE_ACTIONS:
        act = NODE_ACTIONS[c]
        collate(reply, o["servers"], lambda h: act(st, d or district_for_server(st, reply, h), h))
    elif c == "create":
        cmd_create(st, reply, o)
    elif c == "destroy":
        cmd_destroy(st, reply, o, d)
    else:
        cmd_list(st, reply, o, d)
    if (o["uuid"] or o["name"]) and c not in ("destroy", "publish-uids"):
        append_district(reply, S.find_district(st, o["uuid"], o["name"]))


def preflight(st, o):
    """tool:134-181: returns (district, None) or (None, exit code) after printing why."""
    cfg = st["config"]
    c = o["command"]
    if o["profile"] and o["profile"] not in cfg["gear_sizes"]:
        cli.puts(f"Node profile must be one of: {sizes_display(cfg)}")
        return None, 1
    d = None
    if o["uuid"] or o["name"]:
        if not o["uuid"]:
            try:
                model.check_name(o["name"])
            except OOError as e:
                raise Crash(f"{e.msg} (OpenShift::OOException)") from e
        d = S.find_district(st, o["uuid"], o["name"])
        label = o["uuid"] or o["name"]
        if d is None:
            if c == "add-node" and not o["profile"]:
                cli.puts(f"District '{label}' not found, and no profile given to auto-create.")
                return None, 1
            if c not in ("create", "add-node"):
                cli.puts(f"District '{label}' not found.")
                return None, 1
        elif c == "create":
            cli.puts(f"District '{o['name'] or ''}' already exists")
            return None, 1
        if c in ("remove-node", "deactivate-node", "activate-node", "set-region", "unset-region") and o["servers"] is None:
            cli.puts(f"--server_identity is required with command: {c}")
            return None, 1
        if c == "add-node" and not (o["servers"] is not None or o["available"]):
            cli.puts(f"--server_identity or --available is required with command: {c}")
            return None, 1
    elif c and c not in WITHOUT_DISTRICT:
        cli.puts("--name is required with create" if c == "create" else f"--uuid or --name is required with command: {c}")
        return None, 1
    return d, None


def run(st, o):
    """Everything after the broker is loaded (tool:130-334); returns the exit code."""
    try:
        d, rc = preflight(st, o)
        if rc is not None:
            return rc
        if o["command"] in NOT_IMPLEMENTED:
            print(f"{TOOL}: the gearshift stand-in does not implement '{o['command']}'", file=sys.stderr)
            return 3
        reply = Reply()
        try:
            dispatch(st, reply, o, d)
        except OOError as e:
            reply.error += e.msg
            reply.exitcode = e.code or 1
    except Crash as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 1
    if reply.result:
        cli.puts(reply.result + "\n")
    if reply.error:
        cli.puts("ERROR OUTPUT:\n" + reply.error + "\n")
    return reply.exitcode


def options(args):
    """The parsed options as the tool names them (tool:105-117)."""
    ident = args.get("--server_identity")
    return {
        "command": args.get("--command"),
        "uuid": args.get("--uuid"),
        "name": args.get("--name"),
        "servers": split_servers(ident) if ident is not None else None,
        "available": "--available" in args,
        "region": args.get("--region"),
        "zone": args.get("--zone"),
        "size": args.get("--size"),
        "bypass": "--bypass" in args,
        "profile": args.get("--node_profile"),
        "platform": args.get("--platform") or "Linux",
    }


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
    if not args:
        sys.stdout.write(USAGE)
        return 255
    o = options(args)
    if not o["command"]:
        cli.puts("Error: --command is required with any arguments")
        return 255
    if o["command"] not in COMMANDS:
        cli.puts(f"Command must be one of: {'|'.join(COMMANDS)}")
        return 255
    try:
        with S.locked() as st:
            rc = 1
            try:
                rc = run(st, o)
            finally:
                S.record_call(st, TOOL, argv, rc)
    except S.StateError as e:
        print(f"{TOOL}: {e}", file=sys.stderr)
        return 1
    return rc
