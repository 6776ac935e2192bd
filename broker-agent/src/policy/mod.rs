//! The scaling policy: one evaluation of every node group, read-only:
//! [`evaluate`]`(facts, config, memory, now) -> verdicts`. The coordinator
//! ([`crate::core::Core::evaluate`]) turns the verdicts into saga starts and
//! aborts and updates the memory from them.
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
//! OpenShift's own state counts: a node its district marks inactive
//! (`district_active = false`) is neither capacity nor a victim, and a
//! profile with districts never grows its undistricted (`_none`) group.
//!
//! Guards on both: the stale-node breaker, the start-up grace, missing nodes
//! (the figures are unreliable), and reports newer than the group's last
//! decision. Every rule consulted ends up in the group's explanation.
//!
//! Layout: this file holds the inputs, the verdicts and the walk over the
//! groups; `facts.rs` what one evaluation knows of a group, `up.rs` the
//! scale-up rules, `down.rs` the scale-down rules, `victim.rs` the victim
//! choice and its absorb and no-flap checks, `pause.rs` an operator's pause.

mod down;
mod facts;
mod pause;
mod up;
mod victim;

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{Explanation, Outcome, Reason};
use gearshift_proto::routing::{ALL, NO_DISTRICT};
use serde::{Deserialize, Serialize};

use crate::config::BrokerConfig;
use crate::core::actions::dur;
use crate::core::facts::Facts;
use crate::ops::{GroupState, OpId, Origin};

use self::facts::GroupFacts;
use self::up::ProfilePlan;

/// What the policy remembers of a group between evaluations (journaled with
/// the group, see [`GroupState`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupMemory {
    /// Last scale-up decision.
    pub last_scale_up: Option<DateTime<Utc>>,
    /// Last drain that ended: removed, kept, cancelled, aborted or failed
    /// (the scale-down cooldown runs from here).
    pub last_scale_down: Option<DateTime<Utc>>,
    /// Last failed (aborted) scale-down.
    pub last_failure: Option<DateTime<Utc>>,
    /// Since when the group is continuously under its compact threshold
    /// (the stabilization window runs from here).
    pub underused_since: Option<DateTime<Utc>>,
    /// Last scaling decision (reports must be newer to decide again).
    pub last_decision: Option<DateTime<Utc>>,
}

/// What the policy reads of its own past: each group's record (memory and
/// supply) and the breaker's state.
#[derive(Debug, Clone, Copy)]
pub struct Memory<'a> {
    /// Per group; a group without a record has the default one.
    pub groups: &'a BTreeMap<GroupKey, GroupState>,
    /// Whether the stale-node breaker was open after the last evaluation.
    pub breaker_open: bool,
    /// An operator's pause of the whole fleet, if any.
    pub fleet_pause: Option<&'a crate::ops::Pause>,
}

impl Memory<'_> {
    /// A group's record.
    pub fn group(&self, g: &GroupKey) -> GroupState {
        self.groups.get(g).cloned().unwrap_or_default()
    }

    /// The pause that holds for `g` at `now` (the fleet's first), and
    /// whether it is the fleet's.
    pub fn pause_of(&self, g: &GroupKey, now: DateTime<Utc>) -> Option<(&crate::ops::Pause, bool)> {
        if let Some(p) = self.fleet_pause.filter(|p| p.holds(now)) {
            return Some((p, true));
        }
        self.groups
            .get(g)
            .and_then(|s| s.paused.as_ref())
            .filter(|p| p.holds(now))
            .map(|p| (p, false))
    }
}

/// The stale-node breaker after this evaluation.
#[derive(Debug, Clone, PartialEq)]
pub struct Breaker {
    /// Open: no scaling at all.
    pub open: bool,
    /// `N of M nodes missing; ...`, for the decision when it flips.
    pub detail: String,
}

/// A drain the policy starts.
#[derive(Debug, Clone, PartialEq)]
pub struct Drain {
    /// The victim.
    pub node: String,
    /// The policy, with the victim strategy.
    pub origin: Origin,
    /// Why, for the decision.
    pub reason: String,
}

