//! `cmd.evacuate` and the bookkeeping of a running evacuation.
//!
//! - Bounded parallelism (the command's `parallelism`, else the configured
//!   default of 4); the per-gear retries are the mover's.
//! - A checkpoint ([`Plan`]) after every gear, and before launching gears
//!   the plan had not started yet; a progress event after every gear.
//! - After a restart the plan is resumed ([`Input::Resume`](super::Input)):
//!   finished gears are never moved again, and gears that were in flight are
//!   started with `resumed` set, so that the runtime completes a half-done
//!   move rather than starting over.
//! - Stopping: no new move starts; the moves in flight end (or are
//!   interrupted at a safe point) and stay pending for the next start.
//! - Aborting (`cmd.activate` during an evacuation) or passing the deadline:
//!   no new move starts, moves in flight finish, pending gears are reported
//!   failed with the reason.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{Done, Evacuate, GearResult, Kind, Message};

use super::{
    Action, CHECKPOINT_RETENTION_DAYS, Confirm, Cx, Event, MoveDone, MoveResult, MoveStart,
    NodeCore, ScanError, Wait, done, failed, stored,
};
use crate::evacuate::plan::{GearStatus, Plan, operation_id};

/// Where an evacuation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Moves are in flight or about to start.
    Moving,
    /// Every gear is final: counting the gears left on the node.
    Finishing,
    /// Its result is being published (the evacuation still counts as running).
    Publishing,
    /// A result found unpublished at start is published again.
    Announcing,
    /// The agent stopped it; it resumes at the next start.
    Interrupted,
}

/// One evacuation the core drives.
#[derive(Debug)]
pub struct Evac {
    plan: Plan,
    phase: Phase,
    /// Indices of the gears whose move is in flight.
    in_flight: Vec<u32>,
    /// Every gear before it is final or in flight.
    cursor: usize,
    /// Why it was aborted.
    aborted: Option<String>,
}

