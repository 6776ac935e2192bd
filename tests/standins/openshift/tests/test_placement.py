"""The PaaS broker's placement stand-in: its filter, its default choice, and the
property the end-to-end tests rely on (no new gear on a draining node)."""

import collections
import json
import random
import unittest

from support import StandinCase

from oo_standin import placement


def infos(*caps, district="d", avail=5000):
    return [{"name": f"n{i}", "node_consumed_capacity": float(c), "district_id": district,
             "district_available_capacity": avail, "region_id": None, "zone_id": None}
            for i, c in enumerate(caps)]


class DefaultChoice(unittest.TestCase):
    def test_districted_over_undistricted_and_zoned_over_zoneless(self):
        xs = infos(0, 0)
        xs[0]["district_id"] = None
        self.assertEqual(placement.select_best_fit(xs, rng=random.Random(1))["name"], "n1")
        xs = infos(0, 50)
        xs[1]["zone_id"] = "z"
        self.assertEqual(placement.select_best_fit(xs, rng=random.Random(1))["name"], "n1")

    def test_weighted_toward_the_least_consumed(self):
        rng = random.Random(42)
        count = collections.Counter(placement.select_best_fit(infos(90, 10, 50, 70), rng=rng)["name"]
                                    for _ in range(4000))
        # Weights 2,3,4,5 of 14 from the most to the least consumed.
        self.assertGreater(count["n1"], count["n2"])
        self.assertGreater(count["n2"], count["n3"])
        self.assertGreater(count["n3"], count["n0"])
        self.assertAlmostEqual(count["n1"] / 4000, 5 / 14, delta=0.03)

    def test_many_nodes_drop_the_busy_ones(self):
        rng = random.Random(3)
        xs = infos(95, 96, 97, 98, 10, 12, 11, 9)
        chosen = {placement.select_best_fit(xs, rng=rng)["name"] for _ in range(500)}
        self.assertEqual(chosen, {"n4", "n5", "n6", "n7"})

    def test_least_pick_and_empty(self):
        self.assertEqual(placement.select_best_fit(infos(30, 20, 20), pick="least")["name"], "n1")
        with self.assertRaises(placement.NodeUnavailable):
            placement.select_best_fit([])


class Filter(StandinCase):
    def setUp(self):
        super().setUp()
        for h in ("a", "b", "c"):
            self.add_node(h, "small", 4)
        self.d = self.district("d1", nodes=("a", "b", "c"))

    def candidates(self, **kw):
        from oo_standin import state
        st = state.load(self.state_path)
        why = {}
        try:
            names = [i["name"] for i in placement.find_all_available(st, why=why, **kw)]
        except placement.NodeUnavailable as e:
            names = e.msg
        return names, why

    def test_inactive_full_profile_unreachable(self):
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "a")
        for i in range(4):
            self.add_gear("b", f"gb{i}")
        self.add_node("m", "medium")
        self.district("dm", "medium", nodes=("m",))
        self.add_node("gone")
        self.ok("oo-standin", "node-set", "gone", "--unreachable")
        names, why = self.candidates(profile="small")
        self.assertEqual(names, ["c"])
        self.assertEqual(why, {"a": "inactive", "b": "full", "m": "profile", "gone": "unreachable"})

    def test_idle_and_stopped_gears_do_not_fill_a_node(self):
        for i, s in enumerate(("idle", "stopped", "started", "started")):
            self.add_gear("b", f"gb{i}", "--state", s)
        names, _ = self.candidates(profile="small")
        self.assertIn("b", names)

    def test_undistricted_nodes_unless_a_district_is_required(self):
        self.add_node("free")
        names, _ = self.candidates(profile="small")
        self.assertIn("free", names)
        st = self.state()
        st["config"]["require_district_for_app_create"] = True
        self.write_state(st)
        names, why = self.candidates(profile="small")
        self.assertNotIn("free", names)
        self.assertEqual(why["free"], "inactive")  # the district_active fact filter goes first

    def test_district_out_of_uids(self):
        st = self.state()
        for d in st["districts"].values():
            d["available_capacity"] = 0
        self.write_state(st)
        names, why = self.candidates(profile="small")
        self.assertEqual(names, [])
        self.assertEqual(set(why.values()), {"district_full"})
        names, _ = self.candidates(profile="small", district_uuid=self.d, gear_exists_in_district=True)
        self.assertEqual(names, ["a", "b", "c"])

    def test_specific_district_and_nothing_left(self):
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "a,b,c")
        names, _ = self.candidates(profile="small", district_uuid=self.d, gear_exists_in_district=True)
        self.assertEqual(names, "No nodes available for the specified gear size")
        with self.assertRaises(placement.Incompatible):
            self.candidates(district_uuid=None, gear_exists_in_district=True)


class NoGearOnADrainingNode(StandinCase):
    def test_placements_avoid_the_deactivated_node(self):
        for h in ("a", "b", "c"):
            self.add_node(h, "small", 1000)
        self.district("d1", nodes=("a", "b", "c"))
        # The draining node is the emptiest: the broker's own choice would prefer it.
        for i in range(30):
            self.add_gear("b" if i % 2 else "c", f"old{i}")
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "a")
        for i in range(40):
            out = self.ok("oo-standin", "place", "--app", f"app{i}", "--uuid", f"new{i}", "--json")
            self.assertNotEqual(json.loads(out)["node"], "a")
        st = self.state()
        self.assertEqual({p["node"] for p in st["placements"]} - {"b", "c"}, set())
        self.assertTrue(all(p["left_out"].get("a") == "inactive" for p in st["placements"]))
        # Re-activated, it is a candidate again.
        self.ok("oo-admin-ctl-district", "-c", "activate-node", "-i", "a")
        self.assertEqual(self.ok("oo-standin", "place", "--pick", "least").strip(), "a")

    def test_no_node_left(self):
        self.add_node("a")
        self.district("d1", nodes=("a",))
        self.ok("oo-admin-ctl-district", "-c", "deactivate-node", "-i", "a")
        r = self.run_tool("oo-standin", "place")
        self.assertEqual((r.rc, r.out), (1, "No nodes available\n"))


if __name__ == "__main__":
    unittest.main()
