//! Operations (sagas) and per-group state: plain data, journaled as JSON.
//!
//! A scale-up goes `Preflight -> Requesting -> Booting -> Joined`, or ends
//! `Failed` / `TimedOut`; `Checking` asks the handler whether a request whose
//! outcome is unknown reached the cloud, and `Waiting` delays a retry.
//!
//! A scale-down goes `Deactivating -> (Inventorying) -> Evacuating ->
//! ConfirmingEmpty -> Removing -> ConfirmingGone -> Done(Removed)`; an abort
//! or a drain cancel goes through `Reactivating` to `Done(Aborted|Cancelled)`.

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GearInfo, Move};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An operation id, `op-` and 12 hex digits.
pub type OpId = String;

/// A new operation id.
pub fn new_op_id(u: Uuid) -> OpId {
    let s = u.simple().to_string();
    format!("op-{}", &s[..12])
}

/// One operation: a scale-up or a scale-down saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Operation id (`corr` of its commands and decisions).
    pub id: OpId,
    /// The node group.
    pub group: GroupKey,
    /// The handler that acts for it.
    pub handler: String,
    /// Why it was started.
    pub reason: String,
    /// When it was decided.
    pub created: DateTime<Utc>,
    /// Last state change.
    pub updated: DateTime<Utc>,
    /// Handler calls issued so far; a result is only taken for the latest.
    pub call_seq: u32,
    /// The saga.
    pub body: OpBody,
}

impl Op {
    /// Whether the operation reached its end.
    pub fn is_done(&self) -> bool {
        match &self.body {
            OpBody::ScaleUp(u) => u.step.is_terminal(),
            OpBody::ScaleDown(d) => matches!(d.step, DownStep::Done),
        }
    }

    /// The short state name, for status and metrics.
    pub fn state(&self) -> &'static str {
        match &self.body {
            OpBody::ScaleUp(u) => u.step.name(),
            OpBody::ScaleDown(d) => match (&d.step, &d.end) {
                (DownStep::Done, Some(e)) => e.name(),
                (s, _) => s.name(),
            },
        }
    }

    /// `scale_up` or `scale_down`.
    pub fn kind(&self) -> &'static str {
        match self.body {
            OpBody::ScaleUp(_) => "scale_up",
            OpBody::ScaleDown(_) => "scale_down",
        }
    }

    /// The node concerned, when known.
    pub fn node(&self) -> Option<&str> {
        match &self.body {
            OpBody::ScaleUp(u) => u.node.as_deref(),
            OpBody::ScaleDown(d) => Some(&d.node),
        }
    }
}

/// The two sagas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpBody {
    /// Ask the cloud for one node.
    ScaleUp(ScaleUp),
    /// Empty and remove one node.
    ScaleDown(ScaleDown),
}

/// A scale-up saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleUp {
    /// Where it is.
    pub step: UpStep,
    /// Create requests made (1 for the first).
    pub attempt: u32,
    /// The new node's name, when the handler or the join told.
    pub node: Option<String>,
    /// The cloud's id of the new node.
    pub cloud_id: Option<String>,
    /// When the (last) create request was accepted or became uncertain.
    pub requested_at: Option<DateTime<Utc>>,
    /// The last thing the handler said.
    pub detail: String,
}

/// Steps of a scale-up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum UpStep {
    /// Asking the handler how much capacity is left.
    Preflight,
    /// The create request is (or may be) in flight. Journaled before the call.
    Requesting,
    /// Asking the handler whether an earlier request reached the cloud.
    Checking,
    /// Waiting before another create request (the cloud was busy).
    Waiting {
        /// When to ask again.
        until: DateTime<Utc>,
    },
    /// The node is being built; waiting for its first report.
    Booting {
        /// The handler could not tell whether the request reached the cloud.
        uncertain: bool,
    },
    /// The node reported with this operation's id.
    Joined,
    /// The request failed.
    Failed {
        /// `quota`, `busy`, `transient`, `permanent` or `aborted`.
        kind: String,
        /// What went wrong.
        error: String,
    },
    /// The node never reported within the provision timeout.
    TimedOut,
}

