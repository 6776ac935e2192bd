//! What the policy and the machines may read of the world at one instant:
//! the fleet, the operations, the operator's marks and cordons. Borrowed,
//! never changed.
//!
//! Room is counted as the evacuation planner counts it: every gear takes a
//! slot on its target (an idle gear wakes up on its next request), and the
//! gears other drains of the group will still move take their slots too
//! ([`Facts::pending`]), so that two drains never count the same room.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GroupStats, NodeProperties};

use crate::core::operator::controls::Cordons;
use crate::fleet::{Fleet, NodeEntry};
use crate::ops::{DownStep, Op, Ops};

/// A read-only view of the broker agent's knowledge.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// The fleet model.
    pub fleet: &'a Fleet,
    /// The operations (while a scale-down steps, every other one).
    pub ops: &'a Ops,
    /// Nodes an operator marked do-not-disrupt.
    pub marks: &'a BTreeSet<String>,
    /// Nodes an operator cordoned (out of placement and of scale-down choice).
    pub cordons: &'a Cordons,
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

    /// Whether `node` is a scale-up's new node not joined yet (being added
    /// to its district): not a scale-down candidate of the group it reports in.
    pub fn joining(&self, node: &str) -> bool {
        self.ops
            .in_flight()
            .any(|o| o.up().is_some_and(|u| u.node.as_deref() == Some(node)))
    }

    /// Whether an operator or the node itself opted `node` out of scale-down.
    pub fn do_not_disrupt(&self, node: &str) -> bool {
        self.marks.contains(node)
            || self
                .fleet
                .get(node)
                .is_some_and(|e| e.report.do_not_disrupt)
    }

    /// The nodes being removed (or removed) that the fleet still knows:
    /// what the figures exclude (remembered; see [`Ops::removing_known`]).
    pub fn removing(&self) -> std::sync::Arc<BTreeSet<String>> {
        self.ops.removing_known(self.fleet)
    }

    /// `oo-stats` figures of a group, excluding nodes being removed.
    pub fn group_stats(&self, g: &GroupKey, now: DateTime<Utc>) -> GroupStats {
        self.group_stats_without(g, now, &self.removing())
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
        self.profile_stats_without(profile, now, &self.removing())
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

    /// Whether an operator cordoned `node`.
    pub fn cordoned(&self, node: &str) -> bool {
        self.cordons.contains(node)
    }

    /// What the drains of group `g` other than `victim`'s will still move
    /// onto the group's candidates.
    pub fn pending(&self, g: &GroupKey, victim: &str) -> Pending {
        let mut p = Pending::default();
        for op in self.ops.in_flight().filter(|o| &o.group == g) {
            let Some(d) = op.down().filter(|d| d.node != victim) else {
                continue;
            };
            match d.step {
                // Planned: each target takes its moves, at most the round's
                // remaining gears (progress does not say which moved).
                DownStep::Evacuating => {
                    let mut per: BTreeMap<&str, u32> = BTreeMap::new();
                    for m in &d.moves {
                        *per.entry(m.target.as_str()).or_default() += 1;
                    }
                    for (t, n) in per {
                        *p.per_target.entry(t.to_string()).or_default() +=
                            n.min(d.progress.remaining);
                    }
                }
                // Not planned yet: the node's gears go somewhere in the group.
                DownStep::DistrictDeactivating
                | DownStep::Deactivating
                | DownStep::Inventorying => {
                    p.unplanned += self.fleet.get(&d.node).map_or(0, NodeEntry::total_gears);
                }
                _ => {}
            }
        }
        p
    }

    /// Active, fresh, uncordoned nodes of the group other than the victim
    /// and other draining nodes, as placement candidates; their gear counts
    /// include the gears other drains already planned to move there.
    pub fn candidates(
        &self,
        g: &GroupKey,
        victim: &str,
        now: DateTime<Utc>,
    ) -> Vec<NodeProperties> {
        self.candidates_with(g, victim, now, &self.pending(g, victim))
    }

    fn candidates_with(
        &self,
        g: &GroupKey,
        victim: &str,
        now: DateTime<Utc>,
        pending: &Pending,
    ) -> Vec<NodeProperties> {
        let draining = self.ops.draining_nodes();
        let free = self.fleet.district_free_uids(&g.district);
        self.fleet
            .in_group(g)
            .filter(|e| {
                e.report.node != victim
                    && e.is_active()
                    && !e.cordoned
                    && !self.cordoned(&e.report.node)
                    && !draining.contains(&e.report.node)
                    && e.is_fresh(now, self.stale_intervals)
            })
            .map(|e| {
                let r = &e.report;
                let incoming = pending.per_target.get(&r.node).copied().unwrap_or(0);
                let active = e.active_gears().saturating_add(incoming);
                NodeProperties {
                    name: r.node.clone(),
                    node_consumed_capacity: if r.max_active_gears == 0 {
                        100.0
                    } else {
                        100.0 * f64::from(active) / f64::from(r.max_active_gears)
                    },
                    district_id: r.district_uuid().map(str::to_string),
                    district_available_capacity: free,
                    region_id: r.region.clone(),
                    zone_id: r.zone.clone(),
                    profile: Some(r.profile.clone()),
                    active: true,
                    mem_free_mb: Some(r.mem_free_mb),
                    gears_active: Some(active),
                    max_active_gears: Some(r.max_active_gears),
                }
            })
            .collect()
    }

    /// Free slots left for `node`'s gears on the rest of its group: the
    /// candidates' room, less what other drains will still move there.
    pub fn room_without(&self, g: &GroupKey, node: &str, now: DateTime<Utc>) -> u32 {
        let pending = self.pending(g, node);
        let room: u32 = self
            .candidates_with(g, node, now, &pending)
            .iter()
            .map(|c| {
                c.max_active_gears
                    .unwrap_or(0)
                    .saturating_sub(c.gears_active.unwrap_or(0))
            })
            .sum();
        room.saturating_sub(pending.unplanned)
    }

    /// The group once `victim` is empty and gone: its active gears (and
    /// those other drains are still sending it) took their slots on the
    /// targets.
    pub fn after_drain(&self, g: &GroupKey, victim: &NodeEntry, now: DateTime<Utc>) -> AfterDrain {
        let node = victim.report.node.as_str();
        let room = self.room_without(g, node, now);
        let incoming = self
            .pending(g, "")
            .per_target
            .get(node)
            .copied()
            .unwrap_or(0);
        AfterDrain {
            room,
            need: victim.total_gears() + incoming,
            available: room.saturating_sub(victim.active_gears() + incoming),
        }
    }
}

/// What other drains of a group will still move onto its candidates.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// Gears planned onto each target and not known to have arrived.
    pub per_target: BTreeMap<String, u32>,
    /// Gears of drains not planned yet (targets unknown).
    pub unplanned: u32,
}

/// A group after one more drain, as the absorb and no-flap rules see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AfterDrain {
    /// Free slots the rest of the group has for the victim's gears.
    pub room: u32,
    /// The victim's gears (each takes a slot).
    pub need: u32,
    /// The group's available active gears once the victim's active gears
    /// moved and it is gone (`oo-stats`: idle gears stay idle).
    pub available: u32,
}
