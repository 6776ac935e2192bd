//! AMQP 0-9-1 transport over lapin.
//!
//! ## What goes where on the broker
//! - One durable topic exchange, `gearshift`, declared on every connection.
//! - [`Bus::publish`] publishes to it with publisher confirms; a message is
//!   `application/json`, persistent (delivery mode 2) unless marked transient,
//!   and carries `reply_to` / `correlation_id` as AMQP properties.
//! - [`Bus::send_to_queue`] publishes to the default exchange with the queue
//!   name as routing key, confirmed too.
//! - [`Bus::subscribe`] declares a server-named, exclusive, auto-deleted queue
//!   bound to the pattern and consumes it with a prefetch of 256; each
//!   delivery is acknowledged once the subscription took it, so that what
//!   lapin holds stays bounded.
//! - Named queues ([`Bus::declare_queue`], [`Bus::consume`]): durable ones are
//!   durable and never auto-deleted; transient ones (reply queues) are
//!   exclusive and auto-deleted. Consumers acknowledge manually, with
//!   `basic.qos` prefetch, each on its own channel.
//!
//! ## Reconnection
//! A supervisor task owns the connection. When it is lost (broker restart,
//! `rabbitmqctl close_all_connections`, missed heart-beats) it reports
//! [`BusEvent::Disconnected`], reconnects forever with [`crate::Backoff`],
//! declares the exchange again, every named queue and binding this bus
//! declared, restarts every live consumer (the existing [`Subscription`]s keep
//! receiving), and only then reports [`BusEvent::Connected`]. Operations issued
//! meanwhile wait for it, each bounded by [`ConnectOptions::op_timeout`].
//! Deliveries received on a lost connection can no longer be acknowledged
//! (`ack` fails cleanly); the broker delivers them again, marked redelivered.
//!
//! ## Refusals and oversized messages
//! A declaration or consumer the broker refuses (a channel error such as
//! `ACCESS_REFUSED`) fails the call with [`BusError::Server`] and is recorded
//! in [`Bus::health`]; the next attempt at the same queue waits for its
//! backoff ([`crate::Backoff`], growing with every refusal in a row). A
//! message over [`MAX_PAYLOAD`] is rejected without requeue after lapin
//! received it (lapin cannot refuse earlier; see `forward`) and handed on as
//! a [`crate::TooLarge`] delivery.
//!
//! ## Layout
//! - `link`: one connection: endpoint, TLS socket, channels, loss detection, errors.
//! - `topology`: what to restore (queues, bindings, consumers), starting consumers.
//! - `forward`: the consumer tasks (oversized messages dropped there) and acks.
//! - `health`: refusals and their backoff, [`Bus::health`].
//! - `supervisor`: the first connection, reconnects, restoring the topology,
//!   repairing consumers.
//!
//! TLS (`amqps://`) uses [`crate::tls`]: a private CA or the system's roots,
//! an optional client certificate, and a server-name override.

mod forward;
mod health;
mod link;
mod supervisor;
mod topology;

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::{BasicProperties, Confirmation};
use tokio::sync::{Mutex, broadcast, mpsc, watch};
use tokio::time::{Instant, timeout, timeout_at};
use tokio_util::sync::CancellationToken;

use self::link::{Endpoint, Link, map_error, not_sent};
use self::supervisor::{first_link, repairer, supervise};
use self::topology::{Guard, Slot, Source, Start, Topology, check_key, check_spec};
use crate::api::{
    Bus, BusEvent, ConsumeOptions, Delivery, Durability, OutMessage, QueueSpec, SharedBus,
    Subscription,
};
use crate::backoff::Backoff;
use crate::error::BusError;
use crate::health::{BusHealth, Refusals};
use crate::reply::ReplyRouter;
use crate::{BusUrl, ConnectOptions};

pub use self::topology::MAX_PAYLOAD;

/// Unacknowledged deliveries of a topic subscription, and its buffer.
const SUBSCRIPTION_PREFETCH: u16 = 256;
/// Longest wait for the broker's close-ok when closing.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

#[derive(Clone)]
enum State {
    /// Reconnecting; why the last connection was lost.
    Down(String),
    Up(Arc<Link>),
    Closed,
}

/// What the bus handle, the supervisor and the consumer tasks share.
pub(crate) struct Shared {
    endpoint: Endpoint,
    pub(crate) opts: ConnectOptions,
    state: watch::Sender<State>,
    topo: Mutex<Topology>,
    events: broadcast::Sender<BusEvent>,
    closed: CancellationToken,
    generations: AtomicU64,
    reconnects: AtomicU64,
    /// Connection generations whose consumers need restarting (see `supervisor::repair`).
    repairs: mpsc::UnboundedSender<u64>,
    /// Queues and patterns the broker refused, with their backoff.
    refusals: StdMutex<Refusals>,
    /// Messages over [`MAX_PAYLOAD`] dropped.
    too_large: AtomicU64,
}

