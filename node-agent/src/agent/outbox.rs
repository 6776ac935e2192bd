//! The outbox: what the node publishes, kept while the bus is away.
//!
//! Events (`event.*`) queue in order in a bounded buffer; when it is full,
//! the oldest *droppable* event (a progress event: the next one and the
//! reports carry the same counts) is dropped first. Reports are not queued:
//! only the latest one matters, so there is a single slot that a newer
//! report replaces, and it goes first: liveness never waits behind events
//! (a backlog of events, whatever made it, must not make the node look
//! missing). One publisher task drains both, retrying forever with
//! backoff while the bus is away; local work never waits for the bus,
//! except where a caller asks to be told that an event was published
//! (`cmd.remove` acknowledges its command only then).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gearshift_bus::{OutMessage, SharedBus};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

struct Pending {
    msg: OutMessage,
    droppable: bool,
    done: Option<oneshot::Sender<()>>,
}

#[derive(Default)]
struct State {
    events: VecDeque<Pending>,
    report: Option<(OutMessage, Option<oneshot::Sender<()>>)>,
}

/// The bounded outbox.
pub struct Outbox {
    state: Mutex<State>,
    wake: Notify,
    capacity: usize,
    metrics: Metrics,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("capacity", &self.capacity)
            .field("depth", &self.depth())
            .finish()
    }
}

