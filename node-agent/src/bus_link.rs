//! A bus that is usable before it is connected.
//!
//! The transports reconnect by themselves once connected, but the *first*
//! connection can fail (broker down at boot). [`LazyBus`] connects in the
//! background from its first use on, retrying forever with backoff, and
//! implements [`Bus`] in the meantime: operations wait for the connection up
//! to the operation timeout and then fail with a retryable error. The
//! agent's local work (resuming an evacuation, persisting state) therefore
//! never waits for the broker, and nothing touches the network before the
//! agent was built (its state directory locked).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gearshift_bus::{
    Bus, BusError, BusEvent, ConnectOptions, ConsumeOptions, Delivery, OutMessage, QueueSpec,
    SharedBus, Subscription,
};
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// A bus that connects in the background.
pub struct LazyBus {
    inner: watch::Receiver<Option<SharedBus>>,
    events: broadcast::Sender<BusEvent>,
    op_timeout: Duration,
    transport: &'static str,
    stop: CancellationToken,
    start: Arc<tokio::sync::Notify>,
}

impl std::fmt::Debug for LazyBus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyBus")
            .field("connected", &self.inner.borrow().is_some())
            .finish()
    }
}

impl LazyBus {
    /// A bus for `url` that starts connecting in the background at its first
    /// operation (until `token` is cancelled).
    pub fn spawn(url: String, opts: ConnectOptions, token: CancellationToken) -> SharedBus {
        Self::spawn_on(url, opts, token, &TaskTracker::new())
    }

    /// Like [`LazyBus::spawn`], its connecting task on `tracker` (the
    /// process's tracker, so that the bootstrap waits for it at exit).
    pub fn spawn_on(
        url: String,
        opts: ConnectOptions,
        token: CancellationToken,
        tracker: &TaskTracker,
    ) -> SharedBus {
        let (tx, rx) = watch::channel(None);
        let (events, _) = broadcast::channel(64);
        let transport = match gearshift_bus::BusUrl::parse(&url) {
            Ok(gearshift_bus::BusUrl::Memory { .. }) => "memory",
            Ok(gearshift_bus::BusUrl::Amqp { .. }) => "amqp",
            Ok(gearshift_bus::BusUrl::Stomp { .. }) => "stomp",
            Err(_) => "unknown",
        };
        let stop = token.child_token();
        let ev = events.clone();
        let op_timeout = opts.op_timeout;
        let t = stop.clone();
        let start = Arc::new(tokio::sync::Notify::new());
        let started = start.clone();
        tracker.spawn(async move {
            tokio::select! {
                _ = started.notified() => {}
                _ = t.cancelled() => return,
            }
            let redacted = gearshift_bus::url::redact(&url);
            let mut attempt = 0u32;
            loop {
                let r = tokio::select! {
                    r = gearshift_bus::connect(&url, opts.clone()) => r,
                    _ = t.cancelled() => return,
                };
                match r {
                    Ok(bus) => {
                        tracing::info!(bus = %redacted, "connected to the bus");
                        let mut inner_events = bus.events();
                        let _ = tx.send(Some(bus));
                        let _ = ev.send(BusEvent::Connected { reconnects: 0 });
                        // Forward the transport's own connection events.
                        loop {
                            tokio::select! {
                                e = inner_events.recv() => match e {
                                    Ok(e) => { let _ = ev.send(e); }
                                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                                    Err(broadcast::error::RecvError::Closed) => return,
                                },
                                _ = t.cancelled() => return,
                            }
                        }
                    }
                    Err(e) => {
                        let delay =
                            gearshift_bus::backoff(attempt, opts.reconnect_min, opts.reconnect_max);
                        attempt = attempt.saturating_add(1);
                        tracing::warn!(bus = %redacted, error = %e, retry_in = ?delay, attempt,
                            "cannot connect to the bus; local work continues");
                        let _ = ev.send(BusEvent::Disconnected {
                            reason: e.to_string(),
                        });
                        tokio::select! {
                            _ = tokio::time::sleep(delay) => {}
                            _ = t.cancelled() => return,
                        }
                    }
                }
            }
        });
        Arc::new(LazyBus {
            inner: rx,
            events,
            op_timeout,
            transport,
            stop,
            start,
        })
    }

    async fn bus(&self) -> Result<SharedBus, BusError> {
        self.start.notify_one();
        let mut rx = self.inner.clone();
        let wait = rx.wait_for(|b| b.is_some());
        match tokio::time::timeout(self.op_timeout, wait).await {
            Ok(Ok(b)) => b.clone().ok_or(BusError::Closed),
            Ok(Err(_)) => Err(BusError::Closed),
            Err(_) => Err(BusError::Connect {
                endpoint: "bus".into(),
                reason: "not connected yet".into(),
            }),
        }
    }
}

#[async_trait]
impl Bus for LazyBus {
    fn transport(&self) -> &'static str {
        self.transport
    }

    async fn publish(&self, msg: OutMessage) -> Result<(), BusError> {
        self.bus().await?.publish(msg).await
    }

    async fn send_to_queue(&self, queue: &str, msg: OutMessage) -> Result<(), BusError> {
        self.bus().await?.send_to_queue(queue, msg).await
    }

    async fn subscribe(&self, pattern: &str) -> Result<Subscription, BusError> {
        self.bus().await?.subscribe(pattern).await
    }

    async fn declare_queue(&self, spec: &QueueSpec) -> Result<(), BusError> {
        self.bus().await?.declare_queue(spec).await
    }

    async fn consume(
        &self,
        spec: &QueueSpec,
        opts: ConsumeOptions,
    ) -> Result<Subscription, BusError> {
        self.bus().await?.consume(spec, opts).await
    }

    async fn request(&self, msg: OutMessage, timeout: Duration) -> Result<Delivery, BusError> {
        self.bus().await?.request(msg, timeout).await
    }

    async fn request_all(
        &self,
        msg: OutMessage,
        window: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        self.bus().await?.request_all(msg, window).await
    }

    fn events(&self) -> broadcast::Receiver<BusEvent> {
        self.events.subscribe()
    }

    async fn close(&self) {
        self.stop.cancel();
        let b = self.inner.borrow().clone();
        if let Some(b) = b {
            b.close().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_bus_connects_and_works() {
        let name = format!("lazy-{}", uuid::Uuid::new_v4());
        let token = CancellationToken::new();
        let bus = LazyBus::spawn(
            format!("memory://{name}"),
            ConnectOptions::default(),
            token.clone(),
        );
        let mut sub = bus.subscribe("x.#").await.unwrap();
        bus.publish(OutMessage::new("x.y", b"hi".to_vec()))
            .await
            .unwrap();
        let d = sub
            .next_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&d.payload[..], b"hi");
        bus.close().await;
    }

    #[tokio::test]
    async fn unreachable_bus_fails_operations_retryably() {
        let token = CancellationToken::new();
        let opts = ConnectOptions {
            op_timeout: Duration::from_millis(200),
            connect_timeout: Duration::from_millis(100),
            reconnect_min: Duration::from_millis(10),
            reconnect_max: Duration::from_millis(50),
            ..ConnectOptions::default()
        };
        // Port 1 on loopback: connection refused.
        let bus = LazyBus::spawn(
            "amqp://guest:guest@127.0.0.1:1/%2f".into(),
            opts,
            token.clone(),
        );
        let e = bus
            .publish(OutMessage::new("k", b"x".to_vec()))
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        token.cancel();
    }
}