/// An AMQP 0-9-1 bus (see the [module documentation](self)).
pub struct AmqpBus {
    shared: Arc<Shared>,
    reply: ReplyRouter,
}

impl std::fmt::Debug for AmqpBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmqpBus")
            .field("endpoint", &self.shared.endpoint.display)
            .field("name", &self.shared.opts.name)
            .finish_non_exhaustive()
    }
}

impl AmqpBus {
    /// Connects to the broker of `url` (an `amqp://` or `amqps://` URL).
    ///
    /// Fails with [`BusError::Connect`] when no connection could be made within
    /// [`ConnectOptions::connect_timeout`] (retrying meanwhile), at once with
    /// [`BusError::Auth`] when the broker refuses the credentials or virtual
    /// host, and with [`BusError::Tls`] when the TLS settings are unusable.
    pub async fn connect(url: BusUrl, opts: ConnectOptions) -> Result<SharedBus, BusError> {
        Ok(Arc::new(Self::connect_concrete(url, opts).await?))
    }

    /// Like [`AmqpBus::connect`], returning the concrete type.
    pub async fn connect_concrete(url: BusUrl, opts: ConnectOptions) -> Result<AmqpBus, BusError> {
        let endpoint = Endpoint::new(&url, &opts)?;
        let link = first_link(&endpoint, &opts).await?;
        let refusals = StdMutex::new(Refusals::new(Backoff::reconnect(&opts)));
        tracing::info!(endpoint = %endpoint.display, name = %opts.name, "AMQP connected");
        let (events, _) = broadcast::channel(64);
        let (repairs, repair_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            endpoint,
            opts,
            state: watch::channel(State::Up(link.clone())).0,
            topo: Mutex::default(),
            events,
            closed: CancellationToken::new(),
            generations: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            refusals,
            too_large: AtomicU64::new(0),
            repairs,
        });
        tokio::spawn(repairer(Arc::downgrade(&shared), repair_rx));
        tokio::spawn(supervise(shared.clone(), link));
        Ok(AmqpBus {
            shared,
            reply: ReplyRouter::new(),
        })
    }

    async fn publish_to(&self, exchange: &str, key: &str, msg: OutMessage) -> Result<(), BusError> {
        self.shared.check_open()?;
        let props = properties(key, &msg)?;
        let op_timeout = self.shared.opts.op_timeout;
        let deadline = Instant::now() + op_timeout;
        let timed_out = || BusError::Timeout {
            what: format!("publish to {key:?}"),
            after: op_timeout,
        };
        loop {
            let link = self.shared.link(deadline).await?;
            let sent = timeout_at(deadline, async {
                let mut slot = link.publisher.lock().await;
                let ch = match slot.as_ref() {
                    Some(ch) if ch.status().connected() => ch.clone(),
                    _ => {
                        let ch = link.channel().await?;
                        ch.confirm_select(ConfirmSelectOptions::default())
                            .await
                            .map_err(|e| map_error(&e, &link.endpoint))?;
                        *slot = Some(ch.clone());
                        ch
                    }
                };
                // Held until lapin queued the frames: see `Link::publisher`.
                let r = ch
                    .basic_publish(
                        exchange.into(),
                        key.into(),
                        BasicPublishOptions::default(),
                        &msg.payload,
                        props.clone(),
                    )
                    .await;
                drop(slot);
                Ok::<_, BusError>(r)
            })
            .await;
            let confirm = match sent {
                Err(_) => return Err(self.shared.fail(timed_out())),
                Ok(Err(e)) => {
                    if link.check_lost() {
                        continue;
                    }
                    return Err(self.shared.fail(e));
                }
                Ok(Ok(Err(e))) if not_sent(&e) => {
                    // Never left: the channel or connection was already gone.
                    if !link.check_lost() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    continue;
                }
                Ok(Ok(Err(e))) => {
                    link.check_lost();
                    return Err(self.shared.fail(BusError::NotConfirmed {
                        key: key.to_string(),
                        reason: e.to_string(),
                    }));
                }
                Ok(Ok(Ok(c))) => c,
            };
            return match timeout_at(deadline, confirm).await {
                Err(_) => Err(self.shared.fail(timed_out())),
                Ok(Ok(Confirmation::Ack(_))) => Ok(()),
                Ok(Ok(Confirmation::Nack(_))) => Err(BusError::NotConfirmed {
                    key: key.to_string(),
                    reason: "the broker nacked the message".into(),
                }),
                Ok(Ok(Confirmation::NotRequested)) => Err(BusError::Protocol(
                    "publishing channel is not in confirm mode".into(),
                )),
                Ok(Err(e)) => {
                    link.check_lost();
                    Err(self.shared.fail(BusError::NotConfirmed {
                        key: key.to_string(),
                        reason: format!("no confirm before the channel or connection ended: {e}"),
                    }))
                }
            };
        }
    }

    async fn add_consumer(
        &self,
        source: Source,
        spec: Option<&QueueSpec>,
        prefetch: u16,
        manual_ack: bool,
    ) -> Result<Subscription, BusError> {
        self.shared.check_open()?;
        let cap = usize::from(prefetch.max(1));
        let (tx, rx) = mpsc::channel(cap);
        let dropped = CancellationToken::new();
        let op_timeout = self.shared.opts.op_timeout;
        let deadline = Instant::now() + op_timeout;
        let timed_out = || BusError::Timeout {
            what: format!("starting a consumer of {source:?}"),
            after: op_timeout,
        };
        self.shared
            .wait_out_refusal(&source.label(), deadline)
            .await?;
        let id = loop {
            let link = self.shared.link(deadline).await?;
            let mut topo = timeout_at(deadline, self.shared.topo.lock())
                .await
                .map_err(|_| timed_out())?;
            if link.check_lost() {
                continue;
            }
            let before = spec.map(|s| topo.remember(s));
            let start = Start {
                source: &source,
                spec,
                prefetch,
                manual_ack,
                tx: tx.clone(),
                dropped: dropped.clone(),
            };
            let r = timeout_at(deadline, topology::start(&self.shared, &link, start)).await;
            let err = match r {
                Ok(Ok(running)) => {
                    topo.next_id += 1;
                    let id = topo.next_id;
                    topo.slots.insert(
                        id,
                        Slot {
                            source: source.clone(),
                            prefetch,
                            manual_ack,
                            tx: tx.clone(),
                            dropped: dropped.clone(),
                            running: Some(running),
                        },
                    );
                    break id;
                }
                Ok(Err(e)) => e,
                Err(_) => {
                    dropped.cancel();
                    timed_out()
                }
            };
            if let (Some(s), Some(before)) = (spec, before) {
                topo.forget(&s.name, before);
            }
            if !matches!(err, BusError::Timeout { .. }) && link.check_lost() {
                continue;
            }
            self.shared.note_failure(&source.label(), &err);
            return Err(self.shared.fail(err));
        };
        self.shared.note_success(&source.label());
        Ok(Subscription::new(
            rx,
            Guard {
                shared: Arc::downgrade(&self.shared),
                id,
                dropped,
            },
        ))
    }
}

