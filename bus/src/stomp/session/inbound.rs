//! What the broker sends: RECEIPTs matched to the batches that wait for
//! them, MESSAGEs handed to their subscriptions (oversized ones as well),
//! ERRORs.

use std::time::Instant;

use super::io::{AckBy, Batch, Caller, Lost, Message, Output};
use super::send::destination;
use super::{StompSession, connect};
use crate::error::BusError;
use crate::stomp::dest;
use crate::stomp::frame::{Command, Frame};
use crate::stomp::parse::Item;
use crate::url::StompFlavor;

impl<C: Caller> StompSession<C> {
    /// Something arrived from the broker at `now` (any byte keeps it alive).
    /// `Err`: the connection must be given up.
    pub fn received(&mut self, item: Item, now: Instant) -> Result<(), Lost> {
        if let Some(c) = &mut self.clock {
            c.read(now);
        }
        match item {
            Item::HeartBeat => Ok(()),
            Item::TooLarge { frame, size } => {
                self.on_too_large(frame, size, now);
                Ok(())
            }
            Item::Frame(f) => match f.command {
                Command::Receipt => self.on_receipt(&f, now),
                Command::Message => {
                    self.on_message(f, None, now);
                    Ok(())
                }
                Command::Error => self.on_error(&f, now),
                _ => Ok(()),
            },
        }
    }

    fn on_receipt(&mut self, f: &Frame, now: Instant) -> Result<(), Lost> {
        if let Some(r) = f.get("receipt-id")
            && self.unsubscribing.remove(r)
        {
            return self.release_stranded();
        }
        let Some(a) = f.get("receipt-id").and_then(|r| self.receipts.remove(r)) else {
            return Ok(());
        };
        if let Some(fr) = self
            .inflight
            .get(&a.batch)
            .and_then(|fl| fl.batch.frames.get(a.frame))
        {
            if let Some(d) = destination(fr) {
                self.refusals.succeeded(d);
            }
            if fr.command == Command::Subscribe
                && let Some(id) = fr.get("id")
                && let Some(s) = self.sub_ids.get(id).and_then(|k| self.subs.get_mut(k))
            {
                s.refused.remove(id);
            }
        }
        self.answered(a.batch, now);
        // A declaration's brief subscription ends with this batch's
        // UNSUBSCRIBE receipt.
        self.release_stranded()
    }

    fn on_error(&mut self, f: &Frame, now: Instant) -> Result<(), Lost> {
        let text = connect::error_text(f);
        // An ERROR that names its receipt concerns one frame only; the
        // refusal is logged once, with its backoff, by `Refusals`.
        if let Some(a) = f.get("receipt-id").and_then(|r| self.receipts.remove(r))
            && let Some(fl) = self.inflight.get(&a.batch)
        {
            let frame = fl.batch.frames.get(a.frame).cloned();
            // A reply to a requester gone with its temporary queue is no
            // reason to hold anything back (nor to call the bus unhealthy).
            let delay = frame
                .as_ref()
                .and_then(|fr| destination(fr))
                .filter(|d| !dest::is_temporary(d))
                .map(|d| self.refusals.refused(d, &text, now));
            if delay.is_none() {
                tracing::info!(endpoint = %self.endpoint, error = %text, "STOMP ERROR for one frame");
                self.refusals.count();
            }
            if fl.batch.is_internal() {
                self.retry_later(frame, delay.unwrap_or_default(), now);
                self.answered(a.batch, now);
                return Ok(());
            }
            self.fail_batch(a.batch, frame.as_ref(), BusError::Server(text), now);
            return Ok(());
        }
        tracing::warn!(endpoint = %self.endpoint, error = %text, "STOMP ERROR from the broker");
        self.refusals.count();
        if self.flavor == StompFlavor::ActiveMq {
            // ActiveMQ keeps the connection after an ERROR (measured): one
            // about a frame without a receipt (an ACK) changes nothing else.
            return Ok(());
        }
        // Otherwise the broker closes the session: start over.
        Err(Lost {
            reason: format!("ERROR from the broker: {text}"),
            error: Some(BusError::Server(text)),
            recycle: false,
        })
    }

