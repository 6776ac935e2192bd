"""oo-admin-ctl-district stand-in: every rule, message and exit code it enforces."""

import os
import shutil
import subprocess
import unittest

from support import BIN, StandinCase

NOT_FOUND_MSG = "Node with server identity: {h} doesn't belong to district: {u}"


def info(uuid, active, first=1000, maximum=6999):
    """district.info as set_district writes it (no final newline)."""
    return (f"#Do not modify manually!\nuuid='{uuid}'\nactive='{'true' if active else 'false'}'\n"
            f"first_uid={first}\nmax_uid={maximum}")


class Usage(StandinCase):
    def test_no_arguments_is_usage_255(self):
        r = self.ctl()
        self.assertEqual(r.rc, 255)
        self.assertIn("-c|--command", r.out)

    def test_executables_run_directly(self):
        for tool in ("oo-admin-ctl-district", "oo-admin-move", "oo-standin"):
            self.assertEqual(self.run_tool(tool, "-h", direct=True).rc, 0)

    def test_help_is_0(self):
        self.assertEqual(self.ctl("-h").rc, 0)
        self.assertEqual(self.ctl("--help").rc, 0)

    def test_unknown_option_and_missing_argument_are_255(self):
        self.assertEqual(self.ctl("--frobnicate").rc, 255)
        self.assertEqual(self.ctl("-c").rc, 255)

    def test_arguments_without_command_are_255(self):
        r = self.ctl("-n", "d1")
        self.assertEqual((r.rc, r.out), (255, "Error: --command is required with any arguments\n"))

    def test_unknown_command_is_255(self):
        r = self.ctl("-c", "explode")
        self.assertEqual(r.rc, 255)
        self.assertEqual(r.out, "Command must be one of: list|nodes-available|create|add-node|"
                         "set-region|unset-region|deactivate-node|activate-node|remove-node|"
                         "add-capacity|remove-capacity|destroy|publish-uids\n")

    def test_long_options_abbreviate_like_getoptlong(self):
        r = self.ctl("--comm", "create", "--na", "d1", "--node_p", "small")
        self.assertEqual(r.rc, 0, r)

    def test_unknown_profile_is_1(self):
        r = self.ctl("-c", "create", "-n", "d1", "-p", "huge")
        self.assertEqual((r.rc, r.out), (1, "Node profile must be one of: (small(default)|medium|large)\n"))

    def test_district_not_found_is_1(self):
        r = self.ctl("-c", "deactivate-node", "-n", "nope", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "District 'nope' not found.\n"))
        r = self.ctl("-c", "list", "-u", "0123")
        self.assertEqual((r.rc, r.out), (1, "District '0123' not found.\n"))

    def test_add_node_to_missing_district_without_profile_is_1(self):
        r = self.ctl("-c", "add-node", "-n", "nope", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "District 'nope' not found, and no profile given to auto-create.\n"))

    def test_create_existing_is_1(self):
        self.district("d1")
        r = self.ctl("-c", "create", "-n", "d1", "-p", "small")
        self.assertEqual((r.rc, r.out), (1, "District 'd1' already exists\n"))

    def test_node_commands_need_server_identity_with_a_district(self):
        self.district("d1")
        for c in ("remove-node", "deactivate-node", "activate-node"):
            r = self.ctl("-c", c, "-n", "d1")
            self.assertEqual((r.rc, r.out), (1, f"--server_identity is required with command: {c}\n"))
        r = self.ctl("-c", "add-node", "-n", "d1")
        self.assertEqual((r.rc, r.out), (1, "--server_identity or --available is required with command: add-node\n"))

    def test_node_commands_without_district_or_node_crash(self):
        # tool:174 lets them through without -n; collate_errors then calls nil.each.
        r = self.ctl("-c", "deactivate-node")
        self.assertEqual(r.rc, 1)
        self.assertEqual(r.out, "")
        self.assertIn("NoMethodError", r.err)

    def test_district_required(self):
        r = self.ctl("-c", "add-node", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "--uuid or --name is required with command: add-node\n"))
        r = self.ctl("-c", "create", "-p", "small")
        self.assertEqual((r.rc, r.out), (1, "--name is required with create\n"))

    def test_invalid_name_is_an_unrescued_exception(self):
        r = self.ctl("-c", "create", "-n", "bad name!")
        self.assertEqual(r.rc, 1)
        self.assertIn("Invalid district name 'bad name!'", r.err)

    def test_not_implemented_commands_say_so(self):
        self.district("d1")
        r = self.ctl("-c", "add-capacity", "-n", "d1", "-s", "10")
        self.assertEqual(r.rc, 3)
        self.assertIn("does not implement", r.err)

    def test_missing_state_variable(self):
        env = dict(self.env)
        env.pop("GEARSHIFT_OO_STATE")
        r = self.run_tool("oo-admin-ctl-district", "-c", "list", env=env)
        self.assertEqual(r.rc, 1)
        self.assertIn("GEARSHIFT_OO_STATE", r.err)


