//! The connection task: the only owner of the socket and the timers.
//!
//! It moves bus calls ([`Cmd`]) and the broker's frames into the
//! [`StompSession`], and the session's [`Output`]s out: frames to the
//! socket, answers to callers, deliveries to subscriptions, events to
//! watchers. When a connection is lost it reconnects forever with the
//! bus's [`Backoff`], serving calls meanwhile (they queue in the session;
//! a call whose caller gave up is dropped from the queue).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;

use super::codec::CodecError;
use super::dest;
use super::link::{Conn, Endpoint, codec_error, establish};
use super::parse::Item;
use super::session::{
    self, AckBy, Batch, Caller, HeartBeats, Lost, Message, Output, Request, StompSession, SubSpec,
    Verdict,
};
use crate::api::{AckHandle, BusEvent, Delivery, TooLarge};
use crate::backoff::{Backoff, Delays};
use crate::error::BusError;
use crate::health::BusHealth;

/// How long `close` waits for the broker's DISCONNECT receipt.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// A connection that stayed up this long without a refusal was healthy:
/// the reconnect backoff starts again from its shortest delay after it (as
/// after one the session recycled on purpose). A connection lost sooner (or
/// that saw a refusal) continues the series, so that a failure repeated
/// right after each CONNECTED still backs off.
const STABLE_AFTER: Duration = Duration::from_secs(10);

/// Where a bus call waits for its batch.
pub(crate) type Reply = oneshot::Sender<Result<(), BusError>>;

impl Caller for Reply {
    fn gave_up(&self) -> bool {
        self.is_closed()
    }
}

/// A delivery on its way to a subscription.
pub(crate) struct Incoming {
    pub delivery: Delivery,
    /// For `subscribe`: acknowledge `(generation, ack id)` once handed over.
    pub auto_ack: Option<(u64, String)>,
}

/// What the bus asks of the task.
pub(crate) enum Cmd {
    /// Anything the session handles by itself.
    Request(Request<Reply>),
    /// Opens subscription `key`; its deliveries go to `sink`.
    Subscribe {
        key: u64,
        sub: SubSpec,
        sink: mpsc::UnboundedSender<Incoming>,
        batch: Batch<Reply>,
    },
    /// DISCONNECT, fail what is left; `done` once the socket is closed.
    Close { done: oneshot::Sender<()> },
}

/// Acknowledges one delivery of a `consume` subscription.
pub(crate) struct StompAck {
    pub cmd: mpsc::WeakUnboundedSender<Cmd>,
    pub generation: u64,
    pub sub: u64,
    pub ack_id: String,
    pub op_timeout: Duration,
}

impl StompAck {
    async fn settle(&self, verdict: Verdict) -> Result<(), BusError> {
        let cmd = self.cmd.upgrade().ok_or(BusError::Closed)?;
        let (tx, rx) = oneshot::channel();
        cmd.send(Cmd::Request(Request::Settle {
            generation: self.generation,
            sub: self.sub,
            ack_id: self.ack_id.clone(),
            verdict,
            caller: Some(tx),
        }))
        .map_err(|_| BusError::Closed)?;
        drop(cmd);
        match tokio::time::timeout(self.op_timeout, rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(BusError::Closed),
            Err(_) => Err(BusError::Timeout {
                what: "acknowledging a delivery".into(),
                after: self.op_timeout,
            }),
        }
    }
}

#[async_trait]
impl AckHandle for StompAck {
    async fn ack(&self) -> Result<(), BusError> {
        self.settle(Verdict::Ack).await
    }
    async fn nack(&self, requeue: bool) -> Result<(), BusError> {
        self.settle(Verdict::Nack { requeue }).await
    }
}

/// Why a connection ended.
enum Exit {
    /// Lost; reconnect.
    Lost(Lost),
    /// Closed by the owner.
    Closed,
}

fn now() -> std::time::Instant {
    Instant::now().into_std()
}

/// The connection task.
pub(crate) struct Driver {
    ep: Arc<Endpoint>,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    cmd_weak: mpsc::WeakUnboundedSender<Cmd>,
    events: broadcast::Sender<BusEvent>,
    session: StompSession<Reply>,
    /// Where each live subscription's deliveries go.
    sinks: HashMap<u64, mpsc::UnboundedSender<Incoming>>,
    close_waiter: Option<oneshot::Sender<()>>,
    health: watch::Sender<BusHealth>,
    /// The reconnect delays, kept across connections until one is stable.
    delays: Delays,
}

impl Driver {
    pub fn new(
        ep: Arc<Endpoint>,
        cmd_rx: mpsc::UnboundedReceiver<Cmd>,
        cmd_weak: mpsc::WeakUnboundedSender<Cmd>,
        events: broadcast::Sender<BusEvent>,
        health: watch::Sender<BusHealth>,
    ) -> Self {
        let policy = Backoff::reconnect(&ep.opts);
        Driver {
            session: StompSession::new(ep.name(), ep.flavor, policy),
            delays: policy.delays(),
            ep,
            cmd_rx,
            cmd_weak,
            events,
            sinks: HashMap::new(),
            close_waiter: None,
            health,
        }
    }

