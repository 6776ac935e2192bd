//! Refused commands: every one is counted, logged (rate-limited) and its
//! delivery acknowledged; `event.refused` answers are rate-limited per
//! reason, so that a flood of forged or replayed commands costs the node its
//! counting, not one signed event each (which would queue ahead of nothing
//! useful and make the node an amplifier).
//!
//! Each reason may be answered [`ANSWER_BURST`] times per [`ANSWER_WINDOW`];
//! what is held back is summed into the next answer that gets through ("N
//! more refused for this reason since …"), or, when the flood stopped, into
//! a summary `event.refused` without `cmd` at the next housekeeping.

use chrono::{DateTime, Utc};
use gearshift_proto::Refusal;
use gearshift_proto::msg::Refused;
use gearshift_service::ratelimit::{LogLimiter, Verdict};

use super::{Action, NodeCore, Tag, event};

/// Answers per reason per [`ANSWER_WINDOW`].
pub const ANSWER_BURST: u32 = 10;

/// The window of [`ANSWER_BURST`].
pub const ANSWER_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The answer budget (boxed and made on first use: idle cores stay small).
pub(super) type Answers = Option<Box<LogLimiter<DateTime<Utc>>>>;

fn budget(answers: &mut Answers) -> &mut LogLimiter<DateTime<Utc>> {
    answers.get_or_insert_with(|| Box::new(LogLimiter::new(ANSWER_BURST, ANSWER_WINDOW)))
}

impl NodeCore {
    /// Refuses a command: counted, logged, answered with `event.refused`
    /// within the reason's budget, and its delivery acknowledged (it will
    /// never succeed).
    pub(super) fn refuse(
        &mut self,
        r: Refusal,
        tag: Tag,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        self.refuse_naming(r, None, tag, now, out);
    }

    /// [`NodeCore::refuse`], the answer naming leader epoch `epoch` (the
    /// newest seen, for `stale_epoch`).
    pub(super) fn refuse_naming(
        &mut self,
        r: Refusal,
        epoch: Option<u64>,
        tag: Tag,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        out.push(Action::Count {
            kind: r.kind_label(),
            outcome: "refused",
        });
        if let Verdict::Log { suppressed, since } = budget(&mut self.answers).check(r.reason, now) {
            let detail = match since {
                Some(since) if suppressed > 0 => format!(
                    "{} ({suppressed} more refused for this reason since {}, not answered one by one)",
                    r.detail,
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
                _ => r.detail.clone(),
            };
            out.push(event(
                Refused {
                    cmd: r.id,
                    reason: r.reason.to_string(),
                    detail,
                    epoch,
                },
                r.corr.as_deref(),
            ));
        }
        out.push(Action::Refused {
            refusal: r,
            broadcast: false,
        });
        out.push(Action::Ack {
            tag,
            journaled: None,
        });
    }

    /// Publishes one summary per reason whose answers were held back and
    /// whose window is over (the flood stopped).
    pub(super) fn summarize_refusals(&mut self, now: DateTime<Utc>, out: &mut Vec<Action>) {
        let Some(answers) = self.answers.as_mut() else {
            return;
        };
        for held in answers.drain(now) {
            out.push(event(
                Refused {
                    cmd: None,
                    reason: held.key,
                    detail: format!(
                        "{} refused since {}, not answered one by one",
                        held.count,
                        held.since
                            .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                    ),
                    epoch: None,
                },
                None,
            ));
        }
    }
}
