//! STOMP 1.2 transport: our own codec and session on `tokio_util::codec::Framed`.
//!
//! ## Layout
//! - [`frame`]: frames, commands, header escaping (pure).
//! - [`parse`]: the bounded, resumable decoder and the encoder (pure).
//! - [`codec`]: the thin `tokio_util` codec over [`parse`].
//! - [`session`]: the session without I/O: CONNECT and heart-beat negotiation
//!   ([`session::connect`]), and the state machine of subscriptions,
//!   receipts, acks, heart-beat deadlines and what to resend after a
//!   reconnect (`session::StompSession`, with its tests beside it).
//! - [`dest`]: destinations per broker flavor (RabbitMQ, ActiveMQ), documented there.
//! - `link`: one connection's setup (TCP, TLS, CONNECT, the exchange probe).
//! - `driver`: the connection task, the only owner of the socket and the
//!   timers: it moves bytes, commands and ticks through the session.
//!
//! ## Behaviour
//! - CONNECT with `accept-version:1.2`, `host` (RabbitMQ: the virtual host;
//!   ActiveMQ ignores it: the URL's host when `?flavor=activemq` names it,
//!   else the virtual host), `login`/`passcode` and `heart-beat` =
//!   [`ConnectOptions::heartbeat`] both ways. We send an EOL whenever we
//!   wrote nothing for half the negotiated interval, and declare the broker
//!   dead after [`session::PEER_SILENCE_FACTOR`] (3) times its interval
//!   without a byte.
//! - The flavor (destination names, quirks) is the URL's `?flavor=`, or
//!   what the CONNECTED frame's `server` header names; a contradiction is a
//!   [`BusError::Url`] at connect.
//! - Every SEND carries a `receipt`; `publish` returns after the RECEIPT.
//!   Every SUBSCRIBE, and the ACK/NACK of `Delivery::ack`/`nack`, carry one too.
//! - `consume` subscribes with `ack:client-individual` and `prefetch-count`;
//!   `subscribe` does too, and acknowledges each delivery once the
//!   application's subscription took it, so memory stays bounded by the prefetch.
//! - Dropping a subscription UNSUBSCRIBEs; what it never settled comes back
//!   (ActiveMQ: at once; RabbitMQ: once the connection is recycled).
//! - `nack(true)` is a NACK on RabbitMQ; ActiveMQ's NACK never requeues, so
//!   there the subscription is renewed (UNSUBSCRIBE, SUBSCRIBE), which gives
//!   back every delivery it had not settled.
//! - A MESSAGE whose body is over [`Limits::max_body`] is skipped by the
//!   reader as it arrives (never buffered whole), acknowledged, and handed on
//!   as a [`crate::TooLarge`] delivery; the session goes on.
//! - An ERROR frame becomes [`BusError::Auth`] in answer to CONNECT. One that
//!   names a receipt fails that call with [`BusError::Server`] and puts its
//!   destination in a backoff (see [`session`]: "Refusals"), shown in
//!   [`Bus::health`]; others end the connection on RabbitMQ (it closes it
//!   anyway) and are only counted on ActiveMQ (it keeps it).
//! - A lost connection is re-established forever with [`crate::Backoff`]
//!   (the AMQP transport's policy too); the series of delays restarts only
//!   after a connection that stayed up 10 s without a refusal. Every live
//!   subscription is subscribed again (its `Subscription` keeps delivering)
//!   before [`BusEvent::Connected`]. Calls made meanwhile wait, each bounded
//!   by [`ConnectOptions::op_timeout`]; a publish whose receipt was lost with
//!   the connection is sent again (at least once).
//! - `close` sends DISCONNECT with a receipt and waits for it.

pub mod codec;
pub mod dest;
mod driver;
pub mod frame;
mod link;
pub mod parse;
pub mod session;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use self::driver::{Cmd, Driver, Incoming};
use self::frame::{Command, Frame};
use self::link::Endpoint;
use self::parse::Limits;
use self::session::{Batch, Request, SubSpec, Verdict};
use crate::api::{
    Bus, BusEvent, ConsumeOptions, Delivery, Durability, OutMessage, QueueSpec, SharedBus,
    Subscription,
};
use crate::error::BusError;
use crate::health::BusHealth;
use crate::reply::ReplyRouter;
use crate::url::StompFlavor;
use crate::{BusUrl, ConnectOptions};