class Create(StandinCase):
    def test_create_prints_uuid_and_document(self):
        r = self.ctl("-c", "create", "-n", "d1", "-p", "medium")
        self.assertEqual(r.rc, 0)
        d = self.district_doc("d1")
        self.assertTrue(r.out.startswith(f"Successfully created district: {d['uuid']}\n\n{{"), r.out)
        self.assertIn('"available_uids"=>"<6000 uids hidden>"', r.out)
        self.assertEqual(len(d["uuid"]), 24)
        self.assertEqual((d["gear_size"], d["platform"], d["max_uid"], d["max_capacity"]),
                         ("medium", "linux", 6999, 6000))
        self.assertEqual(d["available_capacity"], 6000)

    def test_default_profile_is_announced(self):
        r = self.ctl("-c", "create", "-n", "d1")
        self.assertEqual(r.rc, 0)
        self.assertTrue(r.out.startswith("node_profile not specified.  Using default: small\n"), r.out)
        self.assertEqual(self.district_doc("d1")["gear_size"], "small")

    def test_unknown_platform_creates_nothing_then_crashes(self):
        # tool:280 then tool:318-320 looks the district up again and calls a method on nil.
        r = self.ctl("-c", "create", "-n", "d1", "-o", "windows")
        self.assertEqual(r.rc, 1)
        self.assertIn("NoMethodError", r.err)
        self.assertEqual(self.state()["districts"], {})

    def test_create_by_uuid_only_names_nothing(self):
        r = self.ctl("-c", "create", "-u", "abc")
        self.assertEqual(r.rc, 1)
        self.assertEqual(r.out, "node_profile not specified.  Using default: small\n"
                         "ERROR OUTPUT:\nInvalid district name ''\n")

    def test_list_and_destroy(self):
        r = self.ctl("-c", "list")
        self.assertEqual((r.rc, r.out), (0, "No districts created yet.  Use 'oo-admin-ctl-district -c create' to create one.\n"))
        self.district("d1")
        self.district("d2")
        r = self.ctl("-c", "list")
        self.assertEqual(r.rc, 0)
        self.assertEqual(r.out.count('"name"=>'), 2)
        r = self.run_tool("oo-admin-ctl-district", "-c", "destroy", "-n", "d2", stdin="n\n")
        self.assertEqual(r.rc, 217)
        r = self.ctl("-c", "destroy", "-n", "d2", "-b")
        self.assertEqual((r.rc, r.out), (0, "Successfully deleted district: d2\n"))
        self.add_node("n1")
        self.ok("oo-admin-ctl-district", "-c", "add-node", "-n", "d1", "-i", "n1")
        r = self.ctl("-c", "destroy", "-n", "d1", "-b")
        self.assertEqual((r.rc, r.out), (1, "ERROR OUTPUT:\nCouldn't delete district 'd1' because it still contains nodes\n"))