impl Evac {
    fn new(plan: Plan, phase: Phase) -> Evac {
        Evac {
            plan,
            phase,
            in_flight: Vec::new(),
            cursor: 0,
            aborted: None,
        }
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    pub(super) fn shows_in_reports(&self) -> bool {
        self.phase != Phase::Announcing
    }

    /// Counts as the evacuation in progress (a new one is refused meanwhile).
    fn running(&self) -> bool {
        matches!(
            self.phase,
            Phase::Moving | Phase::Finishing | Phase::Publishing
        )
    }

    /// Moves in flight, or finishing: a stopping agent waits for it.
    pub(super) fn busy(&self) -> bool {
        matches!(self.phase, Phase::Moving | Phase::Finishing)
    }

    pub(super) fn awaits_publication(&self) -> bool {
        matches!(self.phase, Phase::Publishing | Phase::Announcing)
    }

    fn save(&mut self, now: DateTime<Utc>, out: &mut Vec<Action>) {
        self.plan.updated_at = now;
        out.push(Action::SavePlan {
            plan: Box::new(self.plan.clone()),
            accept: false,
        });
    }

    /// Starts moves up to the parallelism (unless stopping, aborted or past
    /// the deadline); ends the evacuation when nothing is left in flight.
    pub(super) fn advance(
        &mut self,
        may_start: bool,
        stopping: bool,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        if self.phase != Phase::Moving {
            return;
        }
        let past_deadline = self.plan.deadline.is_some_and(|d| now >= d);
        if may_start && !stopping && self.aborted.is_none() && !past_deadline {
            self.launch(now, out);
        }
        if self.in_flight.is_empty() {
            self.end(stopping, now, out);
        }
    }

    fn launch(&mut self, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let room = (self.plan.parallelism as usize).saturating_sub(self.in_flight.len());
        let mut picks: Vec<(usize, bool)> = Vec::new();
        let mut i = self.cursor;
        while picks.len() < room && i < self.plan.gears.len() {
            let g = &self.plan.gears[i];
            if g.status == GearStatus::Pending && !self.in_flight.contains(&(i as u32)) {
                picks.push((i, g.started));
            }
            i += 1;
        }
        self.cursor = i;
        if picks.iter().any(|(_, was_started)| !was_started) {
            for (i, _) in &picks {
                self.plan.gears[*i].started = true;
            }
            // Durable before the moves start: a gear found gone after a
            // crash then counts as already moved.
            self.save(now, out);
        }
        for (i, was_started) in picks {
            self.in_flight.push(i as u32);
            let g = &self.plan.gears[i];
            out.push(Action::StartMove(MoveStart {
                op: self.plan.corr.clone(),
                idx: i as u32,
                gear: g.gear.clone(),
                target: g.target.clone(),
                resumed: was_started,
                deadline: self.plan.deadline,
                watch: self.plan.watch,
            }));
        }
    }

    /// Nothing in flight: interrupted (stopping), or every gear final (the
    /// pending ones failed with the reason when aborted or late).
    fn end(&mut self, stopping: bool, now: DateTime<Utc>, out: &mut Vec<Action>) {
        if stopping && !self.plan.is_complete() {
            self.save(now, out);
            self.phase = Phase::Interrupted;
            out.push(Action::ReportNow);
            return;
        }
        if !self.plan.is_complete() {
            let reason = match &self.aborted {
                Some(r) => format!("cancelled: {r}"),
                None => "deadline passed before the move started".to_string(),
            };
            let results = self.plan.fail_pending(&reason, now);
            self.save(now, out);
            self.progress(results, out);
        }
        self.phase = Phase::Finishing;
        out.push(Action::Scan(super::Scan::Evacuated(self.plan.corr.clone())));
    }

    fn progress(&self, results: Vec<GearResult>, out: &mut Vec<Action>) {
        for r in &results {
            out.push(Action::GearMoved(r.outcome));
        }
        out.push(Action::Emit(Event {
            msg: self.plan.progress(results).into(),
            corr: self.plan.event_corr.clone(),
            droppable: true,
            confirm: None,
        }));
        out.push(Action::ReportNow);
    }

    fn done_message(&self) -> Message {
        Done {
            cmd: self.plan.cmd,
            command: Kind::Evacuate.as_str().into(),
            result: self.plan.result(),
        }
        .into()
    }

    fn announce(&self, out: &mut Vec<Action>) {
        out.push(Action::Emit(Event {
            msg: self.done_message(),
            corr: self.plan.event_corr.clone(),
            droppable: false,
            confirm: Some(Confirm::Evacuated(self.plan.corr.clone())),
        }));
    }
}

impl NodeCore {
    /// The evacuations the core drives.
    pub fn evacuations(&self) -> &[Evac] {
        &self.evacs
    }

    pub(super) fn evacuate_command(&mut self, cx: Cx<'_>, out: &mut Vec<Action>) {
        let Some(c) = self.current.as_deref() else {
            return;
        };
        let env = &c.env;
        let op = operation_id(env.corr.as_deref(), env.id);
        if self.evacs.iter().any(|e| e.running() && e.plan.corr == op) {
            tracing::info!(corr = %op, id = %env.id, "evacuation already running; this command joins it");
            self.accepted(out);
            out.push(Action::Count {
                kind: Kind::Evacuate.as_str(),
                outcome: "duplicate",
            });
            return self.finish(true, out);
        }
        if let Some(other) = self.evacs.iter().find(|e| e.running()) {
            let msg = failed(
                env,
                &format!("another evacuation ({}) is in progress", other.plan.corr),
                true,
                None,
            );
            self.conclude(msg, out);
            return self.finish(true, out);
        }
        if self.active {
            tracing::warn!(corr = %op, "evacuating an active node: new gears may still be placed on it");
        }
        let _ = cx;
        out.push(Action::LoadPlan(op));
        if let Some(c) = self.current.as_deref_mut() {
            c.wait = Wait::Plan;
        }
    }

