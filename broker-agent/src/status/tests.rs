//! The status built group by group equals a full rebuild, after any changes.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::{Status, StatusBuilder};
use crate::core::testkit::*;
use crate::ops::{Cordon, Pause};

/// One change to the broker agent's state.
#[derive(Debug, Clone)]
enum Change {
    /// Node `n` (of 8) reports `active` gears; its group depends on `n`.
    Report {
        n: usize,
        active: u32,
        on: bool,
    },
    /// Time passes (reports are every 10 s, a node is missing after 30 s).
    Wait(i64),
    Cordon {
        n: usize,
        on: bool,
    },
    Mark {
        n: usize,
        on: bool,
    },
    /// Pause group `n % 3` (or the fleet) for `secs` (0: until resumed), or resume it.
    Pause {
        n: usize,
        fleet: bool,
        secs: i64,
        on: bool,
    },
    Evaluate,
    Tick,
    /// The node leaves the fleet (missing for too long, or removed).
    Forget {
        n: usize,
    },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (0..8usize, 0..100u32, any::<bool>())
            .prop_map(|(n, active, on)| Change::Report { n, active, on: on || n % 2 == 0 }),
        3 => (0..45i64).prop_map(Change::Wait),
        1 => (0..8usize, any::<bool>()).prop_map(|(n, on)| Change::Cordon { n, on }),
        1 => (0..8usize, any::<bool>()).prop_map(|(n, on)| Change::Mark { n, on }),
        1 => (0..8usize, any::<bool>(), 0..60i64, any::<bool>())
            .prop_map(|(n, fleet, secs, on)| Change::Pause { n, fleet, secs, on }),
        1 => Just(Change::Evaluate),
        1 => Just(Change::Tick),
        1 => (0..8usize).prop_map(|n| Change::Forget { n }),
    ]
}

/// Nodes 0..8 in three groups over two districts: (d1, small), (d1, large), (d2, small).
fn where_of(n: usize) -> (&'static str, &'static str) {
    [("d1", "small"), ("d1", "large"), ("d2", "small")][n % 3]
}

fn apply(h: &mut H, c: &Change) {
    let name = |n: usize| format!("n{n}");
    let by = "op".to_string();
    match *c {
        Change::Report { n, active, on } => {
            let (d, p) = where_of(n);
            let mut r = rep(&name(n), d, p, 100, active, active / 4);
            r.active = on;
            h.report(r);
        }
        Change::Wait(s) => h.advance(s),
        Change::Cordon { n, on } => {
            let c = on.then(|| Cordon {
                by,
                reason: "test".into(),
                since: h.now,
                op: None,
            });
            let _ = h.core.cordon(&name(n), c);
        }
        Change::Mark { n, on } => h.core.set_do_not_disrupt(&name(n), on),
        Change::Pause { n, fleet, secs, on } => {
            let (d, p) = where_of(n);
            let key = g(d, p);
            let group = (!fleet).then_some(&key);
            if on {
                let until = (secs > 0).then(|| h.now + Duration::seconds(secs));
                let p = Pause {
                    by,
                    reason: "test".into(),
                    since: h.now,
                    until,
                };
                let _ = h.core.pause(group, p);
            } else {
                let _ = h.core.resume_scaling(group);
            }
        }
        Change::Evaluate => {
            h.eval();
        }
        Change::Tick => {
            h.tick();
        }
        Change::Forget { n } => {
            h.core.fleet.forget(&name(n));
        }
    }
}

fn full(h: &H) -> Status {
    Status::of(&h.core, "b", h.now, &BTreeMap::new())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_status_built_group_by_group_equals_a_full_rebuild(
        changes in proptest::collection::vec(change(), 1..60)
    ) {
        let mut h = H::new(cfg_with(|c| c.group_defaults.max_nodes = 20));
        let mut b = StatusBuilder::default();
        for c in &changes {
            apply(&mut h, c);
            let got = b.build(&h.core, "b", h.now, &BTreeMap::new());
            let want = full(&h);
            prop_assert_eq!(&got, &want, "after {:?}", c);
        }
    }
}

#[test]
fn only_the_groups_whose_inputs_changed_are_rebuilt() {
    let mut h = H::new(cfg_with(|_| {}));
    for n in 0..6 {
        let (d, p) = where_of(n);
        h.report(rep(&format!("n{n}"), d, p, 100, 10, 0));
    }
    let mut b = StatusBuilder::default();
    b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 3);
    // Nothing changed: nothing is rebuilt, and the document is the same.
    h.advance(1);
    let again = b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 0);
    assert_eq!(again, full(&h));
    // A report in (d2, small): its group alone (its district has no other group).
    h.report(rep("n2", "d2", "small", 100, 30, 0));
    let s = b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 1);
    assert_eq!(s, full(&h));
    let n2 = s.nodes.iter().find(|n| n.node == "n2").unwrap();
    assert_eq!(n2.gears_active, 30);
    // A report in d1 changes its district's free UIDs: both d1 groups.
    h.report(rep("n0", "d1", "small", 100, 40, 0));
    b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 2);
    // Nodes going stale rebuild their group at that instant, without a report.
    h.advance(40);
    let s = b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 3);
    assert!(s.nodes.iter().all(|n| !n.fresh));
    assert_eq!(s, full(&h));
    // An operator's mark reads in every group: all are rebuilt.
    h.core.set_do_not_disrupt("n1", true);
    b.build(&h.core, "b", h.now, &BTreeMap::new());
    assert_eq!(b.rebuilt(), 3);
}

#[test]
fn the_node_list_is_one_json_array_in_group_order() {
    let mut h = H::new(cfg_with(|_| {}));
    for n in [3, 2, 1, 0] {
        let (d, p) = where_of(n);
        h.report(rep(&format!("n{n}"), d, p, 100, 10, 0));
    }
    let s = full(&h);
    let v = serde_json::to_value(&s).unwrap();
    let names: Vec<&str> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    // (d1, large), (d1, small), (d2, small).
    assert_eq!(names, ["n1", "n0", "n3", "n2"]);
    let back: Status = serde_json::from_value(v).unwrap();
    assert_eq!(back, s);
    assert_eq!(back.nodes.len(), 4);
}
