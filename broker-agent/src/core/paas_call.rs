//! What a machine asks of the PaaS adapter ([`PaasCall`]) and what comes
//! back ([`PaasResult`]): the core names the district change, the driver runs
//! it through [`crate::paas::PaasAdapter`] and hands the answer back with the
//! operation's call tag, like a handler's.

use crate::paas::{Operation, Outcome, PaasAdapter};

/// A district change for the driver to run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PaasCall {
    /// `add-node`: a new, empty, undistricted node joins `district`.
    AddNode {
        /// The district's UUID.
        district: String,
        /// The node's server identity.
        host: String,
        /// The node's profile (add-node checks it against the district's).
        profile: String,
    },
    /// `activate-node`: an operator returns a node to service.
    Activate {
        /// The district's UUID.
        district: String,
        /// The node's server identity.
        host: String,
    },
}

/// The adapter's answer; `Err` when the command could not be run at all
/// (a value the tool may not receive, a tool that cannot start).
pub type PaasResult = Result<Outcome, String>;

impl PaasCall {
    /// The adapter operation, for logs and metrics.
    pub fn operation(&self) -> Operation {
        match self {
            PaasCall::AddNode { .. } => Operation::AddNode,
            PaasCall::Activate { .. } => Operation::Activate,
        }
    }

    /// Runs the call through `paas`.
    pub async fn run(&self, paas: &dyn PaasAdapter) -> PaasResult {
        let r = match self {
            PaasCall::AddNode {
                district,
                host,
                profile,
            } => paas.add_node(district, host, profile).await,
            PaasCall::Activate { district, host } => paas.activate(district, host).await,
        };
        r.map_err(|e| e.to_string())
    }
}
