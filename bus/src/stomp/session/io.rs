//! What goes into the session machine ([`Request`]s from bus calls, frames
//! from the broker) and what comes out of it ([`Output`]): frames to write,
//! answers to callers, deliveries, events. No channels, no socket.

use std::collections::HashSet;

use super::super::frame::Frame;
use super::super::parse::Item;
use crate::api::BusEvent;
use crate::error::BusError;

/// Whoever waits for a batch's receipts (the driver's: a oneshot sender).
pub(crate) trait Caller {
    /// The caller stopped waiting (its own `op_timeout`): its batch is no
    /// longer sent, nor sent again after a lost connection.
    fn gave_up(&self) -> bool;
}

/// Who waits for a batch.
pub(crate) enum Done<C> {
    /// A bus call.
    Caller(C),
    /// The restoration after a reconnect.
    Restore,
    /// Another try of SUBSCRIBEs the broker refused during a restoration
    /// (or an earlier retry), after a backoff.
    Retry,
}

/// Frames sent together, each with a receipt; done when every receipt arrived.
pub(crate) struct Batch<C> {
    /// The frames, without their `receipt` headers.
    pub frames: Vec<Frame>,
    /// Who is told when every receipt came (or why not).
    pub done: Done<C>,
    /// Re-send on the next connection when this one is lost before the receipts.
    pub retry: bool,
    /// The subscription this batch opens.
    pub sub: Option<u64>,
    /// Repeat these frames after every reconnect (transient queue declarations).
    pub redeclare: bool,
    /// Connections lost while this batch waited for its receipts.
    pub attempts: u32,
}

impl<C: Caller> Batch<C> {
    /// A batch for `caller`, re-sent after a lost connection.
    pub fn new(frames: Vec<Frame>, caller: C) -> Self {
        Batch {
            frames,
            done: Done::Caller(caller),
            retry: true,
            sub: None,
            redeclare: false,
            attempts: 0,
        }
    }

    pub(super) fn restore(frames: Vec<Frame>) -> Self {
        Batch {
            frames,
            done: Done::Restore,
            retry: false,
            sub: None,
            redeclare: false,
            attempts: 0,
        }
    }

    /// Retries the SUBSCRIBE `frames` of subscription `sub`.
    pub(super) fn retry(sub: u64, frames: Vec<Frame>) -> Self {
        Batch {
            sub: Some(sub),
            done: Done::Retry,
            ..Self::restore(frames)
        }
    }

    pub(super) fn abandoned(&self) -> bool {
        match &self.done {
            Done::Caller(c) => c.gave_up(),
            Done::Restore | Done::Retry => false,
        }
    }

    pub(super) fn is_restore(&self) -> bool {
        matches!(self.done, Done::Restore)
    }

    /// Made by the session itself, not waited for by a caller.
    pub(super) fn is_internal(&self) -> bool {
        matches!(self.done, Done::Restore | Done::Retry)
    }
}

/// A subscription to open: its SUBSCRIBE frames (with their `id`s, without
/// receipts) and who acknowledges its deliveries.
pub(crate) struct SubSpec {
    /// Re-sent after every reconnect once confirmed.
    pub frames: Vec<Frame>,
    /// The application acknowledges (`consume`); otherwise the forwarder
    /// does, once the delivery is handed over (`subscribe`).
    pub manual: bool,
}

/// A subscription as the session knows it.
pub(super) struct Sub {
    pub frames: Vec<Frame>,
    pub manual: bool,
    /// Its SUBSCRIBEs were confirmed: restore it after a reconnect.
    pub active: bool,
    /// Ack ids delivered on the current connection and not settled.
    pub unacked: HashSet<String>,
    /// Ids of its SUBSCRIBEs the broker refused on this connection; each is
    /// tried again after a backoff.
    pub refused: HashSet<String>,
}

impl From<SubSpec> for Sub {
    fn from(s: SubSpec) -> Self {
        Sub {
            frames: s.frames,
            manual: s.manual,
            active: false,
            unacked: HashSet::new(),
            refused: HashSet::new(),
        }
    }
}

/// Settling a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// ACK: done with.
    Ack,
    /// NACK, delivered again when `requeue`.
    Nack {
        /// The broker delivers it again.
        requeue: bool,
    },
}

/// What a bus call asks of the session.
pub(crate) enum Request<C> {
    /// Frames to send with receipts (publish, declare).
    Batch(Batch<C>),
    /// Opens subscription `key` with `batch` (its SUBSCRIBEs).
    Subscribe {
        /// The bus's key of the subscription.
        key: u64,
        /// Its frames and acknowledgement mode.
        sub: SubSpec,
        /// The SUBSCRIBEs, waited for by the caller.
        batch: Batch<C>,
    },
    /// Cancels subscription `key` (its `Subscription` was dropped).
    Unsubscribe {
        /// The bus's key of the subscription.
        key: u64,
    },
    /// ACK or NACK of delivery `ack_id` of subscription `sub`, received on
    /// connection `generation`.
    Settle {
        /// The connection the delivery came on.
        generation: u64,
        /// The bus's key of the subscription.
        sub: u64,
        /// The MESSAGE's `ack` header.
        ack_id: String,
        /// ACK or NACK.
        verdict: Verdict,
        /// Waits for the receipt; `None`: fire and forget (`subscribe`).
        caller: Option<C>,
    },
}

/// Who acknowledges a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AckBy {
    /// Nobody: the MESSAGE had no `ack` or `message-id` header.
    Nobody,
    /// The application, through the delivery's handle (`consume`).
    App(String),
    /// The forwarder, once the subscription took it (`subscribe`).
    Forwarder(String),
}

/// A MESSAGE for a live subscription.
#[derive(Debug)]
pub(crate) struct Message {
    /// The bus's key of the subscription.
    pub sub: u64,
    /// The connection it came on (settling it on another one fails).
    pub generation: u64,
    /// The MESSAGE frame.
    pub frame: Frame,
    /// Who acknowledges it, with its ack id.
    pub ack: AckBy,
    /// The body was over the limit and skipped (its size in bytes); the
    /// session already acknowledged the message.
    pub too_large: Option<usize>,
}

/// What the session asks of its driver, in order.
pub(crate) enum Output<C> {
    /// Write a frame or a heart-beat.
    Write(Item),
    /// Answer a caller.
    Finish(C, Result<(), BusError>),
    /// Hand a delivery to its subscription.
    Deliver(Message),
    /// Subscription `key` is gone: end its stream.
    Ended(u64),
    /// Report a connection event.
    Event(BusEvent),
}

/// The connection must be given up (and a new one made).
#[derive(Debug)]
pub(crate) struct Lost {
    /// Why, for the log and [`BusEvent::Disconnected`].
    pub reason: String,
    /// The broker's ERROR, if it sent one: the error of the calls it fails.
    pub error: Option<BusError>,
    /// The session gives the connection up on purpose (to get deliveries
    /// back), not because anything failed: no reason to back off.
    pub recycle: bool,
}

impl Lost {
    /// Lost without an ERROR from the broker.
    pub fn new(reason: impl Into<String>) -> Self {
        Lost {
            reason: reason.into(),
            error: None,
            recycle: false,
        }
    }
}
