//! The broker's queues: routing into them, dispatch to consumers with
//! prefetch, acknowledgements and redelivery. Every function runs under the
//! broker's lock.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{broadcast, mpsc};

use crate::api::{AckHandle, BusEvent, Delivery, Durability, OutMessage};
use crate::error::BusError;

#[derive(Clone)]
pub(super) struct Stored {
    pub(super) key: String,
    pub(super) payload: Bytes,
    pub(super) reply_to: Option<String>,
    pub(super) correlation_id: Option<String>,
    pub(super) redelivered: bool,
}

pub(super) struct Consumer {
    pub(super) id: u64,
    pub(super) conn: u64,
    pub(super) tx: mpsc::Sender<Delivery>,
    pub(super) prefetch: usize,
    pub(super) in_flight: usize,
    pub(super) auto_ack: bool,
    pub(super) waiting: bool,
}

pub(super) struct Queue {
    pub(super) durability: Durability,
    pub(super) max_length: Option<u32>,
    /// Only the first live consumer receives (see
    /// [`crate::QueueSpec::single_active_consumer`]).
    pub(super) single_active: bool,
    pub(super) bindings: Vec<String>,
    pub(super) owner: Option<u64>,
    pub(super) ready: VecDeque<Stored>,
    pub(super) consumers: Vec<Consumer>,
    pub(super) next_consumer: usize,
    pub(super) unacked: HashMap<u64, (Stored, u64)>,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) queues: HashMap<String, Queue>,
    pub(super) next_tag: u64,
    pub(super) next_id: u64,
}

pub(super) struct Inner {
    pub(super) state: Mutex<State>,
    pub(super) events: broadcast::Sender<BusEvent>,
    pub(super) resets: AtomicU64,
}

pub(super) fn lock(inner: &Inner) -> MutexGuard<'_, State> {
    // A panic while holding the lock leaves plain data behind; keep going.
    inner.state.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn stored(msg: &OutMessage) -> Stored {
    Stored {
        key: msg.key.clone(),
        payload: msg.payload.clone(),
        reply_to: msg.reply_to.clone(),
        correlation_id: msg.correlation_id.clone(),
        redelivered: false,
    }
}

pub(super) fn enqueue(inner: &Arc<Inner>, st: &mut State, name: &str, m: Stored) {
    if let Some(q) = st.queues.get_mut(name) {
        q.ready.push_back(m);
        // A bounded queue drops its oldest waiting messages (drop-head).
        if let Some(max) = q.max_length {
            while q.ready.len() > max as usize {
                q.ready.pop_front();
            }
        }
        dispatch(inner, st, name);
    }
}

/// Moves unacked deliveries of the consumers selected by `which` back to the
/// front of the queue, in their original order.
pub(super) fn requeue_all(q: &mut Queue, which: impl Fn(u64) -> bool) {
    let mut back: Vec<(u64, Stored)> = Vec::new();
    q.unacked.retain(|tag, (m, consumer)| {
        if which(*consumer) {
            back.push((*tag, m.clone()));
            false
        } else {
            true
        }
    });
    back.sort_by_key(|(tag, _)| std::cmp::Reverse(*tag));
    for (_, mut m) in back {
        m.redelivered = true;
        q.ready.push_front(m);
    }
    for c in q.consumers.iter_mut() {
        if which(c.id) {
            c.in_flight = 0;
        }
    }
}

