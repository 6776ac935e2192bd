//! Cancelling subscriptions and settling deliveries: ACK, NACK, and on
//! ActiveMQ the requeue by subscribing again (its NACK never requeues).

use std::time::Instant;

use super::StompSession;
use super::io::{Batch, Caller, Output, Verdict};
use crate::error::BusError;
use crate::stomp::frame::{Command, Frame};
use crate::stomp::parse::Item;
use crate::url::StompFlavor;

impl<C: Caller> StompSession<C> {
    pub(super) fn unsubscribe(&mut self, key: u64, now: Instant) {
        let Some(sub) = self.remove_sub(key) else {
            return;
        };
        // What the application never settled cannot be given back by NACK
        // here: RabbitMQ would redeliver it at once to the consumer being
        // cancelled and then fail on it with ERROR "Subscription not found".
        // It stays unacknowledged until the connection is recycled (see
        // `stranded`). ActiveMQ gives it back on UNSUBSCRIBE.
        self.strand(sub.unacked.len());
        for f in &sub.frames {
            if let Some(id) = f.get("id") {
                self.next_receipt += 1;
                let receipt = format!("unsub-{}", self.next_receipt);
                self.unsubscribing.insert(receipt.clone());
                let u = Frame::new(Command::Unsubscribe)
                    .header("id", id)
                    .header("receipt", receipt);
                self.write(Item::Frame(u), now);
            }
        }
    }

    /// Counts deliveries that only a new connection gives back (RabbitMQ).
    pub(super) fn strand(&mut self, n: usize) {
        if self.flavor == StompFlavor::RabbitMq {
            self.stranded += n;
        }
    }

    pub(super) fn settle(
        &mut self,
        generation: u64,
        sub: u64,
        ack_id: String,
        verdict: Verdict,
        caller: Option<C>,
        now: Instant,
    ) {
        if generation != self.generation {
            if let Some(c) = caller {
                let e = self.lost_error(
                    "the delivery belongs to a lost connection; the broker delivers it again",
                );
                self.out.push_back(Output::Finish(c, Err(e)));
            }
            return;
        }
        // A delivery whose subscription was cancelled stays with the broker
        // until the connection is recycled; settling it now would make
        // RabbitMQ answer ERROR "Subscription not found" and close the
        // connection. Likewise a second settle of one id.
        let pending = match self.subs.get_mut(&sub) {
            None => false,
            Some(s) if s.manual => s.unacked.remove(&ack_id),
            // `subscribe` deliveries are acknowledged by their forwarder.
            Some(_) => true,
        };
        if !pending {
            if let Some(c) = caller {
                let e = self.lost_error(
                    "the delivery's subscription was cancelled or it was already settled; \
                     the broker delivers it again",
                );
                self.out.push_back(Output::Finish(c, Err(e)));
            }
            return;
        }
        let f = match verdict {
            Verdict::Ack => Frame::new(Command::Ack).header("id", ack_id),
            Verdict::Nack { requeue: true } if self.flavor == StompFlavor::ActiveMq => {
                return self.requeue_by_resubscribing(sub, caller, now);
            }
            Verdict::Nack { requeue } => Frame::new(Command::Nack)
                .header("id", ack_id)
                .header("requeue", if requeue { "true" } else { "false" }),
        };
        match caller {
            Some(c) => {
                let mut b = Batch::new(vec![f], c);
                b.retry = false;
                self.send_batch(b, now);
            }
            None => self.write(Item::Frame(f), now),
        }
    }

    /// ActiveMQ's NACK dead-letters (persistent) or drops, whatever its
    /// `requeue` says; an UNSUBSCRIBE gives every unsettled delivery of the
    /// subscription back at once, marked redelivered. So a requeue cancels
    /// the subscription and subscribes again under new ids: the other
    /// deliveries it still holds come back too, and settling their old
    /// handles fails (as for a cancelled subscription) rather than send an
    /// ACK that ActiveMQ would ignore.
    fn requeue_by_resubscribing(&mut self, key: u64, caller: Option<C>, now: Instant) {
        let Some(sub) = self.subs.get_mut(&key) else {
            return;
        };
        self.resubscribes += 1;
        let n = self.resubscribes;
        let mut frames = Vec::with_capacity(sub.frames.len() * 2);
        let mut renewed = Vec::with_capacity(sub.frames.len());
        for f in &sub.frames {
            let Some(id) = f.get("id") else { continue };
            frames.push(Frame::new(Command::Unsubscribe).header("id", id));
            let base = id.split_once("~r").map_or(id, |(b, _)| b);
            let new_id = format!("{base}~r{n}");
            let mut g = f.clone();
            g.headers.retain(|(k, _)| k != "id");
            g.push_header("id", new_id);
            renewed.push(g);
        }
        sub.unacked.clear();
        sub.refused.clear();
        sub.frames = renewed.clone();
        frames.extend(renewed.iter().cloned());
        self.sub_ids.retain(|_, k| *k != key);
        for f in &renewed {
            if let Some(id) = f.get("id") {
                self.sub_ids.insert(id.to_string(), key);
            }
        }
        match caller {
            Some(c) => {
                let mut b = Batch::new(frames, c);
                b.retry = false;
                b.sub = Some(key);
                self.send_batch(b, now);
            }
            None => {
                for f in frames {
                    self.write(Item::Frame(f), now);
                }
            }
        }
    }

    /// A delivery handed out as [`super::AckBy::Forwarder`] found its
    /// subscription gone: on RabbitMQ it stays unacknowledged until the
    /// connection is recycled.
    pub fn undelivered(&mut self) {
        self.strand(1);
    }

    pub(super) fn lost_error(&self, reason: impl std::fmt::Display) -> BusError {
        BusError::Connect {
            endpoint: self.endpoint.clone(),
            reason: reason.to_string(),
        }
    }
}
