//! One AMQP connection ("link") and how it is opened: the endpoint (URI,
//! client properties, TLS), the socket connector, the publishing and control
//! channels, loss detection, and the mapping of lapin errors to [`BusError`].

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt;
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::types::FieldTable;
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Channel, Connection, ConnectionProperties, ErrorKind, Event, ExchangeKind};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::error::BusError;
use crate::{BusUrl, ConnectOptions};

/// The one topic exchange of the bus contract.
pub(crate) const EXCHANGE: &str = "gearshift";

/// How often a link double-checks its connection state, in case lapin lost
/// the connection without emitting an error event.
const STATUS_POLL: Duration = Duration::from_millis(500);
/// Largest AMQP frame proposed to the broker (see `Endpoint::new`): AMQP
/// 0-9-1's smallest allowed `frame_max`.
const FRAME_MAX: u32 = 4096;

/// Where and how to connect; built (and validated) once, before any network access.
pub(crate) struct Endpoint {
    uri: AMQPUri,
    /// `host:port`, for errors and logs.
    pub(crate) display: String,
    tls: Option<(RustlsConnector, String)>,
    props: ConnectionProperties,
    connect_timeout: Duration,
}

impl Endpoint {
    /// Validates the URL and options and prepares TLS; no network access.
    pub(crate) fn new(url: &BusUrl, opts: &ConnectOptions) -> Result<Self, BusError> {
        let BusUrl::Amqp {
            url: raw,
            tls,
            host,
            port,
        } = url
        else {
            return Err(BusError::Invalid(format!("not an AMQP URL: {url}")));
        };
        let mut uri: AMQPUri = raw.parse().map_err(|reason: String| BusError::Url {
            url: crate::url::redact(raw),
            reason,
        })?;
        if uri.scheme == AMQPScheme::AMQPS && !tls || uri.scheme == AMQPScheme::AMQP && *tls {
            return Err(BusError::Url {
                url: crate::url::redact(raw),
                reason: "scheme and TLS setting disagree".into(),
            });
        }
        // The options decide the heart-beat; 0 disables it, anything else is at least 1 s.
        let hb = opts.heartbeat.as_secs();
        uri.query.heartbeat = Some(if opts.heartbeat.is_zero() {
            0
        } else {
            hb.clamp(1, u16::MAX as u64) as u16
        });
        // lapin keeps 32 frames of send and 32 of receive buffer, each a ring
        // whose pages become resident as traffic goes round it: at RabbitMQ's
        // default frame_max of 128 KiB that is 8 MiB per connection after a
        // while, more than a node agent's whole memory. The protocol's
        // smallest frame, 4 KiB, carries the same messages (a larger one
        // spans several body frames) in 256 KiB. A frame_max in the URL wins.
        if uri.query.frame_max.is_none() {
            uri.query.frame_max = Some(FRAME_MAX);
        }
        let tls = if *tls {
            let config = crate::tls::client_config(&opts.tls)?;
            // Checked here; the connector takes the name as text.
            crate::tls::server_name(host, &opts.tls)?;
            let name = opts.tls.server_name.clone().unwrap_or_else(|| host.clone());
            Some((RustlsConnector::from(config), name))
        } else {
            None
        };
        let props = ConnectionProperties::default().with_connection_name(opts.name.clone().into());
        Ok(Endpoint {
            uri,
            display: format!("{host}:{port}"),
            tls,
            props,
            connect_timeout: opts.connect_timeout,
        })
    }