    pub(super) fn on_plan_loaded(
        &mut self,
        cx: Cx<'_>,
        r: Result<Option<Plan>, String>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self
            .current
            .as_deref()
            .filter(|c| matches!(c.wait, Wait::Plan))
        else {
            return tracing::warn!("checkpoint read without a command waiting for it");
        };
        let env = &c.env;
        let Message::Evacuate(evac) = &env.msg else {
            return;
        };
        let op = operation_id(env.corr.as_deref(), env.id);
        let plan = match r {
            Ok(Some(mut p)) => {
                let work = p.resend(env.id, evac, cx.config.parallelism, now);
                p.event_corr = env.corr.clone();
                if !work {
                    tracing::info!(corr = %op, "evacuation sent again after it finished: publishing its result again");
                    let msg = done(env, p.result());
                    self.conclude(msg, out);
                    return self.finish(true, out);
                }
                tracing::info!(corr = %op, "evacuation sent again: resuming it");
                p
            }
            Ok(None) => new_plan(&op, env, evac, cx.config.parallelism, now),
            Err(e) => {
                tracing::error!(error = %e, "evacuation checkpoint unreadable");
                let msg = failed(
                    env,
                    &format!("evacuation checkpoint unreadable: {e}"),
                    false,
                    None,
                );
                self.conclude(msg, out);
                return self.finish(true, out);
            }
        };
        out.push(Action::SavePlan {
            plan: Box::new(plan.clone()),
            accept: true,
        });
        if let Some(c) = self.current.as_deref_mut() {
            c.wait = Wait::Save(Box::new(plan));
        }
    }

    pub(super) fn on_plan_saved(
        &mut self,
        r: Result<(), String>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(c) = self.current.as_deref_mut() else {
            return tracing::warn!("checkpoint completion without a command waiting for it");
        };
        let plan = match std::mem::replace(&mut c.wait, Wait::Journal) {
            Wait::Save(plan) => *plan,
            other => {
                c.wait = other;
                return tracing::warn!("checkpoint completion without a command waiting for it");
            }
        };
        if let Err(e) = r {
            tracing::error!(error = %e, "cannot write the evacuation checkpoint");
            let msg = failed(
                &c.env,
                &format!("cannot write the evacuation checkpoint: {e}"),
                true,
                None,
            );
            self.conclude(msg, out);
            return self.finish(true, out);
        }
        tracing::info!(corr = %plan.corr, gears = plan.gears.len(), parallelism = plan.parallelism, "evacuation accepted");
        self.accepted(out);
        out.push(Action::Count {
            kind: Kind::Evacuate.as_str(),
            outcome: "accepted",
        });
        // The plan is durable: the delivery can go.
        self.finish(true, out);
        self.start_evacuation(plan, now, out);
    }

    fn start_evacuation(&mut self, plan: Plan, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let mut e = Evac::new(plan, Phase::Moving);
        out.push(Action::ReportNow);
        e.advance(true, self.stopping, now, out);
        self.evacs.push(e);
    }

    pub(super) fn on_moved(&mut self, m: MoveDone, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let stopping = self.stopping;
        let Some(e) = self
            .evacs
            .iter_mut()
            .find(|e| e.phase == Phase::Moving && e.plan.corr == m.op)
        else {
            return tracing::warn!(op = %m.op, "move result of no running evacuation");
        };
        let Some(pos) = e.in_flight.iter().position(|i| *i == m.idx) else {
            return tracing::warn!(op = %m.op, idx = m.idx, "move result of no move in flight");
        };
        e.in_flight.swap_remove(pos);
        let outcome = match m.result {
            // Stays pending; resumes at the next start (or fails below if aborted).
            MoveResult::Interrupted => None,
            MoveResult::Done(o) => Some(Ok(o)),
            MoveResult::Failed(err) => Some(Err(err)),
        };
        if let Some(outcome) = outcome {
            let r = e.plan.record(m.idx as usize, outcome, m.attempts, now);
            e.save(now, out);
            e.progress(vec![r], out);
        }
        e.advance(true, stopping, now, out);
    }

