"""The broker host's records (what origin-server keeps in MongoDB), as one JSON file.

The path comes from ``GEARSHIFT_OO_STATE``. Every tool holds an exclusive
``flock`` on ``<state>.lock`` for its whole read-modify-write, and writes the
file through a temporary file and ``rename``, so parallel calls are safe and a
reader never sees half a file.

Layout (all keys optional in a hand-written file; defaults fill them)::

    {"config":    {...},                       # broker.conf / msg-broker settings
     "nodes":     {host: {"root": dir, "reachable": true, "kernel": "Linux"}},
     "districts": {uuid: {...District document...}},
     "gears":     {uuid: {"server": host, "uid": N, "app": ..., "login": ..., ...}},
     "moves":     [...],   # every oo-admin-move attempt, for the harness
     "placements": [...],  # every gear the placement stand-in placed
     "calls":     [...]}   # every tool run: argv and exit code

``nodes`` maps a server identity to its node root: a directory laid out like
the node's ``/`` (``var/lib/openshift/…``, ``etc/openshift/resource_limits.conf``),
which is what MCollective would reach. ``reachable: false`` stands for a node
that does not answer MCollective.
"""

import contextlib
import fcntl
import json
import os
import secrets
import tempfile
import time

ENV_STATE = "GEARSHIFT_OO_STATE"

# Defaults of origin-server's configuration, with their source:
# - first_uid 1000, max_capacity 6000: DISTRICTS_FIRST_UID / DISTRICTS_MAX_CAPACITY in
#   plugins/msg-broker/mcollective/conf/openshift-origin-msg-broker-mcollective.conf.example:12,15
# - require_district_for_app_create false: DISTRICTS_REQUIRE_FOR_APP_CREATE, same file :9
# - gear_sizes / default_gear_size: VALID_GEAR_SIZES / DEFAULT_GEAR_SIZE, broker/conf/broker.conf:5,33
#   (broker.conf ships "small" only; the stand-in also knows medium and large)
DEFAULT_CONFIG = {
    "first_uid": 1000,
    "max_capacity": 6000,
    "districts_enabled": True,
    "require_district_for_app_create": False,
    "node_profile_enabled": True,
    "gear_sizes": ["small", "medium", "large"],
    "default_gear_size": "small",
    "node_platforms": ["linux"],
    "domain_suffix": "example.com",
    "regions": {},
}


class StateError(Exception):
    """The state file is missing, unreadable or not a JSON object."""


def state_path():
    """The state file named by ``GEARSHIFT_OO_STATE``; raises when unset."""
    p = os.environ.get(ENV_STATE)
    if not p:
        raise StateError(f"{ENV_STATE} is not set (path of the stand-in's JSON state file)")
    return p


def empty():
    """A state with no nodes, districts or gears."""
    return {
        "config": dict(DEFAULT_CONFIG),
        "nodes": {},
        "districts": {},
        "gears": {},
        "moves": [],
        "placements": [],
        "calls": [],
    }


def normalize(st):
    """Fills what a hand-written state leaves out."""
    base = empty()
    for k, v in base.items():
        st.setdefault(k, v)
    cfg = dict(DEFAULT_CONFIG)
    cfg.update(st.get("config") or {})
    st["config"] = cfg
    return st


def load(path):
    """Reads the state file; a missing or empty file is an empty state."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        return empty()
    except OSError as e:
        raise StateError(f"{path}: {e}") from e
    if not text.strip():
        return empty()
    try:
        st = json.loads(text)
    except ValueError as e:
        raise StateError(f"{path}: not JSON: {e}") from e
    if not isinstance(st, dict):
        raise StateError(f"{path}: expected a JSON object")
    return normalize(st)


def save(path, st):
    """Writes the state atomically (temporary file in the same directory, then rename)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".oo-state-", dir=d)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(st, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def locked(path=None, write=True):
    """Yields the state under an exclusive lock and saves it on a normal exit."""
    path = path or state_path()
    with open(path + ".lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            st = load(path)
            yield st
            if write:
                save(path, st)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def object_id():
    """A MongoDB ObjectId-like hex string (24 digits: 4 bytes of time, 8 random).

    A district's ``uuid`` is its ``_id.to_s`` (controller/app/models/district.rb:74).
    """
    return f"{int(time.time()) & 0xFFFFFFFF:08x}{secrets.token_hex(8)}"


def now_iso():
    """UTC time as RFC 3339 with seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def record_call(st, tool, argv, rc):
    """Appends one tool run to ``calls`` (what the harness reads to assert who ran what)."""
    st["calls"].append({"tool": tool, "argv": list(argv), "rc": rc, "ts": now_iso()})


def find_district(st, uuid=None, name=None):
    """The district with this uuid, else with this name; ``None`` when absent."""
    for d in st["districts"].values():
        if uuid is not None and d["uuid"] == uuid:
            return d
        if uuid is None and name is not None and d["name"] == name:
            return d
    return None


def districts_of_server(st, server):
    """Districts whose ``servers`` list this server (more than one is a corrupt database)."""
    return [d for d in st["districts"].values() if any(s["name"] == server for s in d["servers"])]


def server_record(district, server):
    """The embedded ``Server`` document of a district, or ``None``."""
    for s in district["servers"]:
        if s["name"] == server:
            return s
    return None


def new_district(st, name, gear_size, platform):
    """``District#initialize`` (district.rb:68-82): a full UID pool and no servers.

    UIDs are first_uid...first_uid+max_capacity; origin-server shuffles them, the
    stand-in keeps them sorted so tests are repeatable.
    """
    cfg = st["config"]
    first, num = int(cfg["first_uid"]), int(cfg["max_capacity"])
    uid = object_id()
    ts = now_iso()
    d = {
        "_id": uid,
        "name": name,
        "uuid": uid,
        "gear_size": gear_size or cfg["default_gear_size"],
        "platform": platform,
        "max_capacity": num,
        "max_uid": first + num - 1,
        "available_uids": list(range(first, first + num)),
        "available_capacity": num,
        "active_servers_size": 0,
        "servers": [],
        "created_at": ts,
        "updated_at": ts,
    }
    st["districts"][uid] = d
    return d


def first_uid(district):
    """``District#first_uid`` (district.rb:64-66): max_uid - max_capacity + 1."""
    return district["max_uid"] - district["max_capacity"] + 1


def reserve_uid(district, preferred=None):
    """``District.reserve_uid`` (district.rb:216-226): the preferred UID or the first free one.

    Returns the UID, or ``None`` when it cannot be reserved.
    """
    if district["available_capacity"] <= 0:
        return None
    pool = district["available_uids"]
    if preferred is not None:
        if preferred not in pool:
            return None
        pool.remove(preferred)
        uid = preferred
    else:
        uid = pool.pop(0)
    district["available_capacity"] -= 1
    return uid


def unreserve_uid(district, uid):
    """``District.unreserve_uid`` (district.rb:228-230): gives a UID back unless already free."""
    if uid in district["available_uids"]:
        return
    district["available_uids"].append(uid)
    district["available_capacity"] += 1

