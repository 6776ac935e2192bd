//! The connection task: the only owner of the socket and the timers.
//!
//! Bus calls send [`Cmd`]s; the task turns them into frames, matches
//! RECEIPTs to the calls that wait for them, hands MESSAGEs to
//! subscriptions, keeps heart-beats going both ways, and reconnects forever
//! with [`crate::backoff`], restoring every live subscription (and every
//! transient queue declared on this connection) before it reports
//! `Connected`. Calls made while disconnected wait in a queue; a call whose
//! caller gave up (its own `op_timeout`) is dropped from it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::codec::Framed;

use super::codec::{CodecError, StompCodec};
use super::dest;
use super::frame::{Command, Frame};
use super::parse::{Item, Limits};
use super::session::{self, HeartBeats};
use crate::api::{AckHandle, BusEvent, Delivery};
use crate::error::BusError;
use crate::url::StompFlavor;
use crate::{ConnectOptions, backoff};

/// A batch of frames re-sent at most this many times after a lost connection.
const MAX_ATTEMPTS: u32 = 3;
/// How long `close` waits for the broker's DISCONNECT receipt.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Anything we can speak STOMP over.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A framed connection.
pub(crate) type Conn = Framed<Box<dyn Stream>, StompCodec>;

/// Where and how to connect.
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    pub login: String,
    pub passcode: String,
    /// The CONNECT `host` header (RabbitMQ: the virtual host).
    pub host_header: String,
    pub flavor: StompFlavor,
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    pub opts: ConnectOptions,
    pub limits: Limits,
}

