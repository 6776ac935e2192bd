//! The broker agent's brain, without I/O: `(state, input, now) -> (state, actions)`.
//!
//! [`Core`] holds the fleet model, the operations (sagas), the per-group
//! policy memory and the operator's marks. Every input (a report, a node
//! event, a handler result, a tick, an evaluation, an operator request) goes
//! through one method that changes the state and returns [`Action`]s for the
//! driver to carry out. The driver journals the changed records
//! ([`Core::take_changes`]) *before* it carries out the actions, so an effect
//! never happens without its intent on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::{
    Capacity, CreateOutcome, CreateRequest, GroupKey, HandlerError, Lookup, Presence,
    RemoveOutcome, RemoveRequest,
};
use gearshift_proto::msg::{
    Activate, CommandResult, Deactivate, Decision, DecisionKind, Evacuate, Explanation, GearInfo,
    GroupStats, InventoryRequest, Message, NodeProperties, NodeReport,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::config::BrokerConfig;
use crate::fleet::{Fleet, ReportRejected};
use crate::ops::*;
use crate::planner::{EvacuationPlanner, PlanInput};

/// Converts a std duration to chrono (saturating).
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
        corr: String,
        /// Envelope id (stable across re-sends after a restart).
        id: Uuid,
        /// The command.
        msg: Message,
    },
    /// Call the handler; the result comes back through [`Core::on_handler_result`].
    Call {
        /// Where the result goes.
        tag: CallTag,
        /// Handler name.
        handler: String,
        /// The call.
        call: HandlerCall,
    },
    /// Publish a decision on `decision.<kind>.<district>.<profile>`.
    Decide(Decision),
    /// Publish an explanation on `explain.<district>.<profile>`.
    Explain(Explanation),
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
}

/// A handler call.
#[derive(Debug, Clone, PartialEq)]
pub enum HandlerCall {
    /// `create_node`.
    Create(CreateRequest),
    /// `remove_node`.
    Remove(RemoveRequest),
    /// `lookup(op)`.
    Lookup {
        /// Operation id.
        op: OpId,
        /// Group.
        group: GroupKey,
    },
    /// `presence(node)`.
    Presence {
        /// Node.
        node: String,
        /// Group.
        group: GroupKey,
    },
    /// `capacity(group)`.
    Capacity {
        /// Group.
        group: GroupKey,
        /// Shape.
        shape: gearshift_handlers::NodeShape,
    },
}

impl HandlerCall {
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
}

/// Which records changed since the last [`Core::take_changes`].
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
            && !self.meta
    }
}

/// Persisted odds and ends.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// Whether the stale-node breaker is open.
    pub breaker_open: bool,
}

/// The state and the rules.
pub struct Core {
    pub(crate) cfg: Arc<BrokerConfig>,
    pub(crate) planner: Arc<dyn EvacuationPlanner>,
    pub(crate) fleet: Fleet,
    pub(crate) ops: BTreeMap<OpId, Op>,
    pub(crate) groups: BTreeMap<GroupKey, GroupState>,
    pub(crate) marks: BTreeSet<String>,
    pub(crate) meta: Meta,
    pub(crate) started: DateTime<Utc>,
    pub(crate) changes: Changes,
    pub(crate) idgen: Box<dyn FnMut() -> Uuid + Send>,
    /// When an early evaluation is due (a report pushed a group over a threshold).
    pub(crate) eval_due: Option<DateTime<Utc>>,
    /// When the first report since the last evaluation was consumed (decision latency).
    pub(crate) pressure_seen: Option<DateTime<Utc>>,
    pub(crate) last_eval: Option<DateTime<Utc>>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("nodes", &self.fleet.len())
            .field("ops", &self.ops.len())
            .finish_non_exhaustive()
    }
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
    /// Meta.
    pub meta: Meta,
}

impl Core {
    /// A core with empty state, started at `now`.
    pub fn new(
        cfg: Arc<BrokerConfig>,
        planner: Arc<dyn EvacuationPlanner>,
        now: DateTime<Utc>,
    ) -> Self {
        Core {
            cfg,
            planner,
            fleet: Fleet::new(),
            ops: BTreeMap::new(),
            groups: BTreeMap::new(),
            marks: BTreeSet::new(),
            meta: Meta::default(),
            started: now,
            changes: Changes::default(),
            idgen: Box::new(Uuid::new_v4),
            eval_due: None,
            pressure_seen: None,
            last_eval: None,
        }
    }

    /// Uses `f` for new ids (deterministic tests).
    pub fn with_ids(mut self, f: impl FnMut() -> Uuid + Send + 'static) -> Self {
        self.idgen = Box::new(f);
        self
    }

    /// Loads journaled state.
    pub fn restore(&mut self, r: Restored) {
        for op in r.ops {
            self.ops.insert(op.id.clone(), op);
        }
        self.groups.extend(r.groups);
        self.marks = r.marks;
        self.meta = r.meta;
    }

    /// Replaces the configuration (SIGHUP).
    pub fn set_config(&mut self, cfg: Arc<BrokerConfig>) {
        self.cfg = cfg;
    }