class AddNode(StandinCase):
    def setUp(self):
        super().setUp()
        for h in ("n1", "n2", "n3"):
            self.add_node(h)
        self.uuid = self.district("d1")

    def test_add_writes_district_info_and_counts_active(self):
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1")
        self.assertEqual(r.rc, 0)
        self.assertTrue(r.out.startswith("Success for node 'n1'!\n\n\n{"), r.out)
        self.assertEqual(self.district_info("n1"), info(self.uuid, True))
        self.assertEqual(self.server("d1", "n1"), {"name": "n1", "active": True, "unresponsive": False})
        self.assertEqual(self.district_doc("d1")["active_servers_size"], 1)

    def test_server_identity_separators(self):
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1; n2:n3")
        self.assertEqual(r.out.count("Success for node"), 3, r)
        self.assertEqual(self.district_doc("d1")["active_servers_size"], 3)

    def test_already_districted_here_or_elsewhere(self):
        self.ok("oo-admin-ctl-district", "-c", "add-node", "-n", "d1", "-i", "n1")
        self.district("d2")
        for d in ("d1", "d2"):
            r = self.ctl("-c", "add-node", "-n", d, "-i", "n1")
            self.assertEqual(r.rc, 1)
            self.assertIn("ERROR OUTPUT:\nError for node 'n1': Node with server identity: n1 "
                          "already belongs to another district\n", r.out)

    def test_node_with_gears_is_refused(self):
        self.ok("oo-standin", "gear-add", "n1", "g1", "--state", "stopped")
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1")
        self.assertEqual(r.rc, 1)
        self.assertIn("Error for node 'n1': Node with server identity: n1 already has gears on it\n", r.out)
        self.assertIsNone(self.district_info("n1"))

    def test_profile_must_match(self):
        self.add_node("big", "medium")
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "big")
        self.assertEqual(r.rc, 1)
        self.assertIn("Error for node 'big': Node with server identity: big is of node profile "
                      "'medium' and needs to be 'small' to add to district 'd1'\n", r.out)

    def test_mixed_results_keep_going_and_exit_1(self):
        self.add_node("big", "medium")
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1,big,n2")
        self.assertEqual(r.rc, 1)
        self.assertTrue(r.out.startswith("Success for node 'n1'!\nSuccess for node 'n2'!\n\n\n{"), r.out)
        self.assertTrue(r.out.endswith("ERROR OUTPUT:\nError for node 'big': Node with server identity: big "
                                       "is of node profile 'medium' and needs to be 'small' to add to district 'd1'\n\n"), r.out)

    def test_unreachable_node_stops_the_loop(self):
        self.add_node("dead", "small", 100, "--unreachable")
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1,dead,n2")
        self.assertEqual(r.rc, 1)
        self.assertIn("Success for node 'n1'!", r.out)
        self.assertNotIn("'n2'", r.out)
        self.assertNotIn("'dead'", r.out)
        self.assertIn("ERROR OUTPUT:\nCannot connect to node.\n", r.out)
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "ghost")
        self.assertEqual(r.rc, 1)
        self.assertIn("Cannot connect to node.", r.out)

    def test_platform_mismatch_is_reported_as_success(self):
        self.add_node("win", "small", 100, "--kernel", "Windows")
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "win")
        self.assertEqual(r.rc, 0)
        self.assertIn("Cannot add a node with platform 'Windows' to a district with platform 'linux'"
                      "Success for node 'win'!\n", r.out)
        self.assertIsNone(self.server("d1", "win"))

    def test_add_node_auto_creates_with_profile(self):
        r = self.ctl("-c", "add-node", "-n", "d9", "-p", "small", "-i", "n1")
        self.assertEqual(r.rc, 0, r)
        d = self.district_doc("d9")
        self.assertTrue(r.out.startswith(f"Successfully created district: {d['uuid']}\nSuccess for node 'n1'!\n"), r.out)
        self.assertEqual(self.district_info("n1"), info(d["uuid"], True))

    def test_available_adds_every_undistricted_node_of_the_profile(self):
        self.add_node("big", "medium")
        r = self.ctl("-c", "nodes-available")
        self.assertEqual(r.out, "Nodes in profile: medium\n\tbig\nNodes in profile: small\n\tn1\n\tn2\n\tn3\n\n")
        r = self.ctl("-c", "add-node", "-n", "d1", "-a")
        self.assertEqual(r.out.count("Success for node"), 3, r)
        r = self.ctl("-c", "add-node", "-n", "d1", "-a")
        self.assertEqual(r.rc, 1)
        self.assertIn("ERROR OUTPUT:\nNo available nodes for profile 'small'\n", r.out)
        r = self.ctl("-c", "nodes-available", "-p", "small")
        self.assertEqual((r.rc, r.out), (0, "No nodes in profile: small\n\n"))

    def test_regions(self):
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1", "-r", "east", "-z", "a")
        self.assertIn("Region object not found, you can create new region 'east' using oo-admin-ctl-region.", r.out)
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1", "-z", "a")
        self.assertIn("Region name is required when zone name is specified", r.out)
        st = self.state()
        st["config"]["regions"] = {"east": ["a"]}
        self.write_state(st)
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1", "-r", "east")
        self.assertIn("Zone name is required when region name is specified", r.out)
        r = self.ctl("-c", "add-node", "-n", "d1", "-i", "n1", "-r", "east", "-z", "b")
        self.assertIn("Zone object not found, you can add zone 'b' to region 'east' using oo-admin-ctl-region.", r.out)
        self.assertEqual(self.ctl("-c", "add-node", "-n", "d1", "-i", "n1", "-r", "east", "-z", "a").rc, 0)
        self.assertEqual(self.server("d1", "n1")["zone_name"], "a")


