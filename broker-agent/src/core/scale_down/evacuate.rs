//! The evacuation rounds: plan the moves from the node's gears, follow the
//! progress, confirm the node empty, or go round again (and abort when out
//! of rounds or of room).

use chrono::{DateTime, Duration, Utc};
use gearshift_proto::msg::{
    CommandResult, Evacuate, GearInfo, InventoryRequest, Message, Progress,
};
use gearshift_proto::routing::NO_DISTRICT;
use uuid::Uuid;

use super::{DownCtx, DownOut, DownStep, DrainProgress, ScaleDown};
use crate::core::actions::{Out, dur};
use crate::planner::PlanInput;

impl ScaleDown {
    pub(super) fn on_progress(&mut self, p: &Progress) -> DownOut {
        // Broker-side moves count their own progress.
        if self.step != DownStep::Evacuating || Some(p.cmd) != self.cmd || self.moving() {
            return Out::none();
        }
        let prev = self.progress;
        self.progress.moved = p.moved;
        self.progress.failed = p.failed;
        self.progress.remaining = p.remaining;
        self.progress.total = p.total;
        self.progress.moved_total += p.moved.saturating_sub(prev.moved);
        Out::touched()
    }

    pub(super) fn on_done(
        &mut self,
        cx: &mut DownCtx<'_>,
        cmd: Uuid,
        result: &CommandResult,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.cmd != Some(cmd) {
            tracing::debug!(op = %cx.op, %cmd, "done for an older command: ignored");
            return Out::none();
        }
        match (&self.step, result) {
            (DownStep::Deactivating, CommandResult::Deactivated { gears })
            | (DownStep::Inventorying, CommandResult::Inventory { gears }) => {
                self.plan(cx, gears.clone(), now)
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
                self.progress.moved = *moved;
                self.progress.failed = *failed;
                self.progress.remaining = 0;
                if *gears_left > 0 {
                    let why = format!("evacuation left {gears_left} gears ({failed} failed)");
                    return self.next_round(cx, why, now);
                }
                let out = self.confirm_empty(cx, now);
                // The node may already have reported empty.
                match cx.facts.fleet.get(&self.node) {
                    Some(e) if e.total_gears() == 0 && e.received >= now => {
                        out.then(self.emptied(cx, now))
                    }
                    _ => out,
                }
            }
            (DownStep::Reactivating { cancel }, CommandResult::Activated) => {
                let cancel = *cancel;
                self.node_reactivated(cx, cancel, now)
            }
            _ => Out::none(),
        }
    }

    /// The node reported: while waiting for it to show itself empty, an
    /// empty report moves on to the removal, and an idle one with gears
    /// left starts another round.
    pub(super) fn on_report(
        &mut self,
        cx: &mut DownCtx<'_>,
        total_gears: u32,
        busy: bool,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.step != DownStep::ConfirmingEmpty {
            return Out::none();
        }
        if total_gears == 0 {
            self.emptied(cx, now)
        } else if !busy {
            let why = format!(
                "{} still reports {total_gears} gears after its evacuation",
                self.node
            );
            self.next_round(cx, why, now)
        } else {
            Out::none()
        }
    }

    /// The node is confirmed empty: remove it, or keep it (maintenance).
    fn emptied(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        if self.keep {
            self.end(super::DownEnd::Kept)
        } else if cx.openshift() {
            self.remove_from_district(cx, now)
        } else {
            self.enter_removing(cx, now)
        }
    }

    /// Waits for a report that shows the node empty.
    pub(super) fn confirm_empty(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        let out = self.enter(cx, DownStep::ConfirmingEmpty, None, now);
        self.deadline = now + dur(cx.cfg.saga.confirm_empty_timeout);
        out
    }

