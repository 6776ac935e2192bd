//! What can go wrong on the broker agent's side of a PaaS operation: a
//! value that may not reach a tool, or a tool that cannot be started. What
//! OpenShift answers, refusals included, is an [`Outcome`](super::Outcome).

use std::io;

use thiserror::Error;

use super::names::Placeholder;

/// A PaaS operation that did not reach OpenShift.
#[derive(Debug, Error)]
pub enum PaasError {
    /// A value for a placeholder is not one the tools accept as given.
    #[error("{placeholder} {value:?} {reason}")]
    BadValue {
        /// Which value.
        placeholder: Placeholder,
        /// The value (its first 80 characters).
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// The tool could not be started.
    #[error("cannot run {program}: {reason}")]
    Spawn {
        /// `argv[0]` of the template.
        program: String,
        /// Why, with the `PATH` searched when the tool was not found.
        reason: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// Waiting for the tool failed (the system lost track of it).
    #[error("waiting for {program}: {source}")]
    Wait {
        /// `argv[0]` of the template.
        program: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

impl PaasError {
    /// Whether the same call may work later without an operator: a missing
    /// or non-executable tool and a refused value never do; a system out of
    /// processes or memory may.
    pub fn is_retryable(&self) -> bool {
        match self {
            PaasError::BadValue { .. } => false,
            PaasError::Spawn { source, .. } => !matches!(
                source.kind(),
                io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
            ),
            PaasError::Wait { .. } => true,
        }
    }
}
