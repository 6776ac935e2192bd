//! The scale-down saga: empty one node and remove exactly it, crash-safe.
//!
//! `Deactivating -> (Inventorying) -> Evacuating -> ConfirmingEmpty ->
//! Removing -> ConfirmingGone -> Done(Removed)`; an abort or a drain cancel
//! goes through `Reactivating` to `Done(Aborted|Cancelled)`. A maintenance
//! drain (`keep`) ends at `ConfirmingEmpty -> Done(Kept)`: the node stays,
//! empty and inactive.
//!
//! With `[paas] kind = "openshift"` OpenShift is told through the PaaS
//! adapter: `DistrictDeactivating` (`deactivate-node`) comes before
//! `Deactivating`; the evacuation's moves are run by the broker agent
//! (`oo-admin-move`, see `moves.rs`) while the node only watches its gears
//! leave and reports progress; `DistrictRemoving` (`remove-node`) comes
//! between `ConfirmingEmpty` and `Removing`; and an abort or cancel ends
//! with `DistrictActivating` (`activate-node`) after `Reactivating`.
//!
//! [`ScaleDown::step`] is the machine: `(state, input, now) -> (state,
//! effects)`. It reads the fleet and the other operations through
//! [`Facts`] (to plan the moves and to see the node's reports) and never
//! changes them; how the saga ended is its [`DownOutcome`], which the
//! coordinator turns into the group's cooldowns and the fleet's forgetting
//! of a removed node.
//!
//! Layout: this file holds the state, the inputs and the command steps;
//! `steps.rs` the steps and ends; `events.rs` takes the node's events;
//! `evacuate.rs` plans the evacuation rounds, `confirm.rs` judges the
//! node's reports (only those sent after the command's `event.done`
//! count) until one shows it empty, `moves.rs` the
//! broker-side gear moves, `district.rs` the district commands,
//! `remove.rs` asks the handler to remove the node and waits
//! until it is gone.

mod confirm;
mod district;
mod evacuate;
mod events;
mod moves;
mod remove;
mod steps;

pub use confirm::Seen;
pub use moves::{BrokerMove, MoveState};
pub use steps::{DownEnd, DownStep};

use chrono::{DateTime, Utc};
use gearshift_handlers::{GroupKey, Presence};
use gearshift_proto::msg::{
    Activate, Deactivate, DecisionKind, GearInfo, InventoryRequest, Message, Move,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::core::actions::{CallResult, Effect, Note, Out, dur};
use crate::core::facts::Facts;
use crate::ops::OpId;
use crate::planner::EvacuationPlanner;

/// Who started a scale-down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Origin {
    /// The policy, with the victim strategy it used.
    Policy {
        /// Strategy name.
        strategy: String,
    },
    /// An operator (`gearshift-broker evacuate NODE`).
    Operator {
        /// Who asked (the request's `from`).
        by: String,
    },
}

/// Evacuation progress, from the node's `event.progress`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainProgress {
    /// Gears moved (this round).
    pub moved: u32,
    /// Gears failed (this round).
    pub failed: u32,
    /// Gears still to move (this round).
    pub remaining: u32,
    /// Gears in this round.
    pub total: u32,
    /// Gears moved over all rounds.
    pub moved_total: u32,
}

/// A scale-down saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleDown {
    /// The victim.
    pub node: String,
    /// Who chose it.
    pub origin: Origin,
    /// A maintenance drain: the emptied node is kept, not removed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
    /// Where it is.
    pub step: DownStep,
    /// Envelope id of the command of the current step.
    pub cmd: Option<Uuid>,
    /// When that command was last sent.
    pub cmd_sent: Option<DateTime<Utc>>,
    /// Sends of the current command.
    pub sends: u32,
    /// Deadline of the current step.
    pub deadline: DateTime<Utc>,
    /// Evacuation rounds started.
    pub round: u32,
    /// The node's gears, from its last inventory.
    pub gears: Vec<GearInfo>,
    /// The moves of the current round.
    pub moves: Vec<Move>,
    /// Progress of the current round.
    pub progress: DrainProgress,
    /// Remove requests made.
    pub remove_attempt: u32,
    /// When the remove request was accepted.
    pub removed_at: Option<DateTime<Utc>>,
    /// A remove request may have reached the cloud without its answer being
    /// journaled (the process that made it stopped): the removal is
    /// confirmed rather than asked again, unless the node still reports
    /// long after (see `remove.rs`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remove_uncertain: bool,
    /// Next handler call (remove retry or presence poll).
    pub next_call: Option<DateTime<Utc>>,
    /// The handler's last presence answer after the removal.
    #[serde(default)]
    pub presence: Option<Presence>,
    /// Why the saga is being aborted (set with `Reactivating`).
    pub abort_reason: Option<String>,
    /// How it ended.
    pub end: Option<DownEnd>,
    /// Set when the node's gears are known but no evacuation plan was found
    /// while the agent, just started, is still learning the fleet (the
    /// start-up grace): planning is tried again at this instant instead of
    /// aborting a drain that the previous process had started.
    #[serde(default)]
    pub replan_at: Option<DateTime<Utc>>,
    /// `deactivate-node` was asked (journaled before the call): an abort or
    /// cancel must `activate-node` again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub district_deactivated: bool,
    /// Runs of the current district command.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub paas_attempts: u32,
    /// When the current district command is run again after a retryable failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paas_retry_at: Option<DateTime<Utc>>,
    /// The last refusal or failure of a PaaS command, with its cause
    /// (`deactivate-node refused (node_unreachable): …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refusal: Option<String>,
    /// The current round's moves when the broker agent runs them (`openshift`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broker_moves: Vec<BrokerMove>,
    /// When the node sent the `event.done` of the last command answered, by
    /// its clock; cleared when a new command is sent. A report it sent
    /// before then is not used to judge that command (`confirm.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<DateTime<Utc>>,
    /// The newest report of the node taken since the drain began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seen: Option<Seen>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What a scale-down is told.
