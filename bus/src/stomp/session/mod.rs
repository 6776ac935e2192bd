//! The STOMP 1.2 session without I/O, in the manner of rumqtt's `state.rs`.
//!
//! - [`connect`] (re-exported here): the CONNECT frame, heart-beat
//!   negotiation, and how the broker's answers are classified.
//! - `StompSession` (crate-private): the state of a session across
//!   connections: subscriptions and their ids, receipts awaited, unacked
//!   deliveries per subscription, the heart-beat clock, and what to send
//!   again after a reconnect. Its methods take requests, frames and `now`,
//!   and queue outputs (frames to write, answers to callers, deliveries,
//!   events) for the driver, which owns the socket and the timers and only
//!   moves bytes.
//!
//! ## Layout
//! - this file: the machine's state, connection lifecycle and requests.
//! - `inbound`: RECEIPT, MESSAGE and ERROR frames.
//! - `heart`: the heart-beat clock of one connection.
//! - `io`: requests, batches and outputs (the machine's vocabulary).
//! - `tests`: plain `#[test]`s with a made-up clock.

pub mod connect;
mod heart;
mod inbound;
mod io;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

pub use self::connect::{
    HeartBeats, PEER_SILENCE_FACTOR, check_connected, connect_frame, error_text, heart_beat_header,
    negotiate, parse_heart_beat,
};
pub(crate) use self::io::{
    AckBy, Batch, Caller, Done, Lost, Message, Output, Request, SubSpec, Verdict,
};

use self::heart::{Beat, Clock};
use self::io::Sub;
use super::frame::{Command, Frame};
use super::parse::Item;
use crate::api::BusEvent;
use crate::error::BusError;

/// A batch of frames is sent at most this many times (connections lost
/// before its receipts).
pub(crate) const MAX_ATTEMPTS: u32 = 3;

/// The receipt of our DISCONNECT.
pub(crate) const DISCONNECT_RECEIPT: &str = "disconnect";

/// DISCONNECT, with [`DISCONNECT_RECEIPT`]: `close` waits for it.
pub(crate) fn disconnect_frame() -> Frame {
    Frame::new(Command::Disconnect).header("receipt", DISCONNECT_RECEIPT)
}

struct InFlight<C> {
    batch: Batch<C>,
    waiting: usize,
}

/// The session state across connections; `C` is whoever waits for a batch.
pub(crate) struct StompSession<C> {
    /// `host:port`, for errors and logs.
    endpoint: String,
    subs: HashMap<u64, Sub>,
    /// STOMP subscription id -> subscription key.
    sub_ids: HashMap<String, u64>,
    /// Batches waiting for a connection (or for the restoration to finish).
    queued: VecDeque<Batch<C>>,
    /// Transient queue declarations, repeated after every reconnect.
    redeclare: Vec<Vec<Frame>>,
    /// Connection generation; deliveries of an older one cannot be settled.
    generation: u64,
    reconnects: u64,
    connected_before: bool,
    next_receipt: u64,
    next_batch: u64,
    inflight: HashMap<u64, InFlight<C>>,
    /// Receipt id -> batch number.
    receipts: HashMap<String, u64>,
    /// UNSUBSCRIBEs sent on this connection whose RECEIPT has not come yet.
    unsubscribing: HashSet<String>,
    /// Deliveries that reached a cancelled subscription on this connection.
    /// RabbitMQ refuses to settle them once the UNSUBSCRIBE is processed
    /// (ERROR "Subscription not found", which would close the session), and
    /// keeps them unacknowledged until the connection ends: so once the
    /// cancellations are confirmed, the connection is recycled to give them back.
    stranded: usize,
    /// The current connection's heart-beats; `None` while disconnected.
    clock: Option<Clock>,
    out: VecDeque<Output<C>>,
}

