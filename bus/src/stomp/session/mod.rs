//! The STOMP 1.2 session without I/O, in the manner of rumqtt's `state.rs`.
//!
//! - [`connect`] (re-exported here): the CONNECT frame, heart-beat
//!   negotiation, flavor detection, and how the broker's answers are classified.
//! - `StompSession` (crate-private): the state of a session across
//!   connections: subscriptions and their ids, receipts awaited, unacked
//!   deliveries per subscription, the heart-beat clock, refused destinations
//!   and their backoff, and what to send again after a reconnect. Its
//!   methods take requests, frames and `now`, and queue outputs (frames to
//!   write, answers to callers, deliveries, events) for the driver, which
//!   owns the socket and the timers and only moves bytes.
//!
//! ## Layout
//! - this file: the machine's state, connection lifecycle and requests.
//! - `send`: batches, receipts, and batches held back for a refused destination.
//! - `inbound`: RECEIPT, MESSAGE (oversized ones too) and ERROR frames.
//! - `settle`: cancellations, ACK/NACK, ActiveMQ's requeue by subscribing again.
//! - `heart`: the heart-beat clock of one connection.
//! - `io`: requests, batches and outputs (the machine's vocabulary).
//! - `tests`, `tests_flavors`: plain `#[test]`s with a made-up clock.
//!
//! ## Refusals
//! An ERROR that names the receipt of a SUBSCRIBE or SEND is a refusal of
//! that destination (ActiveMQ keeps the connection; RabbitMQ closes it). A
//! caller's refused batch fails with [`BusError::Server`]; a restored
//! subscription's refused SUBSCRIBE is tried again after a backoff, without
//! holding up the restoration. Either way the destination is remembered:
//! further batches naming it wait until its backoff is over, so a caller
//! that retries at once still reaches the broker only once per backoff step,
//! and each refusal is logged once. An attempt that succeeds clears it.

pub mod connect;
mod heart;
mod inbound;
mod io;
mod send;
mod settle;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_flavors;

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Instant;

pub use self::connect::{
    HeartBeats, PEER_SILENCE_FACTOR, check_connected, connect_frame, error_text, heart_beat_header,
    negotiate, parse_heart_beat, resolve_flavor,
};
pub(crate) use self::io::{
    AckBy, Batch, Caller, Done, Lost, Message, Output, Request, SubSpec, Verdict,
};

use self::heart::{Beat, Clock};
use self::io::Sub;
use super::frame::{Command, Frame};
use super::parse::Item;
use crate::backoff::Backoff;
use crate::error::BusError;
use crate::health::{BusHealth, Refusals};
use crate::url::StompFlavor;

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

/// A receipt awaited: frame `frame` of batch `batch`.
#[derive(Debug, Clone, Copy)]
struct Awaited {
    batch: u64,
    frame: usize,
}

/// The session state across connections; `C` is whoever waits for a batch.
pub(crate) struct StompSession<C> {
    /// `host:port`, for errors and logs.
    endpoint: String,
    flavor: StompFlavor,
    subs: HashMap<u64, Sub>,
    /// STOMP subscription id -> subscription key.
    sub_ids: HashMap<String, u64>,
    /// Batches waiting for a connection (or for the restoration to finish).
    queued: VecDeque<Batch<C>>,
    /// Batches naming a refused destination, held until its backoff is over.
    deferred: Vec<(Instant, Batch<C>)>,
    /// Transient queue declarations, repeated after every reconnect.
    redeclare: Vec<Vec<Frame>>,
    /// Connection generation; deliveries of an older one cannot be settled.
    generation: u64,
    reconnects: u64,
    connected_before: bool,
    next_receipt: u64,
    next_batch: u64,
    /// Subscriptions renewed to requeue on ActiveMQ, for fresh ids.
    resubscribes: u64,
    inflight: HashMap<u64, InFlight<C>>,
    receipts: HashMap<String, Awaited>,
    /// UNSUBSCRIBEs sent on this connection whose RECEIPT has not come yet.
    unsubscribing: HashSet<String>,
    /// Deliveries that reached a cancelled subscription on this connection.
    /// RabbitMQ refuses to settle them once the UNSUBSCRIBE is processed
    /// (ERROR "Subscription not found", which would close the session), and
    /// keeps them unacknowledged until the connection ends: so once the
    /// cancellations are confirmed, the connection is recycled to give them
    /// back. Never counted on ActiveMQ, which gives them back on UNSUBSCRIBE.
    stranded: usize,
    refusals: Refusals,
    /// Messages over the size limit, skipped and acknowledged.
    too_large: u64,
    /// The current connection's heart-beats; `None` while disconnected.
    clock: Option<Clock>,
    out: VecDeque<Output<C>>,
}

