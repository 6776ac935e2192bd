//! The one interface every transport implements.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;
use tokio::sync::{broadcast, mpsc};

use crate::error::BusError;
pub use crate::health::{BusHealth, Refusing};

/// A message to publish on the `gearshift` topic exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutMessage {
    /// Logical routing key, for example `report.d1.node-1%2Eexample%2Ecom`.
    pub key: String,
    /// The encoded envelope.
    pub payload: Bytes,
    /// Where replies go (a reply queue name), for requests.
    pub reply_to: Option<String>,
    /// Ties a reply to its request.
    pub correlation_id: Option<String>,
    /// Persist the message on the broker's disk (commands); reports need not be.
    pub persistent: bool,
}

impl OutMessage {
    /// A persistent message with no reply address.
    pub fn new(key: impl Into<String>, payload: impl Into<Bytes>) -> Self {
        OutMessage {
            key: key.into(),
            payload: payload.into(),
            reply_to: None,
            correlation_id: None,
            persistent: true,
        }
    }

    /// Marks the message transient (not written to the broker's disk).
    pub fn transient(mut self) -> Self {
        self.persistent = false;
        self
    }
}

/// Lifetime of a named queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// Survives its consumer's absence and a broker restart (per-node command queues).
    Durable,
    /// Deleted when its connection ends (reply queues, watchers).
    Transient,
}

/// A named queue and the routing patterns bound to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSpec {
    /// Queue name, for example `gearshift.node.node-1%2Eexample%2Ecom`.
    pub name: String,
    /// Topic patterns on the `gearshift` exchange that feed the queue.
    pub bindings: Vec<String>,
    /// Lifetime.
    pub durability: Durability,
    /// At most this many messages wait in the queue (RabbitMQ's
    /// `x-max-length`, ready messages only, as the server counts them); a
    /// message arriving at a full queue pushes out the oldest waiting one
    /// (`x-overflow: drop-head`). `None`: unbounded. Meant for messages a
    /// newer one makes obsolete, such as capacity reports; only a consumer
    /// with acknowledgements and a prefetch (see [`Bus::consume`]) leaves
    /// the backlog in the queue where the bound applies.
    ///
    /// [`Bus::consume`]: crate::Bus::consume
    pub max_length: Option<u32>,
    /// Only one consumer at a time receives the queue's messages: the
    /// broker picks the active one and hands over to another when it goes
    /// away (its connection closed or lost). RabbitMQ's
    /// `x-single-active-consumer` queue argument on AMQP and STOMP,
    /// `activemq.exclusive:true` on ActiveMQ, native on the memory bus.
    /// Leader election uses it: whoever receives the candidates' tokens
    /// is the active consumer. RabbitMQ refuses to change it on an existing
    /// queue, like [`QueueSpec::max_length`].
    pub single_active_consumer: bool,
}

impl QueueSpec {
    /// A durable queue bound to `bindings`.
    pub fn durable(name: impl Into<String>, bindings: Vec<String>) -> Self {
        QueueSpec {
            name: name.into(),
            bindings,
            durability: Durability::Durable,
            max_length: None,
            single_active_consumer: false,
        }
    }

    /// A transient queue bound to `bindings`: this connection's own, deleted
    /// when it ends (declared again on reconnection).
    pub fn transient(name: impl Into<String>, bindings: Vec<String>) -> Self {
        QueueSpec {
            durability: Durability::Transient,
            ..Self::durable(name, bindings)
        }
    }

    /// The same queue, holding at most `max` waiting messages (the oldest go
    /// first); see [`QueueSpec::max_length`].
    pub fn with_max_length(mut self, max: u32) -> Self {
        self.max_length = Some(max);
        self
    }

    /// The same queue, delivering to one consumer at a time; see
    /// [`QueueSpec::single_active_consumer`].
    pub fn with_single_active_consumer(mut self) -> Self {
        self.single_active_consumer = true;
        self
    }

    /// A node's durable command queue, bound to `cmd.<node>`.
    pub fn node_commands(node: &str) -> Self {
        Self::durable(
            gearshift_proto::routing::node_queue(node),
            vec![gearshift_proto::routing::command(node)],
        )
    }
}

/// Options of a subscription or queue consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumeOptions {
    /// Unacknowledged deliveries in flight at once.
    pub prefetch: u16,
}

impl Default for ConsumeOptions {
    fn default() -> Self {
        ConsumeOptions { prefetch: 64 }
    }
}

/// Where a delivery stands among its consumer's, for a transport that can
/// acknowledge a consumer's deliveries up to one in a single frame (AMQP's
/// `basic.ack` with `multiple`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct AckPosition {
    /// The consumer (a new one after every reconnect), unique in the process.
    pub consumer: u64,
    /// The delivery's place in that consumer's order (AMQP's delivery tag).
    pub tag: u64,
}