    /// Opens one connection (TCP, optional TLS, AMQP handshake).
    pub(crate) async fn open(&self) -> Result<Connection, BusError> {
        let runtime = lapin::runtime::default_runtime().map_err(|e| self.connect_error(&e))?;
        let tls = self.tls.clone();
        let display = self.display.clone();
        let limit = self.connect_timeout;
        let timed_out = move |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{what} took longer than {limit:?}"),
            )
        };
        // Runs on lapin's I/O thread, inside the tokio runtime. Bounded, so
        // that an attempt abandoned by a timeout does not keep that thread.
        let connector = async move |uri: AMQPUri, rt| {
            let host = uri
                .authority
                .host
                .trim_start_matches('[')
                .trim_end_matches(']');
            let addrs = tokio::net::lookup_host((host, uri.authority.port)).await?;
            let mut last: Option<std::io::Error> = None;
            let mut stream = None;
            for addr in addrs {
                match tokio::time::timeout(limit, AsyncTcpStream::connect(&rt, addr)).await {
                    Ok(Ok(s)) => {
                        stream = Some(s);
                        break;
                    }
                    Ok(Err(e)) => last = Some(e),
                    Err(_) => last = Some(timed_out("TCP connect")),
                }
            }
            let stream = match stream {
                Some(s) => s,
                None => {
                    return Err(last
                        .unwrap_or_else(|| {
                            std::io::Error::new(
                                std::io::ErrorKind::NotFound,
                                format!("{display} resolves to no address"),
                            )
                        })
                        .into());
                }
            };
            match &tls {
                Some((connector, name)) => {
                    match tokio::time::timeout(limit, stream.into_rustls(connector, name)).await {
                        Ok(s) => Ok(s?),
                        Err(_) => Err(timed_out("TLS handshake").into()),
                    }
                }
                None => Ok(stream),
            }
        };
        Connection::connector(self.uri.clone(), runtime, connector, self.props.clone())
            .await
            .map_err(|e| self.connect_error(&e))
    }

    /// Maps an error of the connection handshake.
    fn connect_error(&self, e: &lapin::Error) -> BusError {
        let endpoint = self.display.clone();
        match e.kind() {
            ErrorKind::ProtocolError(amqp) => {
                let refused = matches!(
                    amqp.kind(),
                    AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                        | AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED)
                        | AMQPErrorKind::Hard(AMQPHardError::INVALIDPATH)
                );
                if refused {
                    BusError::Auth {
                        endpoint,
                        reason: amqp.to_string(),
                    }
                } else {
                    BusError::Connect {
                        endpoint,
                        reason: amqp.to_string(),
                    }
                }
            }
            ErrorKind::AuthProviderError(reason) => BusError::Auth {
                endpoint,
                reason: reason.clone(),
            },
            // rustls-connector reports handshake and certificate failures as InvalidData.
            ErrorKind::IOError(io)
                if self.tls.is_some()
                    && (crate::tls::is_tls_failure(io).is_some()
                        || io.kind() == std::io::ErrorKind::InvalidData) =>
            {
                BusError::Tls(format!("TLS handshake with {endpoint} failed: {io}"))
            }
            _ => map_error(e, &self.display),
        }
    }
}

/// Maps a lapin error of an established connection to a [`BusError`].
pub(crate) fn map_error(e: &lapin::Error, endpoint: &str) -> BusError {
    let connect = |reason: String| BusError::Connect {
        endpoint: endpoint.to_string(),
        reason,
    };
    match e.kind() {
        ErrorKind::ProtocolError(amqp) => match amqp.kind() {
            // Channel-level: the operation was refused, the connection lives on.
            AMQPErrorKind::Soft(_) => BusError::Server(amqp.to_string()),
            AMQPErrorKind::Hard(_) => connect(amqp.to_string()),
        },
        ErrorKind::ParsingError(_)
        | ErrorKind::SerialisationError(_)
        | ErrorKind::InvalidProtocolVersion(_) => BusError::Protocol(e.to_string()),
        ErrorKind::AuthProviderError(reason) => BusError::Auth {
            endpoint: endpoint.to_string(),
            reason: reason.clone(),
        },
        _ => connect(e.to_string()),
    }
}

/// Whether `e` says the operation never reached the broker because the
/// channel or connection was already unusable (so it is safe to do it again
/// on a fresh channel or connection).
pub(crate) fn not_sent(e: &lapin::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::InvalidChannelState(..)
            | ErrorKind::InvalidConnectionState(_)
            | ErrorKind::InvalidChannel(_)
    )
}

/// One live connection with its long-lived channels.
pub(crate) struct Link {
    /// Counts connections of one bus, from 0.
    pub(crate) generation: u64,
    pub(crate) conn: Connection,
    /// The confirm-mode channel every publish goes through. The lock is held
    /// while a publish is handed to lapin so that confirm sequence numbers are
    /// assigned in the order the frames are written (lapin numbers a publish
    /// before it queues its frames, and two threads could interleave there).
    pub(crate) publisher: Mutex<Option<Channel>>,
    /// Channel for declarations.
    control: Mutex<Option<Channel>>,
    /// Cancelled once the connection is known to be lost.
    pub(crate) lost: CancellationToken,
    reason: StdMutex<Option<String>>,
    pub(crate) endpoint: String,
}