impl<C: Caller> StompSession<C> {
    /// A session with no connection yet; `endpoint` names the broker in errors.
    pub fn new(endpoint: impl Into<String>) -> Self {
        StompSession {
            endpoint: endpoint.into(),
            subs: HashMap::new(),
            sub_ids: HashMap::new(),
            queued: VecDeque::new(),
            redeclare: Vec::new(),
            generation: 1,
            reconnects: 0,
            connected_before: false,
            next_receipt: 0,
            next_batch: 0,
            inflight: HashMap::new(),
            receipts: HashMap::new(),
            unsubscribing: HashSet::new(),
            stranded: 0,
            clock: None,
            out: VecDeque::new(),
        }
    }

    /// The next thing for the driver to do, in the order they arose.
    pub fn poll_output(&mut self) -> Option<Output<C>> {
        self.out.pop_front()
    }

    /// A connection is up.
    pub fn is_connected(&self) -> bool {
        self.clock.is_some()
    }

    fn lost_error(&self, reason: impl std::fmt::Display) -> BusError {
        BusError::Connect {
            endpoint: self.endpoint.clone(),
            reason: reason.to_string(),
        }
    }

    /// A connection was made (CONNECTED received, `hb` negotiated). After a
    /// loss, every declaration to repeat and every confirmed subscription is
    /// sent again first (one batch); calls wait until it is confirmed, then
    /// [`BusEvent::Connected`] is reported.
    pub fn connected(&mut self, hb: HeartBeats, now: Instant) {
        self.clock = Some(Clock::new(hb, now));
        if self.connected_before {
            let mut frames: Vec<Frame> = self.redeclare.iter().flatten().cloned().collect();
            for s in self.subs.values().filter(|s| s.active) {
                frames.extend(s.frames.iter().cloned());
            }
            self.send_batch(Batch::restore(frames), now);
        }
        self.connected_before = true;
        if !self.restoring() {
            self.flush_queue(now);
        }
    }

    /// The connection is gone: batches in flight go back to the queue (or
    /// fail), unacked deliveries are forgotten (the broker redelivers them).
    pub fn connection_lost(&mut self, lost: &Lost) {
        self.clock = None;
        self.generation += 1;
        self.receipts.clear();
        self.unsubscribing.clear();
        self.stranded = 0;
        for s in self.subs.values_mut() {
            s.unacked.clear();
        }
        let mut inflight: Vec<(u64, InFlight<C>)> = self.inflight.drain().collect();
        inflight.sort_by_key(|(n, _)| *n);
        let mut requeue = Vec::new();
        for (_, f) in inflight {
            let mut b = f.batch;
            if b.is_restore() {
                continue;
            }
            b.attempts += 1;
            if b.retry && b.attempts < MAX_ATTEMPTS && !b.abandoned() {
                requeue.push(b);
            } else {
                if let Some(key) = b.sub {
                    self.remove_sub(key);
                }
                let e = lost
                    .error
                    .clone()
                    .unwrap_or_else(|| self.lost_error(&lost.reason));
                self.finish(b, Err(e));
            }
        }
        // Re-sent first, in their original order.
        for b in requeue.into_iter().rev() {
            self.queued.push_front(b);
        }
    }

    /// The bus is closed: every call fails, every subscription ends.
    pub fn close(&mut self) {
        self.clock = None;
        let inflight: Vec<InFlight<C>> = self.inflight.drain().map(|(_, f)| f).collect();
        for f in inflight {
            self.finish(f.batch, Err(BusError::Closed));
        }
        let queued: Vec<Batch<C>> = self.queued.drain(..).collect();
        for b in queued {
            self.finish(b, Err(BusError::Closed));
        }
        let mut keys: Vec<u64> = self.subs.keys().copied().collect();
        keys.sort_unstable();
        self.out.extend(keys.into_iter().map(Output::Ended));
        self.subs.clear();
        self.sub_ids.clear();
        self.receipts.clear();
    }

    /// A bus call. While disconnected (or restoring), batches wait in the queue.
    pub fn request(&mut self, req: Request<C>, now: Instant) {
        if !self.is_connected() {
            return self.request_offline(req);
        }
        let restoring = self.restoring();
        match req {
            Request::Batch(b) if restoring => self.queued.push_back(b),
            Request::Batch(b) => self.send_batch(b, now),
            Request::Subscribe { key, sub, batch } => {
                self.add_sub(key, sub);
                if restoring {
                    self.queued.push_back(batch);
                } else {
                    self.send_batch(batch, now);
                }
            }
            Request::Unsubscribe { key } => self.unsubscribe(key, now),
            Request::Settle {
                generation,
                sub,
                ack_id,
                verdict,
                caller,
            } => self.settle(generation, sub, ack_id, verdict, caller, now),
        }
    }