/// Checks a message (size, key, reply address) and makes its AMQP properties.
fn properties(key: &str, msg: &OutMessage) -> Result<BasicProperties, BusError> {
    if msg.payload.len() > MAX_PAYLOAD {
        return Err(BusError::TooLarge {
            size: msg.payload.len(),
            limit: MAX_PAYLOAD,
        });
    }
    check_key("routing key", key, true)?;
    let mut props = BasicProperties::default()
        .with_content_type("application/json".into())
        .with_delivery_mode(if msg.persistent { 2 } else { 1 });
    if let Some(r) = &msg.reply_to {
        check_key("reply_to", r, false)?;
        props = props.with_reply_to(r.as_str().into());
    }
    if let Some(c) = &msg.correlation_id {
        check_key("correlation_id", c, false)?;
        props = props.with_correlation_id(c.as_str().into());
    }
    Ok(props)
}

impl Drop for AmqpBus {
    fn drop(&mut self) {
        // The supervisor closes the connection and ends the subscriptions.
        self.shared.closed.cancel();
    }
}

impl Shared {
    fn check_open(&self) -> Result<(), BusError> {
        if self.closed.is_cancelled() {
            Err(BusError::Closed)
        } else {
            Ok(())
        }
    }

    /// Errors of an operation that raced with `close` are reported as [`BusError::Closed`].
    fn fail(&self, e: BusError) -> BusError {
        if self.closed.is_cancelled() {
            BusError::Closed
        } else {
            e
        }
    }

