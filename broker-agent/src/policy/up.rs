//! Scale-up rules: the profile's demand and where it goes, the group's own
//! triggers, and the guards that hold a scale-up back.

use std::collections::{BTreeMap, BTreeSet};

use gearshift_handlers::GroupKey;
use gearshift_proto::msg::Reason;
use gearshift_proto::routing::NO_DISTRICT;

use super::facts::GroupFacts;
use super::{Eval, Plan, human, reason};
use crate::fleet::usage;
use crate::ops::OpId;

/// What a profile's demand decided for its groups.
#[derive(Debug, Default)]
pub(super) struct ProfilePlan {
    /// The profile's rules, in every group's explanation.
    pub reasons: Vec<Reason>,
    /// The profile needs capacity (even when it cannot act on it): no
    /// scale-down in it.
    pub pressure: bool,
    /// Nodes asked for per group, with why.
    pub assign: BTreeMap<GroupKey, (u32, String)>,
    /// Drains to cancel per group.
    pub cancels: BTreeMap<GroupKey, Vec<OpId>>,
    /// Why the profile needs capacity (the cancels say it).
    pub why: String,
}

impl Eval<'_> {
    /// Every profile's demand, spread over its groups.
    pub(super) fn profile_plans(
        &self,
        all: &BTreeMap<GroupKey, GroupFacts>,
    ) -> BTreeMap<String, ProfilePlan> {
        let profiles: BTreeSet<&String> = all.keys().map(|k| &k.profile).collect();
        profiles
            .into_iter()
            .map(|p| {
                let groups: Vec<&GroupFacts> =
                    all.values().filter(|f| &f.key.profile == p).collect();
                (p.clone(), self.profile_plan(p, &groups))
            })
            .collect()
    }

    fn profile_plan(&self, profile: &str, in_profile: &[&GroupFacts]) -> ProfilePlan {
        let (reasons, want, why) = self.profile_demand(profile, in_profile);
        let mut pp = ProfilePlan {
            reasons,
            why: why.clone(),
            ..Default::default()
        };
        if want == 0 {
            return pp;
        }
        pp.pressure = true;
        let mut remaining = want;
        // Re-activate draining nodes first.
        for f in in_profile {
            for op in &f.cancellable {
                if remaining == 0 {
                    break;
                }
                pp.cancels
                    .entry(f.key.clone())
                    .or_default()
                    .push(op.clone());
                remaining -= 1;
            }
        }
        // Then ask for nodes, in the district with the most free UIDs.
        let mut ranked: Vec<&GroupFacts> = in_profile.to_vec();
        ranked.sort_by(|a, b| {
            let fa = a.stats.district_free_uids.unwrap_or(u32::MAX);
            let fb = b.stats.district_free_uids.unwrap_or(u32::MAX);
            fb.cmp(&fa).then_with(|| a.key.cmp(&b.key))
        });
        let mut refusals = vec![];
        for f in ranked {
            if remaining == 0 {
                break;
            }
            let (ok, guards) = self.up_guards(f);
            if !ok {
                let failed: Vec<String> = guards
                    .iter()
                    .filter(|r| !r.ok)
                    .map(|r| format!("{} ({})", r.rule, r.detail))
                    .collect();
                refusals.push(format!("{}: {}", f.key.district, failed.join("; ")));
                continue;
            }
            let n = remaining.min(self.up_capacity(f));
            if n == 0 {
                continue;
            }
            remaining -= n;
            let free = f
                .stats
                .district_free_uids
                .map_or_else(|| "no district".to_string(), |u| format!("{u} free UIDs"));
            let why = format!(
                "{why}; district {} has the most free capacity ({free})",
                f.key.district
            );
            pp.assign.insert(f.key.clone(), (n, why));
        }
        let placed = want - remaining;
        pp.reasons.push(reason(
            "target_district",
            remaining == 0,
            if remaining == 0 {
                format!("{placed} node(s) placed in the district(s) with the most free capacity")
            } else {
                format!(
                    "{remaining} of {want} node(s) could not be placed: {}",
                    if refusals.is_empty() {
                        "every group is at its limits".to_string()
                    } else {
                        refusals.join(" | ")
                    }
                )
            },
        ));
        pp
    }

    /// Profile-level triggers: (reasons, nodes wanted, why).
    fn profile_demand(&self, profile: &str, groups: &[&GroupFacts]) -> (Vec<Reason>, u32, String) {
        let p = &self.cfg.policy;
        let ps = self
            .facts
            .profile_stats_without(profile, self.now, &self.removing);
        let proj: u32 = groups.iter().map(|f| f.proj_available).sum();
        let booting: u32 = groups.iter().map(|f| f.booting).sum();
        let returning: u32 = groups.iter().map(|f| f.returning).sum();
        let per_node = groups.iter().filter_map(|f| f.per_node_max).max();
        let pu = usage(ps.gears_active, proj);
        let mut reasons = vec![];
        let mut want = 0;
        let mut why = vec![];
        let reporting = ps.nodes_active + ps.nodes_inactive > 0;
        if let Some(th) = p.profile_threshold.for_profile(profile) {
            let over = reporting && pu >= f64::from(th);
            reasons.push(reason(
                "profile_threshold",
                over,
                format!(
                    "profile {profile} at {pu:.1} % active usage{} {} PROFILE_THRESHOLD {th} %",
                    if booting > 0 {
                        format!(" (counting {booting} booting node(s))")
                    } else {
                        String::new()
                    },
                    if over { ">=" } else { "<" }
                ),
            ));
            if over {
                want = 1;
                why.push(format!(
                    "profile {profile} at {pu:.1} % active usage >= PROFILE_THRESHOLD {th} %"
                ));
            }
        }
        if let Some(th) = p.gear_up_threshold.for_profile(profile) {
            let eff = ps
                .effective_available_gears
                .saturating_add(booting * per_node.unwrap_or(0))
                .saturating_add(returning);
            let under = reporting && eff < th;
            reasons.push(reason(
                "gear_up_threshold",
                under,
                format!(
                    "{eff} effective available gears (with booting nodes) {} GEAR_UP_THRESHOLD {th}",
                    if under { "<" } else { ">=" }
                ),
            ));
            if under {
                let size = p.gear_up_size.for_profile(profile).unwrap_or(200);
                let n = match per_node {
                    Some(m) if m > 0 => size.div_ceil(m).max(1),
                    _ => 1,
                };
                want = want.max(n);
                why.push(format!(
                    "profile {profile} has {eff} effective available gears < GEAR_UP_THRESHOLD {th}; GEAR_UP_SIZE {size} gears = {n} node(s)"
                ));
            }
        }
        if want > 0 && ps.nodes_missing > 0 {
            reasons.push(reason(
                "missing_nodes",
                false,
                format!(
                    "{} node(s) of profile {profile} are missing: the figures are incomplete, holding",
                    ps.nodes_missing
                ),
            ));
            // Pressure without action: still blocks scale-down of the profile.
            return (reasons, 0, String::new());
        }
        (reasons, want, why.join("; "))
    }

    /// The group's own triggers (`DISTRICT_THRESHOLD`, `min_nodes`) on top of
    /// what its profile assigned it: more cancels and creates when allowed.
    pub(super) fn group_up(&self, f: &GroupFacts, plan: &mut Plan) {
        let p = &self.cfg.policy;
        let key = &f.key;
        let assigned = plan.creates;
        let mut want = assigned + plan.cancels.len() as u32;
        if let Some(th) = p.district_threshold.get(&key.district, &key.profile) {
            let u = f.proj_usage();
            let over = f.nodes > 0 && u >= f64::from(th);
            plan.reasons.push(reason(
                "district_threshold",
                over,
                format!(
                    "district usage {:.1} % (with booting nodes) {} DISTRICT_THRESHOLD {th} %",
                    u,
                    if over { ">=" } else { "<" }
                ),
            ));
            if over && want == 0 {
                want = 1;
                plan.up_reason.push(format!(
                    "district {} at {u:.1} % active usage >= DISTRICT_THRESHOLD {th} %",
                    key.district
                ));
            }
        }
        let have = f.nodes + f.booting;
        let min = f.settings.min_nodes;
        plan.reasons.push(reason(
            "min_nodes",
            have < min,
            format!("{have} node(s) with booting ones, min_nodes {min}"),
        ));
        if have < min && want < min - have {
            want = min - have;
            plan.up_reason
                .push(format!("{have} node(s) < min_nodes {min}"));
        }
        let planned = assigned + plan.cancels.len() as u32;
        if want <= planned {
            return;
        }
        plan.up_wanted = true;
        let mut extra = want - planned;
        // Re-activate a draining node of this group first.
        for op in &f.cancellable {
            if extra == 0 {
                break;
            }
            if !plan.cancels.contains(op) {
                plan.cancels.push(op.clone());
                extra -= 1;
            }
        }
        if extra == 0 {
            return;
        }
        let (ok, guards) = self.up_guards(f);
        plan.reasons.extend(
            guards
                .into_iter()
                .filter(|r| !self.common.iter().any(|c| c.rule == r.rule)),
        );
        if ok {
            let cap = self.up_capacity(f).saturating_sub(assigned);
            plan.creates += extra.min(cap);
        }
    }

    /// How many more scale-ups a group may have now.
    fn up_capacity(&self, f: &GroupFacts) -> u32 {
        let max_more = f.settings.max_nodes.saturating_sub(f.nodes + f.booting);
        let flight_more = self
            .cfg
            .policy
            .max_scale_ups_in_flight
            .saturating_sub(f.booting);
        max_more.min(flight_more)
    }

    /// Rules that hold a scale-up back; (all ok, reasons).
    fn up_guards(&self, f: &GroupFacts) -> (bool, Vec<Reason>) {
        let p = &self.cfg.policy;
        let now = self.now;
        let supply = self.memory.group(&f.key).supply;
        let mut r: Vec<Reason> = self.common.clone();
        r.push(self.missing_rule(f));
        r.push(self.fresh_rule(f));
        r.push(match &supply.exhausted {
            Some(e) => reason(
                "exhausted",
                false,
                format!(
                    "the cloud has no capacity since {} ({}); next check in {}",
                    e.since.format("%H:%M:%S"),
                    e.reason,
                    human(e.next_check - now)
                ),
            ),
            None => reason("exhausted", true, "the cloud has not refused for quota"),
        });
        r.push(match supply.backoff_until {
            Some(t) if t > now => reason(
                "backoff",
                false,
                format!(
                    "{} failed scale-up(s) in a row; next attempt in {}",
                    supply.up_failures,
                    human(t - now)
                ),
            ),
            _ => reason("backoff", true, "no recent scale-up failure"),
        });
        if f.key.district == NO_DISTRICT && self.districted.contains(&f.key.profile) {
            r.push(reason(
                "districted_target",
                false,
                format!(
                    "undistricted nodes are not scale-up targets: profile {} has districts",
                    f.key.profile
                ),
            ));
        }
        let cap_max = f.settings.max_nodes.saturating_sub(f.nodes + f.booting);
        r.push(reason(
            "max_nodes",
            cap_max > 0,
            format!(
                "{} node(s) + {} booting of max_nodes {}",
                f.nodes, f.booting, f.settings.max_nodes
            ),
        ));
        r.push(reason(
            "scale_ups_in_flight",
            f.booting < p.max_scale_ups_in_flight,
            format!(
                "{} in flight, at most {}",
                f.booting, p.max_scale_ups_in_flight
            ),
        ));
        // GEAR_EXPECTED_ACTIVE_PERCENT: a new node needs UIDs for all its gears.
        if let (Some(free), Some(m)) = (f.stats.district_free_uids, f.per_node_max) {
            let pct = p
                .gear_expected_active_percent
                .get(&f.key.district, &f.key.profile)
                .unwrap_or(100)
                .max(1);
            let need = u64::from(m) * 100 / u64::from(pct);
            r.push(reason(
                "district_room",
                u64::from(free) >= need,
                format!(
                    "{free} free UIDs; a node of {m} active gears at GEAR_EXPECTED_ACTIVE_PERCENT {pct} % holds about {need} gears"
                ),
            ));
        }
        (r.iter().all(|x| x.ok), r)
    }
}
