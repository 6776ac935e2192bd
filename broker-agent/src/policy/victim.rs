//! The victim of a scale-down, and the checks on it: the rest of the group
//! absorbs its gears, and its removal does not push the group or its profile
//! back over a scale-up threshold.
//!
//! The arithmetic: once the victim is gone, each of its active gears takes a
//! slot on its target, so the group's available active gears become the
//! room the rest of the group has ([`Facts::after_drain`]) less the victim's
//! active gears, and usage = active gears / (that + active gears). Forgetting
//! the second term (counting only the victim's free slots as lost) drains
//! nodes the fleet then wants back.
//!
//! [`Facts::after_drain`]: crate::core::facts::Facts::after_drain

use chrono::{DateTime, Utc};
use gearshift_proto::msg::Reason;

use super::facts::GroupFacts;
use super::{Eval, reason};
use crate::config::VictimStrategy;
use crate::fleet::{NodeEntry, usage};

impl Eval<'_> {
    /// Whether the rest of the group absorbs the victim's gears, and
    /// whether removing it keeps the group and its profile under the
    /// scale-up thresholds.
    pub(super) fn victim_rules(&self, f: &GroupFacts, e: &NodeEntry, g: &mut Vec<Reason>) {
        let p = &self.cfg.policy;
        let (key, s, now) = (&f.key, &f.stats, self.now);
        let node = &e.report.node;
        let after = self.facts.after_drain(key, e, now);
        g.push(reason(
            "absorb",
            after.room >= after.need,
            format!(
                "the rest of the district has room for {} gears, {node} has {}",
                after.room, after.need
            ),
        ));
        // The group's capacity lost with the victim, and what the profile keeps.
        let lost = s.available_active_gears.saturating_sub(after.available);
        let group_after = usage(s.gears_active, after.available);
        let ps = self
            .facts
            .profile_stats_without(&key.profile, now, &self.removing);
        let profile_after = usage(
            ps.gears_active,
            ps.available_active_gears.saturating_sub(lost),
        );
        let profile_th = p.profile_threshold.get(&key.district, &key.profile);
        let limits = [
            profile_th,
            p.district_threshold.get(&key.district, &key.profile),
        ];
        if let Some(lim) = limits.iter().flatten().min().copied() {
            let profile_ok = profile_th.is_none_or(|t| profile_after < f64::from(t));
            g.push(reason(
                "no_flap",
                group_after < f64::from(lim) && profile_ok,
                format!(
                    "usage after removal {group_after:.1} % (the victim's {} active gears moved; profile {profile_after:.1} %), must stay below the scale-up threshold {lim} %",
                    e.active_gears()
                ),
            ));
        }
        if let Some(t) = p.gear_up_threshold.for_profile(&key.profile) {
            let eff = |avail: u32| s.district_free_uids.map_or(avail, |u| avail.min(u));
            let eff_after = ps
                .effective_available_gears
                .saturating_sub(s.effective_available_gears)
                .saturating_add(eff(after.available));
            g.push(reason(
                "no_flap_gear_up",
                eff_after >= t,
                format!(
                    "{eff_after} effective available gears after removal, GEAR_UP_THRESHOLD {t}"
                ),
            ));
        }
    }

    /// Inactive nodes first, then the group's strategy. Never a
    /// do-not-disrupt or cordoned node, one with pinned gears, one already
    /// draining, one OpenShift marks inactive in its district, or a new node
    /// still being added to its district.
    pub(super) fn choose_victim(&self, f: &GroupFacts) -> Result<(String, String), String> {
        let (now, intervals) = (self.now, self.facts.stale_intervals);
        let mut excluded = vec![];
        let mut cands: Vec<&NodeEntry> = vec![];
        for e in self.facts.fleet.in_group(&f.key) {
            let n = &e.report.node;
            if !e.is_fresh(now, intervals) {
                excluded.push(format!("{n} missing"));
            } else if self.facts.saga_of(n).is_some() || self.removing.contains(n) {
                excluded.push(format!("{n} draining"));
            } else if e.district_inactive() {
                // Deactivated in OpenShift by someone else: not gearshift's to empty.
                excluded.push(format!("{n} inactive in its district (OpenShift)"));
            } else if self.facts.joining(n) {
                excluded.push(format!("{n} joining its district"));
            } else if self.facts.cordoned(n) {
                excluded.push(format!("{n} cordoned"));
            } else if self.facts.do_not_disrupt(n) {
                excluded.push(format!("{n} do-not-disrupt"));
            } else if e.report.pinned_gears > 0 {
                excluded.push(format!("{n} has {} pinned gears", e.report.pinned_gears));
            } else {
                cands.push(e);
            }
        }
        let none = |extra: &str| {
            let mut s = format!("no node can be drained{extra}");
            if !excluded.is_empty() {
                s.push_str(&format!(" (excluded: {})", excluded.join(", ")));
            }
            s
        };
        if let Some(e) = cands
            .iter()
            .filter(|e| !e.report.active)
            .min_by_key(|e| (e.total_gears(), e.report.node.clone()))
        {
            return Ok((
                e.report.node.clone(),
                format!("already inactive, {} gears", e.total_gears()),
            ));
        }
        let strategy = f.settings.victim_strategy;
        match pick(strategy, &cands) {
            Some(e) => Ok((
                e.report.node.clone(),
                format!(
                    "{}: {} active of {} gears{}",
                    strategy.as_str(),
                    e.active_gears(),
                    e.total_gears(),
                    match strategy {
                        VictimStrategy::Oldest | VictimStrategy::Newest =>
                            format!(", up since {}", born(e).format("%Y-%m-%d %H:%M:%S UTC")),
                        _ => String::new(),
                    }
                ),
            )),
            None if strategy == VictimStrategy::EmptyOnly => {
                Err(none(" (empty_only: no empty node)"))
            }
            None => Err(none("")),
        }
    }
}

/// The strategy's choice among the (active) candidates. `least_busy`
/// minimises the moves: fewest gears, then fewest active gears.
fn pick<'a>(strategy: VictimStrategy, cands: &[&'a NodeEntry]) -> Option<&'a NodeEntry> {
    let name = |e: &NodeEntry| e.report.node.clone();
    let found = match strategy {
        VictimStrategy::LeastBusy => cands
            .iter()
            .min_by_key(|e| (e.total_gears(), e.active_gears(), name(e))),
        VictimStrategy::EmptyOnly => cands
            .iter()
            .filter(|e| e.total_gears() == 0)
            .min_by_key(|e| name(e)),
        VictimStrategy::Oldest => cands.iter().min_by_key(|e| (born(e), name(e))),
        VictimStrategy::Newest => cands
            .iter()
            .max_by_key(|e| (born(e), std::cmp::Reverse(name(e)))),
    };
    found.copied()
}

/// When the host booted (or was created), as the node reports it; the
/// agent's start for nodes too old to say.
fn born(e: &NodeEntry) -> DateTime<Utc> {
    e.report.booted_at.unwrap_or(e.report.started_at)
}
