//! Pull mode's HTTP: `gearshift_cloud::http`'s client (TLS, timeouts,
//! bounded bodies), following no redirect, and its transport failures as
//! [`PushError::Transport`].

use std::path::PathBuf;
use std::time::Duration;

use gearshift_cloud::CloudError;
use gearshift_cloud::http::{HttpClient, HttpOptions};

use crate::error::{PushError, bounded};

/// A client with a whole-request `timeout` (and a connect timeout of at
/// most 10 s), trusting `cacert` beside the system roots, verifying
/// nothing when `insecure`.
pub(crate) fn client(
    timeout: Duration,
    cacert: Option<PathBuf>,
    insecure: bool,
) -> Result<HttpClient, PushError> {
    HttpClient::new(&HttpOptions {
        cacert,
        insecure,
        timeout,
        connect_timeout: timeout.min(Duration::from_secs(10)),
        follow_redirects: false,
        ..HttpOptions::default()
    })
    .map_err(|e| PushError::Config(e.to_string()))
}

/// A request that got no answer (or an unreadable one): retryable.
pub(crate) fn transport(target: &'static str, e: CloudError) -> PushError {
    let message = match e {
        CloudError::Transport { message, .. } | CloudError::Decode { message, .. } => message,
        other => other.to_string(),
    };
    PushError::Transport {
        target,
        message: bounded(&message),
    }
}
