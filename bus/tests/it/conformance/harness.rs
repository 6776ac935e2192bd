//! How each transport is reached and how its broker is made to drop connections.

use std::time::Duration;

use async_trait::async_trait;
use gearshift_bus::memory::MemoryBroker;
use gearshift_bus::{Bus, BusEvent, ConnectOptions, SharedBus};

/// Where a broker's documented behaviour differs, so that each case states
/// what it expects of each one.
#[derive(Debug, Clone, Copy)]
pub struct Quirks {
    /// `nack(true)` gives back every delivery of the subscription not yet
    /// settled, not only the nacked one (ActiveMQ: its NACK never requeues,
    /// the transport subscribes again); their old handles cannot settle.
    pub requeue_returns_every_unsettled: bool,
    /// A queue can have a single active consumer (RabbitMQ's STOMP plugin
    /// ignores `x-single-active-consumer`: the transport refuses the spec).
    pub single_active_consumer: bool,
}

impl Default for Quirks {
    fn default() -> Self {
        Quirks {
            requeue_returns_every_unsettled: false,
            single_active_consumer: true,
        }
    }
}

/// What the cases need from a transport.
#[async_trait]
pub trait Harness: Sync {
    /// A new connection.
    async fn bus(&self, name: &str) -> SharedBus;
    /// Makes the broker drop every connection.
    async fn drop_all_connections(&self);
    /// How this broker differs.
    fn quirks(&self) -> Quirks {
        Quirks::default()
    }
}

/// Connection options for tests: fast reconnects, short operation timeouts.
pub fn test_options(name: &str) -> ConnectOptions {
    ConnectOptions {
        name: format!("gearshift-test-{name}"),
        heartbeat: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        op_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(10),
        ..ConnectOptions::default()
    }
}

/// In-process transport; each test gets its own broker.
pub struct Memory {
    broker: MemoryBroker,
}

impl Memory {
    pub fn new() -> Self {
        Memory {
            broker: MemoryBroker::new(),
        }
    }
}

#[async_trait]
impl Harness for Memory {
    async fn bus(&self, name: &str) -> SharedBus {
        self.broker.connect(name)
    }
    async fn drop_all_connections(&self) {
        self.broker.drop_all_connections();
    }
}

/// The real RabbitMQ, over AMQP or STOMP.
pub struct Real {
    url: String,
}

impl Real {
    pub fn amqp() -> Self {
        Real {
            url: crate::rabbit::amqp_url(),
        }
    }
    pub fn stomp() -> Self {
        Real {
            url: crate::rabbit::stomp_url(),
        }
    }
}

#[async_trait]
impl Harness for Real {
    async fn bus(&self, name: &str) -> SharedBus {
        match gearshift_bus::connect(&self.url, test_options(name)).await {
            Ok(b) => b,
            Err(e) => panic!(
                "cannot reach the test broker at {} ({e}). These tests need a real RabbitMQ \
                 with the STOMP plugin: run scripts/setup-rabbitmq",
                gearshift_bus::url::redact(&self.url)
            ),
        }
    }
    async fn drop_all_connections(&self) {
        crate::rabbit::rabbitmqctl(&["close_all_connections", "gearshift conformance test"]).await;
    }
    fn quirks(&self) -> Quirks {
        Quirks {
            single_active_consumer: !self.url.starts_with("stomp"),
            ..Quirks::default()
        }
    }
}

/// The private ActiveMQ of `scripts/setup-activemq`, through an in-process
/// proxy: dropping every connection cuts only this test's.
pub struct ActiveMq {
    url: String,
    proxy: tokio::sync::OnceCell<crate::proxy::Proxy>,
}

impl ActiveMq {
    pub fn new() -> Self {
        ActiveMq {
            url: crate::activemq::url(),
            proxy: tokio::sync::OnceCell::new(),
        }
    }
}

#[async_trait]
impl Harness for ActiveMq {
    async fn bus(&self, name: &str) -> SharedBus {
        let proxy = self
            .proxy
            .get_or_init(|| async {
                crate::proxy::Proxy::start(crate::activemq::stomp_addr(&self.url), None).await
            })
            .await;
        let url = crate::activemq::url_via(&self.url, proxy.addr);
        crate::activemq::connect(&url, test_options(name)).await
    }
    async fn drop_all_connections(&self) {
        if let Some(p) = self.proxy.get() {
            p.cut();
            p.restore();
        }
    }
    fn quirks(&self) -> Quirks {
        Quirks {
            requeue_returns_every_unsettled: true,
            ..Quirks::default()
        }
    }
}

/// Waits until `bus` reports `Connected` after having been disconnected.
pub async fn wait_reconnected(
    events: &mut tokio::sync::broadcast::Receiver<BusEvent>,
    within: Duration,
) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(BusEvent::Connected { .. })) => return,
            Ok(Ok(BusEvent::Disconnected { .. })) => continue,
            Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => continue,
            Ok(Err(e)) => panic!("bus event channel closed: {e}"),
            Err(_) => panic!("no reconnect within {within:?}"),
        }
    }
}

#[allow(dead_code)]
fn _assert_object_safe(_: &dyn Bus) {}
