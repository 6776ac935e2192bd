//! Leader epochs: a deposed broker agent that has not noticed must not act.
//!
//! Every new command (not a redelivery of one the journal holds) that
//! carries an epoch is compared with the newest epoch this node has seen:
//! - older: refused with `event.refused`, reason `stale_epoch`, naming both
//!   epochs (through the rate-limited refusal path), never acted upon;
//! - newer: persisted first ([`Action::PersistEpoch`], its own field of the
//!   state file, since the journal is pruned), and only once it is durable
//!   is the command journaled and carried out, so a restart never forgets an
//!   epoch that a command was accepted under;
//! - equal (a missing epoch is 0, as is a node that never saw one): as
//!   before epochs existed.
//!
//! A command journaled before a newer epoch was seen finishes (or is
//! answered again) as it would have: it was accepted while its sender led.

use std::cmp::Ordering;

use chrono::{DateTime, Utc};
use gearshift_proto::msg::STALE_EPOCH;
use gearshift_proto::{Envelope, Refusal};

use super::{Action, Current, Cx, NodeCore, Tag, Wait, event, failed};

impl NodeCore {
    /// The newest leader epoch this node has seen and persisted (0: none).
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Fences the new command `env`: returns it when it may go on now;
    /// `None` when it was refused, or waits for its newer epoch to be
    /// persisted (it goes on in [`NodeCore::on_epoch_persisted`]).
    pub(super) fn fence(
        &mut self,
        env: Envelope,
        tag: Tag,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) -> Option<Envelope> {
        let Some(epoch) = env.msg.epoch() else {
            return Some(env);
        };
        match epoch.cmp(&self.epoch) {
            Ordering::Equal => Some(env),
            Ordering::Less => {
                let detail = format!(
                    "{} of leader epoch {epoch} from {}: this node has seen epoch {}; \
                     the sender is no longer the leader",
                    env.kind(),
                    env.from,
                    self.epoch
                );
                let r = Refusal::of(&env, STALE_EPOCH, detail);
                self.refuse_naming(r, Some(self.epoch), tag, now, out);
                None
            }
            Ordering::Greater => {
                out.push(Action::PersistEpoch(epoch));
                self.current = Some(Box::new(Current {
                    env,
                    tag,
                    entry: None,
                    wait: Wait::Epoch(epoch),
                }));
                None
            }
        }
    }

    /// The newer epoch of the current command is durable (or not).
    pub(super) fn on_epoch_persisted(
        &mut self,
        cx: Cx<'_>,
        r: Result<(), String>,
        now: DateTime<Utc>,
        out: &mut Vec<Action>,
    ) {
        let Some(epoch) = self.current.as_ref().and_then(|c| match c.wait {
            Wait::Epoch(e) => Some(e),
            _ => None,
        }) else {
            return tracing::warn!("epoch persisted without a command waiting for it");
        };
        match r {
            Ok(()) => {
                tracing::info!(
                    epoch,
                    previous = self.epoch,
                    "newer leader epoch seen and persisted"
                );
                self.epoch = self.epoch.max(epoch);
                let Some(c) = self.current.take() else { return };
                if matches!(c.env.msg, gearshift_proto::Message::Inventory(_)) {
                    self.begin_inventory(c.env, c.tag, out);
                } else {
                    self.begin_journal(cx, c.env, c.tag, now, out);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, epoch, "cannot persist the leader epoch; command not executed");
                let Some(c) = self.current.as_ref() else {
                    return;
                };
                let reason = format!("node cannot persist leader epoch {epoch}: {e}");
                out.push(event(
                    failed(&c.env, &reason, true, None),
                    c.env.corr.as_deref(),
                ));
                out.push(Action::Count {
                    kind: c.env.kind().as_str(),
                    outcome: "failed",
                });
                self.finish(false, out);
            }
        }
    }
}
