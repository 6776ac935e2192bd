//! What the core asks of its driver ([`Action`]), what an operation's
//! machine asks of the coordinator ([`Effect`]), and what the driver
//! journals ([`Changes`], [`Meta`], [`Restored`]).

use std::collections::BTreeSet;

use chrono::Duration;
use gearshift_handlers::{
    Capacity, CreateOutcome, CreateRequest, GroupKey, HandlerError, Lookup, NodeShape, Presence,
    RemoveOutcome, RemoveRequest,
};
use gearshift_proto::msg::{Decision, DecisionKind, Explanation, Message};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::ops::{GroupState, Op, OpId};
use crate::paas::Outcome;

/// Converts a std duration to chrono (saturating at ten years).
pub fn dur(d: std::time::Duration) -> Duration {
    Duration::from_std(d).unwrap_or(Duration::days(3650))
}

/// Something the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a signed command on `cmd.<node>`.
    Send {
        /// Target node.
        node: String,
        /// Operation id (`corr`).
        corr: OpId,
        /// Envelope id (stable across re-sends after a restart).
        id: Uuid,
        /// The command.
        msg: Message,
    },
    /// Call the handler; the result comes back through
    /// [`Core::on_handler_result`](crate::core::Core::on_handler_result).
    Call {
        /// Where the result goes.
        tag: CallTag,
        /// Handler name.
        handler: String,
        /// The call.
        call: HandlerCall,
    },
    /// Run a PaaS command (`[paas]`: `oo-admin-ctl-district`,
    /// `oo-admin-move`); the outcome comes back through
    /// [`Core::on_handler_result`](crate::core::Core::on_handler_result)
    /// tagged [`CallTag::Paas`].
    Paas {
        /// The operation that asked.
        op: OpId,
        /// The command.
        call: PaasCall,
    },
    /// Publish a decision on `decision.<kind>.<district>.<profile>`.
    Decide(Decision),
    /// Publish an explanation on `explain.<district>.<profile>`.
    Explain(Explanation),
    /// A node refused a command as older than the newest leader epoch it
    /// has seen: this agent has been deposed, or is behind. The driver
    /// logs and counts it, and hands it to whatever decides leadership
    /// (step down). Nothing is journaled for it.
    StaleEpoch(StaleEpoch),
}

/// A `stale_epoch` refusal, as the core read it from `event.refused`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleEpoch {
    /// The node that refused.
    pub node: String,
    /// The refused command's id, when the answer names it (a summary of
    /// refusals held back by the node's rate limit does not).
    pub cmd: Option<Uuid>,
    /// The epoch this agent stamps ([`Core::epoch`](crate::core::Core::epoch)).
    pub ours: u64,
    /// The newest epoch the node has seen, when the answer names it.
    pub theirs: Option<u64>,
    /// The node's words.
    pub detail: String,
}

impl Action {
    /// This action with leader epoch `epoch` in every message and request
    /// that carries one: commands, decisions, and the handler requests
    /// that may become commands (`heat-via-node` sends `cmd.heat_signal`).
    pub fn stamped(mut self, epoch: u64) -> Action {
        match &mut self {
            Action::Send { msg, .. } => {
                msg.set_epoch(epoch);
            }
            Action::Decide(d) => d.epoch = epoch,
            Action::Call { call, .. } => call.stamp(epoch),
            Action::Paas { .. } | Action::Explain(_) | Action::StaleEpoch(_) => {}
        }
        self
    }
}

/// Who a handler result belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallTag {
    /// An operation's step; `seq` must still be the op's latest call.
    Op {
        /// The operation.
        op: OpId,
        /// Its call number.
        seq: u32,
    },
    /// A group's exhaustion check.
    Group(GroupKey),
    /// An operation's PaaS command. Several may be in flight (gear moves):
    /// the machine matches the answer to its state by the call it echoes.
    Paas(OpId),
}

