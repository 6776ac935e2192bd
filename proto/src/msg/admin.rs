//! `admin.request` / `admin.reply`: operator commands to the broker agent.

use serde::{Deserialize, Serialize};

use super::{Validate, check_name};

/// An operator command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "snake_case")]
pub enum AdminRequest {
    /// Fleet figures and operations in flight.
    Status,
    /// Start a scale-down saga for this node.
    Evacuate {
        /// The node to empty and remove.
        node: String,
    },
    /// Abort an operation; a draining node is re-activated.
    Abort {
        /// The operation id.
        op: String,
    },
    /// Mark or unmark a node do-not-disrupt.
    DoNotDisrupt {
        /// The node.
        node: String,
        /// On or off.
        on: bool,
    },
}

/// The broker agent's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminReply {
    /// Whether the command was accepted.
    pub ok: bool,
    /// A sentence for the operator.
    pub message: String,
    /// Structured data (the status report for `status`, the operation id for `evacuate`).
    #[serde(default)]
    pub data: serde_json::Value,
}

impl Validate for AdminRequest {
    fn validate(&self) -> Result<(), String> {
        match self {
            AdminRequest::Status => Ok(()),
            AdminRequest::Evacuate { node } | AdminRequest::DoNotDisrupt { node, .. } => {
                check_name("node", node)
            }
            AdminRequest::Abort { op } => check_name("op", op),
        }
    }
}
impl Validate for AdminReply {}