impl Outbox {
    /// An outbox for at most `capacity` events.
    pub fn new(capacity: usize, metrics: Metrics) -> Arc<Outbox> {
        Arc::new(Outbox {
            state: Mutex::default(),
            wake: Notify::new(),
            capacity: capacity.max(1),
            metrics,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events waiting.
    pub fn depth(&self) -> usize {
        self.lock().events.len()
    }

    fn push(&self, p: Pending) {
        {
            let mut st = self.lock();
            while st.events.len() >= self.capacity {
                let victim = st.events.iter().position(|e| e.droppable).unwrap_or(0);
                if let Some(v) = st.events.remove(victim) {
                    tracing::warn!(key = %v.msg.key, "outbox full: dropping the oldest event");
                }
                self.metrics.outbox_dropped.inc();
            }
            st.events.push_back(p);
            self.metrics.outbox_depth.set(st.events.len() as i64);
        }
        self.wake.notify_one();
    }

    /// Queues an event; `droppable` events go first when the outbox is full.
    pub fn event(&self, msg: OutMessage, droppable: bool) {
        self.push(Pending {
            msg,
            droppable,
            done: None,
        });
    }

    /// Queues an event and returns a receiver that fires once the bus confirmed it.
    pub fn event_confirmed(&self, msg: OutMessage) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.push(Pending {
            msg,
            droppable: false,
            done: Some(tx),
        });
        rx
    }

    /// Replaces the pending report; the receiver fires once it was published
    /// (it is dropped, never fired, when a newer report replaces it).
    pub fn report(&self, msg: OutMessage) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.lock().report = Some((msg, Some(tx)));
        self.wake.notify_one();
        rx
    }

    /// Takes every queued event (tests look at what would be published).
    #[cfg(test)]
    pub(crate) fn take_events(&self) -> Vec<OutMessage> {
        self.lock().events.drain(..).map(|p| p.msg).collect()
    }

    /// The next message to publish: the pending report first, then the
    /// oldest event.
    fn take_next(&self) -> Option<(OutMessage, Option<oneshot::Sender<()>>, bool)> {
        let mut st = self.lock();
        if let Some((m, d)) = st.report.take() {
            return Some((m, d, false));
        }
        st.events.pop_front().map(|p| (p.msg, p.done, true))
    }

    fn put_back(&self, msg: OutMessage, done: Option<oneshot::Sender<()>>, event: bool) {
        let mut st = self.lock();
        if event {
            st.events.push_front(Pending {
                msg,
                droppable: false,
                done,
            });
        } else if st.report.is_none() {
            st.report = Some((msg, done));
        }
    }

    /// Publishes until `token` is cancelled, then tries to flush what is
    /// left for at most `flush` before returning.
    pub async fn run(
        self: Arc<Self>,
        bus: SharedBus,
        token: CancellationToken,
        backoff_min: Duration,
        backoff_max: Duration,
        flush: Duration,
    ) {
        let mut failures: u32 = 0;
        let flush_deadline = async {
            token.cancelled().await;
            tokio::time::sleep(flush).await;
        };
        tokio::pin!(flush_deadline);
        loop {
            let next = self.take_next();
            let Some((msg, done, event)) = next else {
                if token.is_cancelled() {
                    return;
                }
                tokio::select! {
                    _ = self.wake.notified() => continue,
                    _ = token.cancelled() => continue,
                }
            };
            let r = tokio::select! {
                r = bus.publish(msg.clone()) => r,
                _ = &mut flush_deadline => {
                    tracing::warn!(left = self.depth() + 1, "stopping with unpublished events");
                    return;
                }
            };
            match r {
                Ok(()) => {
                    failures = 0;
                    if event {
                        self.metrics.outbox_depth.set(self.depth() as i64);
                    } else {
                        self.metrics.reports_sent.inc();
                    }
                    if let Some(d) = done {
                        let _ = d.send(());
                    }
                }
                Err(e) if !e.is_retryable() && !matches!(e, gearshift_bus::BusError::Closed) => {
                    tracing::error!(key = %msg.key, error = %e, "message cannot be published; dropped");
                    self.metrics.publish_errors.inc();
                }
                Err(e) => {
                    self.metrics.publish_errors.inc();
                    let delay = gearshift_bus::backoff(failures, backoff_min, backoff_max);
                    failures = failures.saturating_add(1);
                    tracing::debug!(key = %msg.key, error = %e, retry_in = ?delay, "publish failed; will retry");
                    self.put_back(msg, done, event);
                    tokio::select! {
                        _ = tokio::time::sleep(delay) => {}
                        _ = &mut flush_deadline => return,
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(key: &str) -> OutMessage {
        OutMessage::new(key, key.as_bytes().to_vec())
    }

    #[test]
    fn full_outbox_drops_progress_first_then_oldest() {
        let o = Outbox::new(3, Metrics::default());
        o.event(msg("ack"), false);
        o.event(msg("progress-1"), true);
        o.event(msg("progress-2"), true);
        o.event(msg("done"), false);
        let keys: Vec<_> = o.lock().events.iter().map(|p| p.msg.key.clone()).collect();
        assert_eq!(keys, ["ack", "progress-2", "done"]);
        o.event(msg("x"), false);
        o.event(msg("y"), false);
        let keys: Vec<_> = o.lock().events.iter().map(|p| p.msg.key.clone()).collect();
        assert_eq!(keys, ["done", "x", "y"]);
    }

    fn next_key(o: &Outbox) -> Option<String> {
        o.take_next().map(|(m, _, _)| m.key)
    }

    #[test]
    fn the_report_goes_before_a_backlog_of_events() {
        let o = Outbox::new(10_000, Metrics::default());
        for i in 0..10_000 {
            o.event(msg(&format!("event.{i}")), false);
        }
        drop(o.report(msg("report.1")));
        assert_eq!(next_key(&o).as_deref(), Some("report.1"));
        assert_eq!(next_key(&o).as_deref(), Some("event.0"));
        assert_eq!(next_key(&o).as_deref(), Some("event.1"));
        // A newer report replaces the pending one and again goes next.
        drop(o.report(msg("report.2")));
        drop(o.report(msg("report.3")));
        assert_eq!(next_key(&o).as_deref(), Some("report.3"));
        assert_eq!(next_key(&o).as_deref(), Some("event.2"));
        assert_eq!(o.depth(), 9_997);
    }

    #[tokio::test]
    async fn publishes_in_order_after_the_bus_comes_back() {
        let broker = gearshift_bus::memory::MemoryBroker::new();
        let bus = broker.connect("t");
        let mut sub = bus.subscribe("event.#").await.unwrap();
        let o = Outbox::new(100, Metrics::default());
        for i in 0..5 {
            o.event(msg(&format!("event.{i}")), false);
        }
        let confirmed = o.event_confirmed(msg("event.last"));
        let token = CancellationToken::new();
        let task = tokio::spawn(o.clone().run(
            bus.clone(),
            token.clone(),
            Duration::from_millis(1),
            Duration::from_millis(10),
            Duration::from_millis(100),
        ));
        tokio::time::timeout(Duration::from_secs(5), confirmed)
            .await
            .unwrap()
            .unwrap();
        for i in 0..5 {
            let d = sub
                .next_timeout(Duration::from_secs(5))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(d.key, format!("event.{i}"));
        }
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