    pub(super) fn on_evacuation_scanned(
        &mut self,
        op: &str,
        result: Result<Vec<gearshift_proto::msg::GearInfo>, ScanError>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let stopping = self.stopping;
        let Some(idx) = self
            .evacs
            .iter()
            .position(|e| e.phase == Phase::Finishing && e.plan.corr == op)
        else {
            return;
        };
        let e = &mut self.evacs[idx];
        let left = match result {
            Ok(gears) => gears.len() as u32,
            Err(err) => err.cached.unwrap_or(0),
        };
        e.plan.gears_left = left;
        e.plan.finished = true;
        e.save(now, out);
        let (moved, failed, _, total) = e.plan.counts();
        tracing::info!(corr = %op, moved, failed, total, gears_left = left, "evacuation finished");
        let msg = e.done_message();
        for entry in self.journal.finish_operation(
            Kind::Evacuate.as_str(),
            e.plan.event_corr.as_deref(),
            &e.plan.cmd,
            &stored(&msg),
        ) {
            out.push(Action::JournalWrite(entry));
        }
        out.push(Action::Count {
            kind: Kind::Evacuate.as_str(),
            outcome: "done",
        });
        e.announce(out);
        if stopping {
            // Nobody waits for the publication any more.
            self.evacs.remove(idx);
            out.push(Action::ReportNow);
        } else {
            e.phase = Phase::Publishing;
        }
    }

    /// The evacuation's result was published (or dropped).
    pub(super) fn evacuation_confirmed(&mut self, op: &str, ok: bool, out: &mut Vec<Action>) {
        let Some(idx) = self
            .evacs
            .iter()
            .position(|e| e.awaits_publication() && e.plan.corr == op)
        else {
            return;
        };
        let mut e = self.evacs.remove(idx);
        if ok {
            e.plan.done_published = true;
            out.push(Action::SavePlan {
                plan: Box::new(e.plan),
                accept: false,
            });
        }
        if e.phase == Phase::Publishing {
            out.push(Action::ReportNow);
        }
    }

    /// At start: resumes unfinished evacuations; publishes results that a
    /// crash kept from being published; forgets old finished checkpoints.
    pub(super) fn resume(&mut self, plans: Vec<Plan>, now: DateTime<Utc>, out: &mut Vec<Action>) {
        for plan in plans {
            if !plan.finished {
                let (moved, failed, remaining, _) = plan.counts();
                tracing::info!(corr = %plan.corr, moved, failed, remaining, "resuming an interrupted evacuation");
                self.start_evacuation(plan, now, out);
            } else if !plan.done_published {
                let e = Evac::new(plan, Phase::Announcing);
                e.announce(out);
                self.evacs.push(e);
            } else if now - plan.updated_at > chrono::Duration::days(CHECKPOINT_RETENTION_DAYS) {
                out.push(Action::ForgetPlan(plan.corr));
            }
        }
    }

    /// Stops every running evacuation: no new move starts; moves in flight
    /// stop at their next safe point; pending gears fail with `reason`.
    pub(super) fn abort_evacuations(&mut self, reason: &str, out: &mut Vec<Action>) {
        for e in self.evacs.iter_mut().filter(|e| e.phase == Phase::Moving) {
            if e.aborted.is_none() {
                e.aborted = Some(reason.to_string());
            }
            out.push(Action::CancelMoves(e.plan.corr.clone()));
        }
    }
}

fn new_plan(
    op: &str,
    env: &gearshift_proto::Envelope,
    evac: &Evacuate,
    parallelism: u32,
    now: DateTime<Utc>,
) -> Plan {
    let mut p = Plan::new(op, env.id, evac, parallelism, now);
    p.event_corr = env.corr.clone();
    p
}