class NodeLifecycle(StandinCase):
    def setUp(self):
        super().setUp()
        for h in ("n1", "n2"):
            self.add_node(h)
        self.uuid = self.district("d1", nodes=("n1", "n2"))

    def test_deactivate_activate_and_repeats(self):
        r = self.ctl("-c", "deactivate-node", "-n", "d1", "-i", "n1")
        self.assertEqual(r.rc, 0)
        self.assertTrue(r.out.startswith("Success for node 'n1'!\n\n\n{"), r.out)
        self.assertEqual(self.district_info("n1"), info(self.uuid, False))
        self.assertFalse(self.server("d1", "n1")["active"])
        self.assertEqual(self.district_doc("d1")["active_servers_size"], 1)
        r = self.ctl("-c", "deactivate-node", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "ERROR OUTPUT:\nError for node 'n1': Node with server "
                                         "identity: n1 is already deactivated\n\n"))
        r = self.ctl("-c", "activate-node", "-i", "n1")
        self.assertEqual((r.rc, r.out), (0, "Success for node 'n1'!\n\n"))
        self.assertEqual(self.district_info("n1"), info(self.uuid, True))
        self.assertEqual(self.district_doc("d1")["active_servers_size"], 2)
        r = self.ctl("-c", "activate-node", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "ERROR OUTPUT:\nError for node 'n1': Node with server "
                                         "identity: n1 is already active\n\n"))

    def test_node_outside_the_district(self):
        self.add_node("n3")
        self.district("d2", nodes=("n3",))
        for c in ("deactivate-node", "activate-node", "remove-node"):
            r = self.ctl("-c", c, "-n", "d1", "-i", "n3")
            self.assertEqual(r.rc, 1)
            self.assertIn("Error for node 'n3': " + NOT_FOUND_MSG.format(h="n3", u=self.uuid) + "\n", r.out)
        r = self.ctl("-c", "deactivate-node", "-i", "ghost")
        self.assertEqual((r.rc, r.out), (1, "ERROR OUTPUT:\nError for node 'ghost': District not found for ghost\n\n"))

    def test_remove_needs_inactive_then_empty(self):
        r = self.ctl("-c", "remove-node", "-i", "n1")
        self.assertEqual(r.rc, 1)
        self.assertIn(f"Error for node 'n1': Node with server identity: n1 from district: {self.uuid} "
                      "must be deactivated before it can be removed\n", r.out)
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n1")
        self.add_gear("n1", "g1")
        r = self.ctl("-c", "remove-node", "-i", "n1")
        self.assertEqual(r.rc, 1)
        self.assertIn(f"Node with server identity: n1 could not be removed from district: {self.uuid} "
                      "because some apps in mongo are still using it.", r.out)
        # A gear directory the database does not know about still blocks it.
        st = self.state()
        st["gears"] = {}
        self.write_state(st)
        r = self.ctl("-c", "remove-node", "-i", "n1")
        self.assertIn(f"Node with server identity: n1 could not be removed from district: {self.uuid} "
                      "because it still has apps on it", r.out)
        shutil.rmtree(self.gear_dir("n1", "g1"))
        r = self.ctl("-c", "remove-node", "-i", "n1")
        self.assertEqual((r.rc, r.out), (0, "Success for node 'n1'!\n\n"))
        self.assertEqual(self.district_info("n1"), info("NONE", False))
        self.assertIsNone(self.server("d1", "n1"))
        self.assertEqual(self.district_doc("d1")["active_servers_size"], 1)
        self.assertIn("n1", self.ctl("-c", "nodes-available").out)

    def test_unreachable_and_unresponsive_nodes(self):
        self.ok("oo-standin", "node-set", "n1", "--unreachable")
        # deactivate reaches no node but succeeds (no reply is no error): the file stays.
        self.assertEqual(self.ctl("-c", "deactivate-node", "-i", "n1").rc, 0)
        self.assertEqual(self.district_info("n1"), info(self.uuid, True))
        r = self.ctl("-c", "remove-node", "-i", "n1")
        self.assertEqual(r.rc, 1)
        self.assertIn("Error for node 'n1': Error: Node execution failure (error getting facts).. Node "
                      "with server identity: n1 might be unresponsive, run oo-admin-repair "
                      "--removed-nodes and retry the current operation.\n", r.out)
        self.ok("oo-standin", "node-set", "n1", "--unresponsive")
        r = self.ctl("-c", "activate-node", "-i", "n1")
        self.assertIn("Node with server identity: n1 is unresponsive", r.out)
        self.assertEqual(self.ctl("-c", "remove-node", "-i", "n1").rc, 0)

    def test_errors_after_successes_and_exit_1(self):
        r = self.ctl("-c", "deactivate-node", "-i", "n1,ghost,n2")
        self.assertEqual(r.rc, 1)
        self.assertEqual(r.out, "Success for node 'n1'!\nSuccess for node 'n2'!\n\n"
                         "ERROR OUTPUT:\nError for node 'ghost': District not found for ghost\n\n")

    def test_calls_are_recorded(self):
        self.ctl("-c", "deactivate-node", "-i", "n1")
        calls = self.state()["calls"]
        self.assertEqual(calls[-1]["argv"], ["-c", "deactivate-node", "-i", "n1"])
        self.assertEqual((calls[-1]["tool"], calls[-1]["rc"]), ("oo-admin-ctl-district", 0))


class Parallel(StandinCase):
    def test_parallel_calls_do_not_lose_updates(self):
        hosts = [f"p{i}" for i in range(12)]
        for h in hosts:
            self.add_node(h)
        self.district("d1")
        procs = [subprocess.Popen([os.path.join(BIN, "oo-admin-ctl-district"), "-c", "add-node", "-n", "d1",
                                   "-i", h], env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for h in hosts]
        for p in procs:
            p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0)
        d = self.district_doc("d1")
        self.assertEqual(sorted(s["name"] for s in d["servers"]), sorted(hosts))
        self.assertEqual(d["active_servers_size"], 12)
        # create + 12 add-node (oo-standin's own runs are not tool calls)
        self.assertEqual(len(self.state()["calls"]), 13)


if __name__ == "__main__":
    unittest.main()
