//! Heat signals: the cfn-push-stats role of the PEP.
//!
//! The agent sees only [`Signaller`]; [`signaller::HeatSignaller`] implements it against
//! the real Heat and Keystone APIs with the node's own credentials, through
//! `gearshift-cloud`'s Heat client.
//!
//! ## Layout
//! - this file: [`Signaller`], [`SignalOutcome`], [`SignalError`].
//! - [`signaller`]: [`HeatSignaller`] from `[heat]`, its checks and `--dry-run` text.
//! - `actions`: what each action sends, and how a scaling signal is
//!   confirmed and the node's own member found and removed.

use async_trait::async_trait;
use gearshift_proto::msg::HeatAction;
use thiserror::Error;

/// What Heat answered to a signal it accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignalOutcome {
    /// HTTP status.
    pub status: u16,
    /// Response body or summary.
    pub detail: String,
}

/// A signal that failed.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
#[error("{message}")]
pub struct SignalError {
    /// What went wrong.
    pub message: String,
    /// HTTP status of the failing call (Heat or Keystone), if it got that far.
    pub http_status: Option<u16>,
    /// Whether sending the same signal later may succeed.
    pub retryable: bool,
}

impl SignalError {
    /// A failure before any HTTP exchange (configuration).
    pub fn config(message: impl Into<String>) -> Self {
        SignalError {
            message: message.into(),
            http_status: None,
            retryable: false,
        }
    }
}

/// Sends Heat signals on behalf of this node.
#[async_trait]
pub trait Signaller: Send + Sync + 'static {
    /// Performs `action`; `reason` goes to Heat where the API takes one.
    async fn signal(&self, action: HeatAction, reason: &str) -> Result<SignalOutcome, SignalError>;
}

/// Whether sending `action` twice has the same effect as once. Marking this
/// node's own member unhealthy (and removing it) is: the member is found by
/// this node's server id, so a second run finds it gone or already marked;
/// a scaling signal is not (it would scale twice), so a signal interrupted
/// by a crash is reported failed rather than sent again.
pub fn is_idempotent(action: HeatAction) -> bool {
    matches!(action, HeatAction::MarkUnhealthy)
}

mod actions;
pub mod signaller;

pub use signaller::{HeatSignaller, signaller_from_config};