/// One PaaS command, as a saga asks for it. `district` is the district's
/// UUID as nodes report it; `host`, `target` server identities.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum PaasCall {
    /// `oo-admin-ctl-district -c deactivate-node`.
    Deactivate {
        /// District UUID.
        district: String,
        /// The node.
        host: String,
    },
    /// `oo-admin-ctl-district -c activate-node`.
    Activate {
        /// District UUID.
        district: String,
        /// The node.
        host: String,
    },
    /// `oo-admin-ctl-district -c add-node`: a new, empty, undistricted node
    /// joins the district (add-node checks `profile` against the district's).
    AddNode {
        /// District UUID.
        district: String,
        /// The node.
        host: String,
        /// The node's profile.
        profile: String,
    },
    /// `oo-admin-ctl-district -c remove-node`.
    RemoveNode {
        /// District UUID.
        district: String,
        /// The node.
        host: String,
    },
    /// `oo-admin-move --gear_uuid {gear} -i {target}`.
    Move {
        /// Gear UUID.
        gear: String,
        /// Target node.
        target: String,
    },
}

impl PaasCall {
    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            PaasCall::Deactivate { .. } => "deactivate_node",
            PaasCall::Activate { .. } => "activate_node",
            PaasCall::AddNode { .. } => "add_node",
            PaasCall::RemoveNode { .. } => "remove_node",
            PaasCall::Move { .. } => "move_gear",
        }
    }
}

/// A handler call.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerCall {
    /// `create_node`.
    Create(CreateRequest),
    /// `remove_node`.
    Remove(RemoveRequest),
    /// `lookup(op)`: did an earlier create request reach the cloud?
    Lookup {
        /// Operation id.
        op: OpId,
        /// Group.
        group: GroupKey,
    },
    /// `presence(node)`: is a removed node gone?
    Presence {
        /// Node.
        node: String,
        /// Group.
        group: GroupKey,
    },
    /// `capacity(group)`: how many more nodes the cloud takes.
    Capacity {
        /// Group.
        group: GroupKey,
        /// The group's cloud shape.
        shape: NodeShape,
    },
}

impl HandlerCall {
    /// Sets the leader epoch of a create or remove request.
    fn stamp(&mut self, epoch: u64) {
        match self {
            HandlerCall::Create(r) => r.epoch = epoch,
            HandlerCall::Remove(r) => r.epoch = epoch,
            HandlerCall::Lookup { .. }
            | HandlerCall::Presence { .. }
            | HandlerCall::Capacity { .. } => {}
        }
    }

    /// Short name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            HandlerCall::Create(_) => "create",
            HandlerCall::Remove(_) => "remove",
            HandlerCall::Lookup { .. } => "lookup",
            HandlerCall::Presence { .. } => "presence",
            HandlerCall::Capacity { .. } => "capacity",
        }
    }

    /// This call's answer when it could not be made or timed out.
    pub fn failed(&self, e: HandlerError) -> CallResult {
        match self {
            HandlerCall::Create(_) => CallResult::Create(Err(e)),
            HandlerCall::Remove(_) => CallResult::Remove(Err(e)),
            HandlerCall::Lookup { .. } => CallResult::Lookup(Err(e)),
            HandlerCall::Presence { .. } => CallResult::Presence(Err(e)),
            HandlerCall::Capacity { .. } => CallResult::Capacity(Err(e)),
        }
    }
}

/// A handler's answer (a timeout is a `Transient` error).
#[derive(Debug, Clone, PartialEq)]
pub enum CallResult {
    /// Of `create_node`.
    Create(Result<CreateOutcome, HandlerError>),
    /// Of `remove_node`.
    Remove(Result<RemoveOutcome, HandlerError>),
    /// Of `lookup`.
    Lookup(Result<Lookup, HandlerError>),
    /// Of `presence`.
    Presence(Result<Presence, HandlerError>),
    /// Of `capacity`.
    Capacity(Result<Capacity, HandlerError>),
    /// Of a PaaS command: the call, echoed, and what OpenShift answered (a
    /// command that could not run is a [`Outcome::Failed`]).
    Paas {
        /// The call.
        call: PaasCall,
        /// The answer.
        outcome: Outcome,
    },
}

impl CallResult {
    /// `ok`, or the error's label (`quota`, `busy`, ...), for metrics.
    pub fn label(&self) -> &'static str {
        let e = match self {
            CallResult::Create(r) => r.as_ref().err(),
            CallResult::Remove(r) => r.as_ref().err(),
            CallResult::Lookup(r) => r.as_ref().err(),
            CallResult::Presence(r) => r.as_ref().err(),
            CallResult::Capacity(r) => r.as_ref().err(),
            CallResult::Paas { outcome, .. } => return outcome.label(),
        };
        e.map_or("ok", HandlerError::label)
    }
}

