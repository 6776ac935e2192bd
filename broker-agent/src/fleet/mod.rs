//! The fleet model: the last accepted report of every node, and the
//! `oo-stats` figures per node, node group (district, profile), district and
//! profile. Pure: every function takes `now`.
//!
//! At fleet scale the broker agent asks for a group's and a profile's
//! figures on every report, so the fleet keeps its nodes indexed by group
//! and by district, and remembers each group's sums until one of its nodes
//! reports, leaves, or goes stale (the earliest instant a fresh node goes
//! stale is known), and each district's UID use until one of its nodes
//! changes. A profile's figures are a running total over its groups: a
//! report refreshes only its own group's share, so asking for a profile
//! does not add up every group of the profile again. The figures are the
//! same as a full scan's.
//!
//! Layout: this file holds the nodes and their indexes, and the figures by
//! full scan; `sums.rs` the remembered sums and running totals.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GroupStats, NodeReport};
use gearshift_proto::routing::NO_DISTRICT;
use serde::{Deserialize, Serialize};

pub use self::sums::add_stats;
use self::sums::{Acc, GroupSums, ProfileSums};

mod sums;

/// One node as the broker agent knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The last accepted report.
    pub report: NodeReport,
    /// When it was accepted (the broker's clock).
    pub received: DateTime<Utc>,
    /// When the node was first seen.
    pub first_seen: DateTime<Utc>,
    /// An operator cordoned the node: no gear goes there, so its free
    /// slots are not capacity (see [`Fleet::set_cordoned`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
}

impl NodeEntry {
    /// The node's group.
    pub fn group(&self) -> GroupKey {
        group_of(&self.report)
    }

    /// Seconds without a report after which the node counts as missing.
    pub fn stale_after(&self, intervals: u32) -> Duration {
        Duration::seconds(i64::from(self.report.interval_secs.max(1)) * i64::from(intervals.max(1)))
    }

    /// Whether the node reported recently enough.
    pub fn is_fresh(&self, now: DateTime<Utc>, intervals: u32) -> bool {
        now - self.received <= self.stale_after(intervals)
    }

    /// Active gears.
    pub fn active_gears(&self) -> u32 {
        self.report.gears.active()
    }

    /// All gears.
    pub fn total_gears(&self) -> u32 {
        self.report.gears.total()
    }

    /// OpenShift's own flag says the node takes no new gears
    /// (`district_active = false`, set by `oo-admin-ctl-district -c
    /// deactivate-node`, by gearshift or by an operator).
    pub fn district_inactive(&self) -> bool {
        self.report.district.as_ref().is_some_and(|d| !d.active)
    }

    /// The node takes new gears: active for gearshift and, when districted,
    /// for OpenShift too. A node either deactivated is not capacity.
    pub fn is_active(&self) -> bool {
        self.report.active && !self.district_inactive()
    }

    /// Free active slots, when the node is active (for gearshift and for
    /// OpenShift) and not cordoned: max(0, max_active - active).
    pub fn available_active(&self) -> u32 {
        if self.is_active() && !self.cordoned {
            self.report
                .max_active_gears
                .saturating_sub(self.active_gears())
        } else {
            0
        }
    }
}

/// The group of a report: (district or `_none`, profile).
pub fn group_of(r: &NodeReport) -> GroupKey {
    GroupKey {
        district: r
            .district_uuid()
            .map_or_else(|| NO_DISTRICT.to_string(), str::to_string),
        profile: r.profile.clone(),
    }
}

/// Why a report was not taken into the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportRejected {
    /// Its `seq` is not greater than the last accepted one.
    StaleSeq {
        /// Last accepted.
        last: u64,
        /// Received.
        got: u64,
    },
    /// The node was removed by a scale-down saga and this agent started
    /// before the removal: a late report of the removed node.
    Removed,
}

impl ReportRejected {
    /// Stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            ReportRejected::StaleSeq { .. } => "stale_seq",
            ReportRejected::Removed => "removed_node",
        }
    }
}

/// What changed with an accepted report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// First report of this node.
    pub new_node: bool,
    /// The node moved to another group (district or profile changed).
    pub moved_from: Option<GroupKey>,
}

