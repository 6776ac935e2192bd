//! The evacuation rounds: plan the moves from the node's gears, send the
//! evacuation, or go round again (and abort when out of rounds or of room).

use chrono::{DateTime, Duration, Utc};
use gearshift_proto::msg::{Evacuate, GearInfo, InventoryRequest, Message};
use gearshift_proto::routing::NO_DISTRICT;

use super::{DownCtx, DownOut, DownStep, DrainProgress, ScaleDown};
use crate::core::actions::{Out, dur};
use crate::planner::PlanInput;

impl ScaleDown {
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
            self.moves.clear();
            // The node may already have reported empty, after its answer.
            return self.confirm_empty(cx, now).then(self.judge_seen(cx, now));
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
