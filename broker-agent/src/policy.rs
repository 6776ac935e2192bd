//! The scaling policy: one evaluation of every node group, pure.
//!
//! Scale-up triggers, per profile: `PROFILE_THRESHOLD` (usage of the
//! profile, to its district with the most free UIDs), `GEAR_UP_THRESHOLD`
//! (too few effective available gears, `GEAR_UP_SIZE` gears' worth of
//! nodes); per group: `DISTRICT_THRESHOLD` and `min_nodes`. Booting nodes
//! count as capacity, so one burst of load asks for one node, not one per
//! evaluation. A draining node is re-activated before a new one is asked for.
//!
//! Scale-down: a group below `COMPACT_THRESHOLD` (or a profile with more
//! than `GEAR_DOWN_THRESHOLD` available gears) for the stabilization window,
//! outside every cooldown, within the disruption budgets, with a victim
//! whose active gears fit on the rest of its district and whose removal does
//! not push the group back over a scale-up threshold.
//!
//! Guards on both: the stale-node breaker, the start-up grace, missing nodes
//! (the figures are unreliable), and reports newer than the group's last
//! decision. Every rule consulted ends up in the group's explanation.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{DecisionKind, Explanation, GroupStats, Outcome, Reason};
use gearshift_proto::routing::ALL;

use crate::config::{GroupSettings, VictimStrategy};
use crate::core::{Action, Core, dur};
use crate::fleet::{NodeEntry, usage};
use crate::ops::{OpBody, OpId, Origin};

fn reason(rule: &str, ok: bool, detail: impl Into<String>) -> Reason {
    Reason {
        rule: rule.to_string(),
        ok,
        detail: detail.into(),
    }
}

fn ago(d: Duration) -> String {
    human(d)
}

fn human(d: Duration) -> String {
    let d = d.to_std().unwrap_or_default();
    humantime::format_duration(std::time::Duration::from_secs(d.as_secs())).to_string()
}

/// What one evaluation knows about a group.
#[derive(Debug, Clone)]
struct Facts {
    key: GroupKey,
    settings: GroupSettings,
    stats: GroupStats,
    /// Known nodes (reporting or missing), not being removed.
    nodes: u32,
    /// Scale-ups not finished.
    booting: u32,
    /// Scale-downs not finished.
    draining: u32,
    /// Drains that can still be cancelled.
    cancellable: Vec<OpId>,
    /// `max_active_gears` of a node of this group (largest seen), if any is known.
    per_node_max: Option<u32>,
    /// Available active gears plus what booting nodes will bring.
    proj_available: u32,
}

impl Facts {
    fn proj_usage(&self) -> f64 {
        usage(self.stats.gears_active, self.proj_available)
    }
}

/// What one group's evaluation decided.
#[derive(Default)]
struct Plan {
    reasons: Vec<Reason>,
    creates: u32,
    cancels: Vec<OpId>,
    up_wanted: bool,
    up_reason: Vec<String>,
}