/// What one evaluation decided for one group.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupVerdict {
    /// The group.
    pub key: GroupKey,
    /// Drains to cancel (re-activate) instead of booting nodes.
    pub cancels: Vec<OpId>,
    /// Scale-ups to start.
    pub creates: u32,
    /// Why the group needs capacity (cancels and creates say it).
    pub up_reason: String,
    /// A drain to start.
    pub drain: Option<Drain>,
    /// What the group's `underused_since` must be after this evaluation.
    pub underused_since: Option<DateTime<Utc>>,
    /// The explanation, without `ops_in_flight` (known once the verdict is applied).
    pub explanation: Explanation,
}

/// What one evaluation decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdicts {
    /// The breaker.
    pub breaker: Breaker,
    /// Every group, in order.
    pub groups: Vec<GroupVerdict>,
}

/// One evaluation of every group known from the fleet, the configuration or
/// an operation in flight. Changes nothing.
pub fn evaluate(
    facts: &Facts<'_>,
    cfg: &BrokerConfig,
    memory: &Memory<'_>,
    now: DateTime<Utc>,
) -> Verdicts {
    evaluate_groups(facts, cfg, memory, now, None)
}

/// An early evaluation of `only` (every group with `None`; a key of
/// district [`ALL`] stands for its profile, see [`pressure_keys`]): what
/// [`evaluate`] decides for those groups, and for the groups of their
/// profiles that the profiles' plans give a scale-up or a drain cancel. A group's
/// verdict reads its own profile's groups (their facts, always all of
/// them), the fleet-wide guards (the breaker, the operations in flight) and
/// the drains this evaluation already started. The groups left out are
/// decided at the next evaluation of every group: only a scale-down, which
/// no report hurries, can wait for it. Changes nothing.
pub fn evaluate_groups(
    facts: &Facts<'_>,
    cfg: &BrokerConfig,
    memory: &Memory<'_>,
    now: DateTime<Utc>,
    only: Option<&BTreeSet<GroupKey>>,
) -> Verdicts {
    let removing = facts.removing();
    let breaker = breaker(facts, cfg, &removing, now);
    let common = vec![reason("breaker", !breaker.open, breaker.detail.clone()), {
        let up = now - facts.started;
        let grace = dur(cfg.policy.startup_grace);
        reason(
            "startup_grace",
            up >= grace,
            format!("agent up {}, grace {}", ago(up), human(grace)),
        )
    }];
    let mut keys: BTreeSet<GroupKey> = facts.fleet.groups().into_iter().collect();
    keys.extend(cfg.configured_groups());
    keys.extend(facts.ops.in_flight().map(|o| o.group.clone()));
    let districted = keys
        .iter()
        .filter(|k| k.district != NO_DISTRICT)
        .map(|k| k.profile.clone())
        .collect();
    if let Some(only) = only {
        let profiles: BTreeSet<&String> = only.iter().map(|g| &g.profile).collect();
        keys.retain(|k| profiles.contains(&k.profile));
    }
    let mut ops_by_group: BTreeMap<GroupKey, Vec<&crate::ops::Op>> = BTreeMap::new();
    for op in facts.ops.in_flight() {
        ops_by_group.entry(op.group.clone()).or_default().push(op);
    }
    let ev = Eval {
        facts,
        cfg,
        memory,
        now,
        removing,
        ops_by_group,
        common,
        districted,
    };
    let all: BTreeMap<GroupKey, GroupFacts> = keys
        .iter()
        .map(|k| (k.clone(), ev.group_facts(k)))
        .collect();
    let profiles = ev.profile_plans(&all);
    let mut fleet_draining = facts.ops.in_flight().filter(|o| o.down().is_some()).count() as u32;
    let mut groups = Vec::with_capacity(all.len());
    let wanted = |k: &GroupKey| {
        only.is_none_or(|o| {
            o.contains(k)
                || profiles
                    .get(&k.profile)
                    .is_some_and(|pp| pp.assign.contains_key(k) || pp.cancels.contains_key(k))
        })
    };
    for f in all.values().filter(|f| wanted(&f.key)) {
        let v = ev.group_verdict(f, &profiles, fleet_draining);
        if v.drain.is_some() {
            fleet_draining += 1;
        }
        groups.push(v);
    }
    Verdicts { breaker, groups }
}

