//! Broker-side gear moves (`[paas] kind = "openshift"`): the broker agent
//! runs `oo-admin-move` for each planned move through the PaaS adapter, at
//! most `saga.evacuation_parallelism` at once and never two of one
//! application at once (OpenShift locks the application for a move). The
//! node watches its gears leave and reports them; its reports confirm the
//! node empty.
//!
//! A move that fails retryably runs again after `saga.paas_retry`, up to
//! `saga.command_attempts` runs (a repeated move of a gear already on its
//! target is answered "already so"). When every move of the round has
//! ended and some failed for good, the round ends at once: the node's
//! inventory is asked again and what is left is planned anew (the saga
//! aborts when out of rounds, with the refusal's cause in its reason).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{DownCtx, DownOut, DownStep, ScaleDown};
use crate::core::actions::{Effect, Out, PaasCall, dur};
use crate::paas::Outcome;

/// Where one broker-side move stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoveState {
    /// Not started yet, or waiting to run again.
    Pending,
    /// `oo-admin-move` is running (journaled before it starts).
    Running,
    /// OpenShift moved it (or it already was on its target).
    Moved,
    /// Failed for good this round.
    Failed,
}

/// One gear move the broker agent runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerMove {
    /// The gear's UUID.
    pub gear: String,
    /// Its application, when the node knows it: one move per application at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// The target node.
    pub target: String,
    /// Where it stands.
    pub state: MoveState,
    /// Runs of `oo-admin-move` so far.
    pub attempts: u32,
    /// Not run again before this instant (after a retryable failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_before: Option<DateTime<Utc>>,
    /// Why it failed (the outcome, with the refusal's cause).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl BrokerMove {
    fn call(&self) -> Effect {
        Effect::Paas(PaasCall::Move {
            gear: self.gear.clone(),
            target: self.target.clone(),
        })
    }

    /// The application lock's key: the application, else the gear alone.
    fn lock(&self) -> &str {
        self.app.as_deref().unwrap_or(&self.gear)
    }
}

impl ScaleDown {
    /// Whether this round's moves are the broker agent's.
    pub(super) fn moving(&self) -> bool {
        !self.broker_moves.is_empty()
    }

    /// The round's moves from `self.moves`, keeping moves still running
    /// from an earlier round (their gear is never moved twice at once).
    pub(super) fn plan_broker_moves(&mut self) {
        let running: Vec<BrokerMove> = self
            .broker_moves
            .drain(..)
            .filter(|m| m.state == MoveState::Running)
            .collect();
        let busy: BTreeSet<&str> = running.iter().map(|m| m.gear.as_str()).collect();
        let app_of = |gear: &str| {
            self.gears
                .iter()
                .find(|g| g.id == gear)
                .and_then(|g| g.app.clone())
        };
        let fresh: Vec<BrokerMove> = self
            .moves
            .iter()
            .filter(|m| !busy.contains(m.gear.as_str()))
            .map(|m| BrokerMove {
                gear: m.gear.clone(),
                app: app_of(&m.gear),
                target: m.target.clone(),
                state: MoveState::Pending,
                attempts: 0,
                not_before: None,
                error: None,
            })
            .collect();
        self.broker_moves = running;
        self.broker_moves.extend(fresh);
    }

    /// Starts pending moves up to the parallelism, one per application.
    pub(super) fn launch_moves(&mut self, cx: &DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        if self.step != DownStep::Evacuating {
            return Out::none();
        }
        let limit = cx.cfg.saga.evacuation_parallelism as usize;
        let mut running = self.count(MoveState::Running);
        let mut locked: BTreeSet<String> = self
            .broker_moves
            .iter()
            .filter(|m| m.state == MoveState::Running)
            .map(|m| m.lock().to_string())
            .collect();
        let mut out = Out::none();
        for m in &mut self.broker_moves {
            if running >= limit {
                break;
            }
            let due = m.not_before.is_none_or(|t| now >= t);
            if m.state != MoveState::Pending || !due || locked.contains(m.lock()) {
                continue;
            }
            m.state = MoveState::Running;
            m.attempts += 1;
            m.not_before = None;
            locked.insert(m.lock().to_string());
            running += 1;
            out = out.then(Out::effect(m.call()));
        }
        out
    }

    /// After a restart: the moves that were running run again (a move that
    /// finished meanwhile is answered "already so").
    pub(super) fn resume_moves(&self) -> DownOut {
        let effects: Vec<Effect> = self
            .broker_moves
            .iter()
            .filter(|m| m.state == MoveState::Running)
            .map(BrokerMove::call)
            .collect();
        Out {
            effects,
            ..Out::none()
        }
    }

    /// `oo-admin-move` of `gear` answered.
    pub(super) fn on_moved(
        &mut self,
        cx: &mut DownCtx<'_>,
        gear: &str,
        outcome: &Outcome,
        now: DateTime<Utc>,
    ) -> DownOut {
        let attempts = cx.cfg.saga.command_attempts;
        let retry = dur(cx.cfg.saga.paas_retry);
        let Some(m) = self
            .broker_moves
            .iter_mut()
            .find(|m| m.gear == gear && m.state == MoveState::Running)
        else {
            tracing::debug!(op = %cx.op, gear, "answer of a move not running: ignored");
            return Out::none();
        };
        if outcome.is_success() {
            m.state = MoveState::Moved;
            m.error = None;
        } else {
            let error = format!("move of gear {gear} to {} {outcome}", m.target);
            tracing::warn!(op = %cx.op, attempt = m.attempts, error, "gear move did not succeed");
            if outcome.is_retryable() && m.attempts < attempts {
                m.state = MoveState::Pending;
                m.not_before = Some(now + retry);
            } else {
                m.state = MoveState::Failed;
                self.refusal = Some(error.clone());
            }
            m.error = Some(error);
        }
        self.count_progress();
        if self.step != DownStep::Evacuating {
            return Out::touched();
        }
        Out::touched()
            .then(self.launch_moves(cx, now))
            .then(self.round_settled(cx, now))
    }

    /// Every move of the round ended: all moved, wait for the node's
    /// reports to show it empty; some failed, plan what is left again.
    fn round_settled(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        let open = self.count(MoveState::Pending) + self.count(MoveState::Running);
        if open > 0 {
            return Out::none();
        }
        let failed = self.count(MoveState::Failed);
        if failed == 0 {
            return self.confirm_empty(cx, now);
        }
        let first = self.refusal.clone().unwrap_or_default();
        let why = format!("{failed} gear moves failed (last: {first})");
        self.next_round(cx, why, now)
    }

    fn count(&self, s: MoveState) -> usize {
        self.broker_moves.iter().filter(|m| m.state == s).count()
    }

    /// The round's progress from the moves.
    fn count_progress(&mut self) {
        let moved = self.count(MoveState::Moved) as u32;
        let prev = self.progress.moved;
        self.progress.moved = moved;
        self.progress.failed = self.count(MoveState::Failed) as u32;
        self.progress.total = self.broker_moves.len() as u32;
        self.progress.remaining = self.progress.total - moved - self.progress.failed;
        self.progress.moved_total += moved.saturating_sub(prev);
    }
}
