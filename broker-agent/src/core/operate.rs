//! Operator requests, carried out: the [`operator`] module decides what a
//! request means (or refuses it); here the coordinator changes its state,
//! starts or aborts operations, and answers. Each request and its answer
//! goes to the history.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{Activate, AdminReply, AdminRequest, Message};

use super::Core;
use super::actions::{Action, PaasCall};
use super::operator::controls::{Cordon, Pause};
use super::operator::{self, Abort, Evacuation, Order};
use super::scale_down::DownInput;
use super::scale_up::UpInput;
use crate::history::{Event, OperatorAct};
use crate::ops::{OpId, Origin};
use crate::status::Status;

impl Core {
    /// An operator's request: the answer, and what it set off. `agent` and
    /// `refused` complete the status document.
    pub fn on_operator(
        &mut self,
        from: &str,
        req: AdminRequest,
        agent: &str,
        refused: &BTreeMap<String, u64>,
        now: DateTime<Utc>,
    ) -> (AdminReply, Vec<Action>) {
        let (reply, acts) = match operator::decide(&self.facts(), from, req.clone(), now) {
            Ok(order) => self.carry_out(from, order, agent, refused, now),
            Err(e) => (operator::refused(e), vec![]),
        };
        if !matches!(req, AdminRequest::Status) {
            self.record(
                now,
                Event::Operator(OperatorAct {
                    by: from.to_string(),
                    request: req,
                    ok: reply.ok,
                    message: reply.message.clone(),
                }),
            );
        }
        (reply, acts)
    }

    fn carry_out(
        &mut self,
        from: &str,
        order: Order,
        agent: &str,
        refused: &BTreeMap<String, u64>,
        now: DateTime<Utc>,
    ) -> (AdminReply, Vec<Action>) {
        match order {
            Order::Status => (
                operator::status(&Status::of(self, agent, now, refused)),
                vec![],
            ),
            Order::Evacuate(ev) if self.is_dry_run(&ev.group) => {
                (operator::refused(dry_run_refusal(&ev)), vec![])
            }
            Order::Evacuate(ev) => {
                let (node, keep) = (ev.node.clone(), ev.keep);
                let (op, acts) = self.evacuate(ev, now);
                (operator::evacuating(&node, &op, keep), acts)
            }
            Order::Abort(a) => {
                let reply = operator::aborting(a.op());
                (reply, self.abort(a, now))
            }
            Order::Mark { node, on } => {
                self.set_do_not_disrupt(&node, on);
                (operator::marked(&node, on), vec![])
            }
            Order::Pause { group, pause } => (self.pause(group.as_ref(), pause), vec![]),
            Order::Resume { group } => (self.resume_scaling(group.as_ref()), vec![]),
            Order::Cordon { node, cordon } => (self.cordon(&node, cordon), vec![]),
            Order::Activate { node } => self.activate(&node, from),
        }
    }

    fn evacuate(&mut self, ev: Evacuation, now: DateTime<Utc>) -> (OpId, Vec<Action>) {
        self.start_scale_down(&ev.group, &ev.node, ev.origin, ev.reason, ev.keep, now)
    }

    fn abort(&mut self, a: Abort, now: DateTime<Utc>) -> Vec<Action> {
        match a {
            Abort::Drain { op, why } => {
                let abort = DownInput::Abort { why, cancel: false };
                self.drive_down(&op, abort, now)
            }
            Abort::ScaleUp { op, by } => self.drive_up(&op, UpInput::Abort { by }, now),
        }
    }