    /// The live connection, waiting for a reconnect until `deadline`.
    async fn link(&self, deadline: Instant) -> Result<Arc<Link>, BusError> {
        let mut rx = self.state.subscribe();
        loop {
            self.check_open()?;
            let reason = match &*rx.borrow_and_update() {
                State::Up(l) if !l.lost.is_cancelled() => return Ok(l.clone()),
                State::Up(l) => l.reason(),
                State::Down(reason) => reason.clone(),
                State::Closed => return Err(BusError::Closed),
            };
            match timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(BusError::Closed),
                Err(_) => {
                    return Err(BusError::Timeout {
                        what: format!(
                            "waiting for the connection to {} ({reason})",
                            self.endpoint.display
                        ),
                        after: self.opts.op_timeout,
                    });
                }
            }
        }
    }

    /// Asks for the consumers of connection `generation` to be checked and restarted.
    pub(crate) fn request_repair(&self, generation: u64) {
        let _ = self.repairs.send(generation);
    }

    /// Forgets a dropped subscription and cancels its consumer.
    pub(crate) async fn remove_slot(&self, id: u64) {
        let slot = {
            let mut topo = self.topo.lock().await;
            let Some(slot) = topo.slots.remove(&id) else {
                return;
            };
            if let Source::Queue(name) = &slot.source {
                let transient = topo
                    .queues
                    .get(name)
                    .is_some_and(|q| q.durability == Durability::Transient);
                let in_use = topo.slots.values().any(|s| s.source == slot.source);
                if transient && !in_use {
                    // Auto-deleted by the broker with its last consumer; not restored.
                    topo.queues.remove(name);
                }
            }
            slot
        };
        if let Some(r) = slot.running
            && r.channel.status().connected()
        {
            // Closing the channel cancels the consumer and returns its
            // unacknowledged deliveries to the queue.
            let _ = timeout(
                self.opts.op_timeout,
                r.channel.close(200, "subscription dropped".into()),
            )
            .await;
        }
    }

    /// Ends every subscription (after `close`).
    async fn end_subscriptions(&self) {
        let slots = {
            let mut topo = self.topo.lock().await;
            topo.queues.clear();
            std::mem::take(&mut topo.slots)
        };
        for s in slots.values() {
            s.dropped.cancel();
        }
    }
}

#[async_trait]
impl Bus for AmqpBus {
    fn transport(&self) -> &'static str {
        "amqp"
    }

    async fn publish(&self, msg: OutMessage) -> Result<(), BusError> {
        let key = msg.key.clone();
        self.publish_to(link::EXCHANGE, &key, msg).await
    }

    async fn send_to_queue(&self, queue: &str, msg: OutMessage) -> Result<(), BusError> {
        check_key("queue name", queue, false)?;
        self.publish_to("", queue, msg).await
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        check_key("pattern", pattern, false)?;
        self.add_consumer(
            Source::Pattern(pattern.to_string()),
            None,
            SUBSCRIPTION_PREFETCH,
            false,
        )
        .await
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BusError> {
        check_spec(spec)?;
        self.shared.check_open()?;
        let op_timeout = self.shared.opts.op_timeout;
        let deadline = Instant::now() + op_timeout;
        self.shared.wait_out_refusal(&spec.name, deadline).await?;
        let timed_out = || BusError::Timeout {
            what: format!("declaring queue {:?}", spec.name),
            after: op_timeout,
        };
        loop {
            let link = self.shared.link(deadline).await?;
            let mut topo = timeout_at(deadline, self.shared.topo.lock())
                .await
                .map_err(|_| timed_out())?;
            if link.check_lost() {
                continue;
            }
            let before = topo.remember(spec);
            let err = match timeout_at(deadline, topology::declare(&link, spec)).await {
                Ok(Ok(())) => {
                    self.shared.note_success(&spec.name);
                    return Ok(());
                }
                Ok(Err(e)) => e,
                Err(_) => timed_out(),
            };
            topo.forget(&spec.name, before);
            if !matches!(err, BusError::Timeout { .. }) && link.check_lost() {
                continue;
            }
            self.shared.note_failure(&spec.name, &err);
            return Err(self.shared.fail(err));
        }
    }

    async fn consume(
        &self,
        spec: &QueueSpec,
        opts: ConsumeOptions,
    ) -> Result<Subscription, BusError> {
        check_spec(spec)?;
        self.add_consumer(
            Source::Queue(spec.name.clone()),
            Some(spec),
            opts.prefetch,
            true,
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
        self.shared.health()
    }

    async fn close(&self) {
        if self.shared.closed.is_cancelled() {
            return;
        }
        self.shared.closed.cancel();
        let prev = self.shared.state.send_replace(State::Closed);
        if let State::Up(link) = prev {
            link.close(CLOSE_WAIT.min(self.shared.opts.op_timeout))
                .await;
        }
        self.shared.end_subscriptions().await;
        tracing::info!(endpoint = %self.shared.endpoint.display, "AMQP bus closed");
    }
}
