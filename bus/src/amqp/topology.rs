//! What this bus declared and consumes, kept so that it can be restored on
//! every new connection: named queues with their bindings, and consumers
//! (named queues or topic subscriptions) with the channel their deliveries go to.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use lapin::Channel;
use lapin::options::{BasicConsumeOptions, BasicQosOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::forward::Forwarder;
use super::link::{EXCHANGE, Link, map_error};
use crate::api::{Delivery, Durability, QueueSpec};
use crate::error::BusError;

/// Largest payload accepted, sent or received (RabbitMQ takes more; our messages never need it).
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;
/// AMQP short strings (queue names, routing keys) are at most 255 bytes.
pub(crate) const MAX_NAME: usize = 255;
/// Attempts to re-declare an exclusive queue that the broker still holds for
/// the previous, dead connection (RESOURCE_LOCKED).
const LOCKED_RETRIES: u32 = 20;
const LOCKED_DELAY: Duration = Duration::from_millis(100);

/// Where a consumer's messages come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// A named queue of [`Topology::queues`].
    Queue(String),
    /// A server-named, exclusive, auto-deleted queue bound to a topic pattern.
    Pattern(String),
}

impl Source {
    /// What refusals of it are recorded under ([`crate::BusHealth::refusing`]).
    pub(crate) fn label(&self) -> String {
        match self {
            Source::Queue(name) => name.clone(),
            Source::Pattern(p) => format!("{EXCHANGE}/{p}"),
        }
    }
}

/// The consumer of one [`crate::Subscription`], across connections.
pub(crate) struct Slot {
    pub(crate) source: Source,
    pub(crate) prefetch: u16,
    pub(crate) manual_ack: bool,
    pub(crate) tx: mpsc::Sender<Delivery>,
    /// Cancelled when the subscription is dropped (or the bus closed).
    pub(crate) dropped: CancellationToken,
    /// The consumer on the current connection, if it runs.
    pub(crate) running: Option<Running>,
}

pub(crate) struct Running {
    pub(crate) generation: u64,
    pub(crate) channel: Channel,
    /// Cancelled when the consumer's task ended (connection lost, or the
    /// broker cancelled the consumer).
    pub(crate) ended: CancellationToken,
}

impl Running {
    /// Whether the consumer still runs on connection `generation`.
    pub(crate) fn runs_on(&self, generation: u64) -> bool {
        self.generation == generation
            && !self.ended.is_cancelled()
            && self.channel.status().connected()
    }
}

/// Everything to restore after a reconnect.
#[derive(Default)]
pub(crate) struct Topology {
    /// Named queues, with every binding ever declared for them.
    pub(crate) queues: BTreeMap<String, QueueSpec>,
    pub(crate) slots: HashMap<u64, Slot>,
    pub(crate) next_id: u64,
}

impl Topology {
    /// Records `spec` (merging bindings); returns the previous entry to undo with.
    pub(crate) fn remember(&mut self, spec: &QueueSpec) -> Option<QueueSpec> {
        let before = self.queues.get(&spec.name).cloned();
        let entry = self
            .queues
            .entry(spec.name.clone())
            .or_insert_with(|| QueueSpec {
                name: spec.name.clone(),
                bindings: vec![],
                durability: spec.durability,
                max_length: spec.max_length,
                single_active_consumer: spec.single_active_consumer,
            });
        entry.durability = spec.durability;
        entry.max_length = spec.max_length;
        entry.single_active_consumer = spec.single_active_consumer;
        for b in &spec.bindings {
            if !entry.bindings.contains(b) {
                entry.bindings.push(b.clone());
            }
        }
        before
    }

    /// Undoes [`Topology::remember`].
    pub(crate) fn forget(&mut self, name: &str, before: Option<QueueSpec>) {
        match before {
            Some(spec) => {
                self.queues.insert(name.to_string(), spec);
            }
            None => {
                self.queues.remove(name);
            }
        }
    }
}