/// Every known node.
#[derive(Debug, Default)]
pub struct Fleet {
    nodes: BTreeMap<String, NodeEntry>,
    /// Node names by group.
    by_group: BTreeMap<GroupKey, BTreeSet<String>>,
    /// Node names by district UUID (districted nodes only).
    by_district: HashMap<String, BTreeSet<String>>,
    /// Remembered group sums.
    sums: Mutex<HashMap<GroupKey, GroupSums>>,
    /// Remembered (UID capacity, gears) per district.
    uids: Mutex<HashMap<String, (u32, u32)>>,
    /// Running totals per profile.
    profiles: Mutex<HashMap<String, ProfileSums>>,
    /// Cordoned nodes, known or not yet reporting.
    cordoned: BTreeSet<String>,
    /// When each group's figures last changed, on one counter for the whole
    /// fleet (see [`Fleet::group_stamp`]).
    stamps: Mutex<Stamps>,
    /// Moves on whenever a node joins, leaves or changes group.
    membership: u64,
}

/// The last change of each group, numbered from one counter: a stamp never
/// comes back, even for a group that left and came back.
#[derive(Debug, Default, Clone)]
struct Stamps {
    last: u64,
    of: HashMap<GroupKey, u64>,
}

impl Clone for Fleet {
    fn clone(&self) -> Self {
        Fleet {
            nodes: self.nodes.clone(),
            by_group: self.by_group.clone(),
            by_district: self.by_district.clone(),
            cordoned: self.cordoned.clone(),
            stamps: Mutex::new(lock(&self.stamps).clone()),
            membership: self.membership,
            sums: Mutex::default(),
            uids: Mutex::default(),
            profiles: Mutex::default(),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a report into the model; refuses one whose `seq` did not increase.
    pub fn accept(
        &mut self,
        report: NodeReport,
        now: DateTime<Utc>,
    ) -> Result<Accepted, ReportRejected> {
        match self.nodes.get(&report.node) {
            Some(e) => {
                if report.seq <= e.report.seq {
                    return Err(ReportRejected::StaleSeq {
                        last: e.report.seq,
                        got: report.seq,
                    });
                }
                let old_entry = e.clone();
                let e = NodeEntry {
                    report,
                    received: now,
                    first_seen: old_entry.first_seen,
                    cordoned: old_entry.cordoned,
                };
                // The same profile and district: the same group (compared
                // without building the keys, on every report).
                let same = old_entry.report.profile == e.report.profile
                    && old_entry.report.district_uuid() == e.report.district_uuid();
                let mut moved_from = None;
                if same {
                    // The common case, a periodic report: same group and
                    // district, so the remembered figures change by the
                    // difference between the two reports.
                    self.update_in_place(&old_entry, &e, now);
                } else {
                    let (old, new) = (old_entry.group(), e.group());
                    moved_from = (old != new).then_some(old);
                    self.unindex(&old_entry);
                    self.index(&e);
                }
                self.nodes.insert(e.report.node.clone(), e);
                Ok(Accepted {
                    new_node: false,
                    moved_from,
                })
            }
            None => {
                let e = NodeEntry {
                    cordoned: self.cordoned.contains(&report.node),
                    report,
                    received: now,
                    first_seen: now,
                };
                self.index(&e);
                self.nodes.insert(e.report.node.clone(), e);
                Ok(Accepted {
                    new_node: true,
                    moved_from: None,
                })
            }
        }
    }

    /// Whether `r` tells the model something besides the node being alive:
    /// a new node, a node that was missing at `now`, or figures, group,
    /// activity, opt-out, operation or interval that differ from its last
    /// accepted report.
    pub fn is_news(&self, r: &NodeReport, now: DateTime<Utc>, stale_intervals: u32) -> bool {
        let Some(e) = self.nodes.get(&r.node) else {
            return true;
        };
        let o = &e.report;
        o.gears != r.gears
            || o.max_active_gears != r.max_active_gears
            || o.active != r.active
            || o.profile != r.profile
            || o.district != r.district
            || o.do_not_disrupt != r.do_not_disrupt
            || o.operation != r.operation
            || o.booted_for != r.booted_for
            || o.interval_secs != r.interval_secs
            || !e.is_fresh(now, stale_intervals)
    }

    /// Inserts an entry as is (restoring state, tests).
    pub fn insert(&mut self, entry: NodeEntry) {
        if let Some(old) = self.nodes.remove(&entry.report.node) {
            self.unindex(&old);
        }
        self.index(&entry);
        self.nodes.insert(entry.report.node.clone(), entry);
    }

    /// Cordons or uncordons `node` (known or not yet reporting): a
    /// cordoned node's free slots stop counting as available gears.
    pub fn set_cordoned(&mut self, node: &str, on: bool) {
        if on {
            self.cordoned.insert(node.to_string());
        } else {
            self.cordoned.remove(node);
        }
        if let Some(mut e) = self.nodes.remove(node) {
            self.unindex(&e);
            e.cordoned = on;
            self.index(&e);
            self.nodes.insert(node.to_string(), e);
        }
    }

    /// Forgets a node (removed, or missing for too long).
    pub fn forget(&mut self, node: &str) -> Option<NodeEntry> {
        let e = self.nodes.remove(node)?;
        self.unindex(&e);
        Some(e)
    }

    /// One node.
    pub fn get(&self, node: &str) -> Option<&NodeEntry> {
        self.nodes.get(node)
    }

    /// Every node.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeEntry> {
        self.nodes.values()
    }

    /// Number of known nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether no node is known.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Nodes of one group, by name.
    pub fn in_group<'a>(&'a self, g: &'a GroupKey) -> impl Iterator<Item = &'a NodeEntry> + 'a {
        self.by_group
            .get(g)
            .into_iter()
            .flat_map(move |names| names.iter().filter_map(move |n| self.nodes.get(n)))
    }

