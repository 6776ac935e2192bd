//! Starting the bus: the first connection, retried with backoff until it
//! succeeds or the agent stops.
//!
//! The transports reconnect by themselves once connected, but the *first*
//! connection can fail (bus broker down at boot). [`connect_retrying`]
//! waits for it (the broker agent, which has nothing to do without the
//! bus). [`LazyBus`] connects in the background from its first use on and
//! implements [`Bus`] in the meantime: operations wait for the connection
//! up to the operation timeout and then fail with a retryable error. The
//! node agent's local work (resuming an evacuation, persisting state)
//! therefore never waits for the bus, and nothing touches the network
//! before the agent was built (its state directory locked).

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

/// Connects to `url`, retrying with `opts`' reconnect backoff until it
/// succeeds; `None` when `token` is cancelled first. `failed` hears of each
/// failed attempt and the wait before the next.
pub async fn connect_retrying(
    url: &str,
    opts: &ConnectOptions,
    token: &CancellationToken,
    mut failed: impl FnMut(&BusError, Duration),
) -> Option<SharedBus> {
    let mut attempt = 0u32;
    loop {
        let r = tokio::select! {
            r = gearshift_bus::connect(url, opts.clone()) => r,
            _ = token.cancelled() => return None,
        };
        match r {
            Ok(bus) => return Some(bus),
            Err(e) => {
                let wait = gearshift_bus::backoff(attempt, opts.reconnect_min, opts.reconnect_max);
                attempt = attempt.saturating_add(1);
                failed(&e, wait);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = token.cancelled() => return None,
                }
            }
        }
    }
}

impl LazyBus {
    /// A bus for `url` that starts connecting in the background at its first
    /// operation (until `token` is cancelled); its task is tracked by `tracker`.
    pub fn spawn(
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
        let op_timeout = opts.op_timeout;
        let start = Arc::new(tokio::sync::Notify::new());
        tracker.spawn(connect_then_forward(
            url,
            opts,
            stop.clone(),
            start.clone(),
            tx,
            events.clone(),
        ));
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

/// [`LazyBus`]'s task: waits for the first use, connects, then forwards
/// the transport's connection events.
async fn connect_then_forward(
    url: String,
    opts: ConnectOptions,
    stop: CancellationToken,
    start: Arc<tokio::sync::Notify>,
    tx: watch::Sender<Option<SharedBus>>,
    events: broadcast::Sender<BusEvent>,
) {
    tokio::select! {
        _ = start.notified() => {}
        _ = stop.cancelled() => return,
    }
    let redacted = gearshift_bus::url::redact(&url);
    let bus = connect_retrying(&url, &opts, &stop, |e, delay| {
        tracing::warn!(bus = %redacted, error = %e, retry_in = ?delay,
            "cannot connect to the bus; local work continues");
        let _ = events.send(BusEvent::Disconnected {
            reason: e.to_string(),
        });
    })
    .await;
    let Some(bus) = bus else { return };
    tracing::info!(bus = %redacted, "connected to the bus");
    let mut inner_events = bus.events();
    let _ = tx.send(Some(bus));
    let _ = events.send(BusEvent::Connected { reconnects: 0 });
    loop {
        tokio::select! {
            e = inner_events.recv() => match e {
                Ok(e) => { let _ = events.send(e); }
                Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = stop.cancelled() => return,
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
            &TaskTracker::new(),
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
            &TaskTracker::new(),
        );
        let e = bus
            .publish(OutMessage::new("k", b"x".to_vec()))
            .await
            .unwrap_err();
        assert!(e.is_retryable(), "{e}");
        token.cancel();
    }
}