/// What group `g` is over, as the keys an early evaluation takes: its
/// profile's thresholds (`PROFILE_THRESHOLD`, `GEAR_UP_THRESHOLD`) as the
/// profile's key (district [`ALL`]: every group of the profile shares
/// them), its own district's (`DISTRICT_THRESHOLD`) as its own key.
pub fn pressure_keys(
    facts: &Facts<'_>,
    cfg: &BrokerConfig,
    g: GroupKey,
    now: DateTime<Utc>,
) -> Vec<GroupKey> {
    [profile_key(&g.profile), g]
        .into_iter()
        .filter(|k| over_threshold(facts, cfg, k, now))
        .collect()
}

/// The key that stands for `profile` as a whole (district [`ALL`]).
pub fn profile_key(profile: &str) -> GroupKey {
    GroupKey {
        district: ALL.to_string(),
        profile: profile.to_string(),
    }
}

/// Whether `key` is over a scale-up threshold: a profile's key (district
/// [`ALL`]) its profile's thresholds, a group's its district's.
pub fn over_threshold(
    facts: &Facts<'_>,
    cfg: &BrokerConfig,
    key: &GroupKey,
    now: DateTime<Utc>,
) -> bool {
    let p = &cfg.policy;
    let over = |th: Option<u32>, u: f64| th.is_some_and(|t| u >= f64::from(t));
    if key.district == ALL {
        let ps = facts.profile_stats(&key.profile, now);
        return over(p.profile_threshold.for_profile(&key.profile), ps.usage_pct)
            || p.gear_up_threshold
                .for_profile(&key.profile)
                .is_some_and(|t| ps.effective_available_gears < t);
    }
    let gs = facts.group_stats(key, now);
    over(
        p.district_threshold.get(&key.district, &key.profile),
        gs.usage_pct,
    )
}

/// `percent` of `nodes`, at least 1.
pub fn budget(nodes: u32, percent: u32) -> u32 {
    (nodes * percent / 100).max(1)
}

fn breaker(
    facts: &Facts<'_>,
    cfg: &BrokerConfig,
    removing: &BTreeSet<String>,
    now: DateTime<Utc>,
) -> Breaker {
    let pct = cfg.policy.breaker_stale_percent;
    let (missing, known) = facts.fleet.staleness(now, facts.stale_intervals, removing);
    Breaker {
        open: known > 0 && missing * 100 > pct as usize * known,
        detail: format!("{missing} of {known} nodes missing; the breaker opens above {pct} %"),
    }
}

/// One evaluation's inputs, and what it computed once for every group.
struct Eval<'a> {
    facts: &'a Facts<'a>,
    cfg: &'a BrokerConfig,
    memory: &'a Memory<'a>,
    now: DateTime<Utc>,
    /// Nodes being removed that the fleet knows (computed once).
    removing: std::sync::Arc<BTreeSet<String>>,
    /// The operations in flight, by group (computed once).
    ops_by_group: BTreeMap<GroupKey, Vec<&'a crate::ops::Op>>,
    /// The breaker and the start-up grace: part of every explanation.
    common: Vec<Reason>,
    /// Profiles with at least one district: their undistricted nodes are
    /// not scale-up targets (a new node goes to a district).
    districted: BTreeSet<String>,
}

/// A group's plan while its verdict is built.
#[derive(Default)]
struct Plan {
    reasons: Vec<Reason>,
    creates: u32,
    cancels: Vec<OpId>,
    up_wanted: bool,
    up_reason: Vec<String>,
}

