"""A node host as the broker reaches it through MCollective, played on a directory.

A node root is laid out like the node's ``/``:

- ``var/lib/openshift/<gear uuid>/`` per gear (GEAR_BASE_DIR), holding
  ``app-root/runtime/.state`` and ``.env/OPENSHIFT_*`` files;
- ``var/lib/openshift/.settings/district.info``, written by ``set_district``;
- ``etc/openshift/resource_limits.conf`` with ``node_profile`` and ``max_active_gears``.

This is the layout gearshift's ``openshift`` node runtime reads
(node-agent/src/runtime/openshift.rs), so a node agent pointed at the root
sees what the stand-ins did.
"""

import math
import os
import shutil
import stat

GEAR_BASE = os.path.join("var", "lib", "openshift")
RESOURCE_LIMITS = os.path.join("etc", "openshift", "resource_limits.conf")
DISTRICT_INFO = os.path.join(GEAR_BASE, ".settings", "district.info")


class NodeUnreachable(Exception):
    """The node does not answer: origin-server raises NodeException
    "Node execution failure (error getting facts)." with code 143
    (mcollective_application_container_proxy.rb:3724-3738)."""

    MESSAGE = "Node execution failure (error getting facts)."
    CODE = 143


def gear_base(root):
    """GEAR_BASE_DIR below a node root."""
    return os.path.join(root, GEAR_BASE)


def parse_config(text):
    """``key=value`` lines as ParseConfig reads them: ``#`` comments, quotes stripped."""
    out = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        v = v.strip()
        if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
            v = v[1:-1]
        else:
            v = v.split(" #", 1)[0].strip()
        out[k.strip()] = v
    return out


def _read(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        return None


def write_district_info(root, uuid, active, first, maximum):
    """What MCollective's ``set_district`` action writes, byte for byte.

    plugins/msg-node/mcollective/src/openshift.rb:1061-1075: the file
    ``<GEAR_BASE_DIR>/.settings/district.info`` is (re)written as
    ``#Do not modify manually!\\nuuid='U'\\nactive='true|false'\\nfirst_uid=N\\nmax_uid=M``
    with no newline at the end.
    """
    path = os.path.join(root, DISTRICT_INFO)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = (
        "#Do not modify manually!\n"
        f"uuid='{uuid}'\n"
        f"active='{'true' if active else 'false'}'\n"
        f"first_uid={first}\n"
        f"max_uid={maximum}"
    )
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def district_facts(root):
    """``district_uuid``/``district_active`` facts as the node computes them.

    plugins/msg-node/mcollective/facts/openshift_facts.rb:18-27: ``NONE``/false
    without the file; ``active`` is true only when it reads ``true``.
    """
    text = _read(os.path.join(root, DISTRICT_INFO))
    if text is None:
        return {"district_uuid": "NONE", "district_active": False}
    kv = parse_config(text)
    return {
        "district_uuid": kv.get("uuid") or "NONE",
        "district_active": kv.get("active") == "true",
        "district_first_uid": int(kv.get("first_uid", 1000)),
        "district_max_uid": int(kv.get("max_uid", 6999)),
    }


def list_gears(root):
    """Gear uuid -> state for each gear directory (a directory holding
    ``app-root/runtime/.state``; hidden entries and symbolic links are not gears)."""
    base = gear_base(root)
    out = {}
    try:
        names = sorted(os.listdir(base))
    except FileNotFoundError:
        return out
    for name in names:
        if name.startswith("."):
            continue
        p = os.path.join(base, name)
        if os.path.islink(p) or not os.path.isdir(p):
            continue
        s = _read(os.path.join(p, "app-root", "runtime", ".state"))
        if s is not None:
            out[name] = s.strip()
    return out


def facts(node, host):
    """The facts the broker asks a node for (``get_facts``), or ``NodeUnreachable``.

    node/lib/openshift-origin-node/model/node.rb:326-386 (node_utilization):
    profile defaults to ``small``, ``max_active_gears`` falls back to
    ``max_active_apps`` then 0; active = total - idle - stopped;
    ``capacity``/``active_capacity`` are percentages of ``max_active_gears``.
    """
    if not node or not node.get("reachable", True):
        raise NodeUnreachable(host)
    root = node["root"]
    kv = parse_config(_read(os.path.join(root, RESOURCE_LIMITS)) or "")
    max_active = int(kv.get("max_active_gears") or kv.get("max_active_apps") or 0)
    gears = list_gears(root)
    total = len(gears)
    idle = sum(1 for s in gears.values() if s == "idle")
    stopped = sum(1 for s in gears.values() if s == "stopped")
    active = total - idle - stopped

    def pct(n):
        # Ruby's n * 100.0 / 0.0 is Infinity (NaN for 0): a node without
        # max_active_gears never passes the "active_capacity < 100" filter.
        if max_active > 0:
            return n * 100.0 / max_active
        return math.inf if n else math.nan

    f = {
        "kernel": node.get("kernel", "Linux"),
        "node_profile": kv.get("node_profile") or "small",
        "max_active_gears": max_active,
        "gears": gears,
        "gears_total_count": total,
        "gears_active_count": active,
        "capacity": pct(total),
        "active_capacity": pct(active),
    }
    f.update(district_facts(root))
    return f


def write_resource_limits(root, profile, max_active_gears):
    """Writes a minimal ``resource_limits.conf``."""
    path = os.path.join(root, RESOURCE_LIMITS)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"node_profile={profile}\nmax_active_gears={max_active_gears}\n")