    fn request_offline(&mut self, req: Request<C>) {
        match req {
            Request::Batch(b) => self.queued.push_back(b),
            Request::Subscribe { key, sub, batch } => {
                self.add_sub(key, sub);
                self.queued.push_back(batch);
            }
            Request::Unsubscribe { key } => {
                // The broker already dropped the consumer with the connection.
                self.remove_sub(key);
            }
            Request::Settle { caller, .. } => {
                if let Some(c) = caller {
                    let e = self.lost_error(
                        "the delivery belongs to a lost connection; the broker delivers it again",
                    );
                    self.out.push_back(Output::Finish(c, Err(e)));
                }
            }
        }
    }

    fn unsubscribe(&mut self, key: u64, now: Instant) {
        let Some(sub) = self.remove_sub(key) else {
            return;
        };
        // What the application never settled cannot be given back by NACK
        // here: RabbitMQ would redeliver it at once to the consumer being
        // cancelled and then fail on it with ERROR "Subscription not found".
        // It stays unacknowledged until the connection is recycled (see
        // `stranded`).
        self.stranded += sub.unacked.len();
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

    fn settle(
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

    /// A delivery handed out as [`AckBy::Forwarder`] found its subscription
    /// gone: it stays unacknowledged until the connection is recycled.
    pub fn undelivered(&mut self) {
        self.stranded += 1;
    }

    /// When the driver's timer should next fire ([`StompSession::timer`]).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.clock.as_ref()?.next_deadline()
    }

    /// The timer fired: send a heart-beat if due; `Err` once the broker was
    /// silent for [`PEER_SILENCE_FACTOR`] of its intervals.
    pub fn timer(&mut self, now: Instant) -> Result<(), Lost> {
        let Some(clock) = &self.clock else {
            return Ok(());
        };
        if clock.due(now)? == Beat::Send {
            self.write(Item::HeartBeat, now);
        }
        Ok(())
    }

    fn write(&mut self, item: Item, now: Instant) {
        if let Some(c) = &mut self.clock {
            c.wrote(now);
        }
        self.out.push_back(Output::Write(item));
    }

    fn finish(&mut self, batch: Batch<C>, r: Result<(), BusError>) {
        if let Done::Caller(c) = batch.done {
            self.out.push_back(Output::Finish(c, r));
        }
    }

    fn add_sub(&mut self, key: u64, sub: SubSpec) {
        for f in &sub.frames {
            if let Some(id) = f.get("id") {
                self.sub_ids.insert(id.to_string(), key);
            }
        }
        self.subs.insert(key, sub.into());
    }

    fn remove_sub(&mut self, key: u64) -> Option<Sub> {
        let sub = self.subs.remove(&key)?;
        self.sub_ids.retain(|_, k| *k != key);
        self.out.push_back(Output::Ended(key));
        Some(sub)
    }

    fn restoring(&self) -> bool {
        self.inflight.values().any(|f| f.batch.is_restore())
    }

    fn flush_queue(&mut self, now: Instant) {
        while let Some(b) = self.queued.pop_front() {
            self.send_batch(b, now);
        }
    }

    /// Sends a batch, each frame with its own receipt.
    fn send_batch(&mut self, batch: Batch<C>, now: Instant) {
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
        if batch.redeclare && batch.attempts == 0 {
            self.redeclare.push(batch.frames.clone());
        }
        let n = self.next_batch;
        self.next_batch += 1;
        let mut sent = Vec::with_capacity(batch.frames.len());
        for f in &batch.frames {
            self.next_receipt += 1;
            let r = format!("r{}", self.next_receipt);
            self.receipts.insert(r.clone(), n);
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

    fn complete(&mut self, n: u64) {
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
