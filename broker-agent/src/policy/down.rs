//! Scale-down rules: the triggers, the stabilization window, the cooldowns
//! and budgets; the victim and its absorb and no-flap checks are in
//! `victim.rs`.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{Outcome, Reason};

use super::facts::GroupFacts;
use super::{Drain, Eval, Plan, ago, budget, human, reason};
use crate::core::actions::dur;
use crate::ops::{GroupMemory, Origin};

/// What the scale-down rules decided for a group.
pub(super) struct DownVerdict {
    pub outcome: Outcome,
    pub summary: String,
    pub drain: Option<Drain>,
    /// The group's `underused_since` after this evaluation.
    pub underused_since: Option<DateTime<Utc>>,
}

/// Why a group is under-used: `COMPACT_THRESHOLD` (with its value) or
/// `GEAR_DOWN_THRESHOLD`.
struct Underused {
    compact: Option<u32>,
    under_compact: bool,
    under_gear_down: bool,
}

impl Eval<'_> {
    pub(super) fn scale_down(
        &self,
        f: &GroupFacts,
        plan: &mut Plan,
        fleet_draining: u32,
    ) -> DownVerdict {
        let under = self.underused(f, plan);
        if !(under.under_compact || under.under_gear_down) {
            return DownVerdict {
                outcome: Outcome::None,
                summary: "within thresholds: nothing to do".into(),
                drain: None,
                underused_since: None,
            };
        }
        let memory = self.memory.group(&f.key).memory;
        let since = memory.underused_since.unwrap_or(self.now);
        let mut g = self.down_guards(f, &memory, since);
        g.extend(self.budgets(f, fleet_draining));
        let victim = self.choose_victim(f);
        match &victim {
            Ok((node, why)) => g.push(reason("victim", true, format!("{node}: {why}"))),
            Err(why) => g.push(reason("victim", false, why.clone())),
        }
        if let Ok((node, _)) = &victim
            && let Some(e) = self.facts.fleet.get(node)
        {
            self.victim_rules(f, e, &mut g);
        }
        let ok = g.iter().all(|r| r.ok) && self.common.iter().all(|r| r.ok);
        plan.reasons.extend(g.clone());
        let held = |summary: String| DownVerdict {
            outcome: Outcome::Held,
            summary,
            drain: None,
            underused_since: Some(since),
        };
        if !ok {
            let failed: Vec<String> = g
                .iter()
                .chain(self.common.iter())
                .filter(|r| !r.ok)
                .map(|r| format!("{} ({})", r.rule, r.detail))
                .collect();
            return held(format!("scale-down wanted but held: {}", failed.join("; ")));
        }
        match victim {
            Ok((node, why)) => self.drain(f, &under, since, node, why),
            Err(_) => held("no victim".into()),
        }
    }

    /// The scale-down triggers, with their reasons.
    fn underused(&self, f: &GroupFacts, plan: &mut Plan) -> Underused {
        let p = &self.cfg.policy;
        let (key, s) = (&f.key, &f.stats);
        let reporting = s.nodes_active + s.nodes_inactive;
        let compact = p.compact_threshold.get(&key.district, &key.profile);
        let under_compact = compact.is_some_and(|c| reporting > 0 && s.usage_pct < f64::from(c));
        if let Some(c) = compact {
            plan.reasons.push(reason(
                "compact_threshold",
                under_compact,
                format!(
                    "district usage {:.1} % {} COMPACT_THRESHOLD {c} %",
                    s.usage_pct,
                    if under_compact { "<" } else { ">=" }
                ),
            ));
        }
        let mut under_gear_down = false;
        if let Some(t) = p.gear_down_threshold.for_profile(&key.profile) {
            let ps = self
                .facts
                .profile_stats_without(&key.profile, self.now, &self.removing);
            under_gear_down = reporting > 0 && ps.available_active_gears >= t;
            plan.reasons.push(reason(
                "gear_down_threshold",
                under_gear_down,
                format!(
                    "profile has {} available gears {} GEAR_DOWN_THRESHOLD {t}",
                    ps.available_active_gears,
                    if under_gear_down { ">=" } else { "<" }
                ),
            ));
        }
        Underused {
            compact,
            under_compact,
            under_gear_down,
        }
    }

    /// The verdict that drains `node`.
    fn drain(
        &self,
        f: &GroupFacts,
        under: &Underused,
        since: DateTime<Utc>,
        node: String,
        why: String,
    ) -> DownVerdict {
        let (key, s) = (&f.key, &f.stats);
        let trig = if under.under_compact {
            format!(
                "district {} at {:.1} % active usage < COMPACT_THRESHOLD {} % for {}",
                key.district,
                s.usage_pct,
                under.compact.unwrap_or(0),
                ago(self.now - since)
            )
        } else {
            format!(
                "profile {} has more available gears than GEAR_DOWN_THRESHOLD",
                key.profile
            )
        };
        let reason_text = format!("{trig}; victim {node} ({why})");
        DownVerdict {
            outcome: Outcome::ScaleDown,
            summary: format!("draining one node: {reason_text}"),
            drain: Some(Drain {
                node,
                origin: Origin::Policy {
                    strategy: f.settings.victim_strategy.as_str().to_string(),
                },
                reason: reason_text,
            }),
            underused_since: None,
        }
    }

    /// Stabilization, missing nodes, fresh reports, cooldowns, scale-ups in
    /// flight.
    fn down_guards(
        &self,
        f: &GroupFacts,
        memory: &GroupMemory,
        since: DateTime<Utc>,
    ) -> Vec<Reason> {
        let p = &self.cfg.policy;
        let now = self.now;
        let window = dur(p.scale_down_stabilization);
        vec![
            reason(
                "stabilization",
                now - since >= window,
                format!(
                    "under the threshold for {}, window {}",
                    ago(now - since),
                    human(window)
                ),
            ),
            self.missing_rule(f),
            self.fresh_rule(f),
            self.cooldown(
                "cooldown_after_scale_up",
                memory.last_scale_up,
                p.cooldown_after_scale_up,
                "scale-up",
            ),
            self.cooldown(
                "cooldown_after_scale_down",
                memory.last_scale_down,
                p.cooldown_after_scale_down,
                "scale-down",
            ),
            self.cooldown(
                "cooldown_after_failure",
                memory.last_failure,
                p.cooldown_after_failure,
                "failed scale-down",
            ),
            reason(
                "scale_up_in_flight",
                f.booting == 0,
                format!("{} scale-up(s) in flight", f.booting),
            ),
        ]
    }

    /// No `what` within `d` of `last`.
    fn cooldown(
        &self,
        rule: &str,
        last: Option<DateTime<Utc>>,
        d: std::time::Duration,
        what: &str,
    ) -> Reason {
        let (now, d) = (self.now, dur(d));
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
    }

    /// `min_nodes` and the disruption budgets of the group and the fleet.
    fn budgets(&self, f: &GroupFacts, fleet_draining: u32) -> Vec<Reason> {
        let p = &self.cfg.policy;
        let remaining_nodes = f.nodes.saturating_sub(f.draining);
        let gbudget = budget(f.nodes, p.disruption_budget_percent);
        let fleet_nodes = self.facts.fleet.len() as u32;
        let fbudget = budget(fleet_nodes, p.fleet_disruption_budget_percent);
        vec![
            reason(
                "min_nodes",
                remaining_nodes > f.settings.min_nodes,
                format!(
                    "{remaining_nodes} node(s) not draining, min_nodes {}",
                    f.settings.min_nodes
                ),
            ),
            reason(
                "disruption_budget",
                f.draining < gbudget,
                format!(
                    "{} draining, budget {gbudget} ({} % of {} nodes, at least 1)",
                    f.draining, p.disruption_budget_percent, f.nodes
                ),
            ),
            reason(
                "fleet_disruption_budget",
                fleet_draining < fbudget,
                format!(
                    "{fleet_draining} draining in the fleet, budget {fbudget} ({} % of {fleet_nodes} nodes, at least 1)",
                    p.fleet_disruption_budget_percent
                ),
            ),
        ]
    }
}
