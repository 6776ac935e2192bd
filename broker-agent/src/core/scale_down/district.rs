//! The district commands of a scale-down (`[paas] kind = "openshift"`):
//! `deactivate-node` before the node is told, `activate-node` after an
//! abort or cancel, `remove-node` once the node is confirmed empty and
//! before the cloud removal.
//!
//! Each is journaled before it runs (the step names it) and is safe to run
//! again: OpenShift answers "already so" to a repeated command, which the
//! adapter reports as success. A retryable failure (a timeout, an
//! unreachable node, a store update that did not apply) runs the command
//! again after `saga.paas_retry`, up to `saga.command_attempts` runs; a
//! refusal ends the step at once, its cause in the saga's `refusal` and in
//! the reason of the decision that ends or aborts the saga.

use chrono::{DateTime, Utc};
use gearshift_proto::routing::NO_DISTRICT;

use super::{DownCtx, DownEnd, DownOut, DownStep, ScaleDown};
use crate::core::actions::{CallResult, Effect, Out, PaasCall, dur};
use crate::paas::Outcome;

impl ScaleDown {
    /// The first step with `openshift`: `deactivate-node` in the node's
    /// district (an undistricted node's gears cannot be moved by OpenShift).
    pub(super) fn start_in_district(
        &mut self,
        cx: &mut DownCtx<'_>,
        now: DateTime<Utc>,
    ) -> DownOut {
        if cx.group.district == NO_DISTRICT {
            let why = format!(
                "{} is in no district: OpenShift moves gears only within a district",
                self.node
            );
            return self.end(DownEnd::Aborted { reason: why });
        }
        self.district_deactivated = true;
        self.district_step(cx, DownStep::DistrictDeactivating, now)
    }

    /// `activate-node` after the node itself is active again.
    pub(super) fn activate_in_district(
        &mut self,
        cx: &mut DownCtx<'_>,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> DownOut {
        self.district_step(cx, DownStep::DistrictActivating { cancel }, now)
    }

    /// `remove-node`: the node is empty; the cloud removal comes after.
    pub(super) fn remove_from_district(
        &mut self,
        cx: &mut DownCtx<'_>,
        now: DateTime<Utc>,
    ) -> DownOut {
        self.district_step(cx, DownStep::DistrictRemoving, now)
    }

    /// Enters a district step and runs its command for the first time.
    fn district_step(
        &mut self,
        cx: &mut DownCtx<'_>,
        step: DownStep,
        now: DateTime<Utc>,
    ) -> DownOut {
        self.step = step;
        self.cmd = None;
        self.cmd_sent = None;
        self.replan_at = None;
        self.paas_attempts = 0;
        self.run_district(cx, now)
    }

    /// The command of the current district step.
    fn district_call(&self, cx: &DownCtx<'_>) -> Option<PaasCall> {
        let (district, host) = (cx.group.district.clone(), self.node.clone());
        Some(match self.step {
            DownStep::DistrictDeactivating => PaasCall::Deactivate { district, host },
            DownStep::DistrictActivating { .. } => PaasCall::Activate { district, host },
            DownStep::DistrictRemoving => PaasCall::RemoveNode { district, host },
            _ => return None,
        })
    }

    /// Runs the current step's command (again); its answer is awaited
    /// until the adapter's own bound has surely passed.
    fn run_district(&mut self, cx: &DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        let Some(call) = self.district_call(cx) else {
            return Out::none();
        };
        let p = &cx.cfg.paas;
        self.paas_attempts += 1;
        self.paas_retry_at = None;
        self.deadline = now + dur(p.timeout + p.kill_grace + cx.cfg.saga.command_timeout);
        Out::effect(Effect::Paas(call))
    }

    /// After a restart: the current command runs again (it is idempotent).
    pub(super) fn resume_district(&mut self, cx: &DownCtx<'_>) -> DownOut {
        match self.district_call(cx) {
            Some(call) => Out {
                effects: vec![Effect::Paas(call)],
                ..Out::none()
            },
            None => Out::none(),
        }
    }

    /// Retries due, and answers that never came.
    pub(super) fn district_tick(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        match self.paas_retry_at {
            Some(t) if now >= t => self.run_district(cx, now),
            Some(_) => Out::none(),
            None if now >= self.deadline => self.district_failed(cx, &Outcome::TimedOut, now),
            None => Out::none(),
        }
    }

    /// A PaaS command answered: a district step's, or a gear move's.
    pub(super) fn on_paas(
        &mut self,
        cx: &mut DownCtx<'_>,
        call: &PaasCall,
        outcome: &Outcome,
        now: DateTime<Utc>,
    ) -> DownOut {
        if let PaasCall::Move { gear, .. } = call {
            return self.on_moved(cx, gear, outcome, now);
        }
        if self.district_call(cx).as_ref() != Some(call) || self.paas_retry_at.is_some() {
            tracing::debug!(op = %cx.op, call = call.name(), "answer of an earlier district command: ignored");
            return Out::none();
        }
        if !outcome.is_success() {
            return self.district_failed(cx, outcome, now);
        }
        tracing::info!(op = %cx.op, node = %self.node, call = call.name(), %outcome, "district command done");
        match self.step {
            DownStep::DistrictDeactivating => self.deactivate_node(cx, now),
            DownStep::DistrictActivating { cancel } => self.reactivated(cancel),
            DownStep::DistrictRemoving => self.enter_removing(cx, now),
            _ => Out::none(),
        }
    }

    /// The current district command did not succeed: again later when
    /// retryable and attempts remain, else the step fails with the cause.
    fn district_failed(
        &mut self,
        cx: &mut DownCtx<'_>,
        outcome: &Outcome,
        now: DateTime<Utc>,
    ) -> DownOut {
        let name = self.district_call(cx).map_or("", |c| c.name());
        let error = format!("{} {name} {outcome}", self.node);
        tracing::warn!(op = %cx.op, attempt = self.paas_attempts, error, "district command did not succeed");
        self.refusal = Some(error.clone());
        if outcome.is_retryable() && self.paas_attempts < cx.cfg.saga.command_attempts {
            self.paas_retry_at = Some(now + dur(cx.cfg.saga.paas_retry));
            return Out::touched();
        }
        let why = format!("{error}; ran {} times", self.paas_attempts);
        match self.step {
            // Refused: nothing changed in OpenShift, nothing to undo. Given
            // up after retries: the last run may have applied, undo it.
            DownStep::DistrictDeactivating if !outcome.is_retryable() => {
                self.district_deactivated = false;
                self.end(DownEnd::Aborted { reason: why })
            }
            DownStep::DistrictDeactivating | DownStep::DistrictRemoving => {
                self.reactivate(cx, why, false, now)
            }
            DownStep::DistrictActivating { .. } => self.end(DownEnd::Failed {
                reason: format!(
                    "could not re-activate the node in its district: {why}; \
                     `gearshift-broker activate {}` once fixed",
                    self.node
                ),
            }),
            _ => Out::none(),
        }
    }

    /// Routes a handler or PaaS answer.
    pub(super) fn on_answer(
        &mut self,
        cx: &mut DownCtx<'_>,
        r: CallResult,
        now: DateTime<Utc>,
    ) -> DownOut {
        match r {
            CallResult::Paas { call, outcome } => self.on_paas(cx, &call, &outcome, now),
            r => self.on_result(cx, r, now),
        }
    }
}