impl Core {
    /// One evaluation of every group: decisions, explanations, new sagas.
    pub fn evaluate(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        self.eval_due = None;
        self.last_eval = Some(now);
        let mut out = vec![];
        let p = self.cfg.policy.clone();
        let intervals = self.stale_intervals();

        // Forget nodes missing for too long (unless a saga still needs them).
        for node in self.fleet.long_missing(now, dur(p.forget_missing_after)) {
            if self.saga_of(&node).is_none() {
                tracing::warn!(node, "missing for too long: forgotten");
                self.fleet.forget(&node);
            }
        }

        // The breaker.
        let removing = self.removing_nodes();
        let (missing, known) = self
            .fleet
            .staleness(now, intervals, &|n| removing.contains(n));
        let open = known > 0 && missing * 100 > p.breaker_stale_percent as usize * known;
        let breaker_detail = format!(
            "{missing} of {known} nodes missing; the breaker opens above {} %",
            p.breaker_stale_percent
        );
        if open != self.meta.breaker_open {
            self.meta.breaker_open = open;
            self.changes.meta = true;
            let all = GroupKey {
                district: ALL.into(),
                profile: ALL.into(),
            };
            let kind = if open {
                DecisionKind::BreakerOpen
            } else {
                DecisionKind::BreakerClosed
            };
            let what = if open {
                "all scaling stopped"
            } else {
                "scaling resumes"
            };
            out.push(self.decision(
                kind,
                &all,
                None,
                None,
                format!("{breaker_detail}: {what}"),
                None,
                None,
            ));
        }
        let common = vec![reason("breaker", !open, breaker_detail), {
            let up = now - self.started;
            let grace = dur(p.startup_grace);
            reason(
                "startup_grace",
                up >= grace,
                format!("agent up {}, grace {}", ago(up), human(grace)),
            )
        }];

        // Facts per group.
        let mut keys: BTreeSet<GroupKey> = self.fleet.groups().into_iter().collect();
        keys.extend(self.cfg.configured_groups());
        keys.extend(
            self.ops
                .values()
                .filter(|o| !o.is_done())
                .map(|o| o.group.clone()),
        );
        let facts: BTreeMap<GroupKey, Facts> = keys
            .iter()
            .map(|k| (k.clone(), self.facts(k, now)))
            .collect();

        // Profile-level scale-up: choose target groups.
        let profiles: BTreeSet<String> = keys.iter().map(|k| k.profile.clone()).collect();
        let mut assign: BTreeMap<GroupKey, (u32, String)> = BTreeMap::new();
        let mut cancels: BTreeMap<GroupKey, Vec<OpId>> = BTreeMap::new();
        let mut profile_reasons: BTreeMap<String, Vec<Reason>> = BTreeMap::new();
        let mut profile_pressure: BTreeSet<String> = BTreeSet::new();
        for profile in &profiles {
            let in_profile: Vec<&Facts> = facts
                .values()
                .filter(|f| &f.key.profile == profile)
                .collect();
            let (reasons, want, why) = self.profile_demand(profile, &in_profile, now);
            let mut reasons = reasons;
            if want == 0 {
                profile_reasons.insert(profile.clone(), reasons);
                continue;
            }
            profile_pressure.insert(profile.clone());
            let mut remaining = want;
            // Re-activate draining nodes first.
            for f in &in_profile {
                for op in &f.cancellable {
                    if remaining == 0 {
                        break;
                    }
                    cancels.entry(f.key.clone()).or_default().push(op.clone());
                    remaining -= 1;
                }
            }
            // Then ask for nodes, in the district with the most free UIDs.
            let mut ranked: Vec<&Facts> = in_profile.clone();
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
                let (ok, guards) = self.up_guards(f, &common, now);
                if !ok {
                    let failed: Vec<String> = guards
                        .iter()
                        .filter(|r| !r.ok)
                        .map(|r| format!("{} ({})", r.rule, r.detail))
                        .collect();
                    refusals.push(format!("{}: {}", f.key.district, failed.join("; ")));
                    continue;
                }
                let cap = self.up_capacity(f);
                let n = remaining.min(cap);
                if n == 0 {
                    continue;
                }
                remaining -= n;
                let free = f
                    .stats
                    .district_free_uids
                    .map_or_else(|| "no district".to_string(), |u| format!("{u} free UIDs"));
                assign.insert(
                    f.key.clone(),
                    (
                        n,
                        format!(
                            "{why}; district {} has the most free capacity ({free})",
                            f.key.district
                        ),
                    ),
                );
            }
            let placed = want - remaining;
            reasons.push(reason(
                "target_district",
                remaining == 0,
                if remaining == 0 {
                    format!(
                        "{placed} node(s) placed in the district(s) with the most free capacity"
                    )
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
            profile_reasons.insert(profile.clone(), reasons);
        }

        // Each group.
        let mut fleet_draining: u32 = self
            .ops
            .values()
            .filter(|o| !o.is_done() && matches!(o.body, OpBody::ScaleDown(_)))
            .count() as u32;
        let fleet_nodes = self.fleet.len() as u32;
        for (key, f) in &facts {
            let mut plan = Plan {
                reasons: common.clone(),
                ..Default::default()
            };
            plan.reasons.extend(
                profile_reasons
                    .get(&key.profile)
                    .cloned()
                    .unwrap_or_default(),
            );
            let (assigned, assigned_why) = assign.get(key).cloned().unwrap_or((0, String::new()));
            if assigned > 0 {
                plan.up_wanted = true;
                plan.up_reason.push(assigned_why);
            }
            plan.cancels = cancels.get(key).cloned().unwrap_or_default();
            if !plan.cancels.is_empty() {
                plan.up_wanted = true;
            }
            plan.creates = assigned;
            // Group-level scale-up triggers.
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
            if want > assigned + plan.cancels.len() as u32 {
                plan.up_wanted = true;
                let mut extra = want - assigned - plan.cancels.len() as u32;
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
                if extra > 0 {
                    let (ok, guards) = self.up_guards(f, &common, now);
                    plan.reasons.extend(
                        guards
                            .into_iter()
                            .filter(|r| !common.iter().any(|c| c.rule == r.rule)),
                    );
                    if ok {
                        let cap = self.up_capacity(f).saturating_sub(assigned);
                        plan.creates += extra.min(cap);
                    }
                }
            }

            let stats = f.stats.clone();
            let outcome;
            let summary;
            if plan.up_wanted {
                // Cancel drains, then create.
                let why = plan.up_reason.join("; ");
                for op in plan.cancels.clone() {
                    out.extend(self.down_abort(
                        &op,
                        format!("scale-up pressure: {why}"),
                        true,
                        now,
                    ));
                }
                for _ in 0..plan.creates {
                    let (_, acts) = self.start_scale_up(key, why.clone(), now);
                    out.extend(acts);
                }
                if !plan.cancels.is_empty() {
                    outcome = Outcome::DrainCancelled;
                    summary = format!(
                        "re-activating {} draining node(s) instead of booting new ones{}: {why}",
                        plan.cancels.len(),
                        if plan.creates > 0 {
                            format!(", and asking for {} node(s)", plan.creates)
                        } else {
                            String::new()
                        }
                    );
                } else if plan.creates > 0 {
                    outcome = Outcome::ScaleUp;
                    summary = format!("asking for {} node(s): {why}", plan.creates);
                } else {
                    outcome = Outcome::Held;
                    let held: Vec<String> = plan
                        .reasons
                        .iter()
                        .filter(|r| !r.ok && is_guard(&r.rule))
                        .map(|r| format!("{} ({})", r.rule, r.detail))
                        .collect();
                    summary = format!(
                        "scale-up wanted but held: {}",
                        if held.is_empty() {
                            "the profile's scale-up goes to another district".to_string()
                        } else {
                            held.join("; ")
                        }
                    );
                }
            } else if profile_pressure.contains(&key.profile) {
                outcome = Outcome::None;
                summary = format!(
                    "profile {} needs capacity (see profile rules); no scale-down while it does",
                    key.profile
                );
            } else {
                let (o, s, acts) =
                    self.scale_down_rules(f, &mut plan, &common, fleet_draining, fleet_nodes, now);
                if o == Outcome::ScaleDown {
                    fleet_draining += 1;
                }
                out.extend(acts);
                outcome = o;
                summary = s;
            }
            let in_flight: Vec<String> = self
                .ops
                .values()
                .filter(|o| !o.is_done() && &o.group == key)
                .map(|o| o.id.clone())
                .collect();
            out.push(Action::Explain(Explanation {
                district: key.district.clone(),
                profile: key.profile.clone(),
                evaluated_at: now,
                outcome,
                summary,
                reasons: plan.reasons,
                stats,
                ops_in_flight: in_flight,
            }));
        }
        out
    }

    fn facts(&self, key: &GroupKey, now: DateTime<Utc>) -> Facts {
        let removing = self.removing_nodes();
        let stats = self.group_stats(key, now);
        let nodes = self
            .fleet
            .in_group(key)
            .filter(|e| !removing.contains(&e.report.node))
            .count() as u32;
        let mut booting = 0;
        let mut draining = 0;
        let mut cancellable = vec![];
        for op in self
            .ops
            .values()
            .filter(|o| !o.is_done() && &o.group == key)
        {
            match &op.body {
                OpBody::ScaleUp(_) => booting += 1,
                OpBody::ScaleDown(d) => {
                    draining += 1;
                    if d.step.cancellable() {
                        cancellable.push(op.id.clone());
                    }
                }
            }
        }
        let per_node_max = self
            .fleet
            .in_group(key)
            .map(|e| e.report.max_active_gears)
            .max()
            .or_else(|| {
                self.fleet
                    .nodes()
                    .filter(|e| e.report.profile == key.profile)
                    .map(|e| e.report.max_active_gears)
                    .max()
            });
        let proj_available = stats
            .available_active_gears
            .saturating_add(booting * per_node_max.unwrap_or(0));
        Facts {
            key: key.clone(),
            settings: self.cfg.group(key),
            stats,
            nodes,
            booting,
            draining,
            cancellable,
            per_node_max,
            proj_available,
        }
    }

    /// Profile-level triggers: (reasons, nodes wanted, why).
    fn profile_demand(
        &self,
        profile: &str,
        groups: &[&Facts],
        now: DateTime<Utc>,
    ) -> (Vec<Reason>, u32, String) {
        let p = &self.cfg.policy;
        let ps = self.profile_stats(profile, now);
        let proj: u32 = groups.iter().map(|f| f.proj_available).sum();
        let booting: u32 = groups.iter().map(|f| f.booting).sum();
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
                .saturating_add(booting * per_node.unwrap_or(0));
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

    /// How many more scale-ups a group may have now.
    fn up_capacity(&self, f: &Facts) -> u32 {
        let max_more = f.settings.max_nodes.saturating_sub(f.nodes + f.booting);
        let flight_more = self
            .cfg
            .policy
            .max_scale_ups_in_flight
            .saturating_sub(f.booting);
        max_more.min(flight_more)
    }

    /// Rules that hold a scale-up back; (all ok, reasons).
    fn up_guards(&self, f: &Facts, common: &[Reason], now: DateTime<Utc>) -> (bool, Vec<Reason>) {
        let p = &self.cfg.policy;
        let gs = self.group_state(&f.key);
        let mut r: Vec<Reason> = common.to_vec();
        r.push(self.missing_rule(f));
        r.push(self.fresh_rule(f, now));
        r.push(match &gs.exhausted {
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
        r.push(match gs.backoff_until {
            Some(t) if t > now => reason(
                "backoff",
                false,
                format!(
                    "{} failed scale-up(s) in a row; next attempt in {}",
                    gs.up_failures,
                    human(t - now)
                ),
            ),
            _ => reason("backoff", true, "no recent scale-up failure"),
        });
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

    fn missing_rule(&self, f: &Facts) -> Reason {
        reason(
            "missing_nodes",
            f.stats.nodes_missing == 0,
            format!("{} node(s) missing", f.stats.nodes_missing),
        )
    }

    /// Decisions only on reports newer than the group's last decision.
    fn fresh_rule(&self, f: &Facts, now: DateTime<Utc>) -> Reason {
        let gs = self.group_state(&f.key);
        let Some(last) = gs.last_decision else {
            return reason("fresh_reports", true, "no earlier decision");
        };
        let intervals = self.stale_intervals();
        let old: Vec<&NodeEntry> = self
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

    #[allow(clippy::too_many_arguments)]
    fn scale_down_rules(
        &mut self,
        f: &Facts,
        plan: &mut Plan,
        common: &[Reason],
        fleet_draining: u32,
        fleet_nodes: u32,
        now: DateTime<Utc>,
    ) -> (Outcome, String, Vec<Action>) {
        let p = self.cfg.policy.clone();
        let key = &f.key;
        let s = &f.stats;
        let reporting = s.nodes_active + s.nodes_inactive;
        let compact = p.compact_threshold.get(&key.district, &key.profile);
        let under_c = compact.is_some_and(|c| reporting > 0 && s.usage_pct < f64::from(c));
        if let Some(c) = compact {
            plan.reasons.push(reason(
                "compact_threshold",
                under_c,
                format!(
                    "district usage {:.1} % {} COMPACT_THRESHOLD {c} %",
                    s.usage_pct,
                    if under_c { "<" } else { ">=" }
                ),
            ));
        }
        let mut under_g = false;
        if let Some(t) = p.gear_down_threshold.for_profile(&key.profile) {
            let ps = self.profile_stats(&key.profile, now);
            under_g = reporting > 0 && ps.available_active_gears >= t;
            plan.reasons.push(reason(
                "gear_down_threshold",
                under_g,
                format!(
                    "profile has {} available gears {} GEAR_DOWN_THRESHOLD {t}",
                    ps.available_active_gears,
                    if under_g { ">=" } else { "<" }
                ),
            ));
        }
        let underused = under_c || under_g;
        let gs = self.group_state(key);
        if !underused {
            if gs.underused_since.is_some() {
                self.group_mut(key).underused_since = None;
            }
            return (
                Outcome::None,
                "within thresholds: nothing to do".into(),
                vec![],
            );
        }
        let since = match gs.underused_since {
            Some(t) => t,
            None => {
                self.group_mut(key).underused_since = Some(now);
                now
            }
        };
        let mut g: Vec<Reason> = vec![];
        let window = dur(p.scale_down_stabilization);
        g.push(reason(
            "stabilization",
            now - since >= window,
            format!(
                "under the threshold for {}, window {}",
                ago(now - since),
                human(window)
            ),
        ));
        g.push(self.missing_rule(f));
        g.push(self.fresh_rule(f, now));
        let cool = |rule: &str, last: Option<DateTime<Utc>>, d: std::time::Duration, what: &str| {
            let d = dur(d);
            match last {
                Some(t) if now - t < d => reason(
                    rule,
                    false,
                    format!(
                        "last {what} {} ago, cooldown {} ({} left)",
                        ago(now - t),
                        human(d),
                        human(d - (now - t))
                    ),
                ),
                Some(t) => reason(
                    rule,
                    true,
                    format!("last {what} {} ago, cooldown {}", ago(now - t), human(d)),
                ),
                None => reason(rule, true, format!("no {what} yet")),
            }
        };
        g.push(cool(
            "cooldown_after_scale_up",
            gs.last_scale_up,
            p.cooldown_after_scale_up,
            "scale-up",
        ));
        g.push(cool(
            "cooldown_after_scale_down",
            gs.last_scale_down,
            p.cooldown_after_scale_down,
            "scale-down",
        ));
        g.push(cool(
            "cooldown_after_failure",
            gs.last_failure,
            p.cooldown_after_failure,
            "failed scale-down",
        ));
        g.push(reason(
            "scale_up_in_flight",
            f.booting == 0,
            format!("{} scale-up(s) in flight", f.booting),
        ));
        let remaining_nodes = f.nodes.saturating_sub(f.draining);
        g.push(reason(
            "min_nodes",
            remaining_nodes > f.settings.min_nodes,
            format!(
                "{remaining_nodes} node(s) not draining, min_nodes {}",
                f.settings.min_nodes
            ),
        ));
        let gbudget = budget(f.nodes, p.disruption_budget_percent);
        g.push(reason(
            "disruption_budget",
            f.draining < gbudget,
            format!(
                "{} draining, budget {gbudget} ({} % of {} nodes, at least 1)",
                f.draining, p.disruption_budget_percent, f.nodes
            ),
        ));
        let fbudget = budget(fleet_nodes, p.fleet_disruption_budget_percent);
        g.push(reason(
            "fleet_disruption_budget",
            fleet_draining < fbudget,
            format!(
                "{fleet_draining} draining in the fleet, budget {fbudget} ({} % of {fleet_nodes} nodes, at least 1)",
                p.fleet_disruption_budget_percent
            ),
        ));
        // The victim.
        let victim = self.choose_victim(f, now);
        match &victim {
            Ok((node, why)) => g.push(reason("victim", true, format!("{node}: {why}"))),
            Err(why) => g.push(reason("victim", false, why.clone())),
        }
        if let Ok((node, _)) = &victim {
            let e = self.fleet.get(node).cloned();
            if let Some(e) = e {
                let room = self.room_without(key, node, now);
                // Every gear takes a slot on its target (an idle gear wakes up on
                // its next request), as the evacuation planner counts them.
                let need = e.total_gears();
                g.push(reason(
                    "absorb",
                    room >= need,
                    format!(
                        "the rest of the district has room for {room} gears, {node} has {need}"
                    ),
                ));
                let avail_after = s
                    .available_active_gears
                    .saturating_sub(e.available_active());
                let after = usage(s.gears_active, avail_after);
                let limits = [
                    p.profile_threshold.get(&key.district, &key.profile),
                    p.district_threshold.get(&key.district, &key.profile),
                ];
                let lim = limits.iter().flatten().min().copied();
                if let Some(lim) = lim {
                    g.push(reason(
                        "no_flap",
                        after < f64::from(lim),
                        format!("usage after removal {after:.1} %, must stay below the scale-up threshold {lim} %"),
                    ));
                }
                if let Some(t) = p.gear_up_threshold.for_profile(&key.profile) {
                    let ps = self.profile_stats(&key.profile, now);
                    let eff_after = ps
                        .effective_available_gears
                        .saturating_sub(e.available_active());
                    g.push(reason(
                        "no_flap_gear_up",
                        eff_after >= t,
                        format!("{eff_after} effective available gears after removal, GEAR_UP_THRESHOLD {t}"),
                    ));
                }
            }
        }
        let ok = g.iter().all(|r| r.ok) && common.iter().all(|r| r.ok);
        plan.reasons.extend(g.clone());
        if !ok {
            let held: Vec<String> = g
                .iter()
                .chain(common.iter())
                .filter(|r| !r.ok)
                .map(|r| format!("{} ({})", r.rule, r.detail))
                .collect();
            return (
                Outcome::Held,
                format!("scale-down wanted but held: {}", held.join("; ")),
                vec![],
            );
        }
        let Ok((node, why)) = victim else {
            return (Outcome::Held, "no victim".into(), vec![]);
        };
        let trig = if under_c {
            format!(
                "district {} at {:.1} % active usage < COMPACT_THRESHOLD {} % for {}",
                key.district,
                s.usage_pct,
                compact.unwrap_or(0),
                ago(now - since)
            )
        } else {
            format!(
                "profile {} has more available gears than GEAR_DOWN_THRESHOLD",
                key.profile
            )
        };
        let reason_text = format!("{trig}; victim {node} ({why})");
        let (_, acts) = self.start_scale_down(
            key,
            &node,
            Origin::Policy {
                strategy: f.settings.victim_strategy.as_str().to_string(),
            },
            reason_text.clone(),
            now,
        );
        self.group_mut(key).underused_since = None;
        (
            Outcome::ScaleDown,
            format!("draining one node: {reason_text}"),
            acts,
        )
    }

    /// Inactive nodes first, then the group's strategy. Never a
    /// do-not-disrupt node, one with pinned gears, or one already draining.
    fn choose_victim(&self, f: &Facts, now: DateTime<Utc>) -> Result<(String, String), String> {
        let intervals = self.stale_intervals();
        let mut excluded = vec![];
        let mut cands: Vec<&NodeEntry> = vec![];
        for e in self.fleet.in_group(&f.key) {
            let n = &e.report.node;
            if !e.is_fresh(now, intervals) {
                excluded.push(format!("{n} missing"));
            } else if self.saga_of(n).is_some() || self.removing_nodes().contains(n) {
                excluded.push(format!("{n} draining"));
            } else if e.report.do_not_disrupt || self.marks.contains(n) {
                excluded.push(format!("{n} do-not-disrupt"));
            } else if e.report.pinned_gears > 0 {
                excluded.push(format!("{n} has {} pinned gears", e.report.pinned_gears));
            } else {
                cands.push(e);
            }
        }
        let strategy = f.settings.victim_strategy;
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
        let pick = match strategy {
            VictimStrategy::LeastBusy => cands
                .iter()
                .min_by_key(|e| (e.active_gears(), e.total_gears(), e.report.node.clone())),
            VictimStrategy::EmptyOnly => cands
                .iter()
                .filter(|e| e.total_gears() == 0)
                .min_by_key(|e| e.report.node.clone()),
            VictimStrategy::Oldest => cands
                .iter()
                .min_by_key(|e| (e.report.started_at, e.report.node.clone())),
            VictimStrategy::Newest => cands.iter().max_by_key(|e| {
                (
                    e.report.started_at,
                    std::cmp::Reverse(e.report.node.clone()),
                )
            }),
        };
        match pick {
            Some(e) => Ok((
                e.report.node.clone(),
                format!(
                    "{}: {} active of {} gears",
                    strategy.as_str(),
                    e.active_gears(),
                    e.total_gears()
                ),
            )),
            None if strategy == VictimStrategy::EmptyOnly => {
                Err(none(" (empty_only: no empty node)"))
            }
            None => Err(none("")),
        }
    }
}

/// `percent` of `nodes`, at least 1.
pub fn budget(nodes: u32, percent: u32) -> u32 {
    (nodes * percent / 100).max(1)
}

fn is_guard(rule: &str) -> bool {
    !matches!(
        rule,
        "profile_threshold"
            | "district_threshold"
            | "gear_up_threshold"
            | "min_nodes"
            | "compact_threshold"
            | "gear_down_threshold"
    )
}