/// Prefetch of `subscribe` (topic) subscriptions, and their buffer.
const TOPIC_PREFETCH: u16 = 256;

struct Shared {
    cmd: mpsc::UnboundedSender<Cmd>,
    events: broadcast::Sender<BusEvent>,
    health: watch::Receiver<BusHealth>,
    ep: Arc<Endpoint>,
    next_key: AtomicU64,
    /// Transient queues without bindings this bus consumes: on ActiveMQ
    /// temporary queues, named so in `reply-to`.
    temporary: Mutex<HashSet<String>>,
}

/// A STOMP 1.2 bus.
pub struct StompBus {
    shared: Arc<Shared>,
    reply: ReplyRouter,
}

impl std::fmt::Debug for StompBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StompBus")
            .field("endpoint", &self.shared.ep.name())
            .field("flavor", &self.shared.ep.flavor)
            .finish()
    }
}

/// Cancels a subscription when its [`Subscription`] is dropped.
struct SubGuard {
    cmd: mpsc::WeakUnboundedSender<Cmd>,
    key: u64,
}

impl Drop for SubGuard {
    fn drop(&mut self) {
        if let Some(cmd) = self.cmd.upgrade() {
            let _ = cmd.send(Cmd::Request(Request::Unsubscribe { key: self.key }));
        }
    }
}

/// Moves deliveries from the connection task to the application without ever
/// blocking the task; for `subscribe`, acknowledges each one once taken.
async fn forward(
    mut rx: mpsc::UnboundedReceiver<Incoming>,
    out: mpsc::Sender<Delivery>,
    cmd: mpsc::WeakUnboundedSender<Cmd>,
    sub: u64,
) {
    while let Some(inc) = rx.recv().await {
        if out.send(inc.delivery).await.is_err() {
            return;
        }
        if let Some((generation, ack_id)) = inc.auto_ack {
            let Some(cmd) = cmd.upgrade() else { return };
            let _ = cmd.send(Cmd::Request(Request::Settle {
                generation,
                sub,
                ack_id,
                verdict: Verdict::Ack,
                caller: None,
            }));
        }
    }
}

impl StompBus {
    /// Connects to the broker named by `url` (a `stomp://` or `stomp+ssl://` URL).
    ///
    /// TLS files are loaded first; then the first connection is attempted,
    /// retried with backoff on network errors within `opts.connect_timeout`.
    /// Refused credentials, TLS failures and (RabbitMQ) a missing `gearshift`
    /// exchange fail at once.
    pub async fn connect(url: BusUrl, opts: ConnectOptions) -> Result<SharedBus, BusError> {
        Ok(Arc::new(
            Self::connect_with(url, opts, Limits::default()).await?,
        ))
    }

    /// [`StompBus::connect`] with explicit frame limits, as the concrete type.
    pub async fn connect_with(
        url: BusUrl,
        opts: ConnectOptions,
        limits: Limits,
    ) -> Result<StompBus, BusError> {
        let BusUrl::Stomp {
            host,
            port,
            login,
            passcode,
            vhost,
            tls,
            flavor,
            flavor_named,
        } = url
        else {
            return Err(BusError::Invalid(format!("{url} is not a STOMP URL")));
        };
        let tls = if tls {
            Some((
                crate::tls::client_config(&opts.tls)?,
                crate::tls::server_name(&host, &opts.tls)?,
            ))
        } else {
            None
        };
        let named = flavor_named.then_some(flavor);
        let host_header = match named {
            Some(StompFlavor::ActiveMq) => host.clone(),
            _ => vhost,
        };
        let mut ep = Endpoint {
            host,
            port,
            login,
            passcode,
            host_header,
            named,
            flavor,
            tls,
            opts,
            limits,
        };
        let (conn, hb) = link::first_connection(&mut ep).await?;
        let ep = Arc::new(ep);
        let (cmd, cmd_rx) = mpsc::unbounded_channel();
        let (events, _) = broadcast::channel(64);
        let (health_tx, health) = watch::channel(BusHealth::healthy());
        let driver = Driver::new(
            ep.clone(),
            cmd_rx,
            cmd.downgrade(),
            events.clone(),
            health_tx,
        );
        tokio::spawn(driver.run(conn, hb));
        tracing::info!(endpoint = %ep.name(), flavor = ep.flavor.name(), "STOMP connected");
        Ok(StompBus {
            shared: Arc::new(Shared {
                cmd,
                events,
                health,
                ep,
                next_key: AtomicU64::new(1),
                temporary: Mutex::default(),
            }),
            reply: ReplyRouter::new(),
        })
    }