    /// Number of nodes of one group (fresh or not).
    pub fn group_len(&self, g: &GroupKey) -> usize {
        self.by_group.get(g).map_or(0, BTreeSet::len)
    }

    /// Every group with at least one node, sorted.
    pub fn groups(&self) -> Vec<GroupKey> {
        self.by_group.keys().cloned().collect()
    }

    /// A number that changes whenever a report, a cordon or a departure
    /// changes what the fleet knows of group `g`'s nodes or of its
    /// district's UIDs (0: never). What a caller built from the group's
    /// nodes holds while the stamp is the one it saw and no node it counted
    /// fresh went stale since.
    pub fn group_stamp(&self, g: &GroupKey) -> u64 {
        lock(&self.stamps).of.get(g).copied().unwrap_or(0)
    }

    /// A number that changes whenever a node joins or leaves the fleet (or
    /// changes group), never shared with another fleet but a clone: what a
    /// caller derived from which nodes are known holds while it is the
    /// one it saw.
    pub fn membership(&self) -> u64 {
        self.membership
    }

    /// Nodes missing for longer than `forget_after`: to be dropped.
    pub fn long_missing(&self, now: DateTime<Utc>, forget_after: Duration) -> Vec<String> {
        self.nodes
            .values()
            .filter(|e| now - e.received > forget_after)
            .map(|e| e.report.node.clone())
            .collect()
    }

    /// The `oo-stats` figures of one group. Nodes in `exclude` (being
    /// removed) count neither as capacity nor as missing.
    pub fn group_stats(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        stale_intervals: u32,
        exclude: &dyn Fn(&str) -> bool,
    ) -> GroupStats {
        let mut acc = Acc::default();
        for e in self.in_group(g) {
            if exclude(&e.report.node) {
                continue;
            }
            acc.add(e, now, stale_intervals);
        }
        let free = self.district_free_uids(&g.district);
        acc.finish(free)
    }

    /// The figures of a profile: the sum over its groups, with
    /// `effective_available_gears` summed per district.
    pub fn profile_stats(
        &self,
        profile: &str,
        now: DateTime<Utc>,
        stale_intervals: u32,
        exclude: &dyn Fn(&str) -> bool,
    ) -> GroupStats {
        let mut total = GroupStats::default();
        for g in self.groups().into_iter().filter(|g| g.profile == profile) {
            add_stats(
                &mut total,
                &self.group_stats(&g, now, stale_intervals, exclude),
            );
        }
        total.usage_pct = usage(total.gears_active, total.available_active_gears);
        total
    }

    /// Every profile with at least one node.
    pub fn profiles(&self) -> Vec<String> {
        // From the group index (a group without nodes leaves it), not a scan.
        let set: BTreeSet<&str> = self.by_group.keys().map(|g| g.profile.as_str()).collect();
        set.into_iter().map(str::to_string).collect()
    }

    /// (missing, known) over the whole fleet, for the breaker.
    pub fn staleness(
        &self,
        now: DateTime<Utc>,
        stale_intervals: u32,
        exclude: &BTreeSet<String>,
    ) -> (usize, usize) {
        // One pass without a lookup per node; the few excluded ones after.
        let fresh = |e: &NodeEntry| e.is_fresh(now, stale_intervals);
        let mut missing = self.nodes.values().filter(|e| !fresh(e)).count();
        let mut known = self.nodes.len();
        for e in exclude.iter().filter_map(|n| self.nodes.get(n)) {
            known -= 1;
            missing -= usize::from(!fresh(e));
        }
        (missing, known)
    }
}

/// usage % = 100 * active / (available_active + active); 0 when both are 0.
pub fn usage(active: u32, available: u32) -> f64 {
    let denom = f64::from(active) + f64::from(available);
    if denom == 0.0 {
        0.0
    } else {
        (100.0 * f64::from(active) / denom * 10.0).round() / 10.0
    }
}

#[cfg(test)]
pub(crate) mod tests;
