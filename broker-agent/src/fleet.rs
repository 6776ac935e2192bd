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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{DEFAULT_DISTRICT_CAPACITY, GroupStats, NodeReport};
use gearshift_proto::routing::NO_DISTRICT;
use serde::{Deserialize, Serialize};

/// One node as the broker agent knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEntry {
    /// The last accepted report.
    pub report: NodeReport,
    /// When it was accepted (the broker's clock).
    pub received: DateTime<Utc>,
    /// When the node was first seen.
    pub first_seen: DateTime<Utc>,
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

    /// Free active slots, when the node is active: max(0, max_active - active).
    pub fn available_active(&self) -> u32 {
        if self.report.active {
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

/// A group's sums over all its nodes (no exclusions), and how long they hold.
#[derive(Debug, Clone)]
struct GroupSums {
    at: DateTime<Utc>,
    /// The first instant at which a node fresh at `at` goes stale.
    until: Option<DateTime<Utc>>,
    intervals: u32,
    acc: Acc,
}

impl GroupSums {
    fn holds(&self, now: DateTime<Utc>, intervals: u32) -> bool {
        self.intervals == intervals && now >= self.at && self.until.is_none_or(|u| now <= u)
    }
}

/// A profile's figures over all its groups (no exclusions), kept as a
/// running total of each group's share. A share is refreshed when its group
/// or district changed (`dirty`) or when its group's sums stop holding.
#[derive(Debug, Default)]
struct ProfileSums {
    intervals: u32,
    /// The latest instant a share was computed at: asking for an earlier
    /// instant starts over.
    at: Option<DateTime<Utc>>,
    /// Each group's share, and until when it holds (`None`: until the group changes).
    shares: HashMap<GroupKey, (GroupStats, Option<DateTime<Utc>>)>,
    /// Shares by the instant they stop holding.
    expiry: BTreeSet<(DateTime<Utc>, GroupKey)>,
    /// Groups whose share must be computed again.
    dirty: BTreeSet<GroupKey>,
    /// The sum of the shares (`usage_pct` and `district_free_uids` unset).
    total: GroupStats,
}

impl ProfileSums {
    fn fresh(intervals: u32, groups: impl Iterator<Item = GroupKey>) -> Self {
        ProfileSums {
            intervals,
            dirty: groups.collect(),
            ..Default::default()
        }
    }

    fn drop_share(&mut self, g: &GroupKey) {
        if let Some((share, until)) = self.shares.remove(g) {
            sub_stats(&mut self.total, &share);
            if let Some(u) = until {
                self.expiry.remove(&(u, g.clone()));
            }
        }
    }

    fn put_share(&mut self, g: GroupKey, share: GroupStats, until: Option<DateTime<Utc>>) {
        add_stats(&mut self.total, &share);
        if let Some(u) = until {
            self.expiry.insert((u, g.clone()));
        }
        self.shares.insert(g, (share, until));
    }
}

fn add_stats(total: &mut GroupStats, s: &GroupStats) {
    total.nodes_active += s.nodes_active;
    total.nodes_inactive += s.nodes_inactive;
    total.nodes_missing += s.nodes_missing;
    total.gears_active += s.gears_active;
    total.gears_total += s.gears_total;
    total.available_active_gears += s.available_active_gears;
    total.effective_available_gears += s.effective_available_gears;
}

fn sub_stats(total: &mut GroupStats, s: &GroupStats) {
    total.nodes_active -= s.nodes_active;
    total.nodes_inactive -= s.nodes_inactive;
    total.nodes_missing -= s.nodes_missing;
    total.gears_active -= s.gears_active;
    total.gears_total -= s.gears_total;
    total.available_active_gears -= s.available_active_gears;
    total.effective_available_gears -= s.effective_available_gears;
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
}

impl Clone for Fleet {
    fn clone(&self) -> Self {
        Fleet {
            nodes: self.nodes.clone(),
            by_group: self.by_group.clone(),
            by_district: self.by_district.clone(),
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

    /// Files `e` in the indexes and forgets what its group and district remembered.
    fn index(&mut self, e: &NodeEntry) {
        let g = e.group();
        lock(&self.sums).remove(&g);
        self.share_changed(&g);
        self.by_group
            .entry(g)
            .or_default()
            .insert(e.report.node.clone());
        if let Some(d) = e.report.district_uuid() {
            lock(&self.uids).remove(d);
            self.district_changed(d);
            self.by_district
                .entry(d.to_string())
                .or_default()
                .insert(e.report.node.clone());
        }
    }

    /// The share of `g` in its profile's total must be computed again.
    fn share_changed(&self, g: &GroupKey) {
        if let Some(p) = lock(&self.profiles).get_mut(&g.profile) {
            p.dirty.insert(g.clone());
        }
    }

    /// A district's free UIDs changed: so did the share of each of its groups.
    fn district_changed(&self, district: &str) {
        let from = GroupKey {
            district: district.to_string(),
            profile: String::new(),
        };
        for g in self
            .by_group
            .range(from..)
            .map(|(g, _)| g)
            .take_while(|g| g.district == district)
        {
            self.share_changed(g);
        }
    }

    /// A node's new report in the same group and district: the remembered
    /// sums take the difference (or are forgotten when they cannot).
    fn update_in_place(&mut self, old: &NodeEntry, new: &NodeEntry, now: DateTime<Utc>) {
        let g = new.group();
        {
            let mut sums = lock(&self.sums);
            let keep = match sums.get_mut(&g) {
                Some(s) if s.holds(now, s.intervals) => {
                    // `old` counts the same at every instant the sums hold;
                    // `new` is fresh from before `at` until its stale instant.
                    s.acc.sub(old, now, s.intervals);
                    s.acc.add(new, now, s.intervals);
                    let stale_at = new.received + new.stale_after(s.intervals);
                    s.until = Some(s.until.map_or(stale_at, |u| u.min(stale_at)));
                    true
                }
                _ => false,
            };
            if !keep {
                sums.remove(&g);
            }
        }
        if new.report.district.is_none() {
            // A districted group is refreshed with its district, below.
            self.share_changed(&g);
        }
        if let (Some(d), Some(od), Some(nd)) = (
            new.report.district_uuid(),
            old.report.district.as_ref(),
            new.report.district.as_ref(),
        ) {
            let mut uids = lock(&self.uids);
            let keep = match uids.get_mut(d) {
                // The capacity is a maximum: it can grow in place, not shrink.
                Some((cap, used)) if nd.capacity() >= od.capacity() || od.capacity() < *cap => {
                    *cap = (*cap).max(nd.capacity());
                    *used = used
                        .saturating_sub(old.total_gears())
                        .saturating_add(new.total_gears());
                    true
                }
                _ => false,
            };
            if !keep {
                uids.remove(d);
            }
            drop(uids);
            self.district_changed(d);
        }
    }

    /// Removes `e` from the indexes and forgets what its group and district remembered.
    fn unindex(&mut self, e: &NodeEntry) {
        let g = e.group();
        lock(&self.sums).remove(&g);
        self.share_changed(&g);
        if let Some(d) = e.report.district_uuid() {
            self.district_changed(d);
        }
        if let Some(set) = self.by_group.get_mut(&g) {
            set.remove(&e.report.node);
            if set.is_empty() {
                self.by_group.remove(&g);
            }
        }
        if let Some(d) = e.report.district_uuid() {
            lock(&self.uids).remove(d);
            if let Some(set) = self.by_district.get_mut(d) {
                set.remove(&e.report.node);
                if set.is_empty() {
                    self.by_district.remove(d);
                }
            }
        }
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
                let old = old_entry.group();
                let e = NodeEntry {
                    report,
                    received: now,
                    first_seen: old_entry.first_seen,
                };
                let new = e.group();
                if old == new && old_entry.report.district_uuid() == e.report.district_uuid() {
                    // The common case, a periodic report: same group and
                    // district, so the remembered figures change by the
                    // difference between the two reports.
                    self.update_in_place(&old_entry, &e, now);
                } else {
                    self.unindex(&old_entry);
                    self.index(&e);
                }
                self.nodes.insert(e.report.node.clone(), e);
                Ok(Accepted {
                    new_node: false,
                    moved_from: (old != new).then_some(old),
                })
            }
            None => {
                let e = NodeEntry {
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

    /// Inserts an entry as is (restoring state, tests).
    pub fn insert(&mut self, entry: NodeEntry) {
        if let Some(old) = self.nodes.remove(&entry.report.node) {
            self.unindex(&old);
        }
        self.index(&entry);
        self.nodes.insert(entry.report.node.clone(), entry);
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

    /// Every group with at least one node, sorted.
    pub fn groups(&self) -> Vec<GroupKey> {
        self.by_group.keys().cloned().collect()
    }

    /// Nodes missing for longer than `forget_after`: to be dropped.
    pub fn long_missing(&self, now: DateTime<Utc>, forget_after: Duration) -> Vec<String> {
        self.nodes
            .values()
            .filter(|e| now - e.received > forget_after)
            .map(|e| e.report.node.clone())
            .collect()
    }

    /// UID capacity and gears of a district, over every known node (missing
    /// ones keep their UIDs). `None` for `_none`.
    pub fn district_uids(&self, district: &str) -> Option<(u32, u32)> {
        if district == NO_DISTRICT {
            return None;
        }
        if let Some(x) = lock(&self.uids).get(district) {
            return Some(*x);
        }
        let mut cap = None::<u32>;
        let mut used = 0u32;
        for n in self.by_district.get(district).into_iter().flatten() {
            if let Some(e) = self.nodes.get(n)
                && let Some(d) = &e.report.district
            {
                cap = Some(cap.unwrap_or(0).max(d.capacity()));
                used = used.saturating_add(e.total_gears());
            }
        }
        let x = (cap.unwrap_or(DEFAULT_DISTRICT_CAPACITY), used);
        lock(&self.uids).insert(district.to_string(), x);
        Some(x)
    }

    /// A group's sums over all its nodes at `now`, remembered while they hold.
    fn group_sums(&self, g: &GroupKey, now: DateTime<Utc>, stale_intervals: u32) -> Acc {
        if let Some(s) = lock(&self.sums).get(g)
            && s.holds(now, stale_intervals)
        {
            return s.acc.clone();
        }
        let mut acc = Acc::default();
        let mut until: Option<DateTime<Utc>> = None;
        for e in self.in_group(g) {
            if e.is_fresh(now, stale_intervals) {
                let stale_at = e.received + e.stale_after(stale_intervals);
                until = Some(until.map_or(stale_at, |u| u.min(stale_at)));
            }
            acc.add(e, now, stale_intervals);
        }
        lock(&self.sums).insert(
            g.clone(),
            GroupSums {
                at: now,
                until,
                intervals: stale_intervals,
                acc: acc.clone(),
            },
        );
        acc
    }

    /// The `oo-stats` figures of one group without the nodes in `excluded`
    /// (being removed): the same figures as [`Fleet::group_stats`], from the
    /// remembered sums.
    pub fn group_stats_without(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        stale_intervals: u32,
        excluded: &BTreeSet<String>,
    ) -> GroupStats {
        let mut acc = self.group_sums(g, now, stale_intervals);
        for n in excluded {
            if let Some(e) = self.nodes.get(n)
                && e.group() == *g
            {
                acc.sub(e, now, stale_intervals);
            }
        }
        acc.finish(self.district_free_uids(&g.district))
    }

    /// A group's share of its profile's figures at `now`, and until when it holds.
    fn share(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        stale_intervals: u32,
    ) -> (GroupStats, Option<DateTime<Utc>>) {
        let acc = self.group_sums(g, now, stale_intervals);
        let until = lock(&self.sums).get(g).and_then(|s| s.until);
        (acc.finish(self.district_free_uids(&g.district)), until)
    }

    /// The figures of a profile over all its nodes at `now`: the running
    /// total, with the shares that changed or stopped holding computed again.
    fn profile_total(&self, profile: &str, now: DateTime<Utc>, stale_intervals: u32) -> GroupStats {
        let mut profiles = lock(&self.profiles);
        let groups_of = || {
            self.by_group
                .keys()
                .filter(|g| g.profile == profile)
                .cloned()
        };
        let p = profiles
            .entry(profile.to_string())
            .or_insert_with(|| ProfileSums::fresh(stale_intervals, groups_of()));
        if p.intervals != stale_intervals || p.at.is_some_and(|at| now < at) {
            *p = ProfileSums::fresh(stale_intervals, groups_of());
        }
        let mut redo = std::mem::take(&mut p.dirty);
        while let Some((u, _)) = p.expiry.first()
            && *u < now
        {
            if let Some((_, g)) = p.expiry.pop_first() {
                redo.insert(g);
            }
        }
        for g in redo {
            p.drop_share(&g);
            if self.by_group.contains_key(&g) {
                let (share, until) = self.share(&g, now, stale_intervals);
                p.put_share(g, share, until);
            }
        }
        p.at = Some(p.at.map_or(now, |at| at.max(now)));
        p.total.clone()
    }

    /// The figures of a profile without the nodes in `excluded`: the same
    /// figures as [`Fleet::profile_stats`], from the running total.
    pub fn profile_stats_without(
        &self,
        profile: &str,
        now: DateTime<Utc>,
        stale_intervals: u32,
        excluded: &BTreeSet<String>,
    ) -> GroupStats {
        let mut minus: BTreeMap<GroupKey, Vec<&NodeEntry>> = BTreeMap::new();
        for n in excluded {
            if let Some(e) = self.nodes.get(n)
                && e.report.profile == profile
            {
                minus.entry(e.group()).or_default().push(e);
            }
        }
        let mut total = self.profile_total(profile, now, stale_intervals);
        for (g, gone) in minus {
            let mut acc = self.group_sums(&g, now, stale_intervals);
            let free = self.district_free_uids(&g.district);
            sub_stats(&mut total, &acc.clone().finish(free));
            for e in gone {
                acc.sub(e, now, stale_intervals);
            }
            add_stats(&mut total, &acc.finish(free));
        }
        total.usage_pct = usage(total.gears_active, total.available_active_gears);
        total
    }

    /// Free UIDs of a district.
    pub fn district_free_uids(&self, district: &str) -> Option<u32> {
        self.district_uids(district)
            .map(|(c, u)| c.saturating_sub(u))
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
        let mut v: Vec<String> = self
            .nodes
            .values()
            .map(|e| e.report.profile.clone())
            .collect();
        v.sort();
        v.dedup();
        v
    }

    /// (missing, known) over the whole fleet, for the breaker.
    pub fn staleness(
        &self,
        now: DateTime<Utc>,
        stale_intervals: u32,
        exclude: &dyn Fn(&str) -> bool,
    ) -> (usize, usize) {
        let mut missing = 0;
        let mut known = 0;
        for e in self.nodes.values() {
            if exclude(&e.report.node) {
                continue;
            }
            known += 1;
            if !e.is_fresh(now, stale_intervals) {
                missing += 1;
            }
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

#[derive(Debug, Clone, Default)]
struct Acc {
    s: GroupStats,
}

impl Acc {
    fn add(&mut self, e: &NodeEntry, now: DateTime<Utc>, stale_intervals: u32) {
        if !e.is_fresh(now, stale_intervals) {
            self.s.nodes_missing += 1;
            return;
        }
        if e.report.active {
            self.s.nodes_active += 1;
        } else {
            self.s.nodes_inactive += 1;
        }
        self.s.gears_active += e.active_gears();
        self.s.gears_total += e.total_gears();
        self.s.available_active_gears += e.available_active();
    }

    /// Takes back what `add` added for `e` at the same `now`.
    fn sub(&mut self, e: &NodeEntry, now: DateTime<Utc>, stale_intervals: u32) {
        if !e.is_fresh(now, stale_intervals) {
            self.s.nodes_missing -= 1;
            return;
        }
        if e.report.active {
            self.s.nodes_active -= 1;
        } else {
            self.s.nodes_inactive -= 1;
        }
        self.s.gears_active -= e.active_gears();
        self.s.gears_total -= e.total_gears();
        self.s.available_active_gears -= e.available_active();
    }

    fn finish(mut self, free_uids: Option<u32>) -> GroupStats {
        self.s.usage_pct = usage(self.s.gears_active, self.s.available_active_gears);
        self.s.effective_available_gears = match free_uids {
            Some(f) => self.s.available_active_gears.min(f),
            None => self.s.available_active_gears,
        };
        self.s.district_free_uids = free_uids;
        self.s
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use gearshift_proto::msg::{DistrictInfo, GearCounts};

    pub fn report(
        node: &str,
        district: Option<&str>,
        profile: &str,
        max: u32,
        started: u32,
        idle: u32,
    ) -> NodeReport {
        NodeReport {
            node: node.into(),
            seq: 1,
            profile: profile.into(),
            district: district.map(|d| DistrictInfo {
                uuid: d.into(),
                active: true,
                first_uid: Some(1000),
                max_uid: Some(1999),
            }),
            max_active_gears: max,
            gears: GearCounts {
                started,
                idle,
                ..Default::default()
            },
            active: true,
            region: None,
            zone: None,
            mem_free_mb: 0,
            mem_total_mb: 0,
            started_at: DateTime::from_timestamp(1_700_000_000, 0).unwrap(),
            booted_for: None,
            do_not_disrupt: false,
            pinned_gears: 0,
            operation: None,
            interval_secs: 10,
            agent_version: "t".into(),
        }
    }

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn oo_stats_figures() {
        let mut f = Fleet::new();
        // n1: 60 active of 100; n2: 90 active (+10 idle) of 100; n3 inactive 5 active.
        f.accept(report("n1", Some("d1"), "small", 100, 60, 0), t(0))
            .unwrap();
        f.accept(report("n2", Some("d1"), "small", 100, 90, 10), t(0))
            .unwrap();
        let mut r3 = report("n3", Some("d1"), "small", 100, 5, 0);
        r3.active = false;
        f.accept(r3, t(0)).unwrap();
        let g = GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        };
        let s = f.group_stats(&g, t(5), 3, &|_| false);
        assert_eq!(s.nodes_active, 2);
        assert_eq!(s.nodes_inactive, 1);
        assert_eq!(s.gears_active, 155);
        assert_eq!(s.gears_total, 165);
        // available = (100-60) + (100-90) = 50; inactive node gives none.
        assert_eq!(s.available_active_gears, 50);
        // usage = 100 * 155 / (50 + 155) = 75.6
        assert_eq!(s.usage_pct, 75.6);
        // district capacity 1000 UIDs, 165 used.
        assert_eq!(s.district_free_uids, Some(835));
        assert_eq!(s.effective_available_gears, 50);
    }

    #[test]
    fn effective_is_capped_by_free_uids() {
        let mut f = Fleet::new();
        let mut r = report("n1", Some("d1"), "small", 2000, 10, 980);
        r.district.as_mut().unwrap().max_uid = Some(1999);
        f.accept(r, t(0)).unwrap();
        let g = GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        };
        let s = f.group_stats(&g, t(0), 3, &|_| false);
        assert_eq!(s.available_active_gears, 1990);
        assert_eq!(s.district_free_uids, Some(10));
        assert_eq!(s.effective_available_gears, 10);
    }

    #[test]
    fn stale_seq_is_refused_and_missing_nodes_counted() {
        let mut f = Fleet::new();
        let mut r = report("n1", None, "small", 100, 1, 0);
        r.seq = 10;
        f.accept(r.clone(), t(0)).unwrap();
        r.seq = 10;
        assert_eq!(
            f.accept(r.clone(), t(1)).unwrap_err(),
            ReportRejected::StaleSeq { last: 10, got: 10 }
        );
        r.seq = 9;
        assert!(f.accept(r.clone(), t(1)).is_err());
        let g = GroupKey {
            district: NO_DISTRICT.into(),
            profile: "small".into(),
        };
        // interval 10 s x 3 = 30 s.
        assert_eq!(f.group_stats(&g, t(30), 3, &|_| false).nodes_missing, 0);
        let s = f.group_stats(&g, t(31), 3, &|_| false);
        assert_eq!((s.nodes_missing, s.nodes_active), (1, 0));
        assert_eq!(s.district_free_uids, None);
        assert_eq!(f.staleness(t(31), 3, &|_| false), (1, 1));
        assert_eq!(
            f.long_missing(t(100), Duration::seconds(60)),
            vec!["n1".to_string()]
        );
    }

    #[test]
    fn profile_sums_districts() {
        let mut f = Fleet::new();
        f.accept(report("a", Some("d1"), "small", 100, 50, 0), t(0))
            .unwrap();
        f.accept(report("b", Some("d2"), "small", 100, 100, 0), t(0))
            .unwrap();
        f.accept(report("c", Some("d3"), "large", 10, 1, 0), t(0))
            .unwrap();
        let p = f.profile_stats("small", t(0), 3, &|_| false);
        assert_eq!(p.gears_active, 150);
        assert_eq!(p.available_active_gears, 50);
        assert_eq!(p.usage_pct, 75.0);
        assert_eq!(f.profiles(), vec!["large".to_string(), "small".to_string()]);
    }

    #[test]
    fn a_district_shared_by_two_profiles_updates_both_totals() {
        // A report of a "small" node uses UIDs of d1, which also caps the
        // "large" group of d1: the large total must follow.
        let mut f = Fleet::new();
        let mut a = report("a", Some("d1"), "small", 2000, 10, 0);
        f.accept(a.clone(), t(0)).unwrap();
        f.accept(report("b", Some("d1"), "large", 2000, 10, 0), t(0))
            .unwrap();
        let none = BTreeSet::new();
        let before = f.profile_stats_without("large", t(1), 3, &none);
        assert_eq!(before.effective_available_gears, 980);
        a.seq = 2;
        a.gears.started = 900;
        f.accept(a, t(2)).unwrap();
        let after = f.profile_stats_without("large", t(3), 3, &none);
        assert_eq!(after, f.profile_stats("large", t(3), 3, &|_| false));
        assert_eq!(after.effective_available_gears, 90);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Any sequence of reports (moving between groups and districts,
        /// changing gears and activity), forgets and clock steps (sometimes
        /// backwards): the running totals equal a full scan at every step.
        #[test]
        fn running_totals_match_a_full_scan(
            steps in proptest::collection::vec(
                (0u8..6, 0usize..12, 0usize..4, 0usize..2, 0u32..120, 0i64..25),
                1..120,
            )
        ) {
            let mut f = Fleet::new();
            let mut now = 0i64;
            let mut seq = 0u64;
            let excl: BTreeSet<String> = ["n1", "n7"].iter().map(|s| s.to_string()).collect();
            for (op, node, d, p, gears, dt) in steps {
                let name = format!("n{node}");
                match op {
                    0 => f.forget(&name).map(|_| ()).unwrap_or(()),
                    1 => now = (now - dt).max(0),
                    _ => {
                        now += dt;
                        seq += 1;
                        let district = ["d1", "d2", "d3"].get(d).copied();
                        let mut r = report(&name, district, ["small", "large"][p], 100, gears, gears % 7);
                        r.seq = seq;
                        r.active = gears % 5 != 0;
                        f.accept(r, t(now)).unwrap();
                    }
                }
                // Asked at the step's instant: the clock goes forward
                // between steps except for a backward step.
                for p in f.profiles() {
                    for ex in [&BTreeSet::new(), &excl] {
                        let full = f.profile_stats(&p, t(now), 3, &|n| ex.contains(n));
                        proptest::prop_assert_eq!(
                            f.profile_stats_without(&p, t(now), 3, ex),
                            full
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn remembered_sums_match_a_full_scan() {
        // Nodes in three groups reporting at different times; figures asked at
        // times around each node's stale instant, with and without
        // exclusions, after reports, moves between groups and forgets.
        let mut f = Fleet::new();
        let mut seq = 0u64;
        let mut rep = |f: &mut Fleet, node: &str, d: &str, p: &str, started: u32, at: i64| {
            seq += 1;
            let mut r = report(node, Some(d), p, 100, started, 3);
            r.seq = seq;
            r.active = started % 7 != 0;
            f.accept(r, t(at)).unwrap();
        };
        for i in 0..30 {
            let d = ["d1", "d2", "d3"][i % 3];
            let p = if i % 4 == 0 { "large" } else { "small" };
            rep(
                &mut f,
                &format!("n{i}"),
                d,
                p,
                (i * 3) as u32 % 100,
                i as i64,
            );
        }
        let check = |f: &Fleet, now: i64, excl: &BTreeSet<String>| {
            for g in f.groups() {
                let full = f.group_stats(&g, t(now), 3, &|n| excl.contains(n));
                assert_eq!(
                    f.group_stats_without(&g, t(now), 3, excl),
                    full,
                    "{g:?} at {now}"
                );
            }
            for p in f.profiles() {
                let full = f.profile_stats(&p, t(now), 3, &|n| excl.contains(n));
                assert_eq!(
                    f.profile_stats_without(&p, t(now), 3, excl),
                    full,
                    "{p} at {now}"
                );
            }
        };
        let none = BTreeSet::new();
        let some: BTreeSet<String> = ["n4", "n5", "n29", "gone"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        // interval 10 s x 3: node i is stale after t(i + 30).
        for now in [0, 5, 29, 30, 31, 35, 45, 59, 60, 61, 100, 40, 20] {
            check(&f, now, &none);
            check(&f, now, &some);
        }
        // Reports in the same group update the remembered sums in place.
        for (k, (i, now)) in [(0usize, 40i64), (1, 41), (0, 42), (5, 43)]
            .into_iter()
            .enumerate()
        {
            check(&f, now, &some);
            let (d, p) = (
                ["d1", "d2", "d3"][i % 3],
                if i % 4 == 0 { "large" } else { "small" },
            );
            rep(&mut f, &format!("n{i}"), d, p, 11 * (k as u32 + 1), now);
            check(&f, now, &none);
            check(&f, now, &some);
            check(&f, now + 31, &some);
        }
        rep(&mut f, "n4", "d3", "small", 99, 50);
        rep(&mut f, "n7", "d1", "large", 10, 51);
        f.forget("n9");
        for now in [50, 51, 55, 80, 81, 82] {
            check(&f, now, &none);
            check(&f, now, &some);
        }
        assert_eq!(f.district_uids("d3"), {
            let mut fresh = f.clone();
            fresh.forget("nobody");
            fresh.district_uids("d3")
        });
    }
}
