//! Sending batches: receipts, completion, and batches held back while a
//! destination they name is in its refusal backoff.

use std::time::Instant;

use super::io::{Batch, Caller, Output};
use super::{Awaited, InFlight, StompSession};
use crate::api::BusEvent;
use crate::error::BusError;
use crate::stomp::frame::{Command, Frame};
use crate::stomp::parse::Item;

/// The destination a frame operates on, if it is one the broker may refuse.
pub(super) fn destination(f: &Frame) -> Option<&str> {
    match f.command {
        Command::Send | Command::Subscribe => f.get("destination"),
        _ => None,
    }
}

impl<C: Caller> StompSession<C> {
    /// Sends a batch, each frame with its own receipt; a batch naming a
    /// destination in its refusal backoff waits for the end of it first.
    pub(super) fn send_batch(&mut self, batch: Batch<C>, now: Instant) {
        if batch.abandoned() {
            if let Some(key) = batch.sub {
                self.remove_sub(key);
            }
            return;
        }
        if let Some(key) = batch.sub
            && !self.subs.contains_key(&key)
        {
            // Its subscription was dropped while the batch waited.
            self.finish(batch, Err(BusError::Closed));
            return;
        }
        if !batch.is_restore()
            && let Some(until) = self.held_until(&batch, now)
        {
            self.deferred.push((until, batch));
            return;
        }
        if batch.redeclare && batch.attempts == 0 {
            self.redeclare.push(batch.frames.clone());
        }
        let n = self.next_batch;
        self.next_batch += 1;
        let mut sent = Vec::with_capacity(batch.frames.len());
        for (i, f) in batch.frames.iter().enumerate() {
            self.next_receipt += 1;
            let r = format!("r{}", self.next_receipt);
            self.receipts
                .insert(r.clone(), Awaited { batch: n, frame: i });
            sent.push(f.clone().header("receipt", r));
        }
        let waiting = sent.len();
        self.inflight.insert(n, InFlight { batch, waiting });
        if waiting == 0 {
            self.complete(n);
            return;
        }
        for f in sent {
            self.write(Item::Frame(f), now);
        }
    }

    fn held_until(&self, batch: &Batch<C>, now: Instant) -> Option<Instant> {
        batch
            .frames
            .iter()
            .filter_map(|f| self.refusals.hold(super::send::destination(f)?, now))
            .max()
    }

    /// Sends the held batches whose backoff is over (while connected and
    /// not restoring; otherwise they wait in the queue).
    pub(super) fn release_deferred(&mut self, now: Instant) {
        self.refusals.forget_stale(now);
        if self.deferred.iter().all(|(t, _)| *t > now) {
            return;
        }
        let (due, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.deferred)
            .into_iter()
            .partition(|(t, _)| *t <= now);
        self.deferred = held;
        let restoring = self.restoring();
        for (_, b) in due {
            if restoring && !b.is_internal() {
                self.queued.push_back(b);
            } else {
                self.send_batch(b, now);
            }
        }
    }

    /// One receipt of batch `n` came (or its frame was refused without
    /// failing the batch); completes the batch with its last one.
    pub(super) fn answered(&mut self, n: u64, now: Instant) {
        let done = match self.inflight.get_mut(&n) {
            Some(fl) => {
                fl.waiting = fl.waiting.saturating_sub(1);
                fl.waiting == 0
            }
            None => false,
        };
        if !done {
            return;
        }
        let was_restore = self
            .inflight
            .get(&n)
            .is_some_and(|fl| fl.batch.is_restore());
        self.complete(n);
        if was_restore {
            self.flush_queue(now);
        }
    }

    pub(super) fn complete(&mut self, n: u64) {
        let Some(f) = self.inflight.remove(&n) else {
            return;
        };
        let batch = f.batch;
        if let Some(key) = batch.sub
            && let Some(s) = self.subs.get_mut(&key)
        {
            s.active = true;
        }
        if batch.is_restore() {
            self.reconnects += 1;
            tracing::info!(endpoint = %self.endpoint, reconnects = self.reconnects, "STOMP connection restored");
            self.out.push_back(Output::Event(BusEvent::Connected {
                reconnects: self.reconnects,
            }));
        }
        self.finish(batch, Ok(()));
    }
}