impl Eval<'_> {
    fn group_verdict(
        &self,
        f: &GroupFacts,
        profiles: &BTreeMap<String, ProfilePlan>,
        fleet_draining: u32,
    ) -> GroupVerdict {
        let key = &f.key;
        let profile = profiles.get(&key.profile);
        let mut plan = Plan {
            reasons: self.common.clone(),
            ..Default::default()
        };
        if let Some(pp) = profile {
            plan.reasons.extend(pp.reasons.iter().cloned());
        }
        let assigned = profile.and_then(|pp| pp.assign.get(key));
        if let Some((n, why)) = assigned.filter(|(n, _)| *n > 0) {
            plan.up_wanted = true;
            plan.up_reason.push(why.clone());
            plan.creates = *n;
        }
        plan.cancels = profile
            .and_then(|pp| pp.cancels.get(key))
            .cloned()
            .unwrap_or_default();
        if !plan.cancels.is_empty() {
            plan.up_wanted = true;
            if plan.up_reason.is_empty()
                && let Some(pp) = profile
            {
                plan.up_reason.push(pp.why.clone());
            }
        }
        self.group_up(f, &mut plan);
        // Every decision held (the start-up grace, the breaker): no drain is
        // cancelled either. A restarted agent has heard from part of the
        // fleet, whose figures can read as pressure (found by the campaign).
        if self.common.iter().any(|r| !r.ok) {
            plan.cancels.clear();
        }
        let remembered = self.memory.group(key).memory.underused_since;
        let mut underused_since = remembered;
        let mut drain = None;
        let (outcome, summary) = if plan.up_wanted {
            up_summary(&plan)
        } else if profile.is_some_and(|pp| pp.pressure) {
            (
                Outcome::None,
                format!(
                    "profile {} needs capacity (see profile rules); no scale-down while it does",
                    key.profile
                ),
            )
        } else {
            let d = self.scale_down(f, &mut plan, fleet_draining);
            underused_since = d.underused_since;
            drain = d.drain;
            (d.outcome, d.summary)
        };
        let v = GroupVerdict {
            key: key.clone(),
            up_reason: plan.up_reason.join("; "),
            cancels: if plan.up_wanted { plan.cancels } else { vec![] },
            creates: if plan.up_wanted { plan.creates } else { 0 },
            drain,
            underused_since,
            explanation: Explanation {
                district: key.district.clone(),
                profile: key.profile.clone(),
                evaluated_at: self.now,
                outcome,
                summary,
                reasons: plan.reasons,
                stats: f.stats.clone(),
                ops_in_flight: vec![],
            },
        };
        match self.memory.pause_of(key, self.now) {
            Some((p, fleet)) => pause::hold(v, p, fleet, remembered),
            None => v,
        }
    }
}

/// Outcome and summary of a group that wants capacity.
fn up_summary(plan: &Plan) -> (Outcome, String) {
    let why = plan.up_reason.join("; ");
    if !plan.cancels.is_empty() {
        let also = if plan.creates > 0 {
            format!(", and asking for {} node(s)", plan.creates)
        } else {
            String::new()
        };
        return (
            Outcome::DrainCancelled,
            format!(
                "re-activating {} draining node(s) instead of booting new ones{also}: {why}",
                plan.cancels.len()
            ),
        );
    }
    if plan.creates > 0 {
        return (
            Outcome::ScaleUp,
            format!("asking for {} node(s): {why}", plan.creates),
        );
    }
    let held: Vec<String> = plan
        .reasons
        .iter()
        .filter(|r| !r.ok && is_guard(&r.rule))
        .map(|r| format!("{} ({})", r.rule, r.detail))
        .collect();
    (
        Outcome::Held,
        format!(
            "scale-up wanted but held: {}",
            if held.is_empty() {
                "the profile's scale-up goes to another district".to_string()
            } else {
                held.join("; ")
            }
        ),
    )
}

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

/// The rules that hold an action back (as opposed to those that call for one).
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

#[cfg(test)]
mod tests;
