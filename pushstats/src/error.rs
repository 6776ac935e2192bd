//! [`PushError`]: every way a push can fail, classified once where the
//! answer is read, so that the [`Pusher`](crate::Pusher) retries by
//! [`PushError::is_retryable`] and never by reading text.

use std::path::PathBuf;

use gearshift_cloud::CloudError;
use thiserror::Error;

/// A failed push (or a refusal to build one).
#[derive(Debug, Clone, Error)]
pub enum PushError {
    /// The configuration or the arguments are wrong: an operator must fix them.
    #[error("push-stats configuration: {0}")]
    Config(String),
    /// A credentials file is missing or malformed.
    #[error("credentials{}: {reason}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Credentials {
        /// The file, when one was read.
        path: Option<PathBuf>,
        /// Why.
        reason: String,
    },
    /// A sample cannot be sent as it is (a NaN value, a name too long, ...).
    #[error("invalid sample {name:?}: {reason}")]
    InvalidSample {
        /// The metric name.
        name: String,
        /// Why.
        reason: String,
    },
    /// No HTTP answer: connection refused or reset, DNS, TLS, timeout.
    #[error("{target}: {message}")]
    Transport {
        /// Which target (`cloudwatch`, `gnocchi`).
        target: &'static str,
        /// What went wrong.
        message: String,
    },
    /// The API answered with an error.
    #[error("{target}: HTTP {status}{}: {message}", code.as_ref().map(|c| format!(" {c}")).unwrap_or_default())]
    Api {
        /// Which target.
        target: &'static str,
        /// HTTP status.
        status: u16,
        /// The API's error code (CloudWatch `<Code>`), when it gave one.
        code: Option<String>,
        /// The API's message, bounded.
        message: String,
        /// Whether the same request may succeed later (5xx, 429, throttling).
        retryable: bool,
        /// The credentials or the signature were refused.
        auth: bool,
    },
    /// Getting a Keystone token (for Gnocchi) failed.
    #[error("gnocchi: keystone: {0}")]
    Cloud(#[from] CloudError),
    /// The answer did not have the documented shape.
    #[error("{target}: unexpected response: {message}")]
    Decode {
        /// Which target.
        target: &'static str,
        /// What did not fit.
        message: String,
    },
    /// The one-off queue is full: the sample was dropped (and counted).
    #[error("push queue full: dropped")]
    QueueFull,
    /// The pusher has stopped.
    #[error("the pusher has stopped")]
    Stopped,
}

impl PushError {
    /// Whether the same push may succeed later without an operator.
    pub fn is_retryable(&self) -> bool {
        match self {
            PushError::Transport { .. } => true,
            PushError::Api { retryable, .. } => *retryable,
            PushError::Cloud(e) => e.is_retryable(),
            PushError::Config(_)
            | PushError::Credentials { .. }
            | PushError::InvalidSample { .. }
            | PushError::Decode { .. }
            | PushError::QueueFull
            | PushError::Stopped => false,
        }
    }

    /// Whether the operator's input is at fault (configuration, options,
    /// credentials file, a bad value): the CLI exits with a usage error.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            PushError::Config(_) | PushError::Credentials { .. } | PushError::InvalidSample { .. }
        )
    }

    /// Whether credentials, a token or a signature were refused.
    pub fn is_auth(&self) -> bool {
        match self {
            PushError::Api { auth, .. } => *auth,
            PushError::Credentials { .. } => true,
            PushError::Cloud(e) => matches!(e.status(), Some(401 | 403)),
            _ => false,
        }
    }

    /// The HTTP status, when the API answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            PushError::Api { status, .. } => Some(*status),
            PushError::Cloud(e) => e.status(),
            _ => None,
        }
    }
}

/// Longest error message kept from a response.
pub const MAX_MESSAGE: usize = 512;

/// Truncates `s` to [`MAX_MESSAGE`] bytes on a character boundary.
pub(crate) fn bounded(s: &str) -> String {
    let s = s.trim();
    if s.len() <= MAX_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        let api = |status, retryable, auth| PushError::Api {
            target: "cloudwatch",
            status,
            code: Some("X".into()),
            message: "m".into(),
            retryable,
            auth,
        };
        assert!(api(503, true, false).is_retryable());
        assert!(!api(403, false, true).is_retryable());
        assert!(api(403, false, true).is_auth());
        assert_eq!(api(400, false, false).status(), Some(400));
        assert!(
            PushError::Transport {
                target: "gnocchi",
                message: "refused".into()
            }
            .is_retryable()
        );
        assert!(!PushError::Config("x".into()).is_retryable());
        assert!(!PushError::QueueFull.is_retryable());
        assert!(api(400, false, false).to_string().contains("HTTP 400 X: m"));
    }

    #[test]
    fn bounded_messages() {
        let s = "é".repeat(MAX_MESSAGE);
        assert!(bounded(&s).len() <= MAX_MESSAGE + 3);
    }
}