impl Endpoint {
    pub fn name(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    fn lost(&self, reason: impl std::fmt::Display) -> BusError {
        BusError::Connect {
            endpoint: self.name(),
            reason: reason.to_string(),
        }
    }
}

fn codec_error(ep: &Endpoint, e: CodecError) -> BusError {
    match e {
        CodecError::Decode(e) => BusError::Protocol(format!("from {}: {e}", ep.name())),
        CodecError::Encode(e) => BusError::Invalid(e.to_string()),
        CodecError::Io(e) => ep.lost(e),
    }
}

/// Opens TCP (and TLS), sends CONNECT and waits for CONNECTED.
pub(crate) async fn establish(ep: &Endpoint) -> Result<(Conn, HeartBeats), BusError> {
    let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .map_err(|e| ep.lost(e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Stream> = match &ep.tls {
        None => Box::new(tcp),
        Some((config, name)) => {
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| match crate::tls::is_tls_failure(&e) {
                    Some(t) => BusError::Tls(format!("handshake with {}: {t}", ep.name())),
                    None => ep.lost(format!("TLS handshake: {e}")),
                })?;
            Box::new(tls)
        }
    };
    let mut conn = Framed::new(io, StompCodec::new(ep.limits));
    let connect =
        session::connect_frame(&ep.host_header, &ep.login, &ep.passcode, ep.opts.heartbeat);
    conn.send(Item::Frame(connect))
        .await
        .map_err(|e| codec_error(ep, e))?;
    loop {
        match conn.next().await {
            Some(Ok(Item::HeartBeat)) => continue,
            Some(Ok(Item::Frame(f))) => {
                let hb = session::check_connected(&f, &ep.name(), ep.opts.heartbeat)?;
                return Ok((conn, hb));
            }
            Some(Err(e)) => return Err(codec_error(ep, e)),
            None => return Err(ep.lost("connection closed before CONNECTED")),
        }
    }
}

/// Checks that the `gearshift` exchange exists (RabbitMQ): a throw-away
/// subscription on a random key, then its cancellation.
pub(crate) async fn probe_exchange(ep: &Endpoint, conn: &mut Conn) -> Result<(), BusError> {
    let id = format!("probe-{}", uuid::Uuid::new_v4().simple());
    let sub = Frame::new(Command::Subscribe)
        .header("id", id.clone())
        .header(
            "destination",
            format!("/exchange/{}/gearshift.probe.{id}", dest::EXCHANGE),
        )
        .header("receipt", format!("{id}-s"));
    let unsub = Frame::new(Command::Unsubscribe)
        .header("id", id.clone())
        .header("receipt", format!("{id}-u"));
    for f in [sub, unsub] {
        conn.send(Item::Frame(f))
            .await
            .map_err(|e| codec_error(ep, e))?;
    }
    let done = format!("{id}-u");
    loop {
        match conn.next().await {
            Some(Ok(Item::Frame(f))) if f.command == Command::Receipt => {
                if f.get("receipt-id") == Some(done.as_str()) {
                    return Ok(());
                }
            }
            Some(Ok(Item::Frame(f))) if f.command == Command::Error => {
                return Err(BusError::Server(format!(
                    "the topic exchange {:?} is not usable on virtual host {:?} of {} ({}). \
                     RabbitMQ's STOMP adapter does not create exchanges: declare it (topic, \
                     durable), for example with scripts/setup-rabbitmq or by starting an agent \
                     over AMQP",
                    dest::EXCHANGE,
                    ep.host_header,
                    ep.name(),
                    session::error_text(&f)
                )));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(codec_error(ep, e)),
            None => return Err(ep.lost("connection closed while checking the exchange")),
        }
    }
}

/// Who waits for a batch.
pub(crate) enum Done {
    /// A bus call.
    Caller(oneshot::Sender<Result<(), BusError>>),
    /// The restoration after a reconnect.
    Restore,
}

/// Frames sent together, each with a receipt; done when every receipt arrived.
pub(crate) struct Batch {
    pub frames: Vec<Frame>,
    pub done: Done,
    /// Re-send on the next connection when this one is lost before the receipts.
    pub retry: bool,
    /// The subscription this batch opens.
    pub sub: Option<u64>,
    /// Repeat these frames after every reconnect (transient queue declarations).
    pub redeclare: bool,
    pub attempts: u32,
}

impl Batch {
    pub fn new(frames: Vec<Frame>, done: oneshot::Sender<Result<(), BusError>>) -> Self {
        Batch {
            frames,
            done: Done::Caller(done),
            retry: true,
            sub: None,
            redeclare: false,
            attempts: 0,
        }
    }

    fn abandoned(&self) -> bool {
        match &self.done {
            Done::Caller(tx) => tx.is_closed(),
            Done::Restore => false,
        }
    }

    fn finish(self, r: Result<(), BusError>) {
        if let Done::Caller(tx) = self.done {
            let _ = tx.send(r);
        }
    }
}

/// A subscription as the task knows it.
pub(crate) struct Sub {
    /// SUBSCRIBE frames (without receipts), re-sent after a reconnect.
    pub frames: Vec<Frame>,
    /// To the subscription's forwarder.
    pub tx: mpsc::UnboundedSender<Incoming>,
    /// Manual acknowledgement by the application (`consume`), or by the
    /// forwarder once the delivery is handed over (`subscribe`).
    pub manual: bool,
    /// Its SUBSCRIBEs were confirmed; restore it after a reconnect.
    pub active: bool,
    /// Ack ids delivered on the current connection and not settled.
    pub unacked: HashSet<String>,
}

/// A delivery on its way to a subscription.
pub(crate) struct Incoming {
    pub delivery: Delivery,
    /// For `subscribe`: acknowledge `(generation, ack id)` once handed over.
    pub auto_ack: Option<(u64, String)>,
}

/// Settling a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ack,
    Nack { requeue: bool },
}

/// What the bus asks of the task.
pub(crate) enum Cmd {
    Batch(Batch),
    Subscribe {
        key: u64,
        sub: Sub,
        batch: Batch,
    },
    Unsubscribe {
        key: u64,
    },
    Settle {
        generation: u64,
        sub: u64,
        ack_id: String,
        verdict: Verdict,
        done: Option<oneshot::Sender<Result<(), BusError>>>,
    },
    Close {
        done: oneshot::Sender<()>,
    },
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
        cmd.send(Cmd::Settle {
            generation: self.generation,
            sub: self.sub,
            ack_id: self.ack_id.clone(),
            verdict,
            done: Some(tx),
        })
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
    /// Lost; reconnect. `error`: the broker's ERROR, if it sent one.
    Lost {
        reason: String,
        error: Option<BusError>,
    },
    /// Closed by the owner.
    Closed,
}

struct InFlight {
    batch: Batch,
    waiting: usize,
}

/// The connection task.
pub(crate) struct Driver {
    ep: Arc<Endpoint>,
    cmd_rx: mpsc::UnboundedReceiver<Cmd>,
    cmd_weak: mpsc::WeakUnboundedSender<Cmd>,
    events: broadcast::Sender<BusEvent>,
    subs: HashMap<u64, Sub>,
    /// STOMP subscription id -> subscription key.
    sub_ids: HashMap<String, u64>,
    queued: VecDeque<Batch>,
    redeclare: Vec<Vec<Frame>>,
    /// Connection generation; deliveries of an older one cannot be settled.
    generation: u64,
    reconnects: u64,
    next_receipt: u64,
    inflight: HashMap<u64, InFlight>,
    receipts: HashMap<String, u64>,
    next_batch: u64,
    last_write: Instant,
    close_waiter: Option<oneshot::Sender<()>>,
    /// UNSUBSCRIBEs sent on this connection whose RECEIPT has not come yet.
    unsubscribing: HashSet<String>,
    /// Deliveries that reached a cancelled subscription on this connection.
    /// RabbitMQ refuses to settle them once the UNSUBSCRIBE is processed
    /// (ERROR "Subscription not found", which would close the session), and
    /// keeps them unacknowledged until the connection ends: so once the
    /// cancellations are confirmed, the connection is recycled to give them back.
    stranded: usize,
}

impl Driver {
    pub fn new(
        ep: Arc<Endpoint>,
        cmd_rx: mpsc::UnboundedReceiver<Cmd>,
        cmd_weak: mpsc::WeakUnboundedSender<Cmd>,
        events: broadcast::Sender<BusEvent>,
    ) -> Self {
        Driver {
            ep,
            cmd_rx,
            cmd_weak,
            events,
            subs: HashMap::new(),
            sub_ids: HashMap::new(),
            queued: VecDeque::new(),
            redeclare: Vec::new(),
            generation: 1,
            reconnects: 0,
            next_receipt: 0,
            inflight: HashMap::new(),
            receipts: HashMap::new(),
            next_batch: 0,
            last_write: Instant::now(),
            close_waiter: None,
            unsubscribing: HashSet::new(),
            stranded: 0,
        }
    }

    /// Runs until the bus is closed, starting on an established connection.
    pub async fn run(mut self, conn: Conn, hb: HeartBeats) {
        let mut current = Some((conn, hb, false));
        loop {
            let Some((mut conn, hb, restore)) = current.take() else {
                return;
            };
            match self.connected(&mut conn, hb, restore).await {
                Exit::Closed => {
                    self.shutdown(&mut conn).await;
                    return;
                }
                Exit::Lost { reason, error } => {
                    tracing::warn!(endpoint = %self.ep.name(), %reason, "STOMP connection lost; reconnecting");
                    let _ = self.events.send(BusEvent::Disconnected {
                        reason: reason.clone(),
                    });
                    self.connection_lost(&reason, error);
                    drop(conn);
                    current = self.reconnect().await.map(|(c, hb)| (c, hb, true));
                }
            }
        }
    }

    /// Settles the state of a lost connection: in-flight batches go back to
    /// the queue (or fail), unacked deliveries are forgotten (the broker
    /// redelivers them).
    fn connection_lost(&mut self, reason: &str, error: Option<BusError>) {
        self.generation += 1;
        self.receipts.clear();
        self.unsubscribing.clear();
        self.stranded = 0;
        for s in self.subs.values_mut() {
            s.unacked.clear();
        }
        let mut inflight: Vec<(u64, InFlight)> = self.inflight.drain().collect();
        inflight.sort_by_key(|(n, _)| *n);
        let mut requeue = Vec::new();
        for (_, f) in inflight {
            let mut b = f.batch;
            if matches!(b.done, Done::Restore) {
                continue;
            }
            b.attempts += 1;
            if b.retry && b.attempts < MAX_ATTEMPTS && !b.abandoned() {
                requeue.push(b);
            } else {
                if let Some(key) = b.sub {
                    self.remove_sub(key);
                }
                let e = error.clone().unwrap_or_else(|| self.ep.lost(reason));
                b.finish(Err(e));
            }
        }
        // Re-sent first, in their original order.
        for b in requeue.into_iter().rev() {
            self.queued.push_front(b);
        }
    }

    /// Once every cancellation of this connection is confirmed, recycles the
    /// connection if deliveries reached cancelled subscriptions meanwhile, so
    /// that the broker delivers them again (to a live consumer).
    fn release_stranded(&mut self) -> Result<(), Exit> {
        if self.stranded == 0 || !self.unsubscribing.is_empty() || self.pending_declarations() {
            return Ok(());
        }
        let n = self.stranded;
        tracing::info!(
            endpoint = %self.ep.name(),
            deliveries = n,
            "deliveries reached cancelled subscriptions; recycling the connection so that they come back"
        );
        Err(Exit::Lost {
            reason: format!(
                "recycling the connection to give back {n} deliveries of cancelled subscriptions"
            ),
            error: None,
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

    fn remove_sub(&mut self, key: u64) -> Option<Sub> {
        let sub = self.subs.remove(&key)?;
        self.sub_ids.retain(|_, k| *k != key);
        Some(sub)
    }

    /// Reconnects with backoff, serving calls meanwhile. `None`: closed.
    async fn reconnect(&mut self) -> Option<(Conn, HeartBeats)> {
        let ep = self.ep.clone();
        let mut attempt = 0u32;
        loop {
            let delay = backoff(attempt, ep.opts.reconnect_min, ep.opts.reconnect_max);
            let attempt_fut = async {
                tokio::time::sleep(delay).await;
                tokio::time::timeout(ep.opts.connect_timeout, establish(&ep)).await
            };
            tokio::select! {
                r = attempt_fut => match r {
                    Ok(Ok(c)) => return Some(c),
                    Ok(Err(e)) => tracing::warn!(endpoint = %ep.name(), error = %e, attempt, "STOMP reconnect failed"),
                    Err(_) => tracing::warn!(endpoint = %ep.name(), attempt, "STOMP reconnect timed out"),
                },
                () = self.serve_offline() => return None,
            }
            attempt = attempt.saturating_add(1);
        }
    }

    /// Serves calls while there is no connection; returns when the bus is closed.
    async fn serve_offline(&mut self) {
        while let Some(cmd) = self.cmd_rx.recv().await {
            match cmd {
                Cmd::Batch(b) => self.queued.push_back(b),
                Cmd::Subscribe { key, sub, batch } => {
                    self.add_sub(key, sub);
                    self.queued.push_back(batch);
                }
                Cmd::Unsubscribe { key } => {
                    // The broker already dropped the consumer with the connection.
                    self.remove_sub(key);
                }
                Cmd::Settle { done, .. } => {
                    if let Some(tx) = done {
                        let _ = tx.send(Err(self.ep.lost(
                            "the delivery belongs to a lost connection; the broker delivers it again",
                        )));
                    }
                }
                Cmd::Close { done } => {
                    self.fail_everything();
                    let _ = done.send(());
                    return;
                }
            }
        }
        self.fail_everything();
    }

    fn add_sub(&mut self, key: u64, sub: Sub) {
        for f in &sub.frames {
            if let Some(id) = f.get("id") {
                self.sub_ids.insert(id.to_string(), key);
            }
        }
        self.subs.insert(key, sub);
    }

    fn fail_everything(&mut self) {
        for (_, f) in self.inflight.drain() {
            f.batch.finish(Err(BusError::Closed));
        }
        for b in self.queued.drain(..) {
            b.finish(Err(BusError::Closed));
        }
        self.subs.clear();
        self.sub_ids.clear();
        self.receipts.clear();
    }

    async fn write(&mut self, conn: &mut Conn, item: Item) -> Result<(), Exit> {
        let timeout = self.ep.opts.op_timeout;
        match tokio::time::timeout(timeout, conn.send(item)).await {
            Ok(Ok(())) => {
                self.last_write = Instant::now();
                Ok(())
            }
            Ok(Err(CodecError::Encode(e))) => {
                // Frames are checked before they reach us; an unencodable one is a bug
                // of ours, not a reason to drop the connection.
                tracing::error!(error = %e, "STOMP frame could not be encoded");
                Ok(())
            }
            Ok(Err(e)) => Err(Exit::Lost {
                reason: format!("write failed: {e}"),
                error: None,
            }),
            Err(_) => Err(Exit::Lost {
                reason: format!("write blocked for {timeout:?}"),
                error: None,
            }),
        }
    }

    /// Sends a batch, each frame with its own receipt.
    async fn send_batch(&mut self, conn: &mut Conn, mut batch: Batch) -> Result<(), Exit> {
        if batch.abandoned() {
            if let Some(key) = batch.sub {
                self.remove_sub(key);
            }
            return Ok(());
        }
        if let Some(key) = batch.sub
            && !self.subs.contains_key(&key)
        {
            // Its subscription was dropped while the batch waited.
            batch.finish(Err(BusError::Closed));
            return Ok(());
        }
        if batch.redeclare && batch.attempts == 0 {
            self.redeclare.push(batch.frames.clone());
        }
        let n = self.next_batch;
        self.next_batch += 1;
        let frames = std::mem::take(&mut batch.frames);
        let mut sent = Vec::with_capacity(frames.len());
        let mut receipts = Vec::with_capacity(frames.len());
        for f in &frames {
            self.next_receipt += 1;
            let r = format!("r{}", self.next_receipt);
            receipts.push(r.clone());
            sent.push(f.clone().header("receipt", r));
        }
        batch.frames = frames;
        for r in &receipts {
            self.receipts.insert(r.clone(), n);
        }
        let waiting = receipts.len();
        self.inflight.insert(n, InFlight { batch, waiting });
        if waiting == 0 {
            self.complete(n);
            return Ok(());
        }
        for f in sent {
            self.write(conn, Item::Frame(f)).await?;
        }
        Ok(())
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
        if matches!(batch.done, Done::Restore) {
            self.reconnects += 1;
            tracing::info!(endpoint = %self.ep.name(), reconnects = self.reconnects, "STOMP connection restored");
            let _ = self.events.send(BusEvent::Connected {
                reconnects: self.reconnects,
            });
        }
        batch.finish(Ok(()));
    }

    fn restoring(&self) -> bool {
        self.inflight
            .values()
            .any(|f| matches!(f.batch.done, Done::Restore))
    }

    async fn flush_queue(&mut self, conn: &mut Conn) -> Result<(), Exit> {
        while let Some(b) = self.queued.pop_front() {
            self.send_batch(conn, b).await?;
        }
        Ok(())
    }

    async fn connected(&mut self, conn: &mut Conn, hb: HeartBeats, restore: bool) -> Exit {
        match self.connected_inner(conn, hb, restore).await {
            Ok(never) => match never {},
            Err(exit) => exit,
        }
    }

    async fn connected_inner(
        &mut self,
        conn: &mut Conn,
        hb: HeartBeats,
        restore: bool,
    ) -> Result<std::convert::Infallible, Exit> {
        self.last_write = Instant::now();
        let mut last_read = Instant::now();
        if restore {
            let mut frames: Vec<Frame> = self.redeclare.iter().flatten().cloned().collect();
            for s in self.subs.values().filter(|s| s.active) {
                frames.extend(s.frames.iter().cloned());
            }
            let batch = Batch {
                frames,
                done: Done::Restore,
                retry: false,
                sub: None,
                redeclare: false,
                attempts: 0,
            };
            self.send_batch(conn, batch).await?;
        }
        if !self.restoring() {
            self.flush_queue(conn).await?;
        }
        let send_every = hb.send_every;
        let mut tick = tokio::time::interval(send_every.map_or(Duration::from_secs(3600), |d| {
            (d / 2).max(Duration::from_millis(1))
        }));
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let peer_timeout = hb.peer_timeout();
        loop {
            let silence_deadline = last_read + peer_timeout.unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                cmd = self.cmd_rx.recv() => match cmd {
                    None => return Err(Exit::Closed),
                    Some(Cmd::Close { done }) => {
                        // Answered once the connection is shut down.
                        self.close_waiter = Some(done);
                        return Err(Exit::Closed);
                    }
                    Some(cmd) => self.on_cmd(conn, cmd).await?,
                },
                item = conn.next() => {
                    last_read = Instant::now();
                    match item {
                        None => return Err(Exit::Lost { reason: "closed by the broker".into(), error: None }),
                        Some(Err(e)) => return Err(Exit::Lost { reason: codec_error(&self.ep, e).to_string(), error: None }),
                        Some(Ok(Item::HeartBeat)) => {}
                        Some(Ok(Item::Frame(f))) => self.on_frame(conn, f).await?,
                    }
                },
                _ = tick.tick(), if send_every.is_some() => {
                    let every = send_every.unwrap_or_default();
                    if self.last_write.elapsed() >= every / 2 {
                        self.write(conn, Item::HeartBeat).await?;
                    }
                },
                () = tokio::time::sleep_until(silence_deadline), if peer_timeout.is_some() => {
                    return Err(Exit::Lost {
                        reason: format!(
                            "no heart-beat from the broker for {:?} (it promised one every {:?})",
                            peer_timeout.unwrap_or_default(),
                            hb.expect_every.unwrap_or_default()
                        ),
                        error: None,
                    });
                },
            }
        }
    }

    async fn on_cmd(&mut self, conn: &mut Conn, cmd: Cmd) -> Result<(), Exit> {
        let restoring = self.restoring();
        match cmd {
            Cmd::Batch(b) if restoring => self.queued.push_back(b),
            Cmd::Batch(b) => self.send_batch(conn, b).await?,
            Cmd::Subscribe { key, sub, batch } => {
                self.add_sub(key, sub);
                if restoring {
                    self.queued.push_back(batch);
                } else {
                    self.send_batch(conn, batch).await?;
                }
            }
            Cmd::Unsubscribe { key } => {
                if let Some(sub) = self.remove_sub(key) {
                    // What the application never settled cannot be given back
                    // by NACK here: RabbitMQ would redeliver it at once to
                    // the consumer being cancelled and then fail on it with
                    // ERROR "Subscription not found". It stays unacknowledged
                    // until the connection is recycled (see `stranded`).
                    self.stranded += sub.unacked.len();
                    for f in &sub.frames {
                        if let Some(id) = f.get("id") {
                            self.next_receipt += 1;
                            let receipt = format!("unsub-{}", self.next_receipt);
                            self.unsubscribing.insert(receipt.clone());
                            let u = Frame::new(Command::Unsubscribe)
                                .header("id", id)
                                .header("receipt", receipt);
                            self.write(conn, Item::Frame(u)).await?;
                        }
                    }
                }
            }
            Cmd::Settle {
                generation,
                sub,
                ack_id,
                verdict,
                done,
            } => {
                if generation != self.generation {
                    if let Some(tx) = done {
                        let _ = tx.send(Err(self.ep.lost(
                            "the delivery belongs to a lost connection; the broker delivers it again",
                        )));
                    }
                    return Ok(());
                }
                // A delivery whose subscription was cancelled was handed back
                // (NACK requeue) with the UNSUBSCRIBE; settling it now would
                // make RabbitMQ answer ERROR "Subscription not found" and
                // close the connection. Likewise a second settle of one id.
                let pending = match self.subs.get_mut(&sub) {
                    None => false,
                    Some(s) if s.manual => s.unacked.remove(&ack_id),
                    // `subscribe` deliveries are acknowledged by their forwarder.
                    Some(_) => true,
                };
                if !pending {
                    if let Some(tx) = done {
                        let _ = tx.send(Err(self.ep.lost(
                            "the delivery's subscription was cancelled or it was already settled; \
                             the broker delivers it again",
                        )));
                    }
                    return Ok(());
                }
                let f = match verdict {
                    Verdict::Ack => Frame::new(Command::Ack).header("id", ack_id),
                    Verdict::Nack { requeue } => Frame::new(Command::Nack)
                        .header("id", ack_id)
                        .header("requeue", if requeue { "true" } else { "false" }),
                };
                match done {
                    Some(tx) => {
                        let mut b = Batch::new(vec![f], tx);
                        b.retry = false;
                        self.send_batch(conn, b).await?;
                    }
                    None => self.write(conn, Item::Frame(f)).await?,
                }
            }
            Cmd::Close { .. } => unreachable!("handled by the caller"),
        }
        Ok(())
    }

    async fn on_frame(&mut self, conn: &mut Conn, f: Frame) -> Result<(), Exit> {
        match f.command {
            Command::Receipt => {
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
                        .is_some_and(|fl| matches!(fl.batch.done, Done::Restore));
                    self.complete(n);
                    if was_restore {
                        self.flush_queue(conn).await?;
                    }
                }
                // A declaration's brief subscription ends with this batch's
                // UNSUBSCRIBE receipt.
                self.release_stranded()
            }
            Command::Message => self.on_message(f).await,
            Command::Error => {
                let text = session::error_text(&f);
                tracing::warn!(endpoint = %self.ep.name(), error = %text, "STOMP ERROR from the broker");
                let error = BusError::Server(text.clone());
                // An ERROR that names its receipt concerns one batch only.
                if let Some(n) = f.get("receipt-id").and_then(|r| self.receipts.remove(r))
                    && let Some(fl) = self.inflight.remove(&n)
                {
                    self.receipts.retain(|_, b| *b != n);
                    if let Some(key) = fl.batch.sub {
                        self.remove_sub(key);
                    }
                    fl.batch.finish(Err(error));
                    return Ok(());
                }
                // Otherwise the broker closes the session: start over.
                Err(Exit::Lost {
                    reason: format!("ERROR from the broker: {text}"),
                    error: Some(error),
                })
            }
            _ => Ok(()),
        }
    }

    async fn on_message(&mut self, f: Frame) -> Result<(), Exit> {
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
            return Ok(());
        };
        let flavor = self.ep.flavor;
        let destination = f.get("destination").unwrap_or_default();
        let acker: Option<Box<dyn AckHandle>> = match (&ack_id, sub.manual) {
            (Some(id), true) => Some(Box::new(StompAck {
                cmd: self.cmd_weak.clone(),
                generation: self.generation,
                sub: key,
                ack_id: id.clone(),
                op_timeout: self.ep.opts.op_timeout,
            })),
            _ => None,
        };
        let delivery = Delivery::new(
            dest::key_of(flavor, destination),
            f.body.clone(),
            f.get("reply-to").map(dest::parse_reply_to),
            f.get("correlation-id").map(str::to_string),
            f.get("redelivered") == Some("true"),
            acker,
        );
        let auto_ack = match (&ack_id, sub.manual) {
            (Some(id), false) => Some((self.generation, id.clone())),
            _ => None,
        };
        if sub.manual
            && let Some(id) = &ack_id
        {
            sub.unacked.insert(id.clone());
        }
        // When the subscription is going away (its Unsubscribe is on its way),
        // a manual delivery is already among its unacked, which the
        // Unsubscribe counts as stranded; count a `subscribe` one here.
        if sub.tx.send(Incoming { delivery, auto_ack }).is_err() && ack_id.is_some() && !sub.manual
        {
            self.stranded += 1;
        }
        Ok(())
    }

    /// DISCONNECT with a receipt, then fail whatever is left.
    async fn shutdown(&mut self, conn: &mut Conn) {
        let receipt = "disconnect";
        let f = Frame::new(Command::Disconnect).header("receipt", receipt);
        if self.write(conn, Item::Frame(f)).await.is_ok() {
            let wait = async {
                while let Some(Ok(item)) = conn.next().await {
                    if let Item::Frame(f) = item
                        && f.command == Command::Receipt
                        && f.get("receipt-id") == Some(receipt)
                    {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(CLOSE_WAIT.min(self.ep.opts.op_timeout), wait).await;
        }
        let _ = conn.close().await;
        self.fail_everything();
        if let Some(done) = self.close_waiter.take() {
            let _ = done.send(());
        }
    }
}
