//! Every input, routed to the machine it concerns.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{Message, NodeReport};

use super::actions::{Action, CallResult, CallTag};
use super::exhaustion::SupplyInput;
use super::scale_down::{DownEnd, DownInput, Seen};
use super::scale_up::{self, Sighting, UpInput};
use super::{Core, REPEAT_PRESSURE};
use crate::fleet::ReportRejected;
use crate::ops::{OpBody, OpId};

impl Core {
    /// A node's report (already authenticated: signature, role, identity),
    /// `sent` at the envelope's `ts` (the node's clock).
    pub fn on_report(
        &mut self,
        report: NodeReport,
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<Vec<Action>, ReportRejected> {
        let node = report.node.clone();
        // A late report from a node this agent removed (sent before it
        // stopped) must not bring it back as a missing node.
        // (Only a node the fleet does not know: the scan is not on every report.)
        let removed_after_start = || {
            self.ops.iter().any(|op| {
                op.down().is_some_and(|d| {
                    d.node == node
                        && d.end == Some(DownEnd::Removed)
                        && op.updated >= report.started_at
                })
            })
        };
        if self.fleet.get(&node).is_none() && removed_after_start() {
            return Err(ReportRejected::Removed);
        }
        let total_gears = report.gears.total();
        let busy = report.operation.is_some();
        let sighting = |m| Sighting::of(&report, m);
        let up = scale_up::claim(&self.ops, &report, self.fleet.get(&node).is_none())
            .map(|(id, m)| (id, sighting(m)));
        let accepted = self.fleet.accept(report, now)?;
        if accepted.new_node {
            tracing::info!(node, "new node reporting");
        }
        let mut out = vec![];
        // A scale-up's node: joins, or is added to its district.
        if let Some((id, s)) = up {
            out.extend(self.drive_up(&id, UpInput::Report(s), now));
        }
        // A draining node that may show itself empty.
        if let Some(op) = self.ops.saga_of(&node) {
            let id = op.id.clone();
            let report = DownInput::Report(Seen {
                sent,
                total_gears,
                busy,
            });
            out.extend(self.drive_down(&id, report, now));
        }
        self.react_to_pressure(&node, now);
        Ok(out)
    }

    /// React quickly when a group goes over a scale-up threshold: an
    /// evaluation of it (of its profile for a profile's threshold, see
    /// [`crate::policy::pressure_keys`]) `react_delay` after `now`. What
    /// the last evaluation of it already found over one (its
    /// scale-up under way, or held by a guard) asks again at most every
    /// [`REPEAT_PRESSURE`]: it was answered, and what changes the answer (an
    /// operation ending, a cooldown running out) does not come with its
    /// reports. Only a new crossing starts the decision latency clock.
    fn react_to_pressure(&mut self, node: &str, now: DateTime<Utc>) {
        let Some(g) = self.fleet.get(node).map(|e| e.group()) else {
            return;
        };
        let react = now + super::dur(self.cfg.policy.react_delay);
        for key in crate::policy::pressure_keys(&self.facts(), &self.cfg, g, now) {
            // Nothing this report shows can bring an evaluation already due
            // by then any earlier.
            if self.due.get(&key).is_some_and(|t| *t <= react) {
                continue;
            }
            // The earliest wins: a new crossing does not wait behind a
            // repeat already asked for (up to REPEAT_PRESSURE later).
            let due = match self.pressured.get(&key) {
                Some(last) => react.max(*last + REPEAT_PRESSURE),
                None => {
                    self.pressure_seen.get_or_insert(now);
                    react
                }
            };
            let at = self.due.entry(key).or_insert(due);
            *at = (*at).min(due);
        }
    }

    /// A node's event about one of our commands (already authenticated),
    /// `sent` at the envelope's `ts` (the node's clock). A `stale_epoch`
    /// refusal is not the operation's business: it becomes
    /// [`Action::StaleEpoch`] (`fence.rs`).
    pub fn on_event(
        &mut self,
        from: &str,
        corr: Option<&str>,
        msg: &Message,
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        if let Message::Refused(r) = msg
            && let Some(a) = self.stale_epoch(from, r)
        {
            return vec![a];
        }
        let Some(corr) = corr else {
            return vec![];
        };
        match self.ops.get(corr).map(|o| (o.id.clone(), &o.body)) {
            Some((id, OpBody::ScaleDown(_))) => {
                self.drive_down(&id, DownInput::Event { from, msg, sent }, now)
            }
            Some((_, OpBody::ScaleUp(_))) => vec![],
            None => {
                tracing::debug!(corr, from, "event for an unknown operation");
                vec![]
            }
        }
    }

    /// A handler call finished (or timed out).
    pub fn on_handler_result(
        &mut self,
        tag: CallTag,
        result: CallResult,
        now: DateTime<Utc>,
    ) -> Vec<Action> {
        match tag {
            CallTag::Group(g) => match result {
                CallResult::Capacity(r) => self.drive_supply(&g, SupplyInput::Capacity(r), now),
                _ => vec![],
            },
            // Several may be in flight: the machine matches the answer by its call.
            CallTag::Paas(op) => match self.ops.get(&op) {
                Some(o) if !o.is_done() && matches!(o.body, OpBody::ScaleDown(_)) => {
                    self.drive_down(&op, DownInput::Result(result), now)
                }
                Some(o) if !o.is_done() => self.drive_up(&op, UpInput::Result(result), now),
                _ => {
                    tracing::debug!(%op, "PaaS answer for no running scale-down: ignored");
                    vec![]
                }
            },
            CallTag::Op { op, seq } => {
                let Some(o) = self.ops.get(&op) else {
                    return vec![];
                };
                if o.call_seq != seq || o.is_done() {
                    tracing::debug!(%op, seq, "result of an older handler call: ignored");
                    return vec![];
                }
                match o.body {
                    OpBody::ScaleUp(_) => self.drive_up(&op, UpInput::Result(result), now),
                    OpBody::ScaleDown(_) => self.drive_down(&op, DownInput::Result(result), now),
                }
            }
        }
    }

    /// Deadlines, polls and retries. Call often (every second or faster).
    pub fn tick(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let mut out = vec![];
        for id in self.ops.in_flight_ids() {
            out.extend(self.step_op(&id, OpStep::Tick, now));
        }
        // Exhausted groups: is there capacity again?
        let due: Vec<_> = self
            .groups
            .iter()
            .filter(|(_, s)| s.supply.check_due(now))
            .map(|(g, _)| g.clone())
            .collect();
        for g in due {
            out.extend(self.drive_supply(&g, SupplyInput::Tick, now));
        }
        out
    }

    /// After a restart: re-issue the effect of every unfinished step. Commands
    /// keep their ids (a node that has one already refuses the copy as a
    /// replay); creates whose outcome is unknown are looked up, never re-sent.
    pub fn resume(&mut self, now: DateTime<Utc>) -> Vec<Action> {
        let mut out = vec![];
        for id in self.ops.in_flight_ids() {
            if let Some(op) = self.ops.get(&id) {
                tracing::info!(op = %id, state = op.state(), "resuming operation");
            }
            out.extend(self.step_op(&id, OpStep::Resume, now));
        }
        out
    }

    fn step_op(&mut self, id: &OpId, step: OpStep, now: DateTime<Utc>) -> Vec<Action> {
        match self.ops.get(id).map(|o| &o.body) {
            Some(OpBody::ScaleUp(_)) => self.drive_up(id, step.up(), now),
            Some(OpBody::ScaleDown(_)) => self.drive_down(id, step.down(), now),
            None => vec![],
        }
    }
}

/// The inputs every operation takes, whatever its kind.
#[derive(Debug, Clone, Copy)]
enum OpStep {
    Tick,
    Resume,
}

impl OpStep {
    fn up(self) -> UpInput {
        match self {
            OpStep::Tick => UpInput::Tick,
            OpStep::Resume => UpInput::Resume,
        }
    }

    fn down(self) -> DownInput<'static> {
        match self {
            OpStep::Tick => DownInput::Tick,
            OpStep::Resume => DownInput::Resume,
        }
    }
}
