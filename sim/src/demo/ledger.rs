//! The demo's own record of every gear it created and deleted, and the
//! independent inventory check at the end: every gear created and not
//! deleted must exist exactly once across all nodes of the simulated world.
//! It trusts no counter of the agents: it compares its own record with the
//! world itself.

use std::collections::{BTreeMap, BTreeSet};

use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::msg::{GearInfo, GearState};
use rand::Rng;
use rand::rngs::StdRng;
use serde::Serialize;

/// Gears created and deleted by the demo.
#[derive(Debug, Default)]
pub struct Ledger {
    next: u32,
    /// Live gears and whether they are active (started).
    live: BTreeMap<String, bool>,
    /// Gears present when the workload started.
    pub before: u64,
    /// Gears created by the workload.
    pub created: u64,
    /// Gears deleted by the workload.
    pub deleted: u64,
    /// Gears that had disappeared when the workload came to delete them.
    pub vanished: Vec<String>,
}

impl Ledger {
    /// An empty ledger.
    pub fn new() -> Ledger {
        Ledger::default()
    }

    fn next_id(&mut self) -> String {
        self.next += 1;
        format!("gear-{:06}", self.next)
    }

    /// Puts a new gear on `node`; false if the world refused it (unknown node).
    pub fn create(&mut self, world: &SimWorld, node: &str, state: GearState) -> bool {
        let id = self.next_id();
        let ok = world.add_gear(
            node,
            GearInfo {
                id: id.clone(),
                app: Some(format!("app-{}", &id[5..])),
                state,
                uid: None,
                bytes: None,
                do_not_disrupt: false,
            },
        );
        if ok {
            self.live.insert(id, state == GearState::Started);
            self.created += 1;
        }
        ok
    }

    /// Marks what exists now as the starting point.
    pub fn mark_start(&mut self) {
        self.before = self.live.len() as u64;
        self.created = 0;
    }

    /// Deletes one active gear chosen by `rng` among the oldest half of the
    /// active gears (old applications are retired first); `None` when none
    /// is left.
    pub fn delete_old(&mut self, world: &SimWorld, rng: &mut StdRng) -> Option<String> {
        // Ids are zero-padded serial numbers: their order is their age.
        let active: Vec<&String> = self
            .live
            .iter()
            .filter(|(_, a)| **a)
            .map(|(k, _)| k)
            .collect();
        if active.is_empty() {
            return None;
        }
        let half = active.len().div_ceil(2);
        let id = active[rng.random_range(0..half)].clone();
        self.live.remove(&id);
        if world.remove_gear(&id) {
            self.deleted += 1;
        } else {
            self.vanished.push(id.clone());
        }
        Some(id)
    }

    /// Gears that should exist.
    pub fn expected(&self) -> usize {
        self.live.len()
    }

    /// Active gears that should exist.
    pub fn expected_active(&self) -> usize {
        self.live.values().filter(|a| **a).count()
    }

    /// Compares the record with the world.
    pub fn check(&self, world: &SimWorld) -> Inventory {
        let mut at: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut per_node = BTreeMap::new();
        for n in world.nodes() {
            let gears = world.gears_of(&n);
            let active = gears
                .iter()
                .filter(|g| !matches!(g.state, GearState::Idle | GearState::Stopped))
                .count();
            per_node.insert(
                n.clone(),
                NodeGears {
                    gears: gears.len(),
                    active,
                },
            );
            for g in gears {
                at.entry(g.id).or_default().push(n.clone());
            }
        }
        let expected: BTreeSet<&String> = self.live.keys().collect();
        let mut missing: Vec<String> = expected
            .iter()
            .filter(|id| !at.contains_key(id.as_str()))
            .map(|s| s.to_string())
            .collect();
        missing.extend(self.vanished.iter().cloned());
        let duplicated = at
            .iter()
            .filter(|(_, v)| v.len() > 1)
            .map(|(k, v)| format!("{k} on {}", v.join(", ")))
            .collect();
        let unexpected = at
            .keys()
            .filter(|k| !expected.contains(k))
            .cloned()
            .collect();
        Inventory {
            expected: self.live.len(),
            found: at.len(),
            missing,
            duplicated,
            unexpected,
            per_node,
        }
    }
}

/// Gears of one node at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct NodeGears {
    /// All gears.
    pub gears: usize,
    /// Active gears.
    pub active: usize,
}

/// The result of the inventory check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Inventory {
    /// Gears that should exist (created and not deleted).
    pub expected: usize,
    /// Distinct gears found in the world.
    pub found: usize,
    /// Expected gears found nowhere (lost), and gears that disappeared
    /// before the workload deleted them.
    pub missing: Vec<String>,
    /// Gears found on more than one node.
    pub duplicated: Vec<String>,
    /// Gears found that the demo never created (or had deleted).
    pub unexpected: Vec<String>,
    /// Gears per node.
    pub per_node: BTreeMap<String, NodeGears>,
}

impl Inventory {
    /// Every expected gear exactly once, nothing else.
    pub fn is_exact(&self) -> bool {
        self.missing.is_empty() && self.duplicated.is_empty() && self.unexpected.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_node::runtime::NodeFacts;
    use rand::SeedableRng;

    fn world() -> std::sync::Arc<SimWorld> {
        let w = SimWorld::new();
        let f = NodeFacts {
            profile: "small".into(),
            max_active_gears: 10,
            district: None,
        };
        w.add_node("a", f.clone());
        w.add_node("b", f);
        w
    }

    #[test]
    fn an_intact_world_passes() {
        let w = world();
        let mut l = Ledger::new();
        assert!(l.create(&w, "a", GearState::Started));
        assert!(l.create(&w, "b", GearState::Idle));
        assert!(!l.create(&w, "nowhere", GearState::Started));
        l.mark_start();
        assert!(l.create(&w, "a", GearState::Started));
        let mut rng = StdRng::seed_from_u64(1);
        assert!(l.delete_old(&w, &mut rng).is_some());
        let inv = l.check(&w);
        assert!(inv.is_exact(), "{inv:?}");
        assert_eq!(inv.expected, 2);
        assert_eq!((l.before, l.created, l.deleted), (2, 1, 1));
    }

    #[test]
    fn lost_duplicated_and_foreign_gears_are_found() {
        let w = world();
        let mut l = Ledger::new();
        for _ in 0..3 {
            l.create(&w, "a", GearState::Started);
        }
        // One gear lost with its node, one foreign gear appears.
        w.remove_gear("gear-000001");
        w.add_gear(
            "b",
            GearInfo {
                id: "stranger".into(),
                app: None,
                state: GearState::Started,
                uid: None,
                bytes: None,
                do_not_disrupt: false,
            },
        );
        let inv = l.check(&w);
        assert_eq!(inv.missing, vec!["gear-000001".to_string()]);
        assert_eq!(inv.unexpected, vec!["stranger".to_string()]);
        assert!(!inv.is_exact());
        // A gear that vanished before its deletion counts as lost too.
        let mut rng = StdRng::seed_from_u64(3);
        let mut l2 = Ledger::new();
        l2.create(&w, "a", GearState::Started);
        w.remove_gear("gear-000001");
        l2.delete_old(&w, &mut rng);
        assert_eq!(l2.check(&w).missing, vec!["gear-000001".to_string()]);
    }
}
