//! The node's events about the saga's commands: progress, the answer
//! (`event.done`), failures and refusals.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{CommandResult, Message, Progress};
use uuid::Uuid;

use super::{DownCtx, DownOut, DownStep, ScaleDown};
use crate::core::actions::Out;

impl ScaleDown {
    pub(super) fn on_event(
        &mut self,
        cx: &mut DownCtx<'_>,
        from: &str,
        msg: &Message,
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.node != from {
            tracing::warn!(corr = %cx.op, from, node = %self.node, "event from another node than the operation's: ignored");
            return Out::none();
        }
        match msg {
            Message::Progress(p) => self.on_progress(p),
            Message::Done(done) => self.on_done(cx, done.cmd, &done.result, sent, now),
            Message::Failed(f) if Some(f.cmd) == self.cmd => {
                let reason = format!("{} failed on {from}: {}", f.command, f.error);
                if f.retryable {
                    self.resend(cx, reason, now)
                } else {
                    self.step_failed(cx, reason, now)
                }
            }
            Message::Refused(r) if r.cmd.is_none() || r.cmd == self.cmd => {
                match r.reason.as_str() {
                    // A copy of a command it already has: its events follow.
                    "replayed" => Out::none(),
                    "expired" | "stale" => {
                        self.resend(cx, format!("{from} refused the command: {}", r.detail), now)
                    }
                    _ => self.step_failed(
                        cx,
                        format!("{from} refused the command ({}): {}", r.reason, r.detail),
                        now,
                    ),
                }
            }
            _ => Out::none(),
        }
    }

    fn on_progress(&mut self, p: &Progress) -> DownOut {
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

    /// The answer to a command: `sent` is when the node sent it, by its
    /// clock; only its reports sent since count as its result (`confirm.rs`).
    fn on_done(
        &mut self,
        cx: &mut DownCtx<'_>,
        cmd: Uuid,
        result: &CommandResult,
        sent: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.cmd != Some(cmd) {
            tracing::debug!(op = %cx.op, %cmd, "done for an older command: ignored");
            return Out::none();
        }
        self.done_at = Some(sent);
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
                // The node may already have reported, after its answer.
                self.confirm_empty(cx, now).then(self.judge_seen(cx, now))
            }
            (DownStep::Reactivating { cancel }, CommandResult::Activated) => {
                let cancel = *cancel;
                self.node_reactivated(cx, cancel, now)
            }
            _ => Out::none(),
        }
    }
}
