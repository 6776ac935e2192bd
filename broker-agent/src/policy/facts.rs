//! What one evaluation knows about a group.

use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GroupStats, Reason};

use super::{Eval, ago, reason};
use crate::config::GroupSettings;
use crate::fleet::{NodeEntry, usage};

/// Whether `e` belongs to group `g` (without building its key).
fn in_group(e: &NodeEntry, g: &GroupKey) -> bool {
    e.report.profile == g.profile
        && e.report
            .district_uuid()
            .unwrap_or(gearshift_proto::routing::NO_DISTRICT)
            == g.district
}
use crate::ops::{DownStep, OpBody, OpId};

/// A group's figures and operations at the evaluation's instant.
#[derive(Debug, Clone)]
pub(super) struct GroupFacts {
    pub key: GroupKey,
    pub settings: GroupSettings,
    pub stats: GroupStats,
    /// Known nodes (reporting or missing), not being removed.
    pub nodes: u32,
    /// Scale-ups not finished.
    pub booting: u32,
    /// Scale-downs not finished.
    pub draining: u32,
    /// Drains that can still be cancelled.
    pub cancellable: Vec<OpId>,
    /// `max_active_gears` of a node of this group (largest seen), if any is known.
    pub per_node_max: Option<u32>,
    /// Free slots of drained nodes being re-activated (an abort or a drain
    /// cancel): capacity on its way back, like a booting node's.
    pub returning: u32,
    /// Available active gears plus what booting and re-activated nodes will bring.
    pub proj_available: u32,
}

impl GroupFacts {
    /// Usage with the booting nodes counted as capacity.
    pub fn proj_usage(&self) -> f64 {
        usage(self.stats.gears_active, self.proj_available)
    }
}

impl Eval<'_> {
    pub(super) fn group_facts(&self, key: &GroupKey) -> GroupFacts {
        let fleet = self.facts.fleet;
        let stats = self
            .facts
            .group_stats_without(key, self.now, &self.removing);
        // Nodes of the group (its index) less those being removed (few).
        let removing_here = self
            .removing
            .iter()
            .filter(|n| fleet.get(n).is_some_and(|e| in_group(e, key)))
            .count();
        let nodes = (fleet.group_len(key) - removing_here) as u32;
        let mut booting = 0;
        let mut draining = 0;
        let mut cancellable = vec![];
        let mut returning = 0u32;
        for op in self.ops_by_group.get(key).into_iter().flatten() {
            match &op.body {
                OpBody::ScaleUp(_) => booting += 1,
                OpBody::ScaleDown(d) => {
                    draining += 1;
                    if d.step.cancellable() {
                        cancellable.push(op.id.clone());
                    }
                    if matches!(d.step, DownStep::Reactivating { .. })
                        && let Some(e) = fleet.get(&d.node).filter(|e| !e.report.active)
                    {
                        returning += e.report.max_active_gears.saturating_sub(e.active_gears());
                    }
                }
            }
        }
        // Remembered with the group's sums; an empty group takes its
        // profile's (a scan, rare: configured groups without nodes).
        let per_node_max = fleet
            .group_max_active(key, self.now, self.facts.stale_intervals)
            .or_else(|| {
                fleet
                    .nodes()
                    .filter(|e| e.report.profile == key.profile)
                    .map(|e| e.report.max_active_gears)
                    .max()
            });
        let proj_available = stats
            .available_active_gears
            .saturating_add(booting * per_node_max.unwrap_or(0))
            .saturating_add(returning);
        GroupFacts {
            key: key.clone(),
            settings: self.cfg.group(key),
            stats,
            nodes,
            booting,
            draining,
            cancellable,
            per_node_max,
            returning,
            proj_available,
        }
    }

    pub(super) fn missing_rule(&self, f: &GroupFacts) -> Reason {
        reason(
            "missing_nodes",
            f.stats.nodes_missing == 0,
            format!("{} node(s) missing", f.stats.nodes_missing),
        )
    }

    /// Decisions only on reports newer than the group's last decision.
    pub(super) fn fresh_rule(&self, f: &GroupFacts) -> Reason {
        let now = self.now;
        let Some(last) = self.memory.group(&f.key).memory.last_decision else {
            return reason("fresh_reports", true, "no earlier decision");
        };
        let intervals = self.facts.stale_intervals;
        let old: Vec<&NodeEntry> = self
            .facts
            .fleet
            .in_group(&f.key)
            .filter(|e| e.is_fresh(now, intervals) && e.received <= last)
            .collect();
        reason(
            "fresh_reports",
            old.is_empty(),
            if old.is_empty() {
                format!(
                    "every node reported since the last decision {} ago",
                    ago(now - last)
                )
            } else {
                format!(
                    "waiting for {} node(s) to report after the last decision {} ago",
                    old.len(),
                    ago(now - last)
                )
            },
        )
    }
}
