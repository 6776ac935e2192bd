//! In-process transport with AMQP topic-exchange semantics: named and
//! transient queues, bindings, competing consumers with prefetch, manual
//! acknowledgement and redelivery. Used by the demo and by unit tests.
//!
//! Agents in one process that connect to the same name share one
//! [`MemoryBroker`]; `memory://` is the default broker.
//!
//! ## Layout
//! - this file: the broker handle, connections and the [`Bus`] interface.
//! - `queues`: queues, routing, dispatch with prefetch, acks and redelivery.

mod queues;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{broadcast, mpsc};

use crate::api::{
    Bus, BusEvent, ConsumeOptions, Delivery, Durability, OutMessage, QueueSpec, SharedBus,
    Subscription,
};
use crate::error::BusError;
use crate::reply::ReplyRouter;

/// Largest payload the memory transport accepts (same order as RabbitMQ's frame limits).
pub const MAX_PAYLOAD: usize = 16 * 1024 * 1024;
/// Buffer of a transient subscription before deliveries wait in the queue.
const SUBSCRIPTION_BUFFER: usize = 8192;

static REGISTRY: LazyLock<Mutex<HashMap<String, MemoryBroker>>> = LazyLock::new(Mutex::default);

use self::queues::{
    Consumer, ConsumerGuard, Inner, Queue, State, dispatch, enqueue, lock, requeue_all, stored,
};

/// One in-process broker.
#[derive(Clone)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for MemoryBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBroker").finish_non_exhaustive()
    }
}

impl Default for MemoryBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryBroker {
    /// A new, private broker.
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(64);
        MemoryBroker {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                events,
                resets: AtomicU64::new(0),
            }),
        }
    }

    /// The process-wide broker called `name` (created on first use).
    pub fn named(name: &str) -> Self {
        let mut reg = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
        reg.entry(name.to_string()).or_default().clone()
    }

    /// A new connection to this broker.
    pub fn connect(&self, name: &str) -> SharedBus {
        Arc::new(self.connection(name))
    }

    /// A new connection, as its concrete type.
    pub fn connection(&self, name: &str) -> MemoryBus {
        let id = {
            let mut st = lock(&self.inner);
            st.next_id += 1;
            st.next_id
        };
        MemoryBus {
            broker: self.clone(),
            conn: id,
            name: name.to_string(),
            closed: Arc::new(AtomicBool::new(false)),
            reply: ReplyRouter::new(),
        }
    }

    /// Simulates the broker dropping every connection: every unacknowledged
    /// delivery goes back to its queue (marked redelivered) and every
    /// connection reports `Disconnected` then `Connected`, as a real transport
    /// does after it reconnected and restored its consumers.
    pub fn drop_all_connections(&self) {
        let _ = self.inner.events.send(BusEvent::Disconnected {
            reason: "broker closed all connections".into(),
        });
        {
            let mut st = lock(&self.inner);
            let names: Vec<String> = st.queues.keys().cloned().collect();
            for name in names {
                if let Some(q) = st.queues.get_mut(&name) {
                    requeue_all(q, |_| true);
                }
                dispatch(&self.inner, &mut st, &name);
            }
        }
        let n = self.inner.resets.fetch_add(1, Ordering::SeqCst) + 1;
        let _ = self
            .inner
            .events
            .send(BusEvent::Connected { reconnects: n });
    }

    /// Messages waiting (ready, not delivered) in a queue; `None` if it does not exist.
    pub fn queue_depth(&self, name: &str) -> Option<usize> {
        lock(&self.inner).queues.get(name).map(|q| q.ready.len())
    }

    /// Deliveries handed out and not yet acknowledged in a queue.
    pub fn unacked(&self, name: &str) -> Option<usize> {
        lock(&self.inner).queues.get(name).map(|q| q.unacked.len())
    }

    fn route(&self, msg: &OutMessage) -> usize {
        let mut st = lock(&self.inner);
        let targets: Vec<String> = st
            .queues
            .iter()
            .filter(|(_, q)| {
                q.bindings
                    .iter()
                    .any(|p| gearshift_proto::routing::topic_matches(p, &msg.key))
            })
            .map(|(n, _)| n.clone())
            .collect();
        for name in &targets {
            enqueue(&self.inner, &mut st, name, stored(msg));
        }
        targets.len()
    }
}

/// One connection to a [`MemoryBroker`].
pub struct MemoryBus {
    broker: MemoryBroker,
    conn: u64,
    name: String,
    closed: Arc<AtomicBool>,
    reply: ReplyRouter,
}

impl std::fmt::Debug for MemoryBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBus")
            .field("name", &self.name)
            .finish()
    }
}

impl MemoryBus {
    /// The broker this connection talks to.
    pub fn broker(&self) -> &MemoryBroker {
        &self.broker
    }

    fn check_open(&self) -> Result<(), BusError> {
        if self.closed.load(Ordering::SeqCst) {
            Err(BusError::Closed)
        } else {
            Ok(())
        }
    }