    /// Plans the moves of `gears` and sends the evacuation; aborts when a
    /// gear opted out or no plan exists.
    pub(super) fn plan(
        &mut self,
        cx: &mut DownCtx<'_>,
        gears: Vec<GearInfo>,
        now: DateTime<Utc>,
    ) -> DownOut {
        if let Some(g) = gears.iter().find(|g| g.do_not_disrupt) {
            let why = format!("gear {} on {} opted out of scale-down", g.id, self.node);
            self.gears = gears;
            return self.abort(cx, why, false, now);
        }
        self.gears = gears;
        self.round += 1;
        self.progress = DrainProgress {
            moved_total: self.progress.moved_total,
            ..Default::default()
        };
        if self.gears.is_empty() {
            let out = self.confirm_empty(cx, now);
            self.moves.clear();
            if cx
                .facts
                .fleet
                .get(&self.node)
                .is_some_and(|e| e.total_gears() == 0)
            {
                return out.then(self.emptied(cx, now));
            }
            return out;
        }
        let candidates = cx.facts.candidates(cx.group, &self.node, now);
        let district = (cx.group.district != NO_DISTRICT).then_some(cx.group.district.as_str());
        let plan = cx.planner.plan(&PlanInput {
            victim: &self.node,
            district,
            gears: &self.gears,
            candidates,
            now,
        });
        match plan {
            Ok(moves) => self.evacuate(cx, moves, now),
            Err(e) => self.no_plan(cx, e, now),
        }
    }

    fn evacuate(
        &mut self,
        cx: &mut DownCtx<'_>,
        moves: Vec<gearshift_proto::msg::Move>,
        now: DateTime<Utc>,
    ) -> DownOut {
        let s = &cx.cfg.saga;
        let deadline = now + dur(s.evacuation_timeout);
        // The node gives up at `deadline`; allow it one command timeout to say so.
        let grace = dur(s.command_timeout);
        let msg = Message::Evacuate(self.evacuate_message(cx, moves.clone(), deadline));
        let total = moves.len() as u32;
        let out = self.enter(cx, DownStep::Evacuating, Some(msg), now);
        self.moves = moves;
        self.deadline = deadline + grace;
        self.progress.total = total;
        self.progress.remaining = total;
        if cx.openshift() {
            self.plan_broker_moves();
            return out.then(self.launch_moves(cx, now));
        }
        out
    }

    /// `cmd.evacuate` for `moves`: with `openshift` the node only watches
    /// (the broker agent moves), every gear at once.
    pub(super) fn evacuate_message(
        &self,
        cx: &DownCtx<'_>,
        moves: Vec<gearshift_proto::msg::Move>,
        deadline: DateTime<Utc>,
    ) -> Evacuate {
        let watch = cx.openshift();
        let parallelism = if watch {
            (moves.len() as u32).clamp(1, 256)
        } else {
            cx.cfg.saga.evacuation_parallelism
        };
        Evacuate {
            moves,
            parallelism: Some(parallelism),
            deadline: Some(deadline),
            watch,
            epoch: 0,
        }
    }

    /// No plan: just started (a resumed drain, most likely), the other nodes
    /// may not have reported to this process yet, so try again until the
    /// start-up grace is over; then give up as usual.
    fn no_plan(&mut self, cx: &mut DownCtx<'_>, e: String, now: DateTime<Utc>) -> DownOut {
        let learning_until = cx.facts.started + dur(cx.cfg.policy.startup_grace);
        if now < learning_until {
            let retry = (now + Duration::seconds(1)).min(learning_until);
            tracing::info!(
                op = %cx.op,
                node = %self.node,
                error = %e,
                "no evacuation plan yet while the fleet reports after the start; planning again"
            );
            self.round = self.round.saturating_sub(1);
            self.replan_at = Some(retry);
            return Out::touched();
        }
        let why = format!("no evacuation plan for {}: {e}", self.node);
        self.abort(cx, why, false, now)
    }

    /// Another evacuation round (ask the inventory again), or abort when out of rounds.
    pub(super) fn next_round(
        &mut self,
        cx: &mut DownCtx<'_>,
        why: String,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.round >= cx.cfg.saga.evacuation_attempts {
            let why = format!("{why}; gave up after {} evacuation rounds", self.round);
            return self.abort(cx, why, false, now);
        }
        tracing::info!(op = %cx.op, why, "evacuation: another round");
        let msg = Message::Inventory(InventoryRequest::default());
        self.enter(cx, DownStep::Inventorying, Some(msg), now)
    }
}
