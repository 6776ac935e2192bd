//! Exhaustion tracking: per group, whether and when the cloud can supply a
//! node.
//!
//! Failed scale-ups back off (doubling from `backoff_initial` to
//! `backoff_max`); enough consecutive quota failures mark the group
//! **exhausted**, which is published, held by the policy, and checked again
//! every `exhaustion_check_interval` until the handler says nodes fit again.
//! A join ends the backoff.
//!
//! [`Supply::step`] is the machine: `(state, input, now) -> (state,
//! effects)`, with no knowledge of operations.

use chrono::{DateTime, Utc};
use gearshift_handlers::{Capacity, GroupKey, HandlerError};
use gearshift_proto::msg::DecisionKind;
use serde::{Deserialize, Serialize};

use crate::config::PolicyConfig;
use crate::core::actions::{Effect, Note, dur};

/// A group the cloud has no capacity for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exhaustion {
    /// Since when.
    pub since: DateTime<Utc>,
    /// What the cloud said.
    pub reason: String,
    /// Next capacity check.
    pub next_check: DateTime<Utc>,
}

/// A group's supply state: backoff, quota failures, exhaustion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Supply {
    /// No scale-up before this (after failed scale-ups).
    pub backoff_until: Option<DateTime<Utc>>,
    /// Consecutive failed scale-ups.
    pub up_failures: u32,
    /// Consecutive quota failures.
    pub quota_failures: u32,
    /// Set while the cloud has no capacity for the group.
    pub exhausted: Option<Exhaustion>,
}

/// What the tracker of a group is told.
#[derive(Debug, Clone, PartialEq)]
pub enum SupplyInput {
    /// A scale-up failed (a provision timeout is a transient failure).
    Failed(HandlerError),
    /// A scale-up's node joined.
    Joined,
    /// Time passed: a capacity check may be due.
    Tick,
    /// The answer to the capacity check.
    Capacity(Result<Capacity, HandlerError>),
}

/// What a step did: decisions about the group, and whether a capacity
/// check is due (the coordinator addresses it to the group's handler).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SupplyOut {
    /// Decisions to publish.
    pub effects: Vec<Effect>,
    /// A capacity check is due.
    pub check: bool,
    /// The record changed: journal it.
    pub changed: bool,
}

impl Supply {
    /// The machine. `group` names the group in the decisions' reasons.
    pub fn step(
        &mut self,
        group: &GroupKey,
        p: &PolicyConfig,
        input: SupplyInput,
        now: DateTime<Utc>,
    ) -> SupplyOut {
        match input {
            SupplyInput::Failed(e) => self.failed(group, p, &e, now),
            SupplyInput::Joined => {
                self.up_failures = 0;
                self.backoff_until = None;
                SupplyOut {
                    changed: true,
                    ..Default::default()
                }
            }
            SupplyInput::Tick => self.tick(p, now),
            SupplyInput::Capacity(r) => self.on_capacity(group, p, r, now),
        }
    }

    /// Whether a capacity check is due at `now`.
    pub fn check_due(&self, now: DateTime<Utc>) -> bool {
        self.exhausted.as_ref().is_some_and(|e| now >= e.next_check)
    }

    fn failed(
        &mut self,
        g: &GroupKey,
        p: &PolicyConfig,
        e: &HandlerError,
        now: DateTime<Utc>,
    ) -> SupplyOut {
        self.up_failures += 1;
        let factor = 2u32.saturating_pow(self.up_failures.saturating_sub(1).min(16));
        let wait = p.backoff_initial.saturating_mul(factor).min(p.backoff_max);
        self.backoff_until = Some(now + dur(wait));
        let mut out = SupplyOut {
            changed: true,
            ..Default::default()
        };
        if !e.is_quota() {
            self.quota_failures = 0;
            return out;
        }
        self.quota_failures += 1;
        if self.quota_failures >= p.exhausted_after_quota_failures && self.exhausted.is_none() {
            self.exhausted = Some(Exhaustion {
                since: now,
                reason: e.to_string(),
                next_check: now + dur(p.exhaustion_check_interval),
            });
            let n = self.quota_failures;
            out.effects.push(Effect::Decide(Note {
                kind: DecisionKind::Exhausted,
                node: None,
                reason: format!("the cloud has no capacity for {g} ({n} quota failures): {e}"),
                stats: true,
            }));
        }
        out
    }

    fn tick(&mut self, p: &PolicyConfig, now: DateTime<Utc>) -> SupplyOut {
        if !self.check_due(now) {
            return SupplyOut::default();
        }
        if let Some(ex) = self.exhausted.as_mut() {
            ex.next_check = now + dur(p.exhaustion_check_interval);
        }
        SupplyOut {
            check: true,
            changed: true,
            ..Default::default()
        }
    }

    fn on_capacity(
        &mut self,
        g: &GroupKey,
        p: &PolicyConfig,
        r: Result<Capacity, HandlerError>,
        now: DateTime<Utc>,
    ) -> SupplyOut {
        let Some(ex) = self.exhausted.as_mut() else {
            return SupplyOut::default();
        };
        let (lift, detail) = match &r {
            Ok(Capacity {
                nodes_available: Some(n),
                detail,
            }) if *n > 0 => (true, format!("{n} nodes fit again: {detail}")),
            Ok(Capacity {
                nodes_available: None,
                detail,
            }) => (
                true,
                format!("the handler cannot tell ({detail}); allowing one attempt"),
            ),
            Ok(c) => (false, c.detail.clone()),
            Err(e) => (false, e.to_string()),
        };
        let mut out = SupplyOut {
            changed: true,
            ..Default::default()
        };
        if !lift {
            ex.next_check = now + dur(p.exhaustion_check_interval);
            tracing::info!(group = %g, detail, "still exhausted");
            return out;
        }
        self.exhausted = None;
        self.quota_failures = p.exhausted_after_quota_failures.saturating_sub(1);
        self.backoff_until = None;
        out.effects.push(Effect::Decide(Note {
            kind: DecisionKind::ExhaustionLifted,
            node: None,
            reason: detail,
            stats: true,
        }));
        out
    }
}

#[cfg(test)]
mod tests;
