//! Confirming the node empty: which report may say so, and which may say
//! the evacuation left gears behind.
//!
//! Reports and events reach the broker agent by different routes (its
//! report subscription and its events queue), and events go first: a report
//! the node sent *before* its `event.done` can be taken *after* it (a
//! report backlog, a reconnect, a batch of events). Such a report tells
//! nothing about what the command did: one sent before the evacuation began
//! still shows every gear, and the node is no longer busy in it. So a
//! report counts only when the node sent it at or after the `event.done`
//! that ended the command, both by the node's own clock (the report's and
//! the event's envelope `ts`, millisecond resolution). An older one is
//! ignored; the step waits for a newer one, bounded by
//! `saga.confirm_empty_timeout` as before.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{DownCtx, DownOut, DownStep, ScaleDown};
use crate::core::actions::{Out, dur};

/// A report of the victim as the saga takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seen {
    /// When the node sent it, by the node's clock (the envelope's `ts`).
    pub sent: DateTime<Utc>,
    /// Its gears, every state counted.
    pub total_gears: u32,
    /// Whether it was carrying out a command.
    pub busy: bool,
}

impl ScaleDown {
    /// The node reported. Remembered (the newest by the node's clock), so
    /// that a report taken before the `event.done` it follows still counts
    /// once the done arrives; while confirming the node empty, judged.
    pub(super) fn on_report(
        &mut self,
        cx: &mut DownCtx<'_>,
        r: Seen,
        now: DateTime<Utc>,
    ) -> DownOut {
        if self.seen.is_none_or(|s| r.sent >= s.sent) {
            self.seen = Some(r);
        }
        if self.step != DownStep::ConfirmingEmpty {
            return Out::none();
        }
        self.judge(cx, r, now)
    }

    /// The newest report already seen, judged: called when the step starts
    /// waiting for one.
    pub(super) fn judge_seen(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        match self.seen {
            Some(r) => self.judge(cx, r, now),
            None => Out::none(),
        }
    }

    /// An empty report moves on to the removal; an idle one with gears left
    /// starts another round; a busy one, or one older than the command's
    /// `event.done`, waits.
    fn judge(&mut self, cx: &mut DownCtx<'_>, r: Seen, now: DateTime<Utc>) -> DownOut {
        if let Some(done) = self.done_at.filter(|d| r.sent < *d) {
            tracing::debug!(
                op = %cx.op,
                node = %self.node,
                report = %r.sent,
                %done,
                "report sent before the command's done: not used to judge it"
            );
            return Out::none();
        }
        if r.total_gears == 0 {
            self.emptied(cx, now)
        } else if !r.busy {
            let why = format!(
                "{} still reports {} gears after its evacuation",
                self.node, r.total_gears
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
}