    /// Starts a scale-down of `node` at an operator's request. Thresholds and
    /// budgets do not apply; do-not-disrupt, pinned gears and room do.
    pub fn operator_evacuate(
        &mut self,
        node: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<(OpId, Vec<Action>), String> {
        let ev = operator::evacuate(&self.facts(), node, by, now)?;
        if self.is_dry_run(&ev.group) {
            return Err(dry_run_refusal(&ev));
        }
        Ok(self.evacuate(ev, now))
    }

    /// Aborts an operation at an operator's request.
    pub fn operator_abort(
        &mut self,
        id: &str,
        by: &str,
        now: DateTime<Utc>,
    ) -> Result<Vec<Action>, String> {
        let a = operator::abort(&self.facts(), id, by)?;
        Ok(self.abort(a, now))
    }

    /// Marks or unmarks a node do-not-disrupt (persisted).
    pub fn set_do_not_disrupt(&mut self, node: &str, on: bool) {
        if self.marks.set(node, on) {
            self.changes.marks = true;
        }
    }

    /// Pauses the fleet (`None`) or one group (persisted).
    pub fn pause(&mut self, group: Option<&GroupKey>, p: Pause) -> AdminReply {
        let reply = operator::paused(group, &p);
        match group {
            Some(g) => self.group_mut(g).paused = Some(p),
            None => {
                self.meta.fleet_pause = Some(p);
                self.changes.meta = true;
            }
        }
        reply
    }

    /// Lifts the pause of the fleet (`None`) or of one group.
    pub fn resume_scaling(&mut self, group: Option<&GroupKey>) -> AdminReply {
        let was = match group {
            Some(g) => match self.groups.get(g).and_then(|s| s.paused.clone()) {
                Some(p) => {
                    self.group_mut(g).paused = None;
                    Some(p)
                }
                None => None,
            },
            None => {
                let p = self.meta.fleet_pause.take();
                self.changes.meta |= p.is_some();
                p
            }
        };
        operator::resumed(group, was.as_ref())
    }

    /// The fleet's pause, or the group's, holding at `now` (fleet first).
    pub fn pause_of(&self, g: &GroupKey, now: DateTime<Utc>) -> Option<&Pause> {
        let fleet = self.meta.fleet_pause.as_ref().filter(|p| p.holds(now));
        fleet.or_else(|| {
            self.groups
                .get(g)
                .and_then(|s| s.paused.as_ref())
                .filter(|p| p.holds(now))
        })
    }

    /// Forgets pauses that expired (before an evaluation).
    pub(crate) fn lift_expired_pauses(&mut self, now: DateTime<Utc>) {
        if self
            .meta
            .fleet_pause
            .as_ref()
            .is_some_and(|p| !p.holds(now))
        {
            tracing::info!("the fleet's pause expired");
            self.meta.fleet_pause = None;
            self.changes.meta = true;
        }
        let expired: Vec<GroupKey> = self
            .groups
            .iter()
            .filter(|(_, s)| s.paused.as_ref().is_some_and(|p| !p.holds(now)))
            .map(|(g, _)| g.clone())
            .collect();
        for g in expired {
            tracing::info!(group = %g, "the group's pause expired");
            self.group_mut(&g).paused = None;
        }
    }

    /// Cordons (`Some`) or uncordons a node (persisted).
    pub fn cordon(&mut self, node: &str, c: Option<Cordon>) -> AdminReply {
        let on = c.is_some();
        if !on && !self.cordons.contains(node) {
            return operator::refused(format!("{node} is not cordoned"));
        }
        if self.cordons.set(node, c) {
            self.changes.cordons = true;
        }
        self.fleet.set_cordoned(node, on);
        operator::cordoned(node, on)
    }

    /// Sends `cmd.activate` to an inactive node, runs `activate-node` when
    /// OpenShift's district marks it inactive, and lifts its cordon.
    fn activate(&mut self, node: &str, by: &str) -> (AdminReply, Vec<Action>) {
        let mut acts = vec![];
        let district = self
            .fleet
            .get(node)
            .filter(|e| e.district_inactive())
            .and_then(|e| e.report.district_uuid().map(str::to_string));
        let paas = self.cfg.paas.kind == crate::paas::PaasKind::OpenShift;
        if let Some(district) = district.clone().filter(|_| paas) {
            // Its own id: the answer matches no operation and is only logged.
            acts.push(Action::Paas {
                op: OpId::new((self.idgen)()),
                call: PaasCall::Activate {
                    district,
                    host: node.to_string(),
                },
            });
        }
        let inactive = self.fleet.get(node).is_some_and(|e| !e.report.active);
        let mut op = None;
        if inactive {
            let corr = OpId::new((self.idgen)());
            let msg = Message::Activate(Activate {
                reason: format!("operator {by} asked to activate {node}"),
                epoch: self.meta.epoch,
            });
            acts.push(Action::Send {
                node: node.to_string(),
                corr: corr.clone(),
                id: (self.idgen)(),
                msg,
            });
            op = Some(corr);
        }
        let uncordoned = self.cordons.contains(node);
        if uncordoned {
            self.cordon(node, None);
        }
        let mut reply = operator::activating(node, op.as_ref(), uncordoned);
        if let Some(d) = district {
            let said = if paas {
                format!("activate-node {node} in district {d}")
            } else {
                format!(
                    "{node} is inactive in district {d}: run `oo-admin-ctl-district -c activate-node -u {d} -i {node}` ([paas] kind = \"none\")"
                )
            };
            reply.message = [reply.message.as_str(), said.as_str()]
                .into_iter()
                .filter(|p| !p.is_empty())
                .collect::<Vec<_>>()
                .join("; ");
        }
        (reply, acts)
    }

    /// A maintenance drain ended: its node stays cordoned until an operator
    /// activates or uncordons it.
    pub(crate) fn keep_cordoned(&mut self, op: &OpId, node: &str, now: DateTime<Utc>) {
        let by = match self.ops.get(op).and_then(|o| o.down()).map(|d| &d.origin) {
            Some(Origin::Operator { by }) => by.clone(),
            _ => "the broker agent".to_string(),
        };
        let c = Cordon {
            by,
            reason: format!("emptied for maintenance by {op}"),
            since: now,
            op: Some(op.to_string()),
        };
        if self.cordons.set(node, Some(c)) {
            self.changes.cordons = true;
        }
        self.fleet.set_cordoned(node, true);
    }
}

/// Why a drain is refused in a group whose handler is `log`: a dry run
/// sends no command to any node.
fn dry_run_refusal(ev: &Evacuation) -> String {
    format!(
        "{}'s group {} has the log handler, a dry run: no command is sent to any node; give the group a handler that acts to drain it",
        ev.node, ev.group
    )
}
