"""oo-admin-move stand-in: refusals, exit codes, what it moves, what it records."""

import json
import os
import subprocess
import unittest

from support import BIN, StandinCase

G = "5480c40bac2c4a2cd2000001"


class Usage(StandinCase):
    def test_usage_errors(self):
        r = self.move("--bogus")
        self.assertEqual(r.rc, 255)
        self.assertIn("--gear_uuid", r.out)
        self.assertEqual(self.move("-h").rc, 0)
        r = self.move("--gear_uuid", G, "-t", "soon")
        self.assertEqual((r.rc, r.out), (1, "ERROR: Timeout must be a positive integer\n"))
        r = self.move("-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "ERROR: Please specify gear_uuid for moving gear\n"))
        r = self.move("--gear_uuid")
        self.assertEqual(r.rc, 255)

    def test_unknown_gear(self):
        r = self.move("--gear_uuid", "nope", "-i", "n1")
        self.assertEqual((r.rc, r.out), (1, "ERROR: Gear not found: nope\n"))


class Moves(StandinCase):
    def setUp(self):
        super().setUp()
        for h in ("n1", "n2", "n3", "lone"):
            self.add_node(h)
        self.d1 = self.district("d1", nodes=("n1", "n2"))
        self.d2 = self.district("d2", nodes=("n3",))
        self.uid = self.add_gear("n1", G, "--app", "shop", "--namespace", "acme", "--login", "alice")

    def last_move(self):
        return self.state()["moves"][-1]

    def test_move_keeps_uid_and_moves_the_files(self):
        gd = self.gear_dir("n1", G)
        with open(os.path.join(gd, "data.txt"), "w") as f:
            f.write("payload")
        base1 = os.path.join(self.root("n1"), "var/lib/openshift")
        os.makedirs(os.path.join(base1, ".httpd.d", f"{G}_shop"))
        os.makedirs(os.path.join(base1, ".last_access"))
        open(os.path.join(base1, ".last_access", G), "w").close()
        r = self.move("--gear_uuid", G, "-i", "n2")
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(r.out, "URL: http://shop-acme.example.com\nLogin: alice\n"
                         f"App UUID: {G}\nGear UUID: {G}\n"
                         f"DEBUG: Source district uuid: {self.d1}\nDEBUG: Destination district uuid: {self.d1}\n"
                         f"Successfully moved gear with uuid '{G}' of app 'shop' from 'n1' to 'n2'\n")
        self.assertFalse(os.path.exists(gd))
        nd = self.gear_dir("n2", G)
        with open(os.path.join(nd, "data.txt")) as f:
            self.assertEqual(f.read(), "payload")
        with open(os.path.join(nd, ".env", "OPENSHIFT_APP_NAME")) as f:
            self.assertEqual(f.read(), "shop")
        with open(os.path.join(nd, "app-root/runtime/.state")) as f:
            self.assertEqual(f.read(), "started\n")
        base2 = os.path.join(self.root("n2"), "var/lib/openshift")
        self.assertTrue(os.path.isdir(os.path.join(base2, ".httpd.d", f"{G}_shop")))
        self.assertTrue(os.path.exists(os.path.join(base2, ".last_access", G)))
        self.assertFalse(os.path.exists(os.path.join(base1, ".last_access", G)))
        m = self.last_move()
        self.assertTrue(m["ok"])
        self.assertEqual((m["source"], m["target"], m["uid"]), ("n1", "n2", self.uid))
        self.assertTrue(m["same_district"] and m["target_active"] and m["target_fact_active"])
        self.assertTrue(m["uid_kept"])
        self.assertEqual(os.lstat(nd).st_uid, self.uid if os.geteuid() == 0 else os.getuid())
        self.assertEqual(self.state()["gears"][G]["server"], "n2")
        # Same district: the UID stays reserved, nothing returns to the pool.
        self.assertEqual(self.district_doc("d1")["available_capacity"], 5999)

    def test_refusals(self):
        cases = [
            ("n1", f"Error moving gear. Old and new servers are the same: n1"),
            ("lone", "Error moving gear. Move gear only allowed from non-districted/districted node to districted node."),
            ("ghost", "Node execution failure (error getting facts)."),
        ]
        for target, msg in cases:
            r = self.move("--gear_uuid", G, "-i", target)
            self.assertEqual(r.rc, 1, r)
            self.assertTrue(r.out.endswith(msg + "\n"), r.out)
            self.assertTrue(r.out.startswith("URL: http://shop-acme.example.com\n"), r.out)
            m = self.last_move()
            self.assertEqual((m["ok"], m["error"]), (False, msg))
        self.assertTrue(os.path.isdir(self.gear_dir("n1", G)))
        self.ok("oo-standin", "node-set", "n2", "--unreachable")
        r = self.move("--gear_uuid", G, "-i", "n2")
        self.assertEqual(r.rc, 1)
        self.assertIn("Node execution failure (error getting facts).", r.out)

    def test_inactive_target_is_not_refused_but_recorded(self):
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n2")
        r = self.move("--gear_uuid", G, "-i", "n2")
        self.assertEqual(r.rc, 0, r)
        m = self.last_move()
        self.assertTrue(m["ok"])
        self.assertFalse(m["target_active"])
        self.assertFalse(m["target_fact_active"])
        self.assertTrue(m["same_district"])

    def test_strict_mode_refuses_what_the_caller_must_check(self):
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n2")
        env = dict(self.env, GEARSHIFT_OO_MOVE_STRICT="1")
        r = self.run_tool("oo-admin-move", "--gear_uuid", G, "-i", "n2", env=env)
        self.assertEqual(r.rc, 1)
        self.assertTrue(r.out.endswith("gearshift stand-in (GEARSHIFT_OO_MOVE_STRICT=1): target n2 is inactive\n"), r.out)
        r = self.run_tool("oo-admin-move", "--gear_uuid", G, "-i", "n3", env=env)
        self.assertIn("target n3 is in another district", r.out)
        self.assertTrue(os.path.isdir(self.gear_dir("n1", G)))
        self.ok("oo-admin-ctl-district", "-c", "activate-node", "-i", "n2")
        self.assertEqual(self.run_tool("oo-admin-move", "--gear_uuid", G, "-i", "n2", env=env).rc, 0)

    def test_other_district_is_not_refused_but_recorded(self):
        r = self.move("--gear_uuid", G, "-i", "n3")
        self.assertEqual(r.rc, 0, r)
        m = self.last_move()
        self.assertFalse(m["same_district"])
        self.assertEqual((m["source_district"], m["target_district"]), (self.d1, self.d2))
        self.assertTrue(m["uid_kept"])
        # The UID moved from d1's reservations to d2's.
        self.assertIn(self.uid, self.district_doc("d1")["available_uids"])
        self.assertNotIn(self.uid, self.district_doc("d2")["available_uids"])

    def test_uid_taken_in_the_other_district_crashes(self):
        self.add_gear("n3", "other", "--uid", str(self.uid))
        r = self.move("--gear_uuid", G, "-i", "n3")
        self.assertEqual(r.rc, 1)
        self.assertIn(f"uid could not be reserved in target district '{self.d2}'.  Please ensure the target "
                      "district has available capacity or does not contain a conflicting uid.", r.err)
        self.assertTrue(os.path.isdir(self.gear_dir("n1", G)))

    def test_profile_platform_and_region(self):
        self.add_node("m1", "medium")
        self.district("dm", "medium", nodes=("m1",))
        self.add_gear("n2", "scaled", "--scalable")
        r = self.move("--gear_uuid", "scaled", "-i", "m1")
        self.assertIn("Error moving gear. Cannot change node profile for *scalable* app.", r.out)
        r = self.move("--gear_uuid", "scaled", "-i", "n1", "-p", "small")
        self.assertEqual((r.rc, r.out), (1, "Cannot specify 'node_profile' for a gear belonging to a scalable application.\n"))
        r = self.move("--gear_uuid", "scaled", "-i", "n1", "--change_region")
        self.assertIn("Error moving gear. Cannot change region for *scalable* app.", r.out)
        # Not scalable: a profile change is allowed.
        self.assertEqual(self.move("--gear_uuid", G, "-i", "m1").rc, 0)
        st = self.state()
        st["nodes"]["n2"]["kernel"] = "Windows"
        for d in st["districts"].values():
            for s in d["servers"]:
                if s["name"] == "n3":
                    s.update(region_id="west", region_name="west")
        self.write_state(st)
        r = self.move("--gear_uuid", G, "-i", "n2")
        self.assertIn("Error moving gear. Destination container platform is not the same as the source "
                      "container platform.", r.out)
        r = self.move("--gear_uuid", G, "-i", "n3")
        self.assertIn("Error moving gear. Old and new servers must belong to the same region, source "
                      "region:  destination region: west", r.out)
        self.assertEqual(self.move("--gear_uuid", G, "-i", "n3", "--change_region").rc, 0)

    def test_several_gears_json_and_exit_code(self):
        self.add_gear("n1", "g2", "--app", "blog")
        r = self.move("--gear_uuid", f"{G},missing,g2", "-i", "n2", "--json")
        self.assertEqual(r.rc, 1)
        out = json.loads(r.out)
        self.assertEqual(out["missing"], {"result": False, "message": "ERROR: Gear not found: missing"})
        self.assertTrue(out[G]["result"])
        self.assertEqual((out[G]["destination"], out[G]["source"], out[G]["app_name"]), ("n2", "n1", "shop"))
        self.assertTrue(out["g2"]["result"])
        r = self.move("--gear_uuid", "g2", "-i", "n2", "--json")
        self.assertEqual(json.loads(r.out)["g2"]["message"], "Error moving gear. Old and new servers are the same: n2")

    def test_change_district_parses_and_is_ignored_with_a_target(self):
        r = self.move("--gear_uuid", G, "-i", "n2", "--change_district", "--destination_district_uuid", self.d2)
        self.assertEqual(r.rc, 0, r)
        self.assertEqual(self.last_move()["target_district"], self.d1)
        r = self.move("--gear_uuid", G, "--allow_change_district", "-i", "n1")
        self.assertEqual(r.rc, 255)

    def test_without_target_the_broker_picks_an_active_node_of_the_district(self):
        self.add_node("n4")
        self.ok("oo-admin-ctl-district", "-c", "add-node", "-n", "d1", "-i", "n4")
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n2")
        env = dict(self.env, GEARSHIFT_OO_SEED="7")
        targets = set()
        for _ in range(6):
            r = self.run_tool("oo-admin-move", "--gear_uuid", G, env=env)
            if r.rc == 0:
                targets.add(self.state()["gears"][G]["server"])
            else:  # the broker may pick the gear's own node (it is a candidate)
                self.assertIn("Old and new servers are the same", r.out)
        self.assertLessEqual(targets, {"n1", "n4"})
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n4")
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "n1")
        where = self.state()["gears"][G]["server"]
        r = self.move("--gear_uuid", G)
        self.assertEqual(r.rc, 1)
        self.assertTrue(r.out.endswith("No nodes available for the specified gear size\n"), r.out)
        self.assertEqual(self.state()["gears"][G]["server"], where)

    def test_parallel_moves(self):
        gears = [f"pg{i}" for i in range(6)]
        for g in gears:
            self.add_gear("n1", g)
        procs = [subprocess.Popen([os.path.join(BIN, "oo-admin-move"), "--gear_uuid", g, "-i", "n2"],
                                  env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE) for g in gears]
        for p in procs:
            p.communicate(timeout=60)
            self.assertEqual(p.returncode, 0)
        st = self.state()
        self.assertTrue(all(st["gears"][g]["server"] == "n2" for g in gears))
        self.assertTrue(all(os.path.isdir(self.gear_dir("n2", g)) for g in gears))
        self.assertFalse(any(os.path.exists(self.gear_dir("n1", g)) for g in gears))

    def test_unrecorded_gear_directory_is_found_on_its_node(self):
        st = self.state()
        del st["gears"][G]
        self.write_state(st)
        r = self.move("--gear_uuid", G, "-i", "n2")
        self.assertEqual(r.rc, 0, r)
        self.assertIn("URL: http://shop-acme.example.com\n", r.out)
        self.assertTrue(self.last_move()["uid_kept"])


if __name__ == "__main__":
    unittest.main()
