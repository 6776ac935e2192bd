//! The removal: ask the handler to remove exactly this node, then wait
//! until the handler says it is gone or its reports stop.

use chrono::{DateTime, Utc};
use gearshift_handlers::{HandlerError, Presence, RemoveOutcome, RemoveRequest};
use gearshift_proto::msg::DecisionKind;

use super::{DownCtx, DownEnd, DownOut, DownStep, ScaleDown};
use crate::core::actions::{CallResult, Effect, HandlerCall, Note, Out, dur};

impl ScaleDown {
    /// The node is confirmed empty: journal the intent and ask the handler.
    pub(super) fn enter_removing(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        self.step = DownStep::Removing;
        self.cmd = None;
        self.deadline = now + dur(cx.cfg.saga.remove_timeout);
        self.remove_attempt = 0;
        self.call_remove(cx)
    }

    pub(super) fn call_remove(&mut self, cx: &DownCtx<'_>) -> DownOut {
        self.remove_attempt += 1;
        self.next_call = None;
        Out::effect(Effect::Call(HandlerCall::Remove(RemoveRequest {
            op: cx.op.to_string(),
            group: cx.group.clone(),
            node: self.node.clone(),
            cloud_id: None,
            attempt: self.remove_attempt,
            epoch: 0,
        })))
    }

    /// `Removing` after a restart or a takeover: a request whose answer
    /// was journaled as a retryable failure is retried; otherwise the last
    /// one may have reached the cloud, so it is not sent again (a second
    /// remove-node for one operation): the removal is confirmed instead,
    /// and asked again only if the node goes on reporting (see
    /// [`ScaleDown::removal_tick`]).
    pub(super) fn resume_removing(&mut self, cx: &DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        if self.next_call.is_some() {
            return self.call_remove(cx);
        }
        tracing::info!(op = %cx.op, node = %self.node,
            "resumed while a remove request was in flight: confirming the removal before asking again");
        self.step = DownStep::ConfirmingGone;
        self.removed_at = Some(now);
        self.remove_uncertain = true;
        self.call_presence(cx)
    }

    /// Whether a removal confirmed after a resume shows the request never
    /// reached the cloud: the node still reports twice its stale window
    /// after the resume, and the handler does not say it is gone.
    fn remove_never_arrived(&self, cx: &DownCtx<'_>, now: DateTime<Utc>) -> bool {
        let (true, Some(at)) = (self.remove_uncertain, self.removed_at) else {
            return false;
        };
        let intervals = cx.facts.stale_intervals;
        cx.facts
            .fleet
            .get(&self.node)
            .is_some_and(|e| e.is_fresh(now, intervals) && now - at > e.stale_after(intervals) * 2)
            && self.presence != Some(Presence::Gone)
    }

    pub(super) fn call_presence(&mut self, cx: &DownCtx<'_>) -> DownOut {
        self.next_call = None;
        Out::effect(Effect::Call(HandlerCall::Presence {
            node: self.node.clone(),
            group: cx.group.clone(),
        }))
    }

    pub(super) fn on_result(
        &mut self,
        cx: &mut DownCtx<'_>,
        r: CallResult,
        now: DateTime<Utc>,
    ) -> DownOut {
        match r {
            CallResult::Remove(r) => self.on_remove(cx, r, now),
            CallResult::Presence(r) => self.on_presence(cx, r, now),
            _ => Out::none(),
        }
    }

    fn on_remove(
        &mut self,
        cx: &mut DownCtx<'_>,
        r: Result<RemoveOutcome, HandlerError>,
        now: DateTime<Utc>,
    ) -> DownOut {
        let poll = dur(cx.cfg.saga.presence_poll);
        match r {
            Ok(o) => {
                tracing::info!(op = %cx.op, detail = %o.detail, gone = o.gone, "remove request accepted");
                if o.gone {
                    return self.end(DownEnd::Removed);
                }
                self.step = DownStep::ConfirmingGone;
                self.removed_at = Some(now);
                self.next_call = Some(now + poll);
                Out::touched()
            }
            Err(e) if e.is_retryable() => {
                tracing::warn!(op = %cx.op, error = %e, "remove request failed; will retry");
                self.next_call = Some(now + poll);
                Out::touched()
            }
            Err(e) => {
                let failed = Out::effect(Effect::Decide(Note {
                    kind: DecisionKind::HandlerFailed,
                    node: Some(self.node.clone()),
                    reason: format!("remove-node {} failed ({}): {e}", self.node, e.label()),
                    stats: false,
                }));
                failed.then(self.end(DownEnd::Failed {
                    reason: format!("the handler refused to remove the node: {e}"),
                }))
            }
        }
    }

    fn on_presence(
        &mut self,
        cx: &mut DownCtx<'_>,
        r: Result<Presence, HandlerError>,
        now: DateTime<Utc>,
    ) -> DownOut {
        let gone_by_reports = self.reports_stopped(cx, now);
        if let Ok(p) = &r {
            self.presence = Some(*p);
        }
        match r {
            Ok(Presence::Gone) => self.end(DownEnd::Removed),
            Ok(Presence::Unknown) if gone_by_reports => self.end(DownEnd::Removed),
            other => {
                if let Err(e) = other {
                    tracing::warn!(op = %cx.op, error = %e, "presence check failed");
                }
                self.next_call = Some(now + dur(cx.cfg.saga.presence_poll));
                Out::touched()
            }
        }
    }

    /// Whether a removed node stopped reporting (no report for its stale
    /// window since the removal request).
    fn reports_stopped(&self, cx: &DownCtx<'_>, now: DateTime<Utc>) -> bool {
        let Some(at) = self.removed_at else {
            return false;
        };
        // A node keeps reporting until the cloud has actually stopped it,
        // which takes a while after the request: reports after `at` are
        // expected; the node is gone once it has been silent for its stale
        // window, and that window has passed since the request.
        let intervals = cx.facts.stale_intervals;
        match cx.facts.fleet.get(&self.node) {
            None => true,
            Some(e) => !e.is_fresh(now, intervals) && now - at > e.stale_after(intervals),
        }
    }

    /// Deadlines and polls of `Removing` and `ConfirmingGone`.
    pub(super) fn removal_tick(&mut self, cx: &mut DownCtx<'_>, now: DateTime<Utc>) -> DownOut {
        if now >= self.deadline {
            let still = if self.step == DownStep::Removing {
                "the handler did not accept the removal"
            } else {
                "the node is still there"
            };
            let failed = Out::effect(Effect::Decide(Note {
                kind: DecisionKind::HandlerFailed,
                node: Some(self.node.clone()),
                reason: format!("remove-node {} not confirmed: {still}", self.node),
                stats: false,
            }));
            return failed.then(self.end(DownEnd::Failed {
                reason: format!("removal not confirmed within the remove timeout: {still}"),
            }));
        }
        let due = self.next_call.is_some_and(|t| now >= t);
        match self.step {
            DownStep::Removing if due => self.call_remove(cx),
            DownStep::ConfirmingGone if self.remove_never_arrived(cx, now) => {
                tracing::warn!(op = %cx.op, node = %self.node,
                    "the node still reports long after the resumed removal: asking the handler again");
                self.step = DownStep::Removing;
                self.remove_uncertain = false;
                self.removed_at = None;
                self.call_remove(cx)
            }
            DownStep::ConfirmingGone
                if self.reports_stopped(cx, now) && self.presence != Some(Presence::Present) =>
            {
                self.end(DownEnd::Removed)
            }
            DownStep::ConfirmingGone if due => self.call_presence(cx),
            _ => Out::none(),
        }
    }
}