    /// Runs until the bus is closed, starting on an established connection.
    pub async fn run(mut self, conn: Conn, hb: HeartBeats) {
        let mut current = Some((conn, hb));
        while let Some((mut conn, hb)) = current.take() {
            let since = Instant::now();
            let refused_before = self.session.health().refused_total;
            match self.connected(&mut conn, hb).await {
                Exit::Closed => {
                    self.shutdown(&mut conn).await;
                    return;
                }
                Exit::Lost(lost) => {
                    let healthy = (lost.recycle || since.elapsed() >= STABLE_AFTER)
                        && self.session.health().refused_total == refused_before;
                    if healthy {
                        self.delays = Backoff::reconnect(&self.ep.opts).delays();
                    }
                    tracing::warn!(endpoint = %self.ep.name(), reason = %lost.reason, "STOMP connection lost; reconnecting");
                    let _ = self.events.send(BusEvent::Disconnected {
                        reason: lost.reason.clone(),
                    });
                    self.session.connection_lost(&lost);
                    self.settle_outputs();
                    self.publish_health();
                    drop(conn);
                    current = self.reconnect().await;
                }
            }
        }
    }

    /// Tells the bus handle what changed in the session's health.
    fn publish_health(&self) {
        let now = self.session.health();
        self.health.send_if_modified(|h| {
            if *h == now {
                return false;
            }
            *h = now;
            true
        });
    }

    /// Moves commands, frames and timer ticks into the session until the
    /// connection ends.
    async fn connected(&mut self, conn: &mut Conn, hb: HeartBeats) -> Exit {
        self.session.connected(hb, now());
        if let Err(exit) = self.flush(conn, Ok(())).await {
            return exit;
        }
        loop {
            let deadline = self.session.next_deadline();
            let wake = deadline.map_or_else(
                || Instant::now() + Duration::from_secs(3600),
                Instant::from_std,
            );
            let step = tokio::select! {
                cmd = self.cmd_rx.recv() => match cmd {
                    None => return Exit::Closed,
                    Some(cmd) => match self.on_cmd(cmd) {
                        Ok(()) => Ok(()),
                        Err(done) => {
                            // Answered once the connection is shut down.
                            self.close_waiter = Some(done);
                            return Exit::Closed;
                        }
                    },
                },
                item = conn.next() => match item {
                    None => Err(Lost::new("closed by the broker")),
                    Some(Err(e)) => Err(Lost::new(codec_error(&self.ep, e).to_string())),
                    Some(Ok(item)) => self.session.received(item, now()),
                },
                () = tokio::time::sleep_until(wake), if deadline.is_some() => {
                    self.session.timer(now())
                },
            };
            if let Err(exit) = self.flush(conn, step).await {
                return exit;
            }
        }
    }

    /// Hands a command to the session; `Err(done)` for `Close`.
    fn on_cmd(&mut self, cmd: Cmd) -> Result<(), oneshot::Sender<()>> {
        match cmd {
            Cmd::Request(r) => self.session.request(r, now()),
            Cmd::Subscribe {
                key,
                sub,
                sink,
                batch,
            } => {
                self.sinks.insert(key, sink);
                self.session
                    .request(Request::Subscribe { key, sub, batch }, now());
            }
            Cmd::Close { done } => return Err(done),
        }
        Ok(())
    }

    /// Carries out the session's outputs in order; the connection is lost
    /// when `step` says so or a write fails.
    async fn flush(&mut self, conn: &mut Conn, step: Result<(), Lost>) -> Result<(), Exit> {
        // Before any caller is answered, so that it sees what its call did.
        self.publish_health();
        let mut failed = None;
        while let Some(out) = self.session.poll_output() {
            match out {
                Output::Write(item) => {
                    if failed.is_none()
                        && let Err(lost) = self.write(conn, item).await
                    {
                        failed = Some(lost);
                    }
                }
                other => self.settle_output(other),
            }
        }
        match (step, failed) {
            (Err(lost), _) | (Ok(()), Some(lost)) => Err(Exit::Lost(lost)),
            (Ok(()), None) => Ok(()),
        }
    }

    /// Carries out the outputs that need no connection (nothing is written
    /// while there is none).
    fn settle_outputs(&mut self) {
        while let Some(out) = self.session.poll_output() {
            self.settle_output(out);
        }
    }

    fn settle_output(&mut self, out: Output<Reply>) {
        match out {
            Output::Write(_) => {}
            Output::Finish(tx, r) => {
                let _ = tx.send(r);
            }
            Output::Deliver(m) => self.hand_out(m),
            Output::Ended(key) => {
                self.sinks.remove(&key);
            }
            Output::Event(e) => {
                let _ = self.events.send(e);
            }
        }
    }

