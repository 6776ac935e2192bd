//! # gearshift-bus: one message bus over AMQP 0-9-1, STOMP 1.2 and memory
//!
//! Both agents talk to the bus only through the [`Bus`] trait. Which
//! transport carries the messages is decided by the bus URL:
//!
//! | URL | transport |
//! | --- | --- |
//! | `memory://[name]` | in-process ([`memory`]), for the demo and unit tests |
//! | `amqp://user:pass@host:port/vhost`, `amqps://…` | AMQP 0-9-1 via lapin ([`amqp`]) |
//! | `stomp://user:pass@host:port[/vhost][?flavor=rabbitmq\|activemq]`, `stomp+ssl://…` | STOMP 1.2, our own codec and session ([`stomp`]); the flavor is detected when not named |
//!
//! ## Layout
//! - [`api`]: the trait, messages, deliveries, subscriptions, queue specs.
//! - [`mod@backoff`]: the one retry policy (reconnects of both transports,
//!   consumer restarts, and [`fn@backoff`] for the agents), on `backon`.
//! - [`health`]: what a bus reports about itself ([`BusHealth`]: connected,
//!   refused operations, oversized messages dropped).
//! - [`url`]: bus URL parsing (no network access).
//! - [`reply`]: request/reply on top of any transport.
//! - [`memory`], [`amqp`], [`stomp`]: the transports.
//! - [`tls`]: TLS client configuration (private CA, client certificates).
//!
//! ## Guarantees
//! - `publish` returns only once the broker took responsibility for the
//!   message (publisher confirm, STOMP receipt).
//! - Consumers of named queues acknowledge manually; a delivery that is
//!   neither acked nor nacked when its consumer goes away is delivered again.
//! - Transports reconnect with backoff and restore their topology
//!   (exchange, queues, bindings, consumers) before reporting `Connected`.
//! - A message over the transport's size limit never ends a session: it is
//!   settled and handed on as a delivery with [`Delivery::too_large`] set.
//! - An operation the broker refuses is retried no sooner than its backoff
//!   allows, and shows in [`Bus::health`] until it succeeds.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

#[cfg(feature = "amqp")]
pub mod amqp;
pub mod api;
pub mod backoff;
pub mod error;
pub mod health;
pub mod memory;
pub mod reply;
pub mod stomp;
pub mod tls;
pub mod url;

use std::path::PathBuf;
use std::time::Duration;

pub use api::{
    AckHandle, AckPosition, Bus, BusEvent, ConsumeOptions, Delivery, Durability, OutMessage,
    QueueSpec, SharedBus, Subscription, TooLarge,
};
pub use backoff::Backoff;
pub use error::BusError;
pub use health::{BusHealth, Refusing};
pub use url::{BusUrl, StompFlavor};

/// TLS settings for `amqps://` and `stomp+ssl://`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// PEM file of the CA(s) that signed the server's certificate (a private CA);
    /// the system's roots are used when absent.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for brokers that require client certificates.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<PathBuf>,
    /// Name to check in the server certificate, when it differs from the URL's host.
    pub server_name: Option<String>,
}

/// How to connect and how patiently to retry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectOptions {
    /// Connection name shown by the broker's management tools.
    pub name: String,
    /// TLS settings.
    pub tls: TlsOptions,
    /// Heart-beat interval proposed to the broker (both directions).
    pub heartbeat: Duration,
    /// First reconnect delay; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    pub reconnect_max: Duration,
    /// How long one operation (publish confirm, declare, ...) may wait,
    /// including waiting for a reconnect.
    pub op_timeout: Duration,
    /// How long the first connection attempt may take before `connect` fails.
    pub connect_timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            name: "gearshift".into(),
            tls: TlsOptions::default(),
            heartbeat: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(2),
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Connects to the bus named by `url`.
pub async fn connect(url: &str, opts: ConnectOptions) -> Result<SharedBus, BusError> {
    match BusUrl::parse(url)? {
        BusUrl::Memory { name } => Ok(memory::MemoryBroker::named(&name).connect(&opts.name)),
        #[cfg(feature = "amqp")]
        u @ BusUrl::Amqp { .. } => amqp::AmqpBus::connect(u, opts).await,
        #[cfg(not(feature = "amqp"))]
        BusUrl::Amqp { url, .. } => Err(BusError::Url {
            url: url::redact(&url),
            reason: "this build of gearshift-bus has no AMQP transport (feature `amqp`)".into(),
        }),
        u @ BusUrl::Stomp { .. } => stomp::StompBus::connect(u, opts).await,
    }
}

/// Delay before reconnect attempt number `attempt` (0-based): exponential
/// from `min` to `max`, with up to 20 % random jitter so that a fleet does not
/// reconnect in lock step; never more than `max`. The same policy as the
/// transports' own reconnects ([`Backoff`]).
pub fn backoff(attempt: u32, min: Duration, max: Duration) -> Duration {
    Backoff::new(min, max).delay(attempt)
}