/// Checks a queue name before it goes to the broker.
pub(crate) fn check_queue_name(name: &str) -> Result<(), BusError> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(BusError::Invalid(format!(
            "queue name must be 1..={MAX_NAME} bytes, got {}",
            name.len()
        )));
    }
    if name.starts_with("amq.") {
        return Err(BusError::Invalid(format!(
            "queue name {name:?}: the amq. prefix is reserved for the broker"
        )));
    }
    Ok(())
}

/// Checks a routing key or binding pattern.
pub(crate) fn check_key(what: &str, key: &str, allow_empty: bool) -> Result<(), BusError> {
    if key.len() > MAX_NAME || (!allow_empty && key.is_empty()) {
        return Err(BusError::Invalid(format!(
            "{what} must be {}..={MAX_NAME} bytes, got {}",
            u8::from(!allow_empty),
            key.len()
        )));
    }
    Ok(())
}

/// Checks a whole queue spec.
pub(crate) fn check_spec(spec: &QueueSpec) -> Result<(), BusError> {
    check_queue_name(&spec.name)?;
    for b in &spec.bindings {
        check_key("binding pattern", b, false)?;
    }
    Ok(())
}

fn declare_options(durability: Durability) -> QueueDeclareOptions {
    match durability {
        Durability::Durable => QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        Durability::Transient => QueueDeclareOptions {
            exclusive: true,
            auto_delete: true,
            ..QueueDeclareOptions::default()
        },
    }
}

/// A failed declaration or consumer start; `locked` when the broker answered
/// RESOURCE_LOCKED: an exclusive queue still held by our previous connection,
/// which the broker is about to close.
pub(crate) struct Failure {
    pub(crate) err: BusError,
    locked: bool,
}

impl From<BusError> for Failure {
    fn from(err: BusError) -> Self {
        Failure { err, locked: false }
    }
}

fn failure(e: lapin::Error, endpoint: &str, context: &str) -> Failure {
    let locked = matches!(e.kind(), lapin::ErrorKind::ProtocolError(a)
        if a.kind() == &AMQPErrorKind::Soft(AMQPSoftError::RESOURCELOCKED));
    let err = match map_error(&e, endpoint) {
        BusError::Server(s) => BusError::Server(format!("{context}: {s}")),
        other => other,
    };
    Failure { err, locked }
}

/// The optional arguments of a queue declaration: its length bound and
/// single active consumer.
fn queue_arguments(spec: &QueueSpec) -> FieldTable {
    let mut args = FieldTable::default();
    if let Some(max) = spec.max_length {
        args.insert(
            "x-max-length".into(),
            AMQPValue::LongLongInt(i64::from(max)),
        );
        args.insert(
            "x-overflow".into(),
            AMQPValue::LongString("drop-head".into()),
        );
    }
    if spec.single_active_consumer {
        args.insert("x-single-active-consumer".into(), AMQPValue::Boolean(true));
    }
    args
}

/// Declares a queue and its bindings on `ch`.
async fn declare_on(ch: &Channel, spec: &QueueSpec, endpoint: &str) -> Result<(), Failure> {
    let context = format!("queue {:?}", spec.name);
    ch.queue_declare(
        spec.name.as_str().into(),
        declare_options(spec.durability),
        queue_arguments(spec),
    )
    .await
    .map_err(|e| failure(e, endpoint, &context))?;
    for b in &spec.bindings {
        ch.queue_bind(
            spec.name.as_str().into(),
            EXCHANGE.into(),
            b.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| failure(e, endpoint, &format!("{context} binding {b:?}")))?;
    }
    Ok(())
}

/// Declares `spec` on the link's control channel, retrying while an
/// exclusive queue is still locked by a connection the broker is closing.
pub(crate) async fn declare(link: &Link, spec: &QueueSpec) -> Result<(), BusError> {
    let mut attempt = 0;
    loop {
        let ch = link.control().await?;
        match declare_on(&ch, spec, &link.endpoint).await {
            Err(f) if f.locked && attempt < LOCKED_RETRIES && !link.check_lost() => {
                attempt += 1;
                tokio::time::sleep(LOCKED_DELAY).await;
            }
            Err(f) => {
                link.check_lost();
                return Err(f.err);
            }
            Ok(()) => return Ok(()),
        }
    }
}