pub(super) fn dispatch(inner: &Arc<Inner>, st: &mut State, name: &str) {
    let State {
        queues, next_tag, ..
    } = st;
    let Some(q) = queues.get_mut(name) else {
        return;
    };
    loop {
        if q.ready.is_empty() || q.consumers.is_empty() {
            return;
        }
        // Drop consumers whose subscription is gone, returning their deliveries.
        let dead: Vec<u64> = q
            .consumers
            .iter()
            .filter(|c| c.tx.is_closed())
            .map(|c| c.id)
            .collect();
        if !dead.is_empty() {
            requeue_all(q, |c| dead.contains(&c));
            q.consumers.retain(|c| !dead.contains(&c.id));
            continue;
        }
        let n = q.consumers.len();
        // A single-active-consumer queue delivers to its oldest consumer only.
        let order: Vec<usize> = if q.single_active {
            vec![0]
        } else {
            (0..n).map(|i| (q.next_consumer + i) % n).collect()
        };
        let Some(idx) = order.into_iter().find(|&i| {
            let c = &q.consumers[i];
            !c.waiting && (c.auto_ack || c.in_flight < c.prefetch)
        }) else {
            return;
        };
        q.next_consumer = (idx + 1) % n;
        let Some(m) = q.ready.pop_front() else { return };
        *next_tag += 1;
        let tag = *next_tag;
        let c = &mut q.consumers[idx];
        let acker: Option<Box<dyn AckHandle>> = if c.auto_ack {
            None
        } else {
            Some(Box::new(MemAck {
                inner: Arc::downgrade(inner),
                queue: name.to_string(),
                tag,
            }))
        };
        let d = Delivery::new(
            m.key.clone(),
            m.payload.clone(),
            m.reply_to.clone(),
            m.correlation_id.clone(),
            m.redelivered,
            acker,
        );
        match c.tx.try_send(d) {
            Ok(()) => {
                if !c.auto_ack {
                    c.in_flight += 1;
                    q.unacked.insert(tag, (m, c.id));
                }
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                // Only transient subscriptions can be full: wait for room, then retry.
                q.ready.push_front(m);
                wait_for_room(inner, c, name);
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                q.ready.push_front(m);
                let id = c.id;
                requeue_all(q, |c| c == id);
                q.consumers.retain(|c| c.id != id);
            }
        }
    }
}

/// Marks `c` waiting until its subscription has room, then dispatches again.
fn wait_for_room(inner: &Arc<Inner>, c: &mut Consumer, name: &str) {
    c.waiting = true;
    let tx = c.tx.clone();
    let id = c.id;
    let weak = Arc::downgrade(inner);
    let qname = name.to_string();
    tokio::spawn(async move {
        let ok = tx.reserve().await.is_ok();
        if let Some(inner) = weak.upgrade() {
            let mut st = lock(&inner);
            if let Some(q) = st.queues.get_mut(&qname)
                && let Some(c) = q.consumers.iter_mut().find(|c| c.id == id)
            {
                c.waiting = false;
            }
            if ok {
                dispatch(&inner, &mut st, &qname);
            }
        }
    });
}

pub(super) struct MemAck {
    pub(super) inner: Weak<Inner>,
    pub(super) queue: String,
    pub(super) tag: u64,
}

impl MemAck {
    fn settle(&self, requeue: Option<bool>) -> Result<(), BusError> {
        let inner = self.inner.upgrade().ok_or(BusError::Closed)?;
        let mut st = lock(&inner);
        let q = st
            .queues
            .get_mut(&self.queue)
            .ok_or_else(|| BusError::Server(format!("queue {} no longer exists", self.queue)))?;
        let (mut m, consumer) = q
            .unacked
            .remove(&self.tag)
            .ok_or_else(|| BusError::Connect {
                endpoint: "memory".into(),
                reason: "delivery belongs to a connection that was reset; it will be redelivered"
                    .into(),
            })?;
        if let Some(c) = q.consumers.iter_mut().find(|c| c.id == consumer) {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        if requeue == Some(true) {
            m.redelivered = true;
            q.ready.push_front(m);
        }
        dispatch(&inner, &mut st, &self.queue);
        Ok(())
    }
}

#[async_trait]
impl AckHandle for MemAck {
    async fn ack(&self) -> Result<(), BusError> {
        self.settle(None)
    }
    async fn nack(&self, requeue: bool) -> Result<(), BusError> {
        self.settle(Some(requeue))
    }
}

/// Removes a consumer when its subscription is dropped.
pub(super) struct ConsumerGuard {
    pub(super) inner: Weak<Inner>,
    pub(super) queue: String,
    pub(super) consumer: u64,
}

impl Drop for ConsumerGuard {
    fn drop(&mut self) {
        let Some(inner) = self.inner.upgrade() else {
            return;
        };
        let mut st = lock(&inner);
        let mut delete = false;
        if let Some(q) = st.queues.get_mut(&self.queue) {
            let id = self.consumer;
            requeue_all(q, |c| c == id);
            q.consumers.retain(|c| c.id != id);
            delete = q.durability == Durability::Transient && q.consumers.is_empty();
        }
        if delete {
            st.queues.remove(&self.queue);
        } else {
            dispatch(&inner, &mut st, &self.queue);
        }
    }
}
