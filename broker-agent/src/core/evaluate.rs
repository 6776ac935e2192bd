//! One evaluation: forget long-missing nodes, ask the policy, and apply its
//! verdicts (breaker, drain cancels, scale-ups, drains, memory,
//! explanations).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{Decision, DecisionKind, Explanation};
use gearshift_proto::routing::ALL;

use super::Core;
use super::actions::{Action, dur};
use super::scale_down::DownInput;
use crate::policy::{self, Breaker, GroupVerdict, Memory};

impl Core {
    /// One evaluation of every group: decisions, explanations, new sagas.
    pub fn evaluate(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        self.due.clear();
        self.forget_long_missing(now);
        self.lift_expired_pauses(now);
        self.evaluate_groups(None, now)
    }

    /// The early evaluations due by `now` ([`Core::evaluation_due`]): of the
    /// groups reports pushed over a threshold, not of the whole fleet (see
    /// [`policy::evaluate_groups`] for what it decides). Nothing when none
    /// is due.
    pub fn evaluate_due(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let groups: BTreeSet<GroupKey> = self
            .due
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(g, _)| g.clone())
            .collect();
        if groups.is_empty() {
            return vec![];
        }
        self.due.retain(|g, _| !groups.contains(g));
        self.lift_expired_pauses(now);
        self.evaluate_groups(Some(&groups), now)
    }

    /// One evaluation of `only` (of every group with `None`).
    fn evaluate_groups(
        &mut self,
        only: Option<&BTreeSet<GroupKey>>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        // Which of the groups evaluated are over a threshold (see `route.rs`).
        let pressured: Vec<GroupKey> = {
            let facts = self.facts();
            let over = |g: &GroupKey| policy::over_threshold(&facts, &self.cfg, g, now);
            match only {
                Some(o) => o.iter().filter(|g| over(g)).cloned().collect(),
                None => {
                    let groups = facts.fleet.groups();
                    let profiles: BTreeSet<GroupKey> = groups
                        .iter()
                        .map(|g| policy::profile_key(&g.profile))
                        .collect();
                    profiles.into_iter().chain(groups).filter(over).collect()
                }
            }
        };
        self.pressured
            .retain(|g, _| only.is_some_and(|o| !o.contains(g)));
        self.pressured
            .extend(pressured.into_iter().map(|g| (g, now)));
        let memory = Memory {
            groups: &self.groups,
            breaker_open: self.meta.breaker_open,
            fleet_pause: self.meta.fleet_pause.as_ref(),
        };
        let verdicts = policy::evaluate_groups(&self.facts(), &self.cfg, &memory, now, only);
        let mut out: Vec<Action> = self.apply_breaker(verdicts.breaker).into_iter().collect();
        let mut explanations = Vec::with_capacity(verdicts.groups.len());
        for v in verdicts.groups {
            let (acts, x) = self.apply_group(v, now);
            out.extend(acts);
            explanations.push(x);
        }
        // Each explanation with the operations now in flight in its group
        // (one pass over the operations, not one per group).
        let mut in_flight: BTreeMap<&GroupKey, Vec<String>> = BTreeMap::new();
        for o in self.ops.in_flight() {
            in_flight
                .entry(&o.group)
                .or_default()
                .push(o.id.to_string());
        }
        for mut x in explanations {
            let key = GroupKey {
                district: x.district.clone(),
                profile: x.profile.clone(),
            };
            x.ops_in_flight = in_flight.get(&key).cloned().unwrap_or_default();
            out.push(Action::Explain(x));
        }
        out
    }

    /// Forgets nodes missing for too long (unless a saga still needs them).
    /// The scan covers the whole fleet, so it runs every tenth of
    /// `forget_missing_after` (a minute at most), not at every evaluation: a
    /// node is forgotten that much late at most.
    fn forget_long_missing(&mut self, now: DateTime<Utc>) {
        let after = dur(self.cfg.policy.forget_missing_after);
        let every = (after / 10).min(chrono::Duration::minutes(1));
        if self.forget_scanned.is_some_and(|t| now - t < every) {
            return;
        }
        self.forget_scanned = Some(now);
        for node in self.fleet.long_missing(now, after) {
            if self.ops.saga_of(&node).is_none() {
                tracing::warn!(node, "missing for too long: forgotten");
                self.fleet.forget(&node);
            }
        }
    }

    /// Records the breaker; a decision when it opens or closes.
    fn apply_breaker(&mut self, b: Breaker) -> Option<Action> {
        if b.open == self.meta.breaker_open {
            return None;
        }
        self.meta.breaker_open = b.open;
        self.changes.meta = true;
        let (kind, what) = if b.open {
            (DecisionKind::BreakerOpen, "all scaling stopped")
        } else {
            (DecisionKind::BreakerClosed, "scaling resumes")
        };
        Some(Action::Decide(Decision {
            decision: kind,
            district: ALL.into(),
            profile: ALL.into(),
            op: None,
            node: None,
            reason: format!("{}: {what}", b.detail),
            handler: None,
            stats: None,
            dry_run: false,
            epoch: self.meta.epoch,
        }))
    }

    /// Cancels drains, then starts scale-ups, or starts a drain; updates the
    /// group's memory; returns the actions and the explanation (without the
    /// operations in flight, known once every group's verdict is applied).
    fn apply_group(&mut self, v: GroupVerdict, now: DateTime<Utc>) -> (Vec<Action>, Explanation) {
        let key: GroupKey = v.key.clone();
        let mut out = vec![];
        let mut summary = None;
        if self.is_dry_run(&key) {
            // No operation starts: see `dry_run.rs`.
            let (acts, said) = self.dry_verdict(&key, &v, now);
            out.extend(acts);
            summary = said;
        } else {
            out.extend(self.start_verdict(&key, &v, now));
        }
        let underused = self.groups.get(&key).and_then(|s| s.memory.underused_since);
        if underused != v.underused_since {
            self.group_mut(&key).memory.underused_since = v.underused_since;
        }
        let mut x = v.explanation;
        if let Some(s) = summary {
            x.summary = s;
        }
        (out, x)
    }

    /// The drain cancels, scale-ups and drain a verdict calls for.
    fn start_verdict(
        &mut self,
        key: &GroupKey,
        v: &GroupVerdict,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let mut out = vec![];
        for op in &v.cancels {
            let why = format!("scale-up pressure: {}", v.up_reason);
            let cancel = DownInput::Abort { why, cancel: true };
            out.extend(self.drive_down(op, cancel, now));
        }
        for _ in 0..v.creates {
            out.extend(self.start_scale_up(key, v.up_reason.clone(), now).1);
        }
        if let Some(d) = &v.drain {
            let (node, origin, reason) = (&d.node, d.origin.clone(), d.reason.clone());
            out.extend(
                self.start_scale_down(key, node, origin, reason, false, now)
                    .1,
            );
        }
        out
    }
}