    /// The configuration.
    pub fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    /// The fleet model.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Every operation, finished ones included.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.ops.values()
    }

    /// One operation.
    pub fn op(&self, id: &str) -> Option<&Op> {
        self.ops.get(id)
    }

    /// A group's policy memory.
    pub fn group_state(&self, g: &GroupKey) -> GroupState {
        self.groups.get(g).cloned().unwrap_or_default()
    }

    /// Every group with policy memory.
    pub fn group_states(&self) -> &BTreeMap<GroupKey, GroupState> {
        &self.groups
    }

    /// Operator do-not-disrupt marks.
    pub fn marks(&self) -> &BTreeSet<String> {
        &self.marks
    }

    /// Persisted odds and ends.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The records changed since the last call; the driver journals them
    /// before carrying out the actions returned with them.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// When an early evaluation is due, if one is.
    pub fn evaluation_due(&self) -> Option<DateTime<Utc>> {
        self.eval_due
    }

    pub(crate) fn new_id(&mut self) -> Uuid {
        (self.idgen)()
    }

    pub(crate) fn touch_op(&mut self, id: &str, now: DateTime<Utc>) {
        if let Some(op) = self.ops.get_mut(id) {
            op.updated = now;
        }
        self.changes.ops.insert(id.to_string());
    }

    pub(crate) fn group_mut(&mut self, g: &GroupKey) -> &mut GroupState {
        self.changes.groups.insert(g.clone());
        self.groups.entry(g.clone()).or_default()
    }

    pub(crate) fn stale_intervals(&self) -> u32 {
        self.cfg.policy.stale_after_intervals
    }

    /// Nodes whose removal is under way or done: not capacity, not missing.
    pub(crate) fn removing_nodes(&self) -> BTreeSet<String> {
        self.ops
            .values()
            .filter_map(|op| match &op.body {
                OpBody::ScaleDown(d)
                    if matches!(d.step, DownStep::Removing | DownStep::ConfirmingGone)
                        || d.end == Some(DownEnd::Removed) =>
                {
                    Some(d.node.clone())
                }
                _ => None,
            })
            .collect()
    }

    /// The active scale-down of a node, if any.
    pub(crate) fn saga_of(&self, node: &str) -> Option<&Op> {
        self.ops
            .values()
            .find(|op| !op.is_done() && matches!(&op.body, OpBody::ScaleDown(d) if d.node == node))
    }

    /// `oo-stats` figures of a group, excluding nodes being removed.
    pub fn group_stats(&self, g: &GroupKey, now: DateTime<Utc>) -> GroupStats {
        let removing = self.removing_nodes();
        self.fleet
            .group_stats_without(g, now, self.stale_intervals(), &removing)
    }

    /// `oo-stats` figures of a profile.
    pub fn profile_stats(&self, profile: &str, now: DateTime<Utc>) -> GroupStats {
        let removing = self.removing_nodes();
        self.fleet
            .profile_stats_without(profile, now, self.stale_intervals(), &removing)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn decision(
        &self,
        kind: DecisionKind,
        g: &GroupKey,
        op: Option<&str>,
        node: Option<&str>,
        reason: String,
        handler: Option<&str>,
        stats: Option<GroupStats>,
    ) -> Action {
        Action::Decide(Decision {
            decision: kind,
            district: g.district.clone(),
            profile: g.profile.clone(),
            op: op.map(str::to_string),
            node: node.map(str::to_string),
            reason,
            handler: handler.map(str::to_string),
            stats,
        })
    }

    // ----------------------------------------------------------------- reports

    /// A node's report (already authenticated: signature, role, identity).
    pub fn on_report(
        &mut self,
        report: NodeReport,
        now: DateTime<Utc>,
    ) -> Result<Vec<Action>, ReportRejected> {
        let node = report.node.clone();
        // A late report from a node this agent removed (sent before it
        // stopped) must not bring it back as a missing node.
        let removed_after_start = self.ops.values().any(|op| {
            matches!(&op.body, OpBody::ScaleDown(d)
                if d.node == node && d.end == Some(DownEnd::Removed) && op.updated >= report.started_at)
        });
        if removed_after_start && self.fleet.get(&node).is_none() {
            return Err(ReportRejected::Removed);
        }
        let booted_for = report.booted_for.clone();
        let total = report.gears.total();
        let busy = report.operation.is_some();
        let accepted = self.fleet.accept(report, now)?;
        let mut out = vec![];
        if accepted.new_node {
            tracing::info!(node, "new node reporting");
        }
        // A scale-up's node joins with its first report.
        if let Some(op_id) = booted_for
            && let Some(op) = self.ops.get(&op_id)
            && let OpBody::ScaleUp(u) = &op.body
            && !u.step.is_terminal()
        {
            let g = op.group.clone();
            let handler = op.handler.clone();
            if let Some(op) = self.ops.get_mut(&op_id)
                && let OpBody::ScaleUp(u) = &mut op.body
            {
                u.step = UpStep::Joined;
                u.node = Some(node.clone());
            }
            self.touch_op(&op_id, now);
            let gs = self.group_mut(&g);
            gs.up_failures = 0;
            gs.backoff_until = None;
            gs.last_scale_up = Some(now);
            let stats = self.group_stats(&g, now);
            out.push(self.decision(
                DecisionKind::Joined,
                &g,
                Some(&op_id),
                Some(&node),
                format!("{node} reported for the first time, booted for {op_id}"),
                Some(&handler),
                Some(stats),
            ));
        }
        // A draining node that confirms it is empty.
        if let Some(op) = self.saga_of(&node)
            && let OpBody::ScaleDown(d) = &op.body
            && d.step == DownStep::ConfirmingEmpty
        {
            let id = op.id.clone();
            if total == 0 {
                out.extend(self.down_enter_removing(&id, now));
            } else if !busy {
                let reason = format!("{node} still reports {total} gears after its evacuation");
                out.extend(self.down_next_round(&id, reason, now));
            }
        }
        // React quickly when a group goes over a scale-up threshold.
        if self.eval_due.is_none() && self.pressure_on(&node, now) {
            self.eval_due = Some(now + dur(self.cfg.policy.react_delay));
            self.pressure_seen.get_or_insert(now);
        }
        Ok(out)
    }

    fn pressure_on(&self, node: &str, now: DateTime<Utc>) -> bool {
        let Some(e) = self.fleet.get(node) else {
            return false;
        };
        let g = e.group();
        let p = &self.cfg.policy;
        let gs = self.group_stats(&g, now);
        let ps = self.profile_stats(&g.profile, now);
        let over = |th: Option<u32>, u: f64| th.is_some_and(|t| u >= f64::from(t));
        over(
            p.district_threshold.get(&g.district, &g.profile),
            gs.usage_pct,
        ) || over(p.profile_threshold.for_profile(&g.profile), ps.usage_pct)
            || p.gear_up_threshold
                .for_profile(&g.profile)
                .is_some_and(|t| ps.effective_available_gears < t)
    }

    /// Decision latency start: the first report that showed pressure since
    /// the last evaluation, taken by the driver when a decision is published.
    pub fn take_pressure_seen(&mut self) -> Option<DateTime<Utc>> {
        self.pressure_seen.take()
    }

    // ------------------------------------------------------------ node events

    /// A node's event about one of our commands (already authenticated).
    pub fn on_event(
        &mut self,
        from: &str,
        corr: Option<&str>,
        msg: &Message,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(corr) = corr else {
            return vec![];
        };
        let Some(op) = self.ops.get(corr) else {
            tracing::debug!(corr, from, "event for an unknown operation");
            return vec![];
        };
        let OpBody::ScaleDown(d) = &op.body else {
            return vec![];
        };
        if d.node != from {
            tracing::warn!(corr, from, node = %d.node, "event from another node than the operation's: ignored");
            return vec![];
        }
        let id = op.id.clone();
        let step = d.step.clone();
        let cmd = d.cmd;
        match msg {
            Message::Ack(_) => vec![],
            Message::Progress(p) => {
                if step == DownStep::Evacuating && Some(p.cmd) == cmd {
                    if let Some(d) = self.down_mut(&id) {
                        let prev = d.progress;
                        d.progress.moved = p.moved;
                        d.progress.failed = p.failed;
                        d.progress.remaining = p.remaining;
                        d.progress.total = p.total;
                        d.progress.moved_total += p.moved.saturating_sub(prev.moved);
                    }
                    self.touch_op(&id, now);
                }
                vec![]
            }
            Message::Done(done) => self.down_on_done(&id, &step, done.cmd, &done.result, now),
            Message::Failed(f) => {
                if Some(f.cmd) != cmd {
                    return vec![];
                }
                let reason = format!("{} failed on {from}: {}", f.command, f.error);
                if f.retryable {
                    self.down_resend(&id, reason, now)
                } else {
                    self.down_step_failed(&id, reason, now)
                }
            }
            Message::Refused(r) => {
                if r.cmd.is_some() && r.cmd != cmd {
                    return vec![];
                }
                match r.reason.as_str() {
                    // A copy of a command it already has: its events follow.
                    "replayed" => vec![],
                    "expired" | "stale" => self.down_resend(
                        &id,
                        format!("{from} refused the command: {}", r.detail),
                        now,
                    ),
                    _ => self.down_step_failed(
                        &id,
                        format!("{from} refused the command ({}): {}", r.reason, r.detail),
                        now,
                    ),
                }
            }
            _ => vec![],
        }
    }

    pub(crate) fn down_mut(&mut self, id: &str) -> Option<&mut ScaleDown> {
        match self.ops.get_mut(id).map(|o| &mut o.body) {
            Some(OpBody::ScaleDown(d)) => Some(d),
            _ => None,
        }
    }

    pub(crate) fn up_mut(&mut self, id: &str) -> Option<&mut ScaleUp> {
        match self.ops.get_mut(id).map(|o| &mut o.body) {
            Some(OpBody::ScaleUp(u)) => Some(u),
            _ => None,
        }
    }

    fn down_on_done(
        &mut self,
        id: &str,
        step: &DownStep,
        cmd: Uuid,
        result: &CommandResult,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let current = self.down_mut(id).and_then(|d| d.cmd);
        if current != Some(cmd) {
            tracing::debug!(op = id, %cmd, "done for an older command: ignored");
            return vec![];
        }
        match (step, result) {
            (DownStep::Deactivating, CommandResult::Deactivated { gears })
            | (DownStep::Inventorying, CommandResult::Inventory { gears }) => {
                self.down_plan(id, gears.clone(), now)
            }
            (
                DownStep::Evacuating,
                CommandResult::Evacuated {
                    moved,
                    failed,
                    gears_left,
                    ..
                },
            ) => {
                if let Some(d) = self.down_mut(id) {
                    d.progress.moved = *moved;
                    d.progress.failed = *failed;
                    d.progress.remaining = 0;
                }
                if *gears_left == 0 {
                    self.down_enter(id, DownStep::ConfirmingEmpty, None, now);
                    let t = dur(self.cfg.saga.confirm_empty_timeout);
                    if let Some(d) = self.down_mut(id) {
                        d.deadline = now + t;
                    }
                    // The node may already have reported empty.
                    let node = self
                        .down_mut(id)
                        .map(|d| d.node.clone())
                        .unwrap_or_default();
                    if let Some(e) = self.fleet.get(&node)
                        && e.total_gears() == 0
                        && e.received >= now
                    {
                        return self.down_enter_removing(id, now);
                    }
                    vec![]
                } else {
                    self.down_next_round(
                        id,
                        format!("evacuation left {gears_left} gears ({failed} failed)"),
                        now,
                    )
                }
            }
            (DownStep::Reactivating { cancel }, CommandResult::Activated) => {
                let cancel = *cancel;
                self.down_finish_reactivated(id, cancel, now)
            }
            _ => vec![],
        }
    }

    /// Moves a scale-down to `step`, with a new command when given.
    pub(crate) fn down_enter(
        &mut self,
        id: &str,
        step: DownStep,
        msg: Option<Message>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let cmd_id = msg.as_ref().map(|_| self.new_id());
        let timeout = dur(self.cfg.saga.command_timeout);
        let mut out = vec![];
        if let Some(d) = self.down_mut(id) {
            d.step = step;
            d.replan_at = None;
            d.cmd = cmd_id;
            d.cmd_sent = cmd_id.map(|_| now);
            d.sends = u32::from(cmd_id.is_some());
            d.deadline = now + timeout;
            if let (Some(msg), Some(cid)) = (msg, cmd_id) {
                out.push(Action::Send {
                    node: d.node.clone(),
                    corr: id.to_string(),
                    id: cid,
                    msg,
                });
            }
        }
        self.touch_op(id, now);
        out
    }

    fn down_plan(&mut self, id: &str, gears: Vec<GearInfo>, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let OpBody::ScaleDown(d) = &op.body else {
            return vec![];
        };
        let node = d.node.clone();
        let group = op.group.clone();
        if let Some(g) = gears.iter().find(|g| g.do_not_disrupt) {
            let reason = format!("gear {} on {node} opted out of scale-down", g.id);
            if let Some(d) = self.down_mut(id) {
                d.gears = gears;
            }
            return self.down_abort(id, reason, false, now);
        }
        if let Some(d) = self.down_mut(id) {
            d.gears = gears.clone();
            d.round += 1;
            d.progress = DrainProgress {
                moved_total: d.progress.moved_total,
                ..Default::default()
            };
        }
        if gears.is_empty() {
            self.down_enter(id, DownStep::ConfirmingEmpty, None, now);
            let t = dur(self.cfg.saga.confirm_empty_timeout);
            if let Some(d) = self.down_mut(id) {
                d.moves.clear();
                d.deadline = now + t;
            }
            if self.fleet.get(&node).is_some_and(|e| e.total_gears() == 0) {
                return self.down_enter_removing(id, now);
            }
            return vec![];
        }
        let candidates = self.candidates(&group, &node, now);
        let district = (group.district != gearshift_proto::routing::NO_DISTRICT)
            .then_some(group.district.as_str());
        let plan = self.planner.plan(&PlanInput {
            victim: &node,
            district,
            gears: &gears,
            candidates,
            now,
        });
        let moves = match plan {
            Ok(m) => m,
            Err(e) => {
                // Just started (a resumed drain, most likely): the other
                // nodes may not have reported to this process yet. Try again
                // until the start-up grace is over, then give up as usual.
                let learning_until = self.started + dur(self.cfg.policy.startup_grace);
                if now < learning_until {
                    let retry = (now + Duration::seconds(1)).min(learning_until);
                    tracing::info!(
                        op = id,
                        node,
                        error = %e,
                        "no evacuation plan yet while the fleet reports after the start; planning again"
                    );
                    if let Some(d) = self.down_mut(id) {
                        d.round = d.round.saturating_sub(1);
                        d.replan_at = Some(retry);
                    }
                    self.touch_op(id, now);
                    return vec![];
                }
                return self.down_abort(
                    id,
                    format!("no evacuation plan for {node}: {e}"),
                    false,
                    now,
                );
            }
        };
        let s = &self.cfg.saga;
        let deadline = now + dur(s.evacuation_timeout);
        let msg = Message::Evacuate(Evacuate {
            moves: moves.clone(),
            parallelism: Some(s.evacuation_parallelism),
            deadline: Some(deadline),
        });
        let total = moves.len() as u32;
        let out = self.down_enter(id, DownStep::Evacuating, Some(msg), now);
        // The node gives up at `deadline`; allow it one command timeout to say so.
        let grace = dur(self.cfg.saga.command_timeout);
        if let Some(d) = self.down_mut(id) {
            d.moves = moves;
            d.deadline = deadline + grace;
            d.progress.total = total;
            d.progress.remaining = total;
        }
        out
    }

    /// Active, fresh nodes of the group other than the victim and other
    /// draining nodes, as placement candidates.
    pub(crate) fn candidates(
        &self,
        g: &GroupKey,
        victim: &str,
        now: DateTime<Utc>,
    ) -> Vec<NodeProperties> {
        let draining: BTreeSet<String> = self
            .ops
            .values()
            .filter(|o| !o.is_done())
            .filter_map(|o| match &o.body {
                OpBody::ScaleDown(d) => Some(d.node.clone()),
                _ => None,
            })
            .collect();
        let free = self.fleet.district_free_uids(&g.district);
        self.fleet
            .in_group(g)
            .filter(|e| {
                e.report.node != victim
                    && e.report.active
                    && !draining.contains(&e.report.node)
                    && e.is_fresh(now, self.stale_intervals())
            })
            .map(|e| {
                let r = &e.report;
                NodeProperties {
                    name: r.node.clone(),
                    node_consumed_capacity: if r.max_active_gears == 0 {
                        100.0
                    } else {
                        100.0 * f64::from(e.active_gears()) / f64::from(r.max_active_gears)
                    },
                    district_id: r.district_uuid().map(str::to_string),
                    district_available_capacity: free,
                    region_id: r.region.clone(),
                    zone_id: r.zone.clone(),
                    profile: Some(r.profile.clone()),
                    active: true,
                    mem_free_mb: Some(r.mem_free_mb),
                    gears_active: Some(e.active_gears()),
                    max_active_gears: Some(r.max_active_gears),
                }
            })
            .collect()
    }

    /// Another evacuation round (ask the inventory again), or abort when out of rounds.
    pub(crate) fn down_next_round(
        &mut self,
        id: &str,
        why: String,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let round = self.down_mut(id).map_or(0, |d| d.round);
        if round >= self.cfg.saga.evacuation_attempts {
            return self.down_abort(
                id,
                format!("{why}; gave up after {round} evacuation rounds"),
                false,
                now,
            );
        }
        tracing::info!(op = id, why, "evacuation: another round");
        self.down_enter(
            id,
            DownStep::Inventorying,
            Some(Message::Inventory(InventoryRequest {})),
            now,
        )
    }

    /// Sends the current command again (with a new id), or fails the step.
    pub(crate) fn down_resend(&mut self, id: &str, why: String, now: DateTime<Utc>) -> Vec<Action> {
        let attempts = self.cfg.saga.command_attempts;
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let OpBody::ScaleDown(d) = &op.body else {
            return vec![];
        };
        if d.sends >= attempts {
            return self.down_step_failed(id, format!("{why}; sent {} times", d.sends), now);
        }
        let msg = match &d.step {
            DownStep::Deactivating => Message::Deactivate(Deactivate {
                reason: op.reason.clone(),
            }),
            DownStep::Inventorying => Message::Inventory(InventoryRequest {}),
            DownStep::Reactivating { .. } => Message::Activate(Activate {
                reason: d.abort_reason.clone().unwrap_or_default(),
            }),
            DownStep::Evacuating => Message::Evacuate(Evacuate {
                moves: d.moves.clone(),
                parallelism: Some(self.cfg.saga.evacuation_parallelism),
                deadline: Some(d.deadline - dur(self.cfg.saga.command_timeout)),
            }),
            _ => return vec![],
        };
        tracing::warn!(op = id, why, "sending the command again");
        let new = self.new_id();
        let timeout = dur(self.cfg.saga.command_timeout);
        let mut out = vec![];
        if let Some(d) = self.down_mut(id) {
            d.cmd = Some(new);
            d.cmd_sent = Some(now);
            d.sends += 1;
            if d.step != DownStep::Evacuating {
                d.deadline = now + timeout;
            }
            out.push(Action::Send {
                node: d.node.clone(),
                corr: id.to_string(),
                id: new,
                msg,
            });
        }
        self.touch_op(id, now);
        out
    }

    /// The current step cannot go on.
    pub(crate) fn down_step_failed(
        &mut self,
        id: &str,
        why: String,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let step = match self.ops.get(id).map(|o| &o.body) {
            Some(OpBody::ScaleDown(d)) => d.step.clone(),
            _ => return vec![],
        };
        match step {
            DownStep::Reactivating { .. } => self.down_end(
                id,
                DownEnd::Failed {
                    reason: format!("could not re-activate the node: {why}"),
                },
                now,
            ),
            s if s.cancellable() => self.down_abort(id, why, false, now),
            _ => vec![],
        }
    }

    /// Aborts (or cancels) a drain: the node is re-activated.
    pub(crate) fn down_abort(
        &mut self,
        id: &str,
        why: String,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let OpBody::ScaleDown(d) = &op.body else {
            return vec![];
        };
        if !d.step.cancellable() {
            return vec![];
        }
        tracing::warn!(op = id, node = %d.node, why, cancel, "re-activating the node");
        let msg = Message::Activate(Activate {
            reason: if cancel {
                format!("drain cancelled: {why}")
            } else {
                format!("scale-down aborted: {why}")
            },
        });
        if let Some(d) = self.down_mut(id) {
            d.abort_reason = Some(why);
        }
        self.down_enter(id, DownStep::Reactivating { cancel }, Some(msg), now)
    }

    fn down_finish_reactivated(
        &mut self,
        id: &str,
        cancel: bool,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let reason = self
            .down_mut(id)
            .and_then(|d| d.abort_reason.clone())
            .unwrap_or_default();
        let end = if cancel {
            DownEnd::Cancelled
        } else {
            DownEnd::Aborted { reason }
        };
        self.down_end(id, end, now)
    }

    /// Ends a scale-down and publishes how.
    pub(crate) fn down_end(&mut self, id: &str, end: DownEnd, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let g = op.group.clone();
        let handler = op.handler.clone();
        let node = op.node().unwrap_or_default().to_string();
        if let Some(d) = self.down_mut(id) {
            d.step = DownStep::Done;
            d.end = Some(end.clone());
            d.cmd = None;
        }
        self.touch_op(id, now);
        let (kind, reason) = match &end {
            DownEnd::Removed => {
                self.group_mut(&g).last_scale_down = Some(now);
                self.fleet.forget(&node);
                (DecisionKind::Removed, format!("{node} is empty and gone"))
            }
            DownEnd::Cancelled => (
                DecisionKind::DrainCancelled,
                format!("{node} is active again: scale-up pressure returned during its drain"),
            ),
            DownEnd::Aborted { reason } => {
                self.group_mut(&g).last_failure = Some(now);
                (
                    DecisionKind::Aborted,
                    format!("scale-down of {node} aborted, node active again: {reason}"),
                )
            }
            DownEnd::Failed { reason } => {
                self.group_mut(&g).last_failure = Some(now);
                (
                    DecisionKind::Aborted,
                    format!("scale-down of {node} failed and needs an operator: {reason}"),
                )
            }
        };
        let stats = self.group_stats(&g, now);
        let mut out = vec![self.decision(
            kind,
            &g,
            Some(id),
            Some(&node),
            reason,
            Some(&handler),
            Some(stats),
        )];
        out.extend(self.prune(now));
        out
    }

    /// The node is confirmed empty: journal the intent and ask the handler.
    pub(crate) fn down_enter_removing(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let timeout = dur(self.cfg.saga.remove_timeout);
        if let Some(d) = self.down_mut(id) {
            d.step = DownStep::Removing;
            d.cmd = None;
            d.deadline = now + timeout;
            d.remove_attempt = 0;
        }
        self.touch_op(id, now);
        self.down_call_remove(id, now)
    }

    fn down_call_remove(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get_mut(id) else {
            return vec![];
        };
        op.call_seq += 1;
        let seq = op.call_seq;
        let group = op.group.clone();
        let handler = op.handler.clone();
        let OpBody::ScaleDown(d) = &mut op.body else {
            return vec![];
        };
        d.remove_attempt += 1;
        d.next_call = None;
        let req = RemoveRequest {
            op: id.to_string(),
            group,
            node: d.node.clone(),
            cloud_id: None,
            attempt: d.remove_attempt,
        };
        self.touch_op(id, now);
        vec![Action::Call {
            tag: CallTag::Op {
                op: id.to_string(),
                seq,
            },
            handler,
            call: HandlerCall::Remove(req),
        }]
    }

    fn down_call_presence(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get_mut(id) else {
            return vec![];
        };
        op.call_seq += 1;
        let seq = op.call_seq;
        let group = op.group.clone();
        let handler = op.handler.clone();
        let OpBody::ScaleDown(d) = &mut op.body else {
            return vec![];
        };
        d.next_call = None;
        let node = d.node.clone();
        self.touch_op(id, now);
        vec![Action::Call {
            tag: CallTag::Op {
                op: id.to_string(),
                seq,
            },
            handler,
            call: HandlerCall::Presence { node, group },
        }]
    }

    // --------------------------------------------------------- handler results

    /// A handler call finished (or timed out).
    pub fn on_handler_result(
        &mut self,
        tag: CallTag,
        result: CallResult,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        match tag {
            CallTag::Group(g) => self.on_exhaustion_check(&g, result, now),
            CallTag::Op { op, seq } => {
                let Some(o) = self.ops.get(&op) else {
                    return vec![];
                };
                if o.call_seq != seq || o.is_done() {
                    tracing::debug!(op, seq, "result of an older handler call: ignored");
                    return vec![];
                }
                match (&o.body, result) {
                    (OpBody::ScaleUp(_), r) => self.up_on_result(&op, r, now),
                    (OpBody::ScaleDown(_), CallResult::Remove(r)) => {
                        self.down_on_remove(&op, r, now)
                    }
                    (OpBody::ScaleDown(_), CallResult::Presence(r)) => {
                        self.down_on_presence(&op, r, now)
                    }
                    _ => vec![],
                }
            }
        }
    }

    fn down_on_remove(
        &mut self,
        id: &str,
        r: Result<RemoveOutcome, HandlerError>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let poll = dur(self.cfg.saga.presence_poll);
        match r {
            Ok(o) => {
                tracing::info!(op = id, detail = %o.detail, gone = o.gone, "remove request accepted");
                if o.gone {
                    return self.down_end(id, DownEnd::Removed, now);
                }
                if let Some(d) = self.down_mut(id) {
                    d.step = DownStep::ConfirmingGone;
                    d.removed_at = Some(now);
                    d.next_call = Some(now + poll);
                }
                self.touch_op(id, now);
                vec![]
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(op = id, error = %e, "remove request failed; will retry");
                if let Some(d) = self.down_mut(id) {
                    d.next_call = Some(now + poll);
                }
                self.touch_op(id, now);
                vec![]
            }
            Err(e) => {
                let g = self.ops.get(id).map(|o| o.group.clone());
                let mut out = vec![];
                if let Some(g) = g {
                    let node = self
                        .ops
                        .get(id)
                        .and_then(|o| o.node())
                        .unwrap_or_default()
                        .to_string();
                    let handler = self.ops.get(id).map(|o| o.handler.clone());
                    out.push(self.decision(
                        DecisionKind::HandlerFailed,
                        &g,
                        Some(id),
                        Some(&node),
                        format!("remove-node {node} failed ({}): {e}", e.label()),
                        handler.as_deref(),
                        None,
                    ));
                }
                out.extend(self.down_end(
                    id,
                    DownEnd::Failed {
                        reason: format!("the handler refused to remove the node: {e}"),
                    },
                    now,
                ));
                out
            }
        }
    }

    fn down_on_presence(
        &mut self,
        id: &str,
        r: Result<Presence, HandlerError>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let poll = dur(self.cfg.saga.presence_poll);
        let gone_by_reports = self.reports_stopped(id, now);
        if let (Ok(p), Some(d)) = (&r, self.down_mut(id)) {
            d.presence = Some(*p);
        }
        match r {
            Ok(Presence::Gone) => self.down_end(id, DownEnd::Removed, now),
            Ok(Presence::Unknown) if gone_by_reports => self.down_end(id, DownEnd::Removed, now),
            other => {
                if let Err(e) = other {
                    tracing::warn!(op = id, error = %e, "presence check failed");
                }
                if let Some(d) = self.down_mut(id) {
                    d.next_call = Some(now + poll);
                }
                self.touch_op(id, now);
                vec![]
            }
        }
    }

    /// Whether a removed node stopped reporting (no report for its stale window since removal).
    fn reports_stopped(&self, id: &str, now: DateTime<Utc>) -> bool {
        let Some(OpBody::ScaleDown(d)) = self.ops.get(id).map(|o| &o.body) else {
            return false;
        };
        let Some(at) = d.removed_at else {
            return false;
        };
        // A node keeps reporting until the cloud has actually stopped it,
        // which takes a while after the request: reports after `at` are
        // expected; the node is gone once it has been silent for its stale
        // window, and that window has passed since the request.
        let intervals = self.stale_intervals();
        match self.fleet.get(&d.node) {
            None => true,
            Some(e) => !e.is_fresh(now, intervals) && now - at > e.stale_after(intervals),
        }
    }

    fn up_on_result(&mut self, id: &str, r: CallResult, now: DateTime<Utc>) -> Vec<Action> {
        let step = match self.ops.get(id).map(|o| &o.body) {
            Some(OpBody::ScaleUp(u)) => u.step.clone(),
            _ => return vec![],
        };
        match (step, r) {
            (UpStep::Preflight, CallResult::Capacity(r)) => match r {
                Ok(Capacity {
                    nodes_available: Some(0),
                    detail,
                }) => self.up_failed(
                    id,
                    HandlerError::Quota(format!("pre-flight: {detail}")),
                    now,
                ),
                Err(e) if e.is_quota() => self.up_failed(id, e, now),
                Ok(_) | Err(_) => self.up_request(id, now),
            },
            (UpStep::Requesting, CallResult::Create(r)) => match r {
                Ok(o) => self.up_booting(id, Some(o), false, now),
                Err(HandlerError::Transient(e)) => {
                    // The request may or may not have reached the cloud: ask.
                    tracing::warn!(
                        op = id,
                        error = e,
                        "create-node outcome unknown; looking it up"
                    );
                    self.up_check(id, now)
                }
                Err(HandlerError::Busy(e)) => self.up_retry_later(id, e, now),
                Err(e) => self.up_failed(id, e, now),
            },
            (UpStep::Checking, CallResult::Lookup(r)) => match r {
                Ok(Lookup::Found(o)) => self.up_booting(id, Some(o), false, now),
                Ok(Lookup::NotFound) => {
                    let attempt = self.up_mut(id).map_or(0, |u| u.attempt);
                    if attempt >= self.cfg.saga.create_attempts {
                        self.up_failed(
                            id,
                            HandlerError::Transient(format!(
                                "no node after {attempt} create requests"
                            )),
                            now,
                        )
                    } else {
                        self.up_request(id, now)
                    }
                }
                // Cannot tell: never ask twice; wait for the join or the provision timeout.
                Ok(Lookup::Unknown) | Err(_) => self.up_booting(id, None, true, now),
            },
            _ => vec![],
        }
    }

    fn up_call(&mut self, id: &str, call: HandlerCall, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get_mut(id) else {
            return vec![];
        };
        op.call_seq += 1;
        let tag = CallTag::Op {
            op: id.to_string(),
            seq: op.call_seq,
        };
        let handler = op.handler.clone();
        self.touch_op(id, now);
        vec![Action::Call { tag, handler, call }]
    }

    /// Journals `Requesting` and issues the create call.
    pub(crate) fn up_request(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let group = op.group.clone();
        let shape = self.cfg.group(&group).shape;
        let attempt = match self.up_mut(id) {
            Some(u) => {
                u.step = UpStep::Requesting;
                u.attempt += 1;
                u.attempt
            }
            None => return vec![],
        };
        let req = CreateRequest {
            op: id.to_string(),
            group,
            shape,
            attempt,
        };
        self.up_call(id, HandlerCall::Create(req), now)
    }

    fn up_check(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(group) = self.ops.get(id).map(|o| o.group.clone()) else {
            return vec![];
        };
        if let Some(u) = self.up_mut(id) {
            u.step = UpStep::Checking;
        }
        self.up_call(
            id,
            HandlerCall::Lookup {
                op: id.to_string(),
                group,
            },
            now,
        )
    }

    fn up_retry_later(&mut self, id: &str, why: String, now: DateTime<Utc>) -> Vec<Action> {
        let attempt = self.up_mut(id).map_or(0, |u| u.attempt);
        if attempt >= self.cfg.saga.create_attempts {
            return self.up_failed(id, HandlerError::Busy(why), now);
        }
        let wait = dur(self.cfg.saga.presence_poll);
        if let Some(u) = self.up_mut(id) {
            u.step = UpStep::Waiting { until: now + wait };
            u.detail = format!("cloud busy: {why}");
        }
        self.touch_op(id, now);
        vec![]
    }

    fn up_booting(
        &mut self,
        id: &str,
        o: Option<CreateOutcome>,
        uncertain: bool,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        if let Some(u) = self.up_mut(id) {
            u.step = UpStep::Booting { uncertain };
            u.requested_at = Some(now);
            if let Some(o) = o {
                u.node = o.node.or(u.node.take());
                u.cloud_id = o.cloud_id.or(u.cloud_id.take());
                u.detail = o.detail;
            } else if uncertain {
                u.detail = "the handler cannot tell whether the request reached the cloud; waiting for the node".into();
            }
        }
        self.touch_op(id, now);
        vec![]
    }

    /// A scale-up failed: backoff, quota accounting, exhaustion.
    pub(crate) fn up_failed(
        &mut self,
        id: &str,
        e: HandlerError,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let g = op.group.clone();
        let handler = op.handler.clone();
        if let Some(u) = self.up_mut(id) {
            u.step = UpStep::Failed {
                kind: e.label().to_string(),
                error: e.to_string(),
            };
        }
        self.touch_op(id, now);
        let mut out = vec![];
        let stats = self.group_stats(&g, now);
        out.push(self.decision(
            DecisionKind::HandlerFailed,
            &g,
            Some(id),
            None,
            format!("create-node failed ({}): {e}", e.label()),
            Some(&handler),
            Some(stats.clone()),
        ));
        out.extend(self.note_up_failure(&g, &e, now));
        out.extend(self.prune(now));
        out
    }

    fn note_up_failure(
        &mut self,
        g: &GroupKey,
        e: &HandlerError,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let p = self.cfg.policy.clone();
        let handler = self.cfg.group(g).handler;
        let gs = self.group_mut(g);
        gs.up_failures += 1;
        let factor = 2u32.saturating_pow(gs.up_failures.saturating_sub(1).min(16));
        let wait = p.backoff_initial.saturating_mul(factor).min(p.backoff_max);
        gs.backoff_until = Some(now + dur(wait));
        let mut out = vec![];
        if e.is_quota() {
            gs.quota_failures += 1;
            if gs.quota_failures >= p.exhausted_after_quota_failures && gs.exhausted.is_none() {
                gs.exhausted = Some(Exhaustion {
                    since: now,
                    reason: e.to_string(),
                    next_check: now + dur(p.exhaustion_check_interval),
                });
                let n = gs.quota_failures;
                let stats = self.group_stats(g, now);
                out.push(self.decision(
                    DecisionKind::Exhausted,
                    g,
                    None,
                    None,
                    format!("the cloud has no capacity for {g} ({n} quota failures): {e}"),
                    Some(&handler),
                    Some(stats),
                ));
            }
        } else {
            gs.quota_failures = 0;
        }
        out
    }

    fn on_exhaustion_check(
        &mut self,
        g: &GroupKey,
        r: CallResult,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let CallResult::Capacity(r) = r else {
            return vec![];
        };
        let p = self.cfg.policy.clone();
        let handler = self.cfg.group(g).handler;
        let Some(ex) = self.group_state(g).exhausted else {
            return vec![];
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
        let gs = self.group_mut(g);
        if !lift {
            gs.exhausted = Some(Exhaustion {
                next_check: now + dur(p.exhaustion_check_interval),
                ..ex
            });
            tracing::info!(group = %g, detail, "still exhausted");
            return vec![];
        }
        gs.exhausted = None;
        gs.quota_failures = p.exhausted_after_quota_failures.saturating_sub(1);
        gs.backoff_until = None;
        let stats = self.group_stats(g, now);
        vec![self.decision(
            DecisionKind::ExhaustionLifted,
            g,
            None,
            None,
            detail,
            Some(&handler),
            Some(stats),
        )]
    }

    // ------------------------------------------------------------------ ticks

    /// Deadlines, polls and retries. Call often (every second or faster).
    pub fn tick(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let mut out = vec![];
        let ids: Vec<OpId> = self
            .ops
            .values()
            .filter(|o| !o.is_done())
            .map(|o| o.id.clone())
            .collect();
        let provision = dur(self.cfg.policy.provision_timeout);
        let cmd_timeout = dur(self.cfg.saga.command_timeout);
        for id in ids {
            let Some(op) = self.ops.get(&id) else {
                continue;
            };
            match &op.body {
                OpBody::ScaleUp(u) => match &u.step {
                    UpStep::Booting { .. } => {
                        let since = u.requested_at.unwrap_or(op.created);
                        if now - since >= provision {
                            out.extend(self.up_timed_out(&id, now));
                        }
                    }
                    UpStep::Waiting { until } if now >= *until => {
                        out.extend(self.up_request(&id, now))
                    }
                    _ => {}
                },
                OpBody::ScaleDown(d) => {
                    let d = d.clone();
                    match d.step {
                        DownStep::Deactivating | DownStep::Inventorying
                            if d.replan_at.is_some_and(|t| now >= t) =>
                        {
                            if let Some(dm) = self.down_mut(&id) {
                                dm.replan_at = None;
                            }
                            out.extend(self.down_plan(&id, d.gears.clone(), now));
                        }
                        // The node answered; waiting to plan again, not to resend.
                        DownStep::Deactivating | DownStep::Inventorying
                            if d.replan_at.is_some() => {}
                        DownStep::Deactivating
                        | DownStep::Inventorying
                        | DownStep::Reactivating { .. }
                            if d.cmd_sent.is_some_and(|t| now - t >= cmd_timeout) =>
                        {
                            out.extend(self.down_resend(
                                &id,
                                format!("no answer within {cmd_timeout}"),
                                now,
                            ));
                        }
                        DownStep::Evacuating if now >= d.deadline => {
                            out.extend(self.down_next_round(
                                &id,
                                "evacuation deadline passed".into(),
                                now,
                            ));
                        }
                        DownStep::ConfirmingEmpty if now >= d.deadline => {
                            out.extend(self.down_next_round(
                                &id,
                                "no report showed the node empty in time".into(),
                                now,
                            ));
                        }
                        DownStep::Removing | DownStep::ConfirmingGone if now >= d.deadline => {
                            let still = if d.step == DownStep::Removing {
                                "the handler did not accept the removal"
                            } else {
                                "the node is still there"
                            };
                            let g = op.group.clone();
                            let handler = op.handler.clone();
                            out.push(self.decision(
                                DecisionKind::HandlerFailed,
                                &g,
                                Some(&id),
                                Some(&d.node),
                                format!("remove-node {} not confirmed: {still}", d.node),
                                Some(&handler),
                                None,
                            ));
                            out.extend(self.down_end(
                                &id,
                                DownEnd::Failed {
                                    reason: format!(
                                        "removal not confirmed within the remove timeout: {still}"
                                    ),
                                },
                                now,
                            ));
                        }
                        DownStep::Removing if d.next_call.is_some_and(|t| now >= t) => {
                            out.extend(self.down_call_remove(&id, now));
                        }
                        DownStep::ConfirmingGone => {
                            if self.reports_stopped(&id, now)
                                && d.presence != Some(Presence::Present)
                            {
                                out.extend(self.down_end(&id, DownEnd::Removed, now));
                            } else if d.next_call.is_some_and(|t| now >= t) {
                                out.extend(self.down_call_presence(&id, now));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        // Exhausted groups: is there capacity again?
        let due: Vec<GroupKey> = self
            .groups
            .iter()
            .filter(|(_, s)| s.exhausted.as_ref().is_some_and(|e| now >= e.next_check))
            .map(|(g, _)| g.clone())
            .collect();
        for g in due {
            let every = dur(self.cfg.policy.exhaustion_check_interval);
            if let Some(ex) = self.group_mut(&g).exhausted.as_mut() {
                ex.next_check = now + every;
            }
            let s = self.cfg.group(&g);
            out.push(Action::Call {
                tag: CallTag::Group(g.clone()),
                handler: s.handler,
                call: HandlerCall::Capacity {
                    group: g,
                    shape: s.shape,
                },
            });
        }
        out
    }

    fn up_timed_out(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(op) = self.ops.get(id) else {
            return vec![];
        };
        let g = op.group.clone();
        let handler = op.handler.clone();
        if let Some(u) = self.up_mut(id) {
            u.step = UpStep::TimedOut;
        }
        self.touch_op(id, now);
        let timeout = self.cfg.policy.provision_timeout;
        let stats = self.group_stats(&g, now);
        let mut out = vec![self.decision(
            DecisionKind::ProvisionTimeout,
            &g,
            Some(id),
            None,
            format!(
                "no node reported for {id} within the provision timeout ({})",
                humantime::format_duration(timeout)
            ),
            Some(&handler),
            Some(stats),
        )];
        out.extend(self.note_up_failure(
            &g,
            &HandlerError::Transient("provision timeout".into()),
            now,
        ));
        out.extend(self.prune(now));
        out
    }

    /// After a restart: re-issue the effect of every unfinished step. Commands
    /// keep their ids (a node that has one already refuses the copy as a
    /// replay); creates whose outcome is unknown are looked up, never re-sent.
    pub fn resume(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let mut out = vec![];
        let ids: Vec<OpId> = self
            .ops
            .values()
            .filter(|o| !o.is_done())
            .map(|o| o.id.clone())
            .collect();
        for id in ids {
            let Some(op) = self.ops.get(&id).cloned() else {
                continue;
            };
            tracing::info!(op = id, state = op.state(), "resuming operation");
            match &op.body {
                OpBody::ScaleUp(u) => match u.step {
                    UpStep::Preflight => out.extend(self.up_preflight(&id, now)),
                    UpStep::Requesting | UpStep::Checking => out.extend(self.up_check(&id, now)),
                    _ => {}
                },
                OpBody::ScaleDown(d) => match &d.step {
                    DownStep::Deactivating
                    | DownStep::Inventorying
                    | DownStep::Evacuating
                    | DownStep::Reactivating { .. } => {
                        if let Some(cmd) = d.cmd {
                            let msg = match &d.step {
                                DownStep::Deactivating => Message::Deactivate(Deactivate {
                                    reason: op.reason.clone(),
                                }),
                                DownStep::Inventorying => Message::Inventory(InventoryRequest {}),
                                DownStep::Evacuating => Message::Evacuate(Evacuate {
                                    moves: d.moves.clone(),
                                    parallelism: Some(self.cfg.saga.evacuation_parallelism),
                                    deadline: Some(d.deadline - dur(self.cfg.saga.command_timeout)),
                                }),
                                _ => Message::Activate(Activate {
                                    reason: d.abort_reason.clone().unwrap_or_default(),
                                }),
                            };
                            out.push(Action::Send {
                                node: d.node.clone(),
                                corr: id.clone(),
                                id: cmd,
                                msg,
                            });
                        }
                    }
                    DownStep::Removing => out.extend(self.down_call_remove(&id, now)),
                    DownStep::ConfirmingGone => out.extend(self.down_call_presence(&id, now)),
                    _ => {}
                },
            }
        }
        out
    }

    pub(crate) fn up_preflight(&mut self, id: &str, now: DateTime<Utc>) -> Vec<Action> {
        let Some(group) = self.ops.get(id).map(|o| o.group.clone()) else {
            return vec![];
        };
        let shape = self.cfg.group(&group).shape;
        self.up_call(id, HandlerCall::Capacity { group, shape }, now)
    }

    /// Drops the oldest finished operations beyond `saga.history`.
    pub(crate) fn prune(&mut self, _now: DateTime<Utc>) -> Vec<Action> {
        let keep = self.cfg.saga.history;
        let mut done: Vec<(DateTime<Utc>, OpId)> = self
            .ops
            .values()
            .filter(|o| o.is_done())
            .map(|o| (o.updated, o.id.clone()))
            .collect();
        if done.len() <= keep {
            return vec![];
        }
        done.sort();
        let excess = done.len() - keep;
        for (_, id) in done.into_iter().take(excess) {
            self.ops.remove(&id);
            self.changes.ops.remove(&id);
            self.changes.deleted_ops.insert(id);
        }
        vec![]
    }

    // ------------------------------------------------------------------ admin

    /// Starts a scale-down of `node` at an operator's request. Thresholds and
    /// budgets do not apply; do-not-disrupt, pinned gears and room do.
    pub fn operator_evacuate(
        &mut self,
        node: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<(OpId, Vec<Action>), String> {
        let e = self
            .fleet
            .get(node)
            .ok_or_else(|| format!("no node {node:?} is reporting"))?
            .clone();
        if !e.is_fresh(now, self.stale_intervals()) {
            return Err(format!("{node} is missing (no recent report)"));
        }
        if let Some(op) = self.saga_of(node) {
            return Err(format!("{node} is already being drained by {}", op.id));
        }
        if e.report.do_not_disrupt || self.marks.contains(node) {
            return Err(format!("{node} is marked do-not-disrupt"));
        }
        if e.report.pinned_gears > 0 {
            return Err(format!(
                "{node} has {} gears that opted out of scale-down",
                e.report.pinned_gears
            ));
        }
        let g = e.group();
        let room = self.room_without(&g, node, now);
        if room < e.total_gears() {
            return Err(format!(
                "the rest of {g} has room for {room} gears, {node} has {}",
                e.total_gears()
            ));
        }
        let reason = format!("operator {by} asked to evacuate {node}");
        let origin = Origin::Operator { by: by.to_string() };
        let (id, out) = self.start_scale_down(&g, node, origin, reason, now);
        Ok((id, out))
    }

    /// Active free slots of a group without `node` and without draining nodes.
    pub(crate) fn room_without(&self, g: &GroupKey, node: &str, now: DateTime<Utc>) -> u32 {
        self.candidates(g, node, now)
            .iter()
            .map(|c| {
                c.max_active_gears
                    .unwrap_or(0)
                    .saturating_sub(c.gears_active.unwrap_or(0))
            })
            .sum()
    }

    /// Creates a scale-down saga and sends `cmd.deactivate`.
    pub(crate) fn start_scale_down(
        &mut self,
        g: &GroupKey,
        node: &str,
        origin: Origin,
        reason: String,
        now: DateTime<Utc>,
    ) -> (OpId, Vec<Action>) {
        let id = new_op_id(self.new_id());
        let handler = self.cfg.group(g).handler;
        let op = Op {
            id: id.clone(),
            group: g.clone(),
            handler: handler.clone(),
            reason: reason.clone(),
            created: now,
            updated: now,
            call_seq: 0,
            body: OpBody::ScaleDown(ScaleDown {
                node: node.to_string(),
                origin,
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
                next_call: None,
                presence: None,
                abort_reason: None,
                replan_at: None,
                end: None,
            }),
        };
        self.ops.insert(id.clone(), op);
        self.group_mut(g).last_decision = Some(now);
        let stats = self.group_stats(g, now);
        let mut out = vec![self.decision(
            DecisionKind::ScaleDown,
            g,
            Some(&id),
            Some(node),
            reason.clone(),
            Some(&handler),
            Some(stats),
        )];
        out.extend(self.down_enter(
            &id,
            DownStep::Deactivating,
            Some(Message::Deactivate(Deactivate { reason })),
            now,
        ));
        (id, out)
    }

    /// Creates a scale-up saga and asks the handler for capacity first.
    pub(crate) fn start_scale_up(
        &mut self,
        g: &GroupKey,
        reason: String,
        now: DateTime<Utc>,
    ) -> (OpId, Vec<Action>) {
        let id = new_op_id(self.new_id());
        let handler = self.cfg.group(g).handler;
        self.ops.insert(
            id.clone(),
            Op {
                id: id.clone(),
                group: g.clone(),
                handler: handler.clone(),
                reason: reason.clone(),
                created: now,
                updated: now,
                call_seq: 0,
                body: OpBody::ScaleUp(ScaleUp {
                    step: UpStep::Preflight,
                    attempt: 0,
                    node: None,
                    cloud_id: None,
                    requested_at: None,
                    detail: String::new(),
                }),
            },
        );
        let gs = self.group_mut(g);
        gs.last_scale_up = Some(now);
        gs.last_decision = Some(now);
        let stats = self.group_stats(g, now);
        let mut out = vec![self.decision(
            DecisionKind::ScaleUp,
            g,
            Some(&id),
            None,
            reason,
            Some(&handler),
            Some(stats),
        )];
        out.extend(self.up_preflight(&id, now));
        (id, out)
    }

    /// Aborts an operation at an operator's request.
    pub fn operator_abort(
        &mut self,
        id: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<Action>, String> {
        let op = self
            .ops
            .get(id)
            .ok_or_else(|| format!("no operation {id}"))?;
        if op.is_done() {
            return Err(format!("{id} already ended ({})", op.state()));
        }
        match &op.body {
            OpBody::ScaleDown(d) if d.step.cancellable() => {
                Ok(self.down_abort(id, format!("operator {by} aborted it"), false, now))
            }
            OpBody::ScaleDown(d) => Err(format!(
                "{id} is past the point of return ({}): the node is empty and being removed",
                d.step.name()
            )),
            OpBody::ScaleUp(_) => {
                if let Some(u) = self.up_mut(id) {
                    u.step = UpStep::Failed {
                        kind: "aborted".into(),
                        error: format!("operator {by} aborted it"),
                    };
                }
                self.touch_op(id, now);
                Ok(vec![])
            }
        }
    }

    /// Marks or unmarks a node do-not-disrupt (persisted).
    pub fn set_do_not_disrupt(&mut self, node: &str, on: bool) {
        let changed = if on {
            self.marks.insert(node.to_string())
        } else {
            self.marks.remove(node)
        };
        if changed {
            self.changes.marks = true;
        }
    }
}

#[cfg(test)]
#[path = "core_tests.rs"]
mod tests;