#[derive(Debug, Clone, PartialEq)]
pub enum DownInput<'m> {
    /// Just decided: deactivate the node.
    Start,
    /// A node event about this operation.
    Event {
        /// The sender (events from another node than the victim are ignored).
        from: &'m str,
        /// The event.
        msg: &'m Message,
        /// When the sender sent it, by its clock (the envelope's `ts`).
        sent: DateTime<Utc>,
    },
    /// The victim reported (it may show itself empty).
    Report(Seen),
    /// The answer to its latest handler call.
    Result(CallResult),
    /// Time passed: deadlines, re-sends, polls.
    Tick,
    /// The agent restarted: re-issue the effect of the current step.
    Resume,
    /// Stop and re-activate the node, unless it is past the point of return.
    Abort {
        /// Why.
        why: String,
        /// A drain cancel (pressure returned) rather than an abort.
        cancel: bool,
    },
}

/// How a scale-down ended, for its group (cooldowns) and the fleet.
#[derive(Debug, Clone, PartialEq)]
pub enum DownOutcome {
    /// The saga reached its end.
    Ended(DownEnd),
}

/// What a scale-down reads besides its own state.
pub struct DownCtx<'a> {
    /// Its id.
    pub op: &'a OpId,
    /// Its group.
    pub group: &'a GroupKey,
    /// Why it was started (the deactivate command says it).
    pub reason: &'a str,
    /// Timeouts, attempts, parallelism, the start-up grace.
    pub cfg: &'a BrokerConfig,
    /// The fleet and the other operations.
    pub facts: Facts<'a>,
    /// Where the gears go.
    pub planner: &'a dyn EvacuationPlanner,
    /// New command ids.
    pub ids: &'a mut dyn FnMut() -> Uuid,
}

type DownOut = Out<DownOutcome>;

impl DownCtx<'_> {
    /// Whether OpenShift is told (`[paas] kind = "openshift"`).
    pub(super) fn openshift(&self) -> bool {
        self.cfg.paas.kind == crate::paas::PaasKind::OpenShift
    }
}

impl ScaleDown {
    /// A drain of `node`, about to send its first command.
    pub fn new(node: &str, origin: Origin, now: DateTime<Utc>) -> ScaleDown {
        ScaleDown {
            node: node.to_string(),
            origin,
            keep: false,
            step: DownStep::Deactivating,
            cmd: None,
            cmd_sent: None,
            sends: 0,
            deadline: now,
            round: 0,
            gears: vec![],
            moves: vec![],
            progress: DrainProgress::default(),
            remove_attempt: 0,
            removed_at: None,
            remove_uncertain: false,
            next_call: None,
            presence: None,
            abort_reason: None,
            end: None,
            replan_at: None,
            district_deactivated: false,
            paas_attempts: 0,
            paas_retry_at: None,
            refusal: None,
            broker_moves: vec![],
            done_at: None,
            seen: None,
        }
    }

