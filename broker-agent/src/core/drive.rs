//! Stepping one machine and turning what it asked for into actions: the
//! operation id as `corr`, the handler and call number of a handler call,
//! the group's figures on a decision; and what an operation's end means for
//! its group (cooldowns, backoff, exhaustion) and for the history.

use chrono::{DateTime, Utc};
use gearshift_handlers::{GroupKey, HandlerError};
use gearshift_proto::msg::{Decision, DecisionKind};

use super::Core;
use super::actions::{Action, CallTag, Effect, HandlerCall, Note, Out};
use super::exhaustion::SupplyInput;
use super::facts::Facts;
use super::scale_down::{DownCtx, DownEnd, DownInput, DownOutcome, Origin, ScaleDown};
use super::scale_up::{ScaleUp, UpCtx, UpInput, UpOutcome};
use crate::ops::{Op, OpBody, OpId};

impl Core {
    /// Creates a scale-up saga and asks the handler for capacity first.
    pub(crate) fn start_scale_up(
        &mut self,
        g: &GroupKey,
        reason: String,
        now: DateTime<Utc>,
    ) -> (OpId, Vec<Action>) {
        let body = OpBody::ScaleUp(ScaleUp::new());
        let id = self.new_op(g, reason.clone(), body, now);
        let gs = self.group_mut(g);
        gs.memory.last_scale_up = Some(now);
        gs.memory.last_decision = Some(now);
        let note = Note {
            kind: DecisionKind::ScaleUp,
            node: None,
            reason,
            stats: true,
        };
        let mut out = vec![self.op_decision(&id, note, now)];
        out.extend(self.drive_up(&id, UpInput::Start, now));
        (id, out)
    }

    /// Creates a scale-down saga (a maintenance drain with `keep`) and
    /// sends `cmd.deactivate`.
    pub(crate) fn start_scale_down(
        &mut self,
        g: &GroupKey,
        node: &str,
        origin: Origin,
        reason: String,
        keep: bool,
        now: DateTime<Utc>,
    ) -> (OpId, Vec<Action>) {
        let mut saga = ScaleDown::new(node, origin, now);
        saga.keep = keep;
        let body = OpBody::ScaleDown(saga);
        let id = self.new_op(g, reason.clone(), body, now);
        self.group_mut(g).memory.last_decision = Some(now);
        let note = Note {
            kind: DecisionKind::ScaleDown,
            node: Some(node.to_string()),
            reason,
            stats: true,
        };
        let mut out = vec![self.op_decision(&id, note, now)];
        out.extend(self.drive_down(&id, DownInput::Start, now));
        (id, out)
    }

    fn new_op(&mut self, g: &GroupKey, reason: String, body: OpBody, now: DateTime<Utc>) -> OpId {
        let id = OpId::new((self.idgen)());
        self.ops.insert(Op {
            id: id.clone(),
            group: g.clone(),
            handler: self.cfg.group(g).handler,
            reason,
            created: now,
            updated: now,
            call_seq: 0,
            body,
        });
        self.note_step(&id, None, now);
        id
    }

    /// Steps scale-up `id`.
    pub(crate) fn drive_up(
        &mut self,
        id: &OpId,
        input: UpInput,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(op) = self.ops.get_mut(id) else {
            return vec![];
        };
        let before = op.state();
        let Op {
            id: op_id,
            group,
            created,
            body: OpBody::ScaleUp(u),
            ..
        } = op
        else {
            return vec![];
        };
        let cx = UpCtx {
            op: op_id,
            group,
            created: *created,
            cfg: &self.cfg,
        };
        let out = u.step(&cx, input, now);
        let op_id = op_id.clone();
        self.note_step(&op_id, Some(before), now);
        self.settle_up(&op_id, out, now)
    }