    /// The broker's flavor (named in the URL or detected at connect).
    pub fn flavor(&self) -> StompFlavor {
        self.shared.ep.flavor
    }

    fn is_temporary(&self, queue: &str) -> bool {
        self.shared
            .temporary
            .lock()
            .is_ok_and(|t| t.contains(queue))
    }

    /// Remembers a transient queue without bindings (a temporary queue on
    /// ActiveMQ), so that `reply-to` names it as such.
    fn note_temporary(&self, spec: &QueueSpec) {
        if spec.durability == Durability::Transient
            && spec.bindings.is_empty()
            && let Ok(mut t) = self.shared.temporary.lock()
        {
            t.insert(spec.name.clone());
        }
    }

    fn op_timeout(&self) -> Duration {
        self.shared.ep.opts.op_timeout
    }

    async fn wait(
        &self,
        rx: oneshot::Receiver<Result<(), BusError>>,
        what: impl FnOnce() -> String,
    ) -> Result<(), BusError> {
        match tokio::time::timeout(self.op_timeout(), rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(BusError::Closed),
            Err(_) => Err(BusError::Timeout {
                what: what(),
                after: self.op_timeout(),
            }),
        }
    }

    async fn run_batch(
        &self,
        frames: Vec<Frame>,
        redeclare: bool,
        what: impl FnOnce() -> String,
    ) -> Result<(), BusError> {
        let (tx, rx) = oneshot::channel();
        let mut batch = Batch::new(frames, tx);
        batch.redeclare = redeclare;
        self.shared
            .cmd
            .send(Cmd::Request(Request::Batch(batch)))
            .map_err(|_| BusError::Closed)?;
        self.wait(rx, what).await
    }

    fn check_size(&self, msg: &OutMessage) -> Result<(), BusError> {
        let limit = self.shared.ep.limits.max_body;
        if msg.payload.len() > limit {
            return Err(BusError::TooLarge {
                size: msg.payload.len(),
                limit,
            });
        }
        Ok(())
    }

    fn send_frame(&self, destination: String, msg: OutMessage) -> Frame {
        let mut f = Frame::new(Command::Send).header("destination", destination);
        if msg.persistent {
            f.push_header("persistent", "true");
        }
        if let Some(r) = &msg.reply_to {
            let header = dest::reply_to_header(self.flavor(), r, self.is_temporary(r));
            f.push_header("reply-to", header);
        }
        if let Some(c) = msg.correlation_id {
            f.push_header("correlation-id", c);
        }
        f.body(msg.payload)
    }

    async fn send(&self, destination: String, msg: OutMessage) -> Result<(), BusError> {
        self.check_size(&msg)?;
        if let Some(r) = &msg.reply_to {
            dest::validate_reply_to(self.flavor(), r)?;
        }
        let key = msg.key.clone();
        let frame = self.send_frame(destination, msg);
        self.run_batch(vec![frame], false, || {
            format!("receipt for a publish to {key:?}")
        })
        .await
    }

    /// Opens a subscription made of `frames` (SUBSCRIBEs with their ids).
    async fn open(
        &self,
        key: u64,
        frames: Vec<Frame>,
        manual: bool,
        buffer: usize,
        what: String,
    ) -> Result<Subscription, BusError> {
        let (in_tx, in_rx) = mpsc::unbounded_channel();
        let (out_tx, out_rx) = mpsc::channel(buffer.max(1));
        let weak = self.shared.cmd.downgrade();
        tokio::spawn(forward(in_rx, out_tx, weak.clone(), key));
        // Created first, so that a failed or abandoned call cancels what it started.
        let subscription = Subscription::new(out_rx, SubGuard { cmd: weak, key });
        let (tx, rx) = oneshot::channel();
        let mut batch = Batch::new(frames.clone(), tx);
        batch.sub = Some(key);
        let sub = SubSpec { frames, manual };
        self.shared
            .cmd
            .send(Cmd::Subscribe {
                key,
                sub,
                sink: in_tx,
                batch,
            })
            .map_err(|_| BusError::Closed)?;
        self.wait(rx, || what).await?;
        Ok(subscription)
    }

