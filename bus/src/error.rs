//! Errors of the bus layer.

use std::time::Duration;

use thiserror::Error;

/// Everything a bus operation can fail with.
///
/// Retry decisions use [`BusError::is_retryable`], never the message text.
#[derive(Debug, Error, Clone)]
pub enum BusError {
    /// The bus URL is not one of the supported forms.
    #[error("invalid bus URL {url:?}: {reason}")]
    Url {
        /// The URL (password removed).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// TLS configuration (CA file, client certificate) could not be loaded.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The connection could not be established or was lost.
    #[error("connection to {endpoint} failed: {reason}")]
    Connect {
        /// host:port
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// The server refused our credentials or virtual host.
    #[error("authentication refused by {endpoint}: {reason}")]
    Auth {
        /// host:port
        endpoint: String,
        /// Server's reason.
        reason: String,
    },
    /// The peer broke the protocol (bad frame, unexpected reply).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The server reported an error for one operation (STOMP ERROR frame, AMQP channel close).
    #[error("server error: {0}")]
    Server(String),
    /// The broker did not confirm a publish (AMQP nack / STOMP missing receipt).
    #[error("publish to {key:?} not confirmed: {reason}")]
    NotConfirmed {
        /// Routing key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The operation did not finish in time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What timed out.
        what: String,
        /// After how long.
        after: Duration,
    },
    /// A message is larger than the transport accepts.
    #[error("message of {size} bytes exceeds the limit of {limit}")]
    TooLarge {
        /// Size.
        size: usize,
        /// Limit.
        limit: usize,
    },
    /// The bus was closed by its owner.
    #[error("bus closed")]
    Closed,
    /// An argument is not acceptable (empty queue name, bad pattern, ...).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl BusError {
    /// Whether trying the same operation again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            BusError::Connect { .. }
            | BusError::NotConfirmed { .. }
            | BusError::Timeout { .. }
            | BusError::Server(_) => true,
            BusError::Url { .. }
            | BusError::Tls(_)
            | BusError::Auth { .. }
            | BusError::Protocol(_)
            | BusError::TooLarge { .. }
            | BusError::Closed
            | BusError::Invalid(_) => false,
        }
    }

    /// A short stable label for metrics.
    pub fn label(&self) -> &'static str {
        match self {
            BusError::Url { .. } => "url",
            BusError::Tls(_) => "tls",
            BusError::Connect { .. } => "connect",
            BusError::Auth { .. } => "auth",
            BusError::Protocol(_) => "protocol",
            BusError::Server(_) => "server",
            BusError::NotConfirmed { .. } => "not_confirmed",
            BusError::Timeout { .. } => "timeout",
            BusError::TooLarge { .. } => "too_large",
            BusError::Closed => "closed",
            BusError::Invalid(_) => "invalid",
        }
    }
}