/// What a consumer needs to start on a link.
pub(crate) struct Start<'a> {
    pub(crate) source: &'a Source,
    pub(crate) spec: Option<&'a QueueSpec>,
    pub(crate) prefetch: u16,
    pub(crate) manual_ack: bool,
    pub(crate) tx: mpsc::Sender<Delivery>,
    pub(crate) dropped: CancellationToken,
}

/// Starts a consumer on its own channel of `link` and the task that forwards
/// its deliveries to `tx`.
pub(crate) async fn start(
    shared: &Arc<Shared>,
    link: &Arc<Link>,
    s: Start<'_>,
) -> Result<Running, BusError> {
    let mut attempt = 0;
    loop {
        match start_once(shared, link, &s).await {
            Err(f) if f.locked && attempt < LOCKED_RETRIES && !link.check_lost() => {
                attempt += 1;
                tokio::time::sleep(LOCKED_DELAY).await;
            }
            Err(f) => {
                link.check_lost();
                return Err(f.err);
            }
            Ok(r) => return Ok(r),
        }
    }
}

async fn start_once(
    shared: &Arc<Shared>,
    link: &Arc<Link>,
    s: &Start<'_>,
) -> Result<Running, Failure> {
    let ch = link.channel().await?;
    let endpoint = link.endpoint.as_str();
    let result = async {
        let queue = match s.source {
            Source::Queue(name) => {
                if let Some(spec) = s.spec {
                    declare_on(&ch, spec, endpoint).await?;
                }
                name.clone()
            }
            Source::Pattern(pattern) => {
                let context = format!("subscription to {pattern:?}");
                let q = ch
                    .queue_declare(
                        "".into(),
                        declare_options(Durability::Transient),
                        FieldTable::default(),
                    )
                    .await
                    .map_err(|e| failure(e, endpoint, &context))?;
                let name = q.name().to_string();
                ch.queue_bind(
                    name.as_str().into(),
                    EXCHANGE.into(),
                    pattern.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| failure(e, endpoint, &context))?;
                name
            }
        };
        let context = format!("consuming {queue:?}");
        // Always with acknowledgements and a prefetch, `subscribe` too (its
        // forwarder acknowledges): what lapin can hold is bounded by the
        // prefetch, oversized messages included.
        ch.basic_qos(s.prefetch.max(1), BasicQosOptions { global: false })
            .await
            .map_err(|e| failure(e, endpoint, &context))?;
        let consumer = ch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(|e| failure(e, endpoint, &context))?;
        Ok::<_, Failure>(consumer)
    }
    .await;
    let consumer = match result {
        Ok(c) => c,
        Err(e) => {
            if ch.status().connected() {
                let _ = ch.close(200, "consumer setup failed".into()).await;
            }
            return Err(e);
        }
    };
    let ended = CancellationToken::new();
    let forwarder = Forwarder {
        shared: Arc::downgrade(shared),
        link: link.clone(),
        tx: s.tx.clone(),
        dropped: s.dropped.clone(),
        ended: ended.clone(),
        manual_ack: s.manual_ack,
        op_timeout: shared.opts.op_timeout,
    };
    tokio::spawn(forwarder.run(consumer));
    Ok(Running {
        generation: link.generation,
        channel: ch,
        ended,
    })
}

/// Cancels a consumer when its subscription is dropped.
pub(crate) struct Guard {
    pub(crate) shared: Weak<Shared>,
    pub(crate) id: u64,
    pub(crate) dropped: CancellationToken,
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Synchronously: the slot is never restored again and its forwarder stops.
        self.dropped.cancel();
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let id = self.id;
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move { shared.remove_slot(id).await });
        }
    }
}