    fn next_key(&self) -> u64 {
        self.shared.next_key.fetch_add(1, Ordering::Relaxed)
    }
}

fn subscribe_frame(id: String, destination: String, headers: Vec<(String, String)>) -> Frame {
    let mut f = Frame::new(Command::Subscribe)
        .header("id", id)
        .header("destination", destination)
        .header("ack", "client-individual");
    f.headers.extend(headers);
    f
}

#[async_trait]
impl Bus for StompBus {
    fn transport(&self) -> &'static str {
        "stomp"
    }

    async fn publish(&self, msg: OutMessage) -> Result<(), BusError> {
        let destination = dest::publish(self.flavor(), &msg.key)?;
        self.send(destination, msg).await
    }

    async fn send_to_queue(&self, queue: &str, msg: OutMessage) -> Result<(), BusError> {
        let destination = dest::send_to_queue(self.flavor(), queue)?;
        self.send(destination, msg).await
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        let destination = dest::subscribe(self.flavor(), pattern)?;
        let key = self.next_key();
        let frames = vec![subscribe_frame(
            format!("s{key}.0"),
            destination,
            dest::prefetch_headers(self.flavor(), TOPIC_PREFETCH),
        )];
        self.open(
            key,
            frames,
            false,
            TOPIC_PREFETCH as usize,
            format!("subscribing to {pattern:?}"),
        )
        .await
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BusError> {
        let subs = dest::queue_subscribes(self.flavor(), spec)?;
        let mut frames = Vec::with_capacity(subs.len() * 2);
        for qs in subs {
            // A brief subscription declares and binds; it is cancelled at once.
            let id = format!("d{}", self.next_key());
            let mut headers = qs.headers;
            headers.extend(dest::declare_prefetch_headers(self.flavor()));
            frames.push(subscribe_frame(id.clone(), qs.destination, headers));
            frames.push(Frame::new(Command::Unsubscribe).header("id", id));
        }
        let transient = spec.durability == Durability::Transient;
        self.note_temporary(spec);
        self.run_batch(frames, transient, || {
            format!("declaring queue {:?}", spec.name)
        })
        .await
    }

    async fn consume(
        &self,
        spec: &QueueSpec,
        opts: ConsumeOptions,
    ) -> Result<Subscription, BusError> {
        let subs = dest::queue_subscribes(self.flavor(), spec)?;
        self.note_temporary(spec);
        let key = self.next_key();
        let frames = subs
            .into_iter()
            .enumerate()
            .map(|(i, qs)| {
                let mut headers = qs.headers;
                headers.extend(dest::prefetch_headers(self.flavor(), opts.prefetch));
                subscribe_frame(format!("s{key}.{i}"), qs.destination, headers)
            })
            .collect();
        self.open(
            key,
            frames,
            true,
            opts.prefetch.max(1) as usize,
            format!("consuming queue {:?}", spec.name),
        )
        .await
    }

    async fn request(&self, msg: OutMessage, timeout: Duration) -> Result<Delivery, BusError> {
        self.reply.request(self, msg, timeout).await
    }

    async fn request_all(
        &self,
        msg: OutMessage,
        window: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        self.reply.request_all(self, msg, window).await
    }

    fn events(&self) -> broadcast::Receiver<BusEvent> {
        self.shared.events.subscribe()
    }

    fn health(&self) -> BusHealth {
        self.shared.health.borrow().clone()
    }

    async fn close(&self) {
        let (tx, rx) = oneshot::channel();
        if self.shared.cmd.send(Cmd::Close { done: tx }).is_ok() {
            let _ = tokio::time::timeout(self.op_timeout(), rx).await;
        }
    }
}