impl Link {
    /// Opens a connection, declares the exchange and puts a channel in confirm mode.
    pub(crate) async fn open(endpoint: &Endpoint, generation: u64) -> Result<Arc<Link>, BusError> {
        let conn = endpoint.open().await?;
        let events = conn.events_listener();
        let map = |e: lapin::Error| map_error(&e, &endpoint.display);
        let setup = async {
            let ch = conn.create_channel().await.map_err(map)?;
            ch.exchange_declare(
                EXCHANGE.into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    durable: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(|e| match map(e) {
                BusError::Server(s) => {
                    BusError::Server(format!("declaring exchange {EXCHANGE:?}: {s}"))
                }
                other => other,
            })?;
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(map)?;
            Ok::<_, BusError>(ch)
        };
        let ch = match setup.await {
            Ok(ch) => ch,
            Err(e) => {
                let _ = tokio::time::timeout(
                    Duration::from_secs(1),
                    conn.close(200, "setup failed".into()),
                )
                .await;
                return Err(e);
            }
        };
        let link = Arc::new(Link {
            generation,
            conn,
            publisher: Mutex::new(Some(ch)),
            control: Mutex::new(None),
            lost: CancellationToken::new(),
            reason: StdMutex::new(None),
            endpoint: endpoint.display.clone(),
        });
        tokio::spawn(watch(Arc::downgrade(&link), link.lost.clone(), events));
        Ok(link)
    }

    /// Marks the link lost (idempotent), remembering the first reason.
    pub(crate) fn mark_lost(&self, reason: &str) {
        if let Ok(mut r) = self.reason.lock()
            && r.is_none()
        {
            *r = Some(reason.to_string());
        }
        self.lost.cancel();
    }

    /// Why the link was lost.
    pub(crate) fn reason(&self) -> String {
        self.reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| "connection lost".into())
    }

    /// Marks the link lost if the connection is no longer connected; true if so.
    pub(crate) fn check_lost(&self) -> bool {
        if !self.conn.status().connected() {
            self.mark_lost("the connection is no longer open");
        }
        self.lost.is_cancelled()
    }

    /// Opens a new channel.
    pub(crate) async fn channel(&self) -> Result<Channel, BusError> {
        match self.conn.create_channel().await {
            Ok(ch) => Ok(ch),
            Err(e) => {
                self.check_lost();
                Err(map_error(&e, &self.endpoint))
            }
        }
    }

    /// The control channel, reopened if the broker closed it after a refused operation.
    pub(crate) async fn control(&self) -> Result<Channel, BusError> {
        let mut slot = self.control.lock().await;
        if let Some(ch) = slot.as_ref()
            && ch.status().connected()
        {
            return Ok(ch.clone());
        }
        let ch = self.channel().await?;
        *slot = Some(ch.clone());
        Ok(ch)
    }

    /// Closes the connection politely (bounded).
    pub(crate) async fn close(&self, within: Duration) {
        self.mark_lost("closed by the application");
        if self.conn.status().connected() {
            let _ = tokio::time::timeout(within, self.conn.close(200, "closing".into())).await;
        }
    }
}

/// Watches a connection's events and state; marks the link lost when it is.
async fn watch(
    link: std::sync::Weak<Link>,
    lost: CancellationToken,
    events: impl futures::Stream<Item = Event> + Send + 'static,
) {
    let mut events = std::pin::pin!(events);
    let mut poll = tokio::time::interval(STATUS_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = lost.cancelled() => return,
            ev = events.next() => match ev {
                Some(Event::Error(e)) => {
                    if let Some(l) = link.upgrade() {
                        l.mark_lost(&e.to_string());
                    }
                    return;
                }
                Some(Event::ConnectionBlocked(reason)) => {
                    tracing::warn!(%reason, "broker blocked the connection (resource alarm): publishes wait");
                }
                Some(Event::ConnectionUnblocked) => tracing::info!("broker unblocked the connection"),
                Some(_) => {}
                None => {
                    if let Some(l) = link.upgrade() {
                        l.mark_lost("connection event stream ended");
                    }
                    return;
                }
            },
            _ = poll.tick() => match link.upgrade() {
                Some(l) => {
                    if l.check_lost() {
                        return;
                    }
                }
                None => return,
            },
        }
    }
}