/// Acknowledges one delivery; implemented by each transport.
#[async_trait]
pub trait AckHandle: Send + Sync {
    /// Positive acknowledgement: the message is done with and leaves the queue.
    async fn ack(&self) -> Result<(), BusError>;
    /// This delivery's position, when the transport can acknowledge every
    /// delivery of its consumer up to it at once ([`AckHandle::ack_up_to`]).
    fn position(&self) -> Option<AckPosition> {
        None
    }
    /// Acknowledges this delivery and every earlier one of its consumer not
    /// yet settled (where [`AckHandle::position`] is `Some`; otherwise this
    /// delivery alone).
    async fn ack_up_to(&self) -> Result<(), BusError> {
        self.ack().await
    }
    /// Negative acknowledgement; with `requeue` the message is delivered again
    /// (on ActiveMQ together with every other delivery of its subscription
    /// not yet settled, whose handles then fail), without it it is dropped
    /// or dead-lettered.
    async fn nack(&self, requeue: bool) -> Result<(), BusError>;
}

/// What is known of a message the transport dropped for its size: it was
/// over the limit, so its body was never handed on (on STOMP, never even
/// buffered). The transport already acknowledged it (a NACK without requeue
/// on AMQP, which dead-letters it where the queue has a dead-letter exchange).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    /// Size of the body in bytes (as announced by `content-length`, or as
    /// counted while it was skipped or received).
    pub size: u64,
    /// The transport's limit, in bytes.
    pub limit: usize,
    /// The message's transport headers (STOMP headers; AMQP properties such
    /// as `message-id`, `user-id`, `app-id`), without the body: the sender
    /// is known from the delivery's key (`event.<node>`, `report.<d>.<node>`)
    /// or `reply_to`, since the envelope's `from` was in the dropped body.
    pub headers: Vec<(String, String)>,
}

/// One received message. Dropping it without `ack` or `nack` leaves it
/// unacknowledged: the broker redelivers it when the consumer goes away.
///
/// A message over the transport's size limit arrives as a delivery with
/// [`Delivery::too_large`] set and an empty payload, so that the consumer can
/// count and answer it (`refused_total{reason="too_large"}`, `event.refused`);
/// the transport already settled it and the subscription goes on.
pub struct Delivery {
    /// The routing key it was published with (for replies: the reply queue).
    pub key: String,
    /// The payload.
    pub payload: Bytes,
    /// The sender's reply address, for requests.
    pub reply_to: Option<String>,
    /// Correlation id (requests and replies).
    pub correlation_id: Option<String>,
    /// The broker delivered it before (a consumer died or nacked).
    pub redelivered: bool,
    /// Set when the message was over the size limit and was dropped: the
    /// payload is empty and `ack`/`nack` do nothing.
    pub too_large: Option<TooLarge>,
    pub(crate) acker: Option<Box<dyn AckHandle>>,
}

impl fmt::Debug for Delivery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("key", &self.key)
            .field("bytes", &self.payload.len())
            .field("reply_to", &self.reply_to)
            .field("correlation_id", &self.correlation_id)
            .field("redelivered", &self.redelivered)
            .field("too_large", &self.too_large)
            .finish()
    }
}

impl Delivery {
    /// A delivery; transports call this.
    pub fn new(
        key: String,
        payload: Bytes,
        reply_to: Option<String>,
        correlation_id: Option<String>,
        redelivered: bool,
        acker: Option<Box<dyn AckHandle>>,
    ) -> Self {
        Delivery {
            key,
            payload,
            reply_to,
            correlation_id,
            redelivered,
            too_large: None,
            acker,
        }
    }

    /// A delivery standing for a message dropped for its size; transports
    /// call this once they have settled the message.
    pub fn oversized(
        key: String,
        reply_to: Option<String>,
        correlation_id: Option<String>,
        redelivered: bool,
        too_large: TooLarge,
    ) -> Self {
        Delivery {
            too_large: Some(too_large),
            ..Self::new(
                key,
                Bytes::new(),
                reply_to,
                correlation_id,
                redelivered,
                None,
            )
        }
    }

    /// Acknowledges the delivery (no-op for auto-acknowledged deliveries).
    pub async fn ack(mut self) -> Result<(), BusError> {
        match self.acker.take() {
            Some(a) => a.ack().await,
            None => Ok(()),
        }
    }