    /// Makes a [`Delivery`] of a MESSAGE and passes it to its subscription.
    fn hand_out(&mut self, m: Message) {
        let f = m.frame;
        let flavor = self.ep.flavor;
        let key = dest::key_of(
            flavor,
            f.get("destination").unwrap_or_default(),
            f.get("original-destination"),
        );
        let reply_to = f.get("reply-to").map(|r| dest::parse_reply_to(flavor, r));
        let correlation_id = f.get("correlation-id").map(str::to_string);
        let redelivered = f.get("redelivered") == Some("true");
        if let Some(size) = m.too_large {
            let d = Delivery::oversized(
                key,
                reply_to,
                correlation_id,
                redelivered,
                TooLarge {
                    size: u64::try_from(size).unwrap_or(u64::MAX),
                    limit: self.ep.limits.max_body,
                    headers: f.headers,
                },
            );
            if let Some(s) = self.sinks.get(&m.sub) {
                let _ = s.send(Incoming {
                    delivery: d,
                    auto_ack: None,
                });
            }
            return;
        }
        let acker: Option<Box<dyn AckHandle>> = match &m.ack {
            AckBy::App(id) => Some(Box::new(StompAck {
                cmd: self.cmd_weak.clone(),
                generation: m.generation,
                sub: m.sub,
                ack_id: id.clone(),
                op_timeout: self.ep.opts.op_timeout,
            })),
            _ => None,
        };
        let delivery = Delivery::new(
            key,
            f.body.clone(),
            reply_to,
            correlation_id,
            redelivered,
            acker,
        );
        let auto_ack = match m.ack {
            AckBy::Forwarder(id) => Some((m.generation, id)),
            _ => None,
        };
        let by_forwarder = auto_ack.is_some();
        let taken = self
            .sinks
            .get(&m.sub)
            .is_some_and(|s| s.send(Incoming { delivery, auto_ack }).is_ok());
        // A manual delivery is already among its subscription's unacked,
        // which its cancellation counts as stranded.
        if !taken && by_forwarder {
            self.session.undelivered();
        }
    }

    /// Reconnects with backoff (the series goes on from the last
    /// connection's unless it was stable), serving calls meanwhile.
    /// `None`: closed.
    async fn reconnect(&mut self) -> Option<(Conn, HeartBeats)> {
        let ep = self.ep.clone();
        loop {
            let attempt = self.delays.taken();
            let delay = self.delays.next_delay();
            let attempt_fut = async {
                tokio::time::sleep(delay).await;
                tokio::time::timeout(ep.opts.connect_timeout, establish(&ep, Some(ep.flavor))).await
            };
            tokio::select! {
                r = attempt_fut => match r {
                    Ok(Ok(o)) => return Some((o.conn, o.hb)),
                    Ok(Err(e)) => tracing::warn!(endpoint = %ep.name(), error = %e, attempt, "STOMP reconnect failed"),
                    Err(_) => tracing::warn!(endpoint = %ep.name(), attempt, "STOMP reconnect timed out"),
                },
                () = self.serve_offline() => return None,
            }
        }
    }

    /// Serves calls while there is no connection; returns when the bus is closed.
    async fn serve_offline(&mut self) {
        while let Some(cmd) = self.cmd_rx.recv().await {
            if let Err(done) = self.on_cmd(cmd) {
                self.session.close();
                self.settle_outputs();
                let _ = done.send(());
                return;
            }
            self.settle_outputs();
        }
        self.session.close();
        self.settle_outputs();
    }

    async fn write(&mut self, conn: &mut Conn, item: Item) -> Result<(), Lost> {
        let timeout = self.ep.opts.op_timeout;
        match tokio::time::timeout(timeout, conn.send(item)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(CodecError::Encode(e))) => {
                // Frames are checked before they reach us; an unencodable one is a bug
                // of ours, not a reason to drop the connection.
                tracing::error!(error = %e, "STOMP frame could not be encoded");
                Ok(())
            }
            Ok(Err(e)) => Err(Lost::new(format!("write failed: {e}"))),
            Err(_) => Err(Lost::new(format!("write blocked for {timeout:?}"))),
        }
    }

    /// DISCONNECT with a receipt, then fail whatever is left.
    async fn shutdown(&mut self, conn: &mut Conn) {
        let f = session::disconnect_frame();
        if self.write(conn, Item::Frame(f)).await.is_ok() {
            let wait = async {
                while let Some(Ok(item)) = conn.next().await {
                    if let Item::Frame(f) = item
                        && f.command == super::frame::Command::Receipt
                        && f.get("receipt-id") == Some(session::DISCONNECT_RECEIPT)
                    {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(CLOSE_WAIT.min(self.ep.opts.op_timeout), wait).await;
        }
        let _ = conn.close().await;
        self.session.close();
        self.settle_outputs();
        if let Some(done) = self.close_waiter.take() {
            let _ = done.send(());
        }
    }
}
