//! The remembered figures: each group's sums while they hold, each
//! district's UID use, and each profile's running total over its groups;
//! and the index upkeep that tells them what changed.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{DEFAULT_DISTRICT_CAPACITY, GroupStats};
use gearshift_proto::routing::NO_DISTRICT;

use super::{Fleet, NodeEntry, lock, usage};

/// A group's sums over all its nodes (no exclusions), and how long they hold.
#[derive(Debug, Clone)]
pub(super) struct GroupSums {
    at: DateTime<Utc>,
    /// The first instant at which a node fresh at `at` goes stale.
    until: Option<DateTime<Utc>>,
    intervals: u32,
    acc: Acc,
    /// The largest `max_active_gears` of the group's nodes, fresh or not.
    max_active: Option<u32>,
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
pub(super) struct ProfileSums {
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

/// Adds `s`'s counts to `total` (`usage_pct` and `district_free_uids` untouched).
pub fn add_stats(total: &mut GroupStats, s: &GroupStats) {
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

impl Fleet {
    /// Files `e` in the indexes and forgets what its group and district remembered.
    pub(super) fn index(&mut self, e: &NodeEntry) {
        self.membership = next_membership();
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

    /// The share of `g` in its profile's total must be computed again, and
    /// the group's stamp moves on too.
    fn share_changed(&self, g: &GroupKey) {
        if let Some(p) = lock(&self.profiles).get_mut(&g.profile) {
            p.dirty.insert(g.clone());
        }
        let mut st = lock(&self.stamps);
        st.last += 1;
        let stamp = st.last;
        match st.of.get_mut(g) {
            Some(s) => *s = stamp,
            None => {
                st.of.insert(g.clone(), stamp);
            }
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
    pub(super) fn update_in_place(&mut self, old: &NodeEntry, new: &NodeEntry, now: DateTime<Utc>) {
        let g = new.group();
        {
            let mut sums = lock(&self.sums);
            let keep = match sums.get_mut(&g) {
                // A largest `max_active_gears` that shrinks is found again by a scan.
                Some(s)
                    if s.holds(now, s.intervals)
                        && (new.report.max_active_gears >= old.report.max_active_gears
                            || s.max_active != Some(old.report.max_active_gears)) =>
                {
                    // `old` counts the same at every instant the sums hold;
                    // `new` is fresh from before `at` until its stale instant.
                    s.max_active = s.max_active.max(Some(new.report.max_active_gears));
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
    pub(super) fn unindex(&mut self, e: &NodeEntry) {
        self.membership = next_membership();
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
        self.remembered(g, now, stale_intervals).0
    }

    /// The largest `max_active_gears` of a group's nodes (fresh or not), if
    /// it has any; remembered with the group's sums.
    pub fn group_max_active(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        stale_intervals: u32,
    ) -> Option<u32> {
        self.remembered(g, now, stale_intervals).1
    }

    /// A group's sums and largest `max_active_gears`, remembered while they hold.
    fn remembered(
        &self,
        g: &GroupKey,
        now: DateTime<Utc>,
        stale_intervals: u32,
    ) -> (Acc, Option<u32>) {
        if let Some(s) = lock(&self.sums).get(g)
            && s.holds(now, stale_intervals)
        {
            return (s.acc.clone(), s.max_active);
        }
        let mut acc = Acc::default();
        let mut until: Option<DateTime<Utc>> = None;
        let mut max_active = None;
        for e in self.in_group(g) {
            max_active = max_active.max(Some(e.report.max_active_gears));
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
                max_active,
            },
        );
        (acc, max_active)
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
}

/// A membership number no fleet had before (two fleets never share one
/// unless one is the other's clone, with the same nodes).
fn next_membership() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

#[derive(Debug, Clone, Default)]
pub(super) struct Acc {
    s: GroupStats,
}

impl Acc {
    pub(super) fn add(&mut self, e: &NodeEntry, now: DateTime<Utc>, stale_intervals: u32) {
        if !e.is_fresh(now, stale_intervals) {
            self.s.nodes_missing += 1;
            return;
        }
        if e.is_active() {
            self.s.nodes_active += 1;
        } else {
            self.s.nodes_inactive += 1;
        }
        self.s.gears_active += e.active_gears();
        self.s.gears_total += e.total_gears();
        self.s.available_active_gears += e.available_active();
    }

    /// Takes back what `add` added for `e` at the same `now`.
    pub(super) fn sub(&mut self, e: &NodeEntry, now: DateTime<Utc>, stale_intervals: u32) {
        if !e.is_fresh(now, stale_intervals) {
            self.s.nodes_missing -= 1;
            return;
        }
        if e.is_active() {
            self.s.nodes_active -= 1;
        } else {
            self.s.nodes_inactive -= 1;
        }
        self.s.gears_active -= e.active_gears();
        self.s.gears_total -= e.total_gears();
        self.s.available_active_gears -= e.available_active();
    }

    pub(super) fn finish(mut self, free_uids: Option<u32>) -> GroupStats {
        self.s.usage_pct = usage(self.s.gears_active, self.s.available_active_gears);
        self.s.effective_available_gears = match free_uids {
            Some(f) => self.s.available_active_gears.min(f),
            None => self.s.available_active_gears,
        };
        self.s.district_free_uids = free_uids;
        self.s
    }
}