    fn declare(&self, st: &mut State, spec: &QueueSpec) -> Result<(), BusError> {
        if spec.name.is_empty() || spec.name.len() > 255 {
            return Err(BusError::Invalid(format!(
                "queue name must be 1..=255 bytes, got {}",
                spec.name.len()
            )));
        }
        let q = st.queues.entry(spec.name.clone()).or_insert_with(|| Queue {
            durability: spec.durability,
            max_length: spec.max_length,
            single_active: spec.single_active_consumer,
            bindings: vec![],
            owner: (spec.durability == Durability::Transient).then_some(self.conn),
            ready: VecDeque::new(),
            consumers: vec![],
            next_consumer: 0,
            unacked: HashMap::new(),
        });
        if q.durability != spec.durability {
            return Err(BusError::Server(format!(
                "queue {} exists with durability {:?}",
                spec.name, q.durability
            )));
        }
        if q.max_length != spec.max_length {
            // RabbitMQ refuses an inequivalent x-max-length the same way.
            return Err(BusError::Server(format!(
                "queue {} exists with max_length {:?}",
                spec.name, q.max_length
            )));
        }
        if q.single_active != spec.single_active_consumer {
            return Err(BusError::Server(format!(
                "queue {} exists with single_active_consumer {}",
                spec.name, q.single_active
            )));
        }
        for b in &spec.bindings {
            if !q.bindings.contains(b) {
                q.bindings.push(b.clone());
            }
        }
        Ok(())
    }

    fn add_consumer(
        &self,
        spec: &QueueSpec,
        prefetch: usize,
        auto_ack: bool,
    ) -> Result<Subscription, BusError> {
        self.check_open()?;
        let inner = &self.broker.inner;
        let mut st = lock(inner);
        self.declare(&mut st, spec)?;
        st.next_id += 1;
        let id = st.next_id;
        let cap = if auto_ack {
            SUBSCRIPTION_BUFFER
        } else {
            prefetch.max(1)
        };
        let (tx, rx) = mpsc::channel(cap);
        if let Some(q) = st.queues.get_mut(&spec.name) {
            q.consumers.push(Consumer {
                id,
                conn: self.conn,
                tx,
                prefetch: prefetch.max(1),
                in_flight: 0,
                auto_ack,
                waiting: false,
            });
        }
        dispatch(inner, &mut st, &spec.name);
        Ok(Subscription::new(
            rx,
            ConsumerGuard {
                inner: Arc::downgrade(inner),
                queue: spec.name.clone(),
                consumer: id,
            },
        ))
    }
}

fn check_size(payload: &Bytes) -> Result<(), BusError> {
    if payload.len() > MAX_PAYLOAD {
        return Err(BusError::TooLarge {
            size: payload.len(),
            limit: MAX_PAYLOAD,
        });
    }
    Ok(())
}

#[async_trait]
impl Bus for MemoryBus {
    fn transport(&self) -> &'static str {
        "memory"
    }

    async fn publish(&self, msg: OutMessage) -> Result<(), BusError> {
        self.check_open()?;
        check_size(&msg.payload)?;
        self.broker.route(&msg);
        Ok(())
    }

    async fn send_to_queue(&self, queue: &str, msg: OutMessage) -> Result<(), BusError> {
        self.check_open()?;
        check_size(&msg.payload)?;
        let inner = &self.broker.inner;
        let mut st = lock(inner);
        // Like AMQP's default exchange: a message to a queue that does not exist is dropped.
        if st.queues.contains_key(queue) {
            enqueue(inner, &mut st, queue, stored(&msg));
        }
        Ok(())
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        if pattern.is_empty() {
            return Err(BusError::Invalid("empty pattern".into()));
        }
        let spec = QueueSpec::transient(
            format!("amq.gen-{}", uuid::Uuid::new_v4().simple()),
            vec![pattern.to_string()],
        );
        self.add_consumer(&spec, SUBSCRIPTION_BUFFER, true)
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BusError> {
        self.check_open()?;
        let mut st = lock(&self.broker.inner);
        self.declare(&mut st, spec)
    }

    async fn consume(
        &self,
        spec: &QueueSpec,
        opts: ConsumeOptions,
    ) -> Result<Subscription, BusError> {
        self.add_consumer(spec, opts.prefetch as usize, false)
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
        self.broker.inner.events.subscribe()
    }

    async fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let inner = &self.broker.inner;
        let mut st = lock(inner);
        let conn = self.conn;
        let names: Vec<String> = st.queues.keys().cloned().collect();
        for name in names {
            let mut delete = false;
            if let Some(q) = st.queues.get_mut(&name) {
                let mine: Vec<u64> = q
                    .consumers
                    .iter()
                    .filter(|c| c.conn == conn)
                    .map(|c| c.id)
                    .collect();
                requeue_all(q, |c| mine.contains(&c));
                q.consumers.retain(|c| c.conn != conn);
                delete = q.owner == Some(conn);
            }
            if delete {
                st.queues.remove(&name);
            } else {
                dispatch(inner, &mut st, &name);
            }
        }
    }
}
