//! What the policy and the machines may read of the world at one instant:
//! the fleet, the operations, the operator's marks. Borrowed, never changed.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GroupStats, NodeProperties};

use crate::fleet::Fleet;
use crate::ops::{Op, Ops};

/// A read-only view of the broker agent's knowledge.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The fleet model.
    pub fleet: &'a Fleet,
    /// The operations (while a scale-down steps, every other one).
    pub ops: &'a Ops,
    /// Nodes an operator marked do-not-disrupt.
    pub marks: &'a BTreeSet<String>,
    /// When this agent started (the start-up grace runs from here).
    pub started: DateTime<Utc>,
    /// Report intervals without a report after which a node is missing.
    pub stale_intervals: u32,
}

impl<'a> Facts<'a> {
    /// The active scale-down of a node, if any.
    pub fn saga_of(&self, node: &str) -> Option<&'a Op> {
        self.ops.saga_of(node)
    }

    /// Whether an operator or the node itself opted `node` out of scale-down.
    pub fn do_not_disrupt(&self, node: &str) -> bool {
        self.marks.contains(node)
            || self
                .fleet
                .get(node)
                .is_some_and(|e| e.report.do_not_disrupt)
    }

    /// `oo-stats` figures of a group, excluding nodes being removed.
    pub fn group_stats(&self, g: &GroupKey, now: DateTime<Utc>) -> GroupStats {
        self.group_stats_without(g, now, &self.ops.removing_nodes())
    }

    /// `oo-stats` figures of a group, excluding `removing`.
    pub fn group_stats_without(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        removing: &BTreeSet<String>,
    ) -> GroupStats {
        self.fleet
            .group_stats_without(g, now, self.stale_intervals, removing)
    }

    /// `oo-stats` figures of a profile, excluding nodes being removed.
    pub fn profile_stats(&self, profile: &str, now: DateTime<Utc>) -> GroupStats {
        self.profile_stats_without(profile, now, &self.ops.removing_nodes())
    }

    /// `oo-stats` figures of a profile, excluding `removing`.
    pub fn profile_stats_without(
        &self,
        profile: &str,
        now: DateTime<Utc>,
        removing: &BTreeSet<String>,
    ) -> GroupStats {
        self.fleet
            .profile_stats_without(profile, now, self.stale_intervals, removing)
    }

    /// Active, fresh nodes of the group other than the victim and other
    /// draining nodes, as placement candidates.
    pub fn candidates(
        &self,
        g: &GroupKey,
        victim: &str,
        now: DateTime<Utc>,
    ) -> Vec<NodeProperties> {
        let draining = self.ops.draining_nodes();
        let free = self.fleet.district_free_uids(&g.district);
        self.fleet
            .in_group(g)
            .filter(|e| {
                e.report.node != victim
                    && e.report.active
                    && !draining.contains(&e.report.node)
                    && e.is_fresh(now, self.stale_intervals)
            })
            .map(|e| {
                let r = &e.report;
                NodeProperties {
                    name: r.node.clone(),
                    node_consumed_capacity: if r.max_active_gears == 0 {
                        100.0
                    } else {
                        100.0 * f64::from(e.active_gears()) / f64::from(r.max_active_gears)
                    },
                    district_id: r.district_uuid().map(str::to_string),
                    district_available_capacity: free,
                    region_id: r.region.clone(),
                    zone_id: r.zone.clone(),
                    profile: Some(r.profile.clone()),
                    active: true,
                    mem_free_mb: Some(r.mem_free_mb),
                    gears_active: Some(e.active_gears()),
                    max_active_gears: Some(r.max_active_gears),
                }
            })
            .collect()
    }

    /// Active free slots of a group without `node` and without draining nodes.
    pub fn room_without(&self, g: &GroupKey, node: &str, now: DateTime<Utc>) -> u32 {
        self.candidates(g, node, now)
            .iter()
            .map(|c| {
                c.max_active_gears
                    .unwrap_or(0)
                    .saturating_sub(c.gears_active.unwrap_or(0))
            })
            .sum()
    }
}
