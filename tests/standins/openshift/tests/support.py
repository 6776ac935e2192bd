"""Shared scaffolding: a temporary broker host (state file) and node roots, and
a runner for the stand-in executables as a caller would run them."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "..", "bin")
LIB = os.path.join(HERE, "..", "lib")
if LIB not in sys.path:
    sys.path.insert(0, LIB)


class Result:
    """A finished run: exit code, standard output, standard error."""

    def __init__(self, rc, out, err):
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self):
        return f"Result(rc={self.rc}, out={self.out!r}, err={self.err!r})"


class StandinCase(unittest.TestCase):
    """A fresh state file and a directory for node roots per test."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="oo-standin-")
        self.state_path = os.path.join(self.dir, "state.json")
        self.env = dict(os.environ, GEARSHIFT_OO_STATE=self.state_path)
        self.env.pop("GEARSHIFT_OO_MOVE_DELAY", None)
        self.env.pop("GEARSHIFT_OO_SEED", None)
        self.env.pop("GEARSHIFT_OO_MOVE_STRICT", None)
        self.ok("oo-standin", "init")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_tool(self, tool, *args, env=None, stdin=None, direct=False):
        """Runs bin/<tool> with ``args`` (through this interpreter, which skips
        any shim on PATH, unless ``direct``); returns its ``Result``."""
        argv = [os.path.join(BIN, tool), *args]
        if not direct:
            argv.insert(0, sys.executable)
        p = subprocess.run(argv, capture_output=True, text=True,
                           env=env or self.env, input=stdin, timeout=60)
        return Result(p.returncode, p.stdout, p.stderr)

    def ok(self, tool, *args):
        """Runs a tool that must exit 0; returns its standard output."""
        r = self.run_tool(tool, *args)
        self.assertEqual(r.rc, 0, r)
        return r.out

    def ctl(self, *args):
        """Runs oo-admin-ctl-district."""
        return self.run_tool("oo-admin-ctl-district", *args)

    def move(self, *args):
        """Runs oo-admin-move."""
        return self.run_tool("oo-admin-move", *args)

    def state(self):
        """The state file as JSON."""
        with open(self.state_path, encoding="utf-8") as f:
            return json.load(f)

    def write_state(self, st):
        """Replaces the state file (for records a test edits by hand)."""
        with open(self.state_path, "w", encoding="utf-8") as f:
            json.dump(st, f)

    def root(self, host):
        """Where a node's root is (or will be)."""
        return os.path.join(self.dir, "nodes", host)

    def add_node(self, host, profile="small", max_active=100, *extra):
        """Registers a node root."""
        self.ok("oo-standin", "node-add", host, self.root(host), "--profile", profile,
                "--max-active-gears", str(max_active), *extra)

    def district(self, name="d1", profile="small", nodes=()):
        """Creates a district with these nodes; returns its uuid."""
        self.ok("oo-admin-ctl-district", "-c", "create", "-n", name, "-p", profile)
        if nodes:
            self.ok("oo-admin-ctl-district", "-c", "add-node", "-n", name, "-i", ",".join(nodes))
        return self.district_doc(name)["uuid"]

    def district_doc(self, name):
        """A district's document from the state file."""
        for d in self.state()["districts"].values():
            if d["name"] == name:
                return d
        raise AssertionError(f"no district {name}")

    def server(self, name, host):
        """A node's server record in a district."""
        for s in self.district_doc(name)["servers"]:
            if s["name"] == host:
                return s
        return None

    def district_info(self, host):
        """The node's district.info, or ``None``."""
        p = os.path.join(self.root(host), "var/lib/openshift/.settings/district.info")
        if not os.path.exists(p):
            return None
        with open(p, encoding="utf-8") as f:
            return f.read()

    def gear_dir(self, host, gear):
        """A gear's directory on a node."""
        return os.path.join(self.root(host), "var/lib/openshift", gear)

    def add_gear(self, host, gear, *extra):
        """Creates a gear on a node; returns its UID."""
        return int(self.ok("oo-standin", "gear-add", host, gear, *extra).strip())