    /// A caller's batch was refused: it fails, and the subscription it
    /// opens ends (what the broker accepted of it is cancelled).
    fn fail_batch(&mut self, n: u64, refused: Option<&Frame>, error: BusError, now: Instant) {
        let Some(fl) = self.inflight.remove(&n) else {
            return;
        };
        self.receipts.retain(|_, a| a.batch != n);
        if let Some(key) = fl.batch.sub {
            let refused_id = refused.and_then(|f| f.get("id"));
            if let Some(sub) = self.remove_sub(key) {
                for id in sub.frames.iter().filter_map(|f| f.get("id")) {
                    if Some(id) != refused_id {
                        let u = Frame::new(Command::Unsubscribe).header("id", id);
                        self.write(Item::Frame(u), now);
                    }
                }
            }
        }
        self.finish(fl.batch, Err(error));
    }

    /// A restored subscription's SUBSCRIBE was refused: sent again after
    /// `delay`, while the restoration goes on without it.
    fn retry_later(&mut self, frame: Option<Frame>, delay: std::time::Duration, now: Instant) {
        let Some(frame) = frame.filter(|f| f.command == Command::Subscribe) else {
            return;
        };
        let Some(id) = frame.get("id").map(str::to_string) else {
            return;
        };
        let Some(&key) = self.sub_ids.get(&id) else {
            return;
        };
        if let Some(s) = self.subs.get_mut(&key) {
            s.refused.insert(id);
            self.deferred
                .push((now + delay, Batch::retry(key, vec![frame])));
        }
    }

    /// Hands a MESSAGE to its subscription; `too_large`: its body was
    /// skipped (its size), and it is acknowledged here.
    fn on_message(&mut self, f: Frame, too_large: Option<usize>, now: Instant) {
        let ack_id = f
            .get("ack")
            .or_else(|| f.get("message-id"))
            .map(str::to_string);
        let key = f
            .get("subscription")
            .and_then(|s| self.sub_ids.get(s))
            .copied();
        let Some(key) = key.filter(|k| self.subs.contains_key(k)) else {
            // A declaration's brief subscription, or one being cancelled: by
            // the time a NACK arrived the broker would have processed the
            // UNSUBSCRIBE and answer it with an ERROR. Leave it; see `stranded`.
            if ack_id.is_some() {
                self.strand(1);
                tracing::debug!(
                    subscription = f.get("subscription").unwrap_or_default(),
                    "delivery for a cancelled subscription; the broker gives it back"
                );
            }
            return;
        };
        let ack = match ack_id {
            None => AckBy::Nobody,
            Some(id) if too_large.is_some() => {
                let ack = Frame::new(Command::Ack).header("id", id);
                self.write(Item::Frame(ack), now);
                AckBy::Nobody
            }
            Some(id) => match self.subs.get_mut(&key) {
                Some(sub) if sub.manual => {
                    sub.unacked.insert(id.clone());
                    AckBy::App(id)
                }
                _ => AckBy::Forwarder(id),
            },
        };
        self.out.push_back(Output::Deliver(Message {
            sub: key,
            generation: self.generation,
            frame: f,
            ack,
            too_large,
        }));
    }

    /// A frame whose body was over the limit and skipped by the decoder: a
    /// MESSAGE is acknowledged (so it cannot come back and wedge the
    /// session) and handed on without its body.
    fn on_too_large(&mut self, frame: Frame, size: usize, now: Instant) {
        if frame.command != Command::Message {
            tracing::warn!(command = %frame.command, bytes = size, "oversized frame from the broker skipped");
            return;
        }
        self.too_large += 1;
        tracing::warn!(
            endpoint = %self.endpoint,
            destination = frame.get("destination").unwrap_or_default(),
            bytes = size,
            "message over the size limit: acknowledged and dropped"
        );
        self.on_message(frame, Some(size), now);
    }

    /// Once every cancellation of this connection is confirmed, recycles the
    /// connection if deliveries reached cancelled subscriptions meanwhile, so
    /// that the broker delivers them again (to a live consumer).
    fn release_stranded(&mut self) -> Result<(), Lost> {
        if self.stranded == 0 || !self.unsubscribing.is_empty() || self.pending_declarations() {
            return Ok(());
        }
        let n = self.stranded;
        tracing::info!(
            endpoint = %self.endpoint,
            deliveries = n,
            "deliveries reached cancelled subscriptions; recycling the connection so that they come back"
        );
        Err(Lost {
            recycle: true,
            ..Lost::new(format!(
                "recycling the connection to give back {n} deliveries of cancelled subscriptions"
            ))
        })
    }

    /// Whether a batch in flight still declares a queue (its brief
    /// subscription may still be receiving).
    fn pending_declarations(&self) -> bool {
        self.inflight.values().any(|fl| {
            fl.batch
                .frames
                .iter()
                .any(|f| f.command == Command::Unsubscribe)
        })
    }
}
