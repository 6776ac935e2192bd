//! `admin.request` / `admin.reply`: operator commands to the broker agent.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{Validate, check_name, check_opt_name, check_text};

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
    /// Stop scaling decisions for the whole fleet (no `district` and
    /// `profile`) or for one node group. Operations in flight carry on;
    /// every evaluation still explains the group, naming the pause.
    Pause {
        /// The group's district; with `profile`, or neither (the fleet).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        district: Option<String>,
        /// The group's profile; with `district`, or neither (the fleet).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
        /// Why, shown in every explanation while the pause holds.
        #[serde(default)]
        reason: String,
        /// When the pause lifts by itself; none: until `resume`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        until: Option<DateTime<Utc>>,
    },
    /// Lift a pause of the fleet (no `district` and `profile`) or of one group.
    Resume {
        /// The group's district, as paused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        district: Option<String>,
        /// The group's profile, as paused.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        profile: Option<String>,
    },
    /// Take a node out of placement and of scale-down choice (`on`), or put
    /// it back. The node is not deactivated nor removed.
    Cordon {
        /// The node.
        node: String,
        /// Cordon (true) or uncordon.
        on: bool,
        /// Why, shown in the status.
        #[serde(default)]
        reason: String,
    },
    /// Send `cmd.activate` to a node left inactive (and lift its cordon).
    Activate {
        /// The node.
        node: String,
    },
    /// Empty a node; with `keep`, for maintenance: the node is left
    /// inactive and cordoned instead of removed. Without `keep`, as `evacuate`.
    Drain {
        /// The node.
        node: String,
        /// Keep the emptied node (do not remove it).
        #[serde(default)]
        keep: bool,
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

/// A group named by `district` and `profile`: both or neither.
fn check_scope(district: &Option<String>, profile: &Option<String>) -> Result<(), String> {
    if district.is_some() != profile.is_some() {
        return Err("district and profile go together (a group), or neither (the fleet)".into());
    }
    check_opt_name("district", district)?;
    check_opt_name("profile", profile)
}

impl Validate for AdminRequest {
    fn validate(&self) -> Result<(), String> {
        match self {
            AdminRequest::Status => Ok(()),
            AdminRequest::Evacuate { node }
            | AdminRequest::DoNotDisrupt { node, .. }
            | AdminRequest::Activate { node }
            | AdminRequest::Drain { node, .. } => check_name("node", node),
            AdminRequest::Cordon { node, reason, .. } => {
                check_name("node", node)?;
                check_text("reason", reason)
            }
            AdminRequest::Abort { op } => check_name("op", op),
            AdminRequest::Pause {
                district,
                profile,
                reason,
                ..
            } => {
                check_scope(district, profile)?;
                check_text("reason", reason)
            }
            AdminRequest::Resume { district, profile } => check_scope(district, profile),
        }
    }
}
impl Validate for AdminReply {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_controls_have_stable_wire_forms() {
        let p: AdminRequest = serde_json::from_str(
            r#"{"command":"pause","district":"d1","profile":"small","reason":"upgrade","until":"2026-11-22T10:00:00Z"}"#,
        )
        .unwrap();
        assert!(matches!(&p, AdminRequest::Pause { until: Some(_), .. }));
        assert!(p.validate().is_ok());
        let fleet: AdminRequest = serde_json::from_str(r#"{"command":"pause"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&fleet).unwrap(),
            r#"{"command":"pause","reason":""}"#
        );
        let half: AdminRequest =
            serde_json::from_str(r#"{"command":"resume","district":"d1"}"#).unwrap();
        assert!(half.validate().unwrap_err().contains("together"));
        let c: AdminRequest =
            serde_json::from_str(r#"{"command":"cordon","node":"n1","on":true}"#).unwrap();
        assert!(c.validate().is_ok());
        let d: AdminRequest = serde_json::from_str(r#"{"command":"drain","node":"n1"}"#).unwrap();
        assert_eq!(
            d,
            AdminRequest::Drain {
                node: "n1".into(),
                keep: false
            }
        );
        let a = AdminRequest::Activate { node: "".into() };
        assert!(a.validate().is_err());
    }
}