def create_gear(root, uuid, uid, app, namespace, state="started", app_uuid=None):
    """Lays out one gear directory as a node's ``create`` would (files only)."""
    g = os.path.join(gear_base(root), uuid)
    os.makedirs(os.path.join(g, "app-root", "runtime"), exist_ok=True)
    os.makedirs(os.path.join(g, ".env"), exist_ok=True)
    with open(os.path.join(g, "app-root", "runtime", ".state"), "w", encoding="utf-8") as f:
        f.write(state + "\n")
    env = {
        "OPENSHIFT_APP_NAME": app,
        "OPENSHIFT_NAMESPACE": namespace,
        "OPENSHIFT_APP_UUID": app_uuid or uuid,
        "OPENSHIFT_GEAR_UUID": uuid,
    }
    for k, v in env.items():
        with open(os.path.join(g, ".env", k), "w", encoding="utf-8") as f:
            f.write(v)
    if os.geteuid() == 0 and uid is not None:
        for dirpath, dirnames, filenames in os.walk(g):
            for n in [dirpath] + [os.path.join(dirpath, x) for x in dirnames + filenames]:
                os.lchown(n, uid, uid)
    return g


def read_env(root, uuid, key):
    """A gear's ``.env/<KEY>`` value (plain or ``export KEY='v'``), or ``None``."""
    t = _read(os.path.join(gear_base(root), uuid, ".env", key))
    if t is None:
        return None
    t = t.strip()
    if t.startswith("export ") and "=" in t:
        t = t.split("=", 1)[1].strip().strip("'\"")
    return t


def gear_owner(root, uuid):
    """The UID owning the gear directory (each gear is a Unix user), or ``None``."""
    try:
        return os.lstat(os.path.join(gear_base(root), uuid)).st_uid
    except FileNotFoundError:
        return None


def _tree(path):
    """Relative path -> (type, size, uid, bytes or link target) of everything under ``path``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            rel = os.path.relpath(p, path)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("l", 0, st.st_uid, os.readlink(p))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("d", 0, st.st_uid, None)
            else:
                with open(p, "rb") as f:
                    out[rel] = ("f", st.st_size, st.st_uid, f.read())
    return out


def _copy_owned(src, dst):
    """Copies a tree keeping modes, times and (as root) owners, like ``rsync -aAXS``."""
    shutil.copytree(src, dst, symlinks=True, copy_function=shutil.copy2)
    if os.geteuid() != 0:
        return
    os.lchown(dst, os.lstat(src).st_uid, os.lstat(src).st_gid)
    for dirpath, dirnames, filenames in os.walk(src):
        for n in dirnames + filenames:
            s = os.path.join(dirpath, n)
            st = os.lstat(s)
            os.lchown(os.path.join(dst, os.path.relpath(s, src)), st.st_uid, st.st_gid)


def move_gear_files(src_root, dst_root, uuid):
    """Moves a gear between two node roots: copy, verify, then delete the source.

    Mirrors rsync_destination_container (mcollective_application_container_proxy.rb:
    2401-2470: the gear directory, then ``.httpd.d/<uuid>_*`` and
    ``.last_access/<uuid>``) and move_gear_destroy_old (2284-2296). The copy lands
    under a temporary name and is renamed into place, so a reader of the target
    never sees half a gear. Raises ``OSError`` when the copy does not verify.
    """
    src = os.path.join(gear_base(src_root), uuid)
    dst = os.path.join(gear_base(dst_root), uuid)
    os.makedirs(gear_base(dst_root), exist_ok=True)
    if os.path.exists(dst):
        raise OSError(f"{dst} already exists")
    tmp = os.path.join(gear_base(dst_root), f".moving-{uuid}")
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_owned(src, tmp)
    if _tree(src) != _tree(tmp):
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"copy of gear {uuid} does not match its source")
    os.rename(tmp, dst)
    extras = []
    httpd = os.path.join(gear_base(src_root), ".httpd.d")
    if os.path.isdir(httpd):
        extras += [os.path.join(".httpd.d", n) for n in os.listdir(httpd) if n.startswith(uuid + "_")]
    if os.path.lexists(os.path.join(gear_base(src_root), ".last_access", uuid)):
        extras.append(os.path.join(".last_access", uuid))
    for rel in extras:
        s = os.path.join(gear_base(src_root), rel)
        d = os.path.join(gear_base(dst_root), rel)
        os.makedirs(os.path.dirname(d), exist_ok=True)
        if os.path.isdir(s) and not os.path.islink(s):
            _copy_owned(s, d)
            shutil.rmtree(s)
        else:
            shutil.copy2(s, d, follow_symlinks=False)
            os.unlink(s)
    shutil.rmtree(src)