impl<C: Caller> StompSession<C> {
    /// A session with no connection yet; `endpoint` names the broker in
    /// errors, `flavor` its quirks, `retry` the backoff of refused destinations.
    pub fn new(endpoint: impl Into<String>, flavor: StompFlavor, retry: Backoff) -> Self {
        StompSession {
            endpoint: endpoint.into(),
            flavor,
            subs: HashMap::new(),
            sub_ids: HashMap::new(),
            queued: VecDeque::new(),
            deferred: Vec::new(),
            redeclare: Vec::new(),
            generation: 1,
            reconnects: 0,
            connected_before: false,
            next_receipt: 0,
            next_batch: 0,
            resubscribes: 0,
            inflight: HashMap::new(),
            receipts: HashMap::new(),
            unsubscribing: HashSet::new(),
            stranded: 0,
            refusals: Refusals::new(retry),
            too_large: 0,
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

    /// What the session knows of its health.
    pub fn health(&self) -> BusHealth {
        let mut h = BusHealth {
            connected: self.is_connected() && !self.restoring(),
            too_large_total: self.too_large,
            ..BusHealth::default()
        };
        self.refusals.report(&mut h);
        h
    }

    /// A connection was made (CONNECTED received, `hb` negotiated). After a
    /// loss, every declaration to repeat and every confirmed subscription is
    /// sent again first (one batch); calls wait until it is confirmed, then
    /// [`crate::BusEvent::Connected`] is reported.
    pub fn connected(&mut self, hb: HeartBeats, now: Instant) {
        self.clock = Some(Clock::new(hb, now));
        if self.connected_before {
            let mut frames: Vec<Frame> = self.redeclare.iter().flatten().cloned().collect();
            let mut keys: Vec<u64> = self.subs.keys().copied().collect();
            keys.sort_unstable();
            for k in keys {
                if let Some(s) = self.subs.get(&k).filter(|s| s.active) {
                    frames.extend(s.frames.iter().cloned());
                }
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
            // The restoration sends them again.
            s.refused.clear();
        }
        self.deferred.retain(|(_, b)| !b.is_internal());
        let mut inflight: Vec<(u64, InFlight<C>)> = self.inflight.drain().collect();
        inflight.sort_by_key(|(n, _)| *n);
        let mut requeue = Vec::new();
        for (_, f) in inflight {
            let mut b = f.batch;
            if b.is_internal() {
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
        let deferred = std::mem::take(&mut self.deferred);
        for b in queued
            .into_iter()
            .chain(deferred.into_iter().map(|(_, b)| b))
        {
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

    /// When the driver's timer should next fire ([`StompSession::timer`]):
    /// a heart-beat, the broker's silence, or a held batch.
    pub fn next_deadline(&self) -> Option<Instant> {
        let clock = self.clock.as_ref()?;
        let held = self.deferred.iter().map(|(t, _)| *t).min();
        match (clock.next_deadline(), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The timer fired: send a heart-beat if due, and the held batches whose
    /// backoff is over; `Err` once the broker was silent for
    /// [`PEER_SILENCE_FACTOR`] of its intervals.
    pub fn timer(&mut self, now: Instant) -> Result<(), Lost> {
        let Some(clock) = &self.clock else {
            return Ok(());
        };
        if clock.due(now)? == Beat::Send {
            self.write(Item::HeartBeat, now);
        }
        self.release_deferred(now);
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
}