    /// Acknowledges every delivery of `all` in as few frames as the
    /// transport allows: on AMQP one per consumer, a cumulative
    /// acknowledgement up to the latest; elsewhere one per delivery. The
    /// caller acknowledges each consumer's deliveries in order: every earlier
    /// delivery of the same consumer is already acknowledged or in `all`,
    /// and none of `all` is acknowledged twice. Returns the first failure
    /// (the deliveries it concerns come again).
    pub async fn ack_all(all: Vec<Delivery>) -> Result<(), BusError> {
        let mut latest: std::collections::BTreeMap<u64, (u64, Box<dyn AckHandle>)> =
            std::collections::BTreeMap::new();
        let mut each = vec![];
        for mut d in all {
            let Some(a) = d.acker.take() else { continue };
            match a.position() {
                Some(p) if latest.get(&p.consumer).is_none_or(|(t, _)| *t < p.tag) => {
                    latest.insert(p.consumer, (p.tag, a));
                }
                // Covered by a later one of its consumer.
                Some(_) => {}
                None => each.push(a),
            }
        }
        let cumulative = latest
            .into_values()
            .map(|(_, a)| async move { a.ack_up_to().await });
        let single = futures::future::join_all(each.iter().map(|a| a.ack()));
        let (c, s) = futures::join!(futures::future::join_all(cumulative), single);
        c.into_iter()
            .chain(s)
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    }

    /// Rejects the delivery; with `requeue` it is delivered again (see
    /// [`AckHandle::nack`] for ActiveMQ).
    pub async fn nack(mut self, requeue: bool) -> Result<(), BusError> {
        match self.acker.take() {
            Some(a) => a.nack(requeue).await,
            None => Ok(()),
        }
    }
}

/// A stream of deliveries. Dropping it cancels the consumer; unacknowledged
/// deliveries then go back to their queue.
pub struct Subscription {
    rx: mpsc::Receiver<Delivery>,
    _guard: Box<dyn Send + Sync>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}

impl Subscription {
    /// Wraps a receiver; `guard` is dropped (cancelling the consumer) with the subscription.
    pub fn new(rx: mpsc::Receiver<Delivery>, guard: impl Send + Sync + 'static) -> Self {
        Subscription {
            rx,
            _guard: Box::new(guard),
        }
    }

    /// The next delivery; `None` once the bus is closed.
    pub async fn next(&mut self) -> Option<Delivery> {
        self.rx.recv().await
    }

    /// The next delivery within `timeout`.
    pub async fn next_timeout(&mut self, timeout: Duration) -> Result<Option<Delivery>, BusError> {
        tokio::time::timeout(timeout, self.rx.recv())
            .await
            .map_err(|_| BusError::Timeout {
                what: "waiting for a delivery".into(),
                after: timeout,
            })
    }
}

impl Stream for Subscription {
    type Item = Delivery;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Delivery>> {
        self.rx.poll_recv(cx)
    }
}

/// Connection state changes, for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusEvent {
    /// (Re)connected; topology and consumers are restored.
    Connected {
        /// How many times this bus connected before.
        reconnects: u64,
    },
    /// The connection was lost; the transport is reconnecting.
    Disconnected {
        /// Why.
        reason: String,
    },
}

/// One message bus: publish with confirmation, topic subscriptions, durable
/// named queues with manual acknowledgement, and request/reply.
///
/// Implementations reconnect by themselves: while the broker is away, calls
/// wait (bounded by their own timeouts) and subscriptions resume afterwards.
#[async_trait]
pub trait Bus: Send + Sync + 'static {
    /// `memory`, `amqp` or `stomp`.
    fn transport(&self) -> &'static str;

    /// Publishes on the `gearshift` topic exchange and returns once the broker
    /// confirmed it (AMQP publisher confirm, STOMP receipt).
    async fn publish(&self, msg: OutMessage) -> Result<(), BusError>;

    /// Sends a message straight to a named queue (for replies to `reply_to`), confirmed.
    async fn send_to_queue(&self, queue: &str, msg: OutMessage) -> Result<(), BusError>;

    /// A transient subscription (its own exclusive, auto-deleted queue) to a topic pattern.
    /// Deliveries need no acknowledgement.
    async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError>;

    /// Declares a named queue and its bindings (idempotent): from then on it
    /// keeps matching messages, also while nobody consumes it.
    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BusError>;

    /// Declares `spec` and consumes it with manual acknowledgement.
    async fn consume(
        &self,
        spec: &QueueSpec,
        opts: ConsumeOptions,
    ) -> Result<Subscription, BusError>;

    /// Publishes a request under `key` and waits for the first reply.
    async fn request(&self, msg: OutMessage, timeout: Duration) -> Result<Delivery, BusError>;

    /// Publishes a request under `key` and gathers every reply that arrives within `window`.
    async fn request_all(
        &self,
        msg: OutMessage,
        window: Duration,
    ) -> Result<Vec<Delivery>, BusError>;

    /// Connection state changes.
    fn events(&self) -> broadcast::Receiver<BusEvent>;

    /// What the bus says about itself now: connected or not, what the broker
    /// refuses, oversized messages dropped. Cheap: for metrics and health
    /// checks. Buses that track nothing (the memory transport, wrappers)
    /// report [`BusHealth::healthy`].
    fn health(&self) -> BusHealth {
        BusHealth::healthy()
    }

    /// Closes the connection; pending operations fail with [`BusError::Closed`].
    async fn close(&self);
}

/// A shared handle to some bus.
pub type SharedBus = Arc<dyn Bus>;