impl UpStep {
    /// Whether this is an end state.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            UpStep::Joined | UpStep::Failed { .. } | UpStep::TimedOut
        )
    }

    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            UpStep::Preflight => "preflight",
            UpStep::Requesting => "requesting",
            UpStep::Checking => "checking",
            UpStep::Waiting { .. } => "waiting",
            UpStep::Booting { .. } => "booting",
            UpStep::Joined => "joined",
            UpStep::Failed { .. } => "failed",
            UpStep::TimedOut => "timed_out",
        }
    }
}

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
    /// Next handler call (remove retry or presence poll).
    pub next_call: Option<DateTime<Utc>>,
    /// The handler's last presence answer after the removal.
    #[serde(default)]
    pub presence: Option<gearshift_handlers::Presence>,
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
}

/// Steps of a scale-down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum DownStep {
    /// `cmd.deactivate` sent; waiting for `Deactivated{gears}`.
    Deactivating,
    /// `cmd.inventory` sent; waiting for `Inventory{gears}`.
    Inventorying,
    /// `cmd.evacuate` sent; following progress until `Evacuated`.
    Evacuating,
    /// Waiting for a report that shows the node empty.
    ConfirmingEmpty,
    /// The handler is asked to remove exactly this node. Journaled before the call.
    Removing,
    /// Waiting until the handler says gone or the reports stop.
    ConfirmingGone,
    /// `cmd.activate` sent (abort or drain cancel).
    Reactivating {
        /// A drain cancel (pressure returned) rather than an abort.
        cancel: bool,
    },
    /// Finished; see `end`.
    Done,
}

impl DownStep {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            DownStep::Deactivating => "deactivating",
            DownStep::Inventorying => "inventorying",
            DownStep::Evacuating => "evacuating",
            DownStep::ConfirmingEmpty => "confirming_empty",
            DownStep::Removing => "removing",
            DownStep::ConfirmingGone => "confirming_gone",
            DownStep::Reactivating { cancel: true } => "cancelling",
            DownStep::Reactivating { cancel: false } => "aborting",
            DownStep::Done => "done",
        }
    }

    /// Whether a drain cancel can still bring the node back (nothing was removed).
    pub fn cancellable(&self) -> bool {
        matches!(
            self,
            DownStep::Deactivating
                | DownStep::Inventorying
                | DownStep::Evacuating
                | DownStep::ConfirmingEmpty
        )
    }
}

/// How a scale-down ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum DownEnd {
    /// Empty and gone.
    Removed,
    /// Aborted; the node is active again.
    Aborted {
        /// Why.
        reason: String,
    },
    /// Pressure returned; the node is active again.
    Cancelled,
    /// Could not finish nor re-activate: needs an operator.
    Failed {
        /// Why.
        reason: String,
    },
}

impl DownEnd {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            DownEnd::Removed => "removed",
            DownEnd::Aborted { .. } => "aborted",
            DownEnd::Cancelled => "cancelled",
            DownEnd::Failed { .. } => "failed",
        }
    }
}

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

/// Per-group memory of the policy: cooldowns, backoff, exhaustion.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupState {
    /// Last scale-up decision.
    pub last_scale_up: Option<DateTime<Utc>>,
    /// Last completed removal.
    pub last_scale_down: Option<DateTime<Utc>>,
    /// Last failed (aborted) scale-down.
    pub last_failure: Option<DateTime<Utc>>,
    /// No scale-up before this (after failed scale-ups).
    pub backoff_until: Option<DateTime<Utc>>,
    /// Consecutive failed scale-ups.
    pub up_failures: u32,
    /// Consecutive quota failures.
    pub quota_failures: u32,
    /// Set while the cloud has no capacity for the group.
    pub exhausted: Option<Exhaustion>,
    /// Since when the group is continuously under its compact threshold.
    pub underused_since: Option<DateTime<Utc>>,
    /// Last scaling decision (reports must be newer to decide again).
    pub last_decision: Option<DateTime<Utc>>,
}
