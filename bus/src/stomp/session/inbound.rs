//! What the broker sends: RECEIPTs matched to the batches that wait for
//! them, MESSAGEs handed to their subscriptions, ERRORs.

use std::time::Instant;

use super::io::{AckBy, Caller, Lost, Message, Output};
use super::{StompSession, connect};
use crate::error::BusError;
use crate::stomp::frame::{Command, Frame};
use crate::stomp::parse::Item;

impl<C: Caller> StompSession<C> {
    /// Something arrived from the broker at `now` (any byte keeps it alive).
    /// `Err`: the connection must be given up.
    pub fn received(&mut self, item: Item, now: Instant) -> Result<(), Lost> {
        if let Some(c) = &mut self.clock {
            c.read(now);
        }
        match item {
            Item::HeartBeat => Ok(()),
            Item::Frame(f) => match f.command {
                Command::Receipt => self.on_receipt(&f, now),
                Command::Message => {
                    self.on_message(f);
                    Ok(())
                }
                Command::Error => self.on_error(&f),
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
        let Some(n) = f.get("receipt-id").and_then(|r| self.receipts.remove(r)) else {
            return Ok(());
        };
        let done = match self.inflight.get_mut(&n) {
            Some(fl) => {
                fl.waiting = fl.waiting.saturating_sub(1);
                fl.waiting == 0
            }
            None => false,
        };
        if done {
            let was_restore = self
                .inflight
                .get(&n)
                .is_some_and(|fl| fl.batch.is_restore());
            self.complete(n);
            if was_restore {
                self.flush_queue(now);
            }
        }
        // A declaration's brief subscription ends with this batch's
        // UNSUBSCRIBE receipt.
        self.release_stranded()
    }

    fn on_error(&mut self, f: &Frame) -> Result<(), Lost> {
        let text = connect::error_text(f);
        tracing::warn!(endpoint = %self.endpoint, error = %text, "STOMP ERROR from the broker");
        let error = BusError::Server(text.clone());
        // An ERROR that names its receipt concerns one batch only.
        if let Some(n) = f.get("receipt-id").and_then(|r| self.receipts.remove(r))
            && let Some(fl) = self.inflight.remove(&n)
        {
            self.receipts.retain(|_, b| *b != n);
            if let Some(key) = fl.batch.sub {
                self.remove_sub(key);
            }
            self.finish(fl.batch, Err(error));
            return Ok(());
        }
        // Otherwise the broker closes the session: start over.
        Err(Lost {
            reason: format!("ERROR from the broker: {text}"),
            error: Some(error),
        })
    }

    fn on_message(&mut self, f: Frame) {
        let ack_id = f
            .get("ack")
            .or_else(|| f.get("message-id"))
            .map(str::to_string);
        let key = f
            .get("subscription")
            .and_then(|s| self.sub_ids.get(s))
            .copied();
        let Some((key, sub)) = key.and_then(|k| self.subs.get_mut(&k).map(|s| (k, s))) else {
            // A declaration's brief subscription, or one being cancelled: by
            // the time a NACK arrived the broker would have processed the
            // UNSUBSCRIBE and answer it with an ERROR. Leave it; see `stranded`.
            if ack_id.is_some() {
                self.stranded += 1;
                tracing::debug!(
                    subscription = f.get("subscription").unwrap_or_default(),
                    "delivery for a cancelled subscription; it is given back when the connection is recycled"
                );
            }
            return;
        };
        let ack = match ack_id {
            None => AckBy::Nobody,
            Some(id) if sub.manual => {
                sub.unacked.insert(id.clone());
                AckBy::App(id)
            }
            Some(id) => AckBy::Forwarder(id),
        };
        self.out.push_back(Output::Deliver(Message {
            sub: key,
            generation: self.generation,
            frame: f,
            ack,
        }));
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
        Err(Lost::new(format!(
            "recycling the connection to give back {n} deliveries of cancelled subscriptions"
        )))
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
