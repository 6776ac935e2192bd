//! One connection's setup: TCP (and TLS), CONNECT/CONNECTED, the broker's
//! flavor, the RabbitMQ exchange probe, and the first connection's retries.
//! The frames and the classification of the answers are [`super::session`]'s.

use std::sync::Arc;

use futures::{SinkExt, StreamExt};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use super::codec::{CodecError, StompCodec};
use super::dest;
use super::frame::{Command, Frame};
use super::parse::{Item, Limits};
use super::session::{self, HeartBeats};
use crate::ConnectOptions;
use crate::backoff::Backoff;
use crate::error::BusError;
use crate::url::StompFlavor;

/// Anything we can speak STOMP over.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A framed connection.
pub(crate) type Conn = Framed<Box<dyn Stream>, StompCodec>;

/// Where and how to connect.
pub(crate) struct Endpoint {
    pub host: String,
    pub port: u16,
    pub login: String,
    pub passcode: String,
    /// The CONNECT `host` header (RabbitMQ: the virtual host; ActiveMQ
    /// ignores it).
    pub host_header: String,
    /// What the URL's `?flavor=` names.
    pub named: Option<StompFlavor>,
    /// The flavor spoken: the named one, or what the first CONNECTED said.
    pub flavor: StompFlavor,
    pub tls: Option<(Arc<rustls::ClientConfig>, ServerName<'static>)>,
    pub opts: ConnectOptions,
    pub limits: Limits,
}

impl Endpoint {
    /// `host:port`.
    pub fn name(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// The error of a connection lost (or never made) for `reason`.
    pub fn lost(&self, reason: impl std::fmt::Display) -> BusError {
        BusError::Connect {
            endpoint: self.name(),
            reason: reason.to_string(),
        }
    }
}

/// A codec failure as a bus error.
pub(crate) fn codec_error(ep: &Endpoint, e: CodecError) -> BusError {
    match e {
        CodecError::Decode(e) => BusError::Protocol(format!("from {}: {e}", ep.name())),
        CodecError::Encode(e) => BusError::Invalid(e.to_string()),
        CodecError::Io(e) => ep.lost(e),
    }
}

/// A connection that answered CONNECT.
pub(crate) struct Opened {
    pub conn: Conn,
    pub hb: HeartBeats,
    /// The broker's flavor, as its `server` header and the URL agree on.
    pub flavor: StompFlavor,
}

/// Opens TCP (and TLS), sends CONNECT and waits for CONNECTED, whose
/// `server` header must not contradict `expect` (the named flavor, or on
/// reconnects the one spoken so far).
pub(crate) async fn establish(
    ep: &Endpoint,
    expect: Option<StompFlavor>,
) -> Result<Opened, BusError> {
    let tcp = TcpStream::connect((ep.host.as_str(), ep.port))
        .await
        .map_err(|e| ep.lost(e))?;
    let _ = tcp.set_nodelay(true);
    let io: Box<dyn Stream> = match &ep.tls {
        None => Box::new(tcp),
        Some((config, name)) => {
            let tls = tokio_rustls::TlsConnector::from(config.clone())
                .connect(name.clone(), tcp)
                .await
                .map_err(|e| match crate::tls::is_tls_failure(&e) {
                    Some(t) => BusError::Tls(format!("handshake with {}: {t}", ep.name())),
                    None => ep.lost(format!("TLS handshake: {e}")),
                })?;
            Box::new(tls)
        }
    };
    let mut conn = Framed::new(io, StompCodec::skipping_oversized(ep.limits));
    let connect =
        session::connect_frame(&ep.host_header, &ep.login, &ep.passcode, ep.opts.heartbeat);
    conn.send(Item::Frame(connect))
        .await
        .map_err(|e| codec_error(ep, e))?;
    loop {
        match conn.next().await {
            Some(Ok(Item::HeartBeat | Item::TooLarge { .. })) => continue,
            Some(Ok(Item::Frame(f))) => {
                let hb = session::check_connected(&f, &ep.name(), ep.opts.heartbeat)
                    .map_err(|e| explain_refusal(ep, e))?;
                let flavor = session::resolve_flavor(expect, f.get("server"), &ep.name())?;
                return Ok(Opened { conn, hb, flavor });
            }
            Some(Err(e)) => return Err(codec_error(ep, e)),
            None => return Err(ep.lost("connection closed before CONNECTED")),
        }
    }
}

/// A refused CONNECT when the URL names ActiveMQ: its `host` header is the
/// URL's host, which RabbitMQ would take for a virtual host.
fn explain_refusal(ep: &Endpoint, e: BusError) -> BusError {
    match e {
        BusError::Auth { endpoint, reason } if ep.named == Some(StompFlavor::ActiveMq) => {
            BusError::Auth {
                endpoint,
                reason: format!(
                    "{reason} (the URL names flavor=activemq, so CONNECT's `host` is {:?}; \
                     if this broker is RabbitMQ, leave ?flavor= out)",
                    ep.host_header
                ),
            }
        }
        other => other,
    }
}

/// Checks that the `gearshift` exchange exists (RabbitMQ): a throw-away
/// subscription on a random key, then its cancellation.
pub(crate) async fn probe_exchange(ep: &Endpoint, conn: &mut Conn) -> Result<(), BusError> {
    let id = format!("probe-{}", uuid::Uuid::new_v4().simple());
    let sub = Frame::new(Command::Subscribe)
        .header("id", id.clone())
        .header(
            "destination",
            format!("/exchange/{}/gearshift.probe.{id}", dest::EXCHANGE),
        )
        .header("receipt", format!("{id}-s"));
    let unsub = Frame::new(Command::Unsubscribe)
        .header("id", id.clone())
        .header("receipt", format!("{id}-u"));
    for f in [sub, unsub] {
        conn.send(Item::Frame(f))
            .await
            .map_err(|e| codec_error(ep, e))?;
    }
    let done = format!("{id}-u");
    loop {
        match conn.next().await {
            Some(Ok(Item::Frame(f))) if f.command == Command::Receipt => {
                if f.get("receipt-id") == Some(done.as_str()) {
                    return Ok(());
                }
            }
            Some(Ok(Item::Frame(f))) if f.command == Command::Error => {
                return Err(BusError::Server(format!(
                    "the topic exchange {:?} is not usable on virtual host {:?} of {} ({}). \
                     RabbitMQ's STOMP adapter does not create exchanges: declare it (topic, \
                     durable), for example with scripts/setup-rabbitmq or by starting an agent \
                     over AMQP",
                    dest::EXCHANGE,
                    ep.host_header,
                    ep.name(),
                    session::error_text(&f)
                )));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(codec_error(ep, e)),
            None => return Err(ep.lost("connection closed while checking the exchange")),
        }
    }
}

/// The first connection: retried with backoff on retryable network errors
/// until `connect_timeout`, failing at once on anything else. It settles the
/// flavor (`ep.flavor`).
pub(crate) async fn first_connection(ep: &mut Endpoint) -> Result<(Conn, HeartBeats), BusError> {
    let deadline = tokio::time::Instant::now() + ep.opts.connect_timeout;
    let mut delays = Backoff::reconnect(&ep.opts).delays();
    loop {
        let r = tokio::time::timeout_at(deadline, async {
            let mut o = establish(ep, ep.named).await?;
            if o.flavor == StompFlavor::RabbitMq {
                probe_exchange(ep, &mut o.conn).await?;
            }
            Ok::<_, BusError>(o)
        })
        .await;
        let e = match r {
            Ok(Ok(o)) => {
                if ep.named.is_none() {
                    tracing::info!(endpoint = %ep.name(), flavor = o.flavor.name(), "STOMP broker flavor detected");
                }
                ep.flavor = o.flavor;
                return Ok((o.conn, o.hb));
            }
            // A missing exchange is a deployment error: say so now.
            Ok(Err(e @ BusError::Server(_))) => return Err(e),
            Ok(Err(e)) if e.is_retryable() => e,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(BusError::Timeout {
                    what: format!("connecting to {}", ep.name()),
                    after: ep.opts.connect_timeout,
                });
            }
        };
        let attempt = delays.taken();
        let delay = delays.next_delay();
        if tokio::time::Instant::now() + delay >= deadline {
            return Err(e);
        }
        tracing::warn!(endpoint = %ep.name(), error = %e, attempt, "STOMP connect failed; retrying");
        tokio::time::sleep(delay).await;
    }
}