    /// The short state name: the step, or how it ended.
    pub fn state_name(&self) -> &'static str {
        match (&self.step, &self.end) {
            (DownStep::Done, Some(e)) => e.name(),
            (s, _) => s.name(),
        }
    }

    /// Whether the node is being removed or was: no longer capacity, not missing.
    pub fn is_removing(&self) -> bool {
        matches!(
            self.step,
            DownStep::DistrictRemoving | DownStep::Removing | DownStep::ConfirmingGone
        ) || self.end == Some(DownEnd::Removed)
    }

    /// The machine.
    pub fn step(
        &mut self,
        cx: &mut DownCtx<'_>,
        input: DownInput<'_>,
        now: DateTime<Utc>,
    ) -> DownOut {
        match input {
            DownInput::Start if cx.openshift() => self.start_in_district(cx, now),
            DownInput::Start => self.deactivate_node(cx, now),
            DownInput::Event { from, msg, sent } => self.on_event(cx, from, msg, sent, now),
            DownInput::Report(r) => self.on_report(cx, r, now),
            DownInput::Result(r) => self.on_answer(cx, r, now),
            DownInput::Tick => self.on_tick(cx, now),
            DownInput::Resume => self.resume(cx, now),
            DownInput::Abort { why, cancel } => self.abort(cx, why, cancel, now),
        }
    }

    /// Tells the node to stop taking gears (`cmd.deactivate`).
    fn deactivate_node(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        let msg = Message::Deactivate(Deactivate {
            reason: cx.reason.to_string(),
            epoch: 0,
        });
        self.enter(cx, DownStep::Deactivating, Some(msg), now)
    }

    /// The command of the current step, as first sent (re-sends and resumes).
    fn current_command(&self, cx: &DownCtx<'_>) -> Option<Message> {
        let saga = &cx.cfg.saga;
        Some(match &self.step {
            DownStep::Deactivating => Message::Deactivate(Deactivate {
                reason: cx.reason.to_string(),
                epoch: 0,
            }),
            DownStep::Inventorying => Message::Inventory(InventoryRequest::default()),
            DownStep::Reactivating { .. } => Message::Activate(Activate {
                reason: self.abort_reason.clone().unwrap_or_default(),
                epoch: 0,
            }),
            DownStep::Evacuating => Message::Evacuate(self.evacuate_message(
                cx,
                self.moves.clone(),
                self.deadline - dur(saga.command_timeout),
            )),
            _ => return None,
        })
    }

    /// Moves to `step`, with a new command when given.
    fn enter(
        &mut self,
        cx: &mut DownCtx<'_>,
        step: DownStep,
        msg: Option<Message>,
        now: DateTime<Utc>,
    ) -> DownOut {
        let cmd = msg.as_ref().map(|_| (cx.ids)());
        if cmd.is_some() {
            self.done_at = None;
        }
        self.step = step;
        self.replan_at = None;
        self.cmd = cmd;
        self.cmd_sent = cmd.map(|_| now);
        self.sends = u32::from(cmd.is_some());
        self.deadline = now + dur(cx.cfg.saga.command_timeout);
        match (msg, cmd) {
            (Some(msg), Some(id)) => Out::effect(Effect::Send {
                node: self.node.clone(),
                id,
                msg,
            }),
            _ => Out::touched(),
        }
    }

    /// Sends the current command again (with a new id), or fails the step.
    fn resend(&mut self, cx: &mut DownCtx<'_>, why: String, now: DateTime<Utc>) -> DownOut {
        if self.sends >= cx.cfg.saga.command_attempts {
            let why = format!("{why}; sent {} times", self.sends);
            return self.step_failed(cx, why, now);
        }
        let Some(msg) = self.current_command(cx) else {
            return Out::none();
        };
        tracing::warn!(op = %cx.op, why, "sending the command again");
        let id = (cx.ids)();
        self.cmd = Some(id);
        self.cmd_sent = Some(now);
        self.sends += 1;
        if self.step != DownStep::Evacuating {
            self.deadline = now + dur(cx.cfg.saga.command_timeout);
        }
        Out::effect(Effect::Send {
            node: self.node.clone(),
            id,
            msg,
        })
    }

    /// The current step cannot go on.
    fn step_failed(&mut self, cx: &mut DownCtx<'_>, why: String, now: DateTime<Utc>) -> DownOut {
        match &self.step {
            DownStep::Reactivating { .. } => self.end(DownEnd::Failed {
                reason: format!("could not re-activate the node: {why}"),
            }),
            s if s.cancellable() => self.abort(cx, why, false, now),
            _ => Out::none(),
        }
    }

    /// Aborts (or cancels) a drain: the node is re-activated.
    fn abort(
        &mut self,
        cx: &mut DownCtx<'_>,
        why: String,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> DownOut {
        if !self.step.cancellable() {
            return Out::none();
        }
        self.reactivate(cx, why, cancel, now)
    }

    /// Re-activates the node: the node first (`cmd.activate`), then its
    /// district; a node never told to deactivate only in its district.
    fn reactivate(
        &mut self,
        cx: &mut DownCtx<'_>,
        why: String,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> DownOut {
        tracing::warn!(op = %cx.op, node = %self.node, why, cancel, "re-activating the node");
        if self.step == DownStep::DistrictDeactivating {
            self.abort_reason = Some(why);
            return self.activate_in_district(cx, cancel, now);
        }
        let msg = Message::Activate(Activate {
            reason: if cancel {
                format!("drain cancelled: {why}")
            } else {
                format!("scale-down aborted: {why}")
            },
            epoch: 0,
        });
        self.abort_reason = Some(why);
        self.enter(cx, DownStep::Reactivating { cancel }, Some(msg), now)
    }

    /// The node answered `Activated` to the abort or cancel: its district
    /// next, when it was deactivated there.
    fn node_reactivated(
        &mut self,
        cx: &mut DownCtx<'_>,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.district_deactivated {
            self.activate_in_district(cx, cancel, now)
        } else {
            self.reactivated(cancel)
        }
    }

    /// The node is active again, in its district too.
    fn reactivated(&mut self, cancel: bool) -> DownOut {
        let end = if cancel {
            DownEnd::Cancelled
        } else {
            DownEnd::Aborted {
                reason: self.abort_reason.clone().unwrap_or_default(),
            }
        };
        self.end(end)
    }

    /// Ends the saga and says how.
    fn end(&mut self, end: DownEnd) -> DownOut {
        self.step = DownStep::Done;
        self.end = Some(end.clone());
        self.cmd = None;
        let node = &self.node;
        let (kind, reason) = match &end {
            DownEnd::Removed => (DecisionKind::Removed, format!("{node} is empty and gone")),
            DownEnd::Kept => (
                DecisionKind::Drained,
                format!("{node} is empty and kept, inactive and cordoned, for maintenance"),
            ),
            DownEnd::Cancelled => (
                DecisionKind::DrainCancelled,
                format!("{node} is active again: scale-up pressure returned during its drain"),
            ),
            DownEnd::Aborted { reason } => (
                DecisionKind::Aborted,
                format!("scale-down of {node} aborted, node active again: {reason}"),
            ),
            DownEnd::Failed { reason } => (
                DecisionKind::Aborted,
                format!("scale-down of {node} failed and needs an operator: {reason}"),
            ),
        };
        Out {
            outcome: Some(DownOutcome::Ended(end)),
            ..Out::effect(Effect::Decide(Note {
                kind,
                node: Some(node.clone()),
                reason,
                stats: true,
            }))
        }
    }

    /// Re-issues the current step's effect after a restart. Commands keep
    /// their ids: a node that has one already refuses the copy as a replay.
    fn resume(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        match &self.step {
            DownStep::Deactivating
            | DownStep::Inventorying
            | DownStep::Evacuating
            | DownStep::Reactivating { .. } => {
                let sent = match (self.cmd, self.current_command(cx)) {
                    (Some(id), Some(msg)) => Out {
                        effects: vec![Effect::Send {
                            node: self.node.clone(),
                            id,
                            msg,
                        }],
                        ..Out::none()
                    },
                    _ => Out::none(),
                };
                sent.then(self.resume_moves())
            }
            DownStep::Removing => self.resume_removing(cx, now),
            DownStep::ConfirmingGone => self.call_presence(cx),
            DownStep::DistrictDeactivating
            | DownStep::DistrictActivating { .. }
            | DownStep::DistrictRemoving => self.resume_district(cx),
            _ => Out::none(),
        }
    }

    fn on_tick(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        let cmd_timeout = dur(cx.cfg.saga.command_timeout);
        let asking = matches!(self.step, DownStep::Deactivating | DownStep::Inventorying);
        match self.step {
            _ if asking && self.replan_at.is_some_and(|t| now >= t) => {
                self.replan_at = None;
                let gears = self.gears.clone();
                self.plan(cx, gears, now)
            }
            // The node answered; waiting to plan again, not to resend.
            _ if asking && self.replan_at.is_some() => Out::none(),
            DownStep::Deactivating | DownStep::Inventorying | DownStep::Reactivating { .. }
                if self.cmd_sent.is_some_and(|t| now - t >= cmd_timeout) =>
            {
                self.resend(cx, format!("no answer within {cmd_timeout}"), now)
            }
            DownStep::Evacuating if now >= self.deadline => {
                self.next_round(cx, "evacuation deadline passed".into(), now)
            }
            DownStep::ConfirmingEmpty if now >= self.deadline => {
                self.next_round(cx, "no report showed the node empty in time".into(), now)
            }
            DownStep::Removing | DownStep::ConfirmingGone => self.removal_tick(cx, now),
            DownStep::DistrictDeactivating
            | DownStep::DistrictActivating { .. }
            | DownStep::DistrictRemoving => self.district_tick(cx, now),
            DownStep::Evacuating => self.launch_moves(cx, now),
            _ => Out::none(),
        }
    }
}

#[cfg(test)]
mod tests;