/// What an operation's machine (or a group's exhaustion tracker) asks for.
/// The coordinator addresses it: the operation id as `corr`, the handler,
/// the call number, the group's figures on a decision.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Send a command to a node.
    Send {
        /// Target node.
        node: String,
        /// Envelope id.
        id: Uuid,
        /// The command.
        msg: Message,
    },
    /// Call the operation's (or group's) handler.
    Call(HandlerCall),
    /// Run a PaaS command for the operation.
    Paas(PaasCall),
    /// Publish a decision about the operation's (or tracker's) group.
    Decide(Note),
}

/// A decision as a machine states it; the coordinator adds the group, the
/// operation, the handler and the figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Note {
    /// What was decided.
    pub kind: DecisionKind,
    /// The node concerned.
    pub node: Option<String>,
    /// Why, for people.
    pub reason: String,
    /// Whether it carries the group's `oo-stats` figures (taken after the step).
    pub stats: bool,
}

/// Which records changed since the last
/// [`Core::take_changes`](crate::core::Core::take_changes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// Operations to write.
    pub ops: BTreeSet<OpId>,
    /// Operations to delete (pruned history).
    pub deleted_ops: BTreeSet<OpId>,
    /// Groups to write.
    pub groups: BTreeSet<GroupKey>,
    /// The marks changed.
    pub marks: bool,
    /// The cordons changed.
    pub cordons: bool,
    /// The breaker state changed.
    pub meta: bool,
}

impl Changes {
    /// Nothing changed.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
            && self.deleted_ops.is_empty()
            && self.groups.is_empty()
            && !self.marks
            && !self.cordons
            && !self.meta
    }
}

/// Persisted odds and ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Whether the stale-node breaker is open.
    pub breaker_open: bool,
    /// An operator's pause of the whole fleet (absent from earlier records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_pause: Option<crate::ops::Pause>,
    /// The leader epoch every command and decision is stamped with
    /// ([`Core::set_epoch`](crate::core::Core::set_epoch)); kept so that a
    /// restarted agent never stamps a lower one. Absent from earlier
    /// records, and 0 for a single agent without high availability.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

fn is_zero(e: &u64) -> bool {
    *e == 0
}

/// What a restart restores.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    /// Every journaled operation.
    pub ops: Vec<Op>,
    /// Every journaled group state.
    pub groups: Vec<(GroupKey, GroupState)>,
    /// Do-not-disrupt marks.
    pub marks: BTreeSet<String>,
    /// Cordoned nodes.
    pub cordons: std::collections::BTreeMap<String, crate::ops::Cordon>,
    /// The breaker state.
    pub meta: Meta,
}

/// What one step of an operation's machine did: effects for the coordinator
/// to address and carry out, an outcome that concerns the group (a failure,
/// a join, an end), and whether the operation's record changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Out<O> {
    /// In order.
    pub effects: Vec<Effect>,
    /// What the group's memory and the other machines must hear.
    pub outcome: Option<O>,
    /// The record changed: journal it, with `updated` set to now.
    pub touched: bool,
}

impl<O> Default for Out<O> {
    fn default() -> Self {
        Out {
            effects: vec![],
            outcome: None,
            touched: false,
        }
    }
}

impl<O> Out<O> {
    /// Nothing happened.
    pub fn none() -> Self {
        Self::default()
    }

    /// The record changed, nothing to do.
    pub fn touched() -> Self {
        Out {
            touched: true,
            ..Self::default()
        }
    }

    /// The record changed and `e` must be carried out.
    pub fn effect(e: Effect) -> Self {
        Out {
            effects: vec![e],
            outcome: None,
            touched: true,
        }
    }

    /// This, then `next` (whose outcome, if any, wins).
    pub fn then(mut self, next: Out<O>) -> Self {
        self.effects.extend(next.effects);
        self.outcome = next.outcome.or(self.outcome);
        self.touched |= next.touched;
        self
    }
}