    fn settle_up(&mut self, id: &OpId, out: Out<UpOutcome>, now: DateTime<Utc>) -> Vec<Action> {
        let Some(group) = self.ops.get(id).map(|o| o.group.clone()) else {
            return vec![];
        };
        let supply_input = match &out.outcome {
            Some(UpOutcome::Joined) => {
                self.group_mut(&group).memory.last_scale_up = Some(now);
                Some(SupplyInput::Joined)
            }
            Some(UpOutcome::Failed(e)) => Some(SupplyInput::Failed(e.clone())),
            Some(UpOutcome::TimedOut) => Some(SupplyInput::Failed(HandlerError::Transient(
                "provision timeout".into(),
            ))),
            Some(UpOutcome::Lost) | None => None,
        };
        let ended = matches!(
            out.outcome,
            Some(UpOutcome::Failed(_) | UpOutcome::TimedOut | UpOutcome::Lost)
        );
        let mut acts = self.address(id, out.effects, out.touched, now);
        if let Some(input) = supply_input {
            acts.extend(self.drive_supply(&group, input, now));
        }
        if ended {
            self.prune();
        }
        acts
    }

    /// Steps scale-down `id`. The operation is taken out of the table while
    /// it steps, so that it reads every other operation.
    pub(crate) fn drive_down(
        &mut self,
        id: &OpId,
        input: DownInput<'_>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(mut op) = self.ops.remove(id) else {
            return vec![];
        };
        let before = op.state();
        let out = match &mut op.body {
            OpBody::ScaleDown(d) => {
                let mut cx = DownCtx {
                    op: &op.id,
                    group: &op.group,
                    reason: &op.reason,
                    cfg: &self.cfg,
                    facts: Facts {
                        fleet: &self.fleet,
                        ops: &self.ops,
                        marks: self.marks.nodes(),
                        cordons: &self.cordons,
                        started: self.started,
                        stale_intervals: self.cfg.policy.stale_after_intervals,
                    },
                    planner: &*self.planner,
                    ids: &mut *self.idgen,
                };
                Some(d.step(&mut cx, input, now))
            }
            OpBody::ScaleUp(_) => None,
        };
        let (op_id, node) = (op.id.clone(), op.node().unwrap_or_default().to_string());
        self.ops.insert(op);
        self.note_step(&op_id, Some(before), now);
        match out {
            Some(out) => self.settle_down(&op_id, &node, out, now),
            None => vec![],
        }
    }

    fn settle_down(
        &mut self,
        id: &OpId,
        node: &str,
        out: Out<DownOutcome>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let Some(group) = self.ops.get(id).map(|o| o.group.clone()) else {
            return vec![];
        };
        let ended = out.outcome.is_some();
        // The group and the fleet first: the decision's figures come after.
        match &out.outcome {
            Some(DownOutcome::Ended(DownEnd::Removed)) => {
                self.group_mut(&group).memory.last_scale_down = Some(now);
                self.fleet.forget(node);
            }
            // Every drain's end holds the next one back for the scale-down
            // cooldown; a failure also for the failure cooldown.
            Some(DownOutcome::Ended(DownEnd::Aborted { .. } | DownEnd::Failed { .. })) => {
                let m = &mut self.group_mut(&group).memory;
                m.last_failure = Some(now);
                m.last_scale_down = Some(now);
            }
            Some(DownOutcome::Ended(DownEnd::Cancelled)) => {
                self.group_mut(&group).memory.last_scale_down = Some(now);
            }
            Some(DownOutcome::Ended(DownEnd::Kept)) => {
                self.group_mut(&group).memory.last_scale_down = Some(now);
                self.keep_cordoned(id, node, now);
            }
            None => {}
        }
        let acts = self.address(id, out.effects, out.touched, now);
        if ended {
            self.prune();
        }
        acts
    }

    /// Records the step of operation `id` and addresses its effects.
    fn address(
        &mut self,
        id: &OpId,
        effects: Vec<Effect>,
        touched: bool,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        if touched {
            if let Some(op) = self.ops.get_mut(id) {
                op.updated = now;
            }
            self.changes.ops.insert(id.clone());
        }
        let mut acts = Vec::with_capacity(effects.len());
        for e in effects {
            let a = match e {
                Effect::Send { node, id: cmd, msg } => Action::Send {
                    node,
                    corr: id.clone(),
                    id: cmd,
                    msg,
                },
                Effect::Call(call) => match self.op_call(id, call) {
                    Some(a) => a,
                    None => continue,
                },
                Effect::Paas(call) => Action::Paas {
                    op: id.clone(),
                    call,
                },
                Effect::Decide(note) => self.op_decision(id, note, now),
            };
            // The machines leave the epoch at 0: the coordinator stamps it.
            acts.push(a.stamped(self.meta.epoch));
        }
        acts
    }

    fn op_call(&mut self, id: &OpId, call: HandlerCall) -> Option<Action> {
        let tag = self.next_tag(id)?;
        let handler = self.ops.get(id)?.handler.clone();
        Some(Action::Call { tag, handler, call })
    }

    /// The tag of operation `id`'s next call (handler or PaaS): only the
    /// latest call's answer is taken.
    fn next_tag(&mut self, id: &OpId) -> Option<CallTag> {
        let op = self.ops.get_mut(id)?;
        op.call_seq += 1;
        self.changes.ops.insert(id.clone());
        Some(CallTag::Op {
            op: id.clone(),
            seq: op.call_seq,
        })
    }

    fn op_decision(&self, id: &OpId, note: Note, now: DateTime<Utc>) -> Action {
        match self.ops.get(id) {
            Some(op) => self.decision(&op.group, Some(id), &op.handler, note, now),
            None => unreachable_decision(id, note, self.meta.epoch),
        }
    }

    /// A decision about group `g` (and operation `op`), with the group's
    /// figures after the step when the note asks for them.
    pub(crate) fn decision(
        &self,
        g: &GroupKey,
        op: Option<&OpId>,
        handler: &str,
        note: Note,
        now: DateTime<Utc>,
    ) -> Action {
        Action::Decide(Decision {
            decision: note.kind,
            district: g.district.clone(),
            profile: g.profile.clone(),
            op: op.map(OpId::to_string),
            node: note.node,
            reason: note.reason,
            handler: Some(handler.to_string()),
            stats: note.stats.then(|| self.group_stats(g, now)),
            dry_run: false,
            epoch: self.meta.epoch,
        })
    }

    /// Steps group `g`'s exhaustion tracker.
    pub(crate) fn drive_supply(
        &mut self,
        g: &GroupKey,
        input: SupplyInput,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        let state = match input {
            // Only a group that is exhausted has anything to check.
            SupplyInput::Tick | SupplyInput::Capacity(_) => match self.groups.get_mut(g) {
                Some(s) => s,
                None => return vec![],
            },
            SupplyInput::Failed(_) | SupplyInput::Joined => {
                self.groups.entry(g.clone()).or_default()
            }
        };
        let out = state.supply.step(g, &self.cfg.policy, input, now);
        if out.changed {
            self.changes.groups.insert(g.clone());
        }
        let settings = self.cfg.group(g);
        let mut acts = vec![];
        if out.check {
            acts.push(Action::Call {
                tag: CallTag::Group(g.clone()),
                handler: settings.handler.clone(),
                call: HandlerCall::Capacity {
                    group: g.clone(),
                    shape: settings.shape,
                },
            });
        }
        for e in out.effects {
            if let Effect::Decide(note) = e {
                acts.push(self.decision(g, None, &settings.handler, note, now));
            }
        }
        acts
    }

    /// Drops the oldest finished operations beyond `saga.history`.
    pub(crate) fn prune(&mut self) {
        for id in self.ops.prune(self.cfg.saga.history) {
            self.changes.ops.remove(&id);
            self.changes.deleted_ops.insert(id);
        }
    }
}

/// A decision about an operation that is not in the table: cannot happen
/// (the coordinator addresses effects of operations it just stepped), but a
/// decision without its group is still better than none.
fn unreachable_decision(id: &OpId, note: Note, epoch: u64) -> Action {
    tracing::error!(op = %id, "decision about an unknown operation");
    Action::Decide(Decision {
        decision: note.kind,
        district: String::new(),
        profile: String::new(),
        op: Some(id.to_string()),
        node: note.node,
        reason: note.reason,
        handler: None,
        stats: None,
        dry_run: false,
        epoch,
    })
}
