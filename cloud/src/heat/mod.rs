//! Heat (orchestration API v1) and Heat signals, as real Heat 27 answers
//! them (`docs/openstack-conformance.md` is the reference; every behaviour
//! below was measured there).
//!
//! Calls (paths under the catalog's `orchestration` endpoint, which ends in
//! `/v1/{tenant_id}`), in [`Heat`]:
//! - `GET stacks/{name}[/{id}]`: a stack and its status (`302` from the
//!   name-only form to the full one, followed on the same origin).
//! - `PATCH stacks/{name}/{id}` `{"parameters": {...}}`: `202` with an HTML
//!   body (never parsed). Heat answers `202` also while the stack is
//!   `UPDATE_IN_PROGRESS`: the new update supersedes the running one, so
//!   callers check that the stack *and* its group are settled first.
//! - `PATCH stacks/{name}/{id}/preview?show_nested=true`: which resources an
//!   update would replace (the operation id hazard: [`scaling`]).
//! - `GET stacks/{name}/{id}/template`, `GET .../resources?nested_depth=N`,
//!   `GET .../resources/{r}/metadata`, `GET .../resources/{r}/events`.
//! - `PATCH .../resources/{member}` `{"mark_unhealthy": true, ...}` in the
//!   member's own (nested) stack: `200`, body `null`.
//! - `POST .../resources/{policy}/signal` and a full `signal_url` with a
//!   token; a pre-signed `alarm_url` without one: all `200` *before* Heat
//!   does anything, and `200` also when Heat then ignores the signal.
//!
//! Before acting on a stack, [`ensure_settled`] refuses with
//! [`CloudError::Busy`] while it is `*_IN_PROGRESS` and with
//! [`CloudError::Failed`] while it is `*_FAILED` (an operator must look).
//!
//! ## Layout
//! - this file: [`StackId`], [`Stack`], [`ensure_settled`].
//! - `client`: [`Heat`], the raw calls, [`post_signal_url`], [`post_alarm_url`].
//! - [`members`]: resources, and finding a node's group member in a listing.
//! - [`template`]: what a stack's template says about its group and policies
//!   (sizes, the parameters feeding them).
//! - [`scaling`]: scaling signals checked before and confirmed after
//!   (the group's metadata, the policy's events, its members).
//! - [`removal`]: removing exactly one member (mark-unhealthy plus the
//!   update that makes Heat drop it, or `removal_policies`).
//! - [`urls`]: what a pre-signed `alarm_url` or a `signal_url` names.

mod client;
pub mod members;
pub mod removal;
pub mod scaling;
pub mod template;
pub mod urls;

pub use client::{
    Event, Heat, PreviewChanges, mark_unhealthy_body, mark_unhealthy_path, post_alarm_url,
    post_signal_url,
};
pub use members::{GroupKind, Link, MemberKey, MemberRef, Resource};

use std::collections::BTreeMap;

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use serde::Deserialize;
use serde_json::Value;

use crate::error::{CloudError, bounded, heat_reason_names_quota};

/// Characters escaped in one URL path segment.
pub(crate) const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}');

/// Escapes one URL path segment (a stack or resource name).
pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// A stack's identity: its name and id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StackId {
    /// Stack name.
    pub name: String,
    /// Stack id (UUID).
    pub id: String,
}

impl StackId {
    /// Parses `name/id`.
    pub fn parse(s: &str) -> Result<Self, CloudError> {
        match s.split_once('/') {
            Some((n, i)) if !n.is_empty() && !i.is_empty() && !i.contains('/') => Ok(StackId {
                name: n.to_string(),
                id: i.to_string(),
            }),
            _ => Err(CloudError::Config(format!(
                "stack {s:?}: expected <stack_name>/<stack_id>"
            ))),
        }
    }

    /// `stacks/{name}/{id}`, escaped, under the orchestration endpoint.
    pub fn path(&self) -> String {
        format!("stacks/{}/{}", seg(&self.name), seg(&self.id))
    }
}

impl std::fmt::Display for StackId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.name, self.id)
    }
}

/// A stack, as `GET /stacks/{name}/{id}` describes it (the fields we use).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Stack {
    /// Stack id.
    pub id: String,
    /// Stack name.
    pub stack_name: String,
    /// `CREATE_COMPLETE`, `UPDATE_IN_PROGRESS`, `UPDATE_FAILED`, ...
    pub stack_status: String,
    /// Heat's reason for the status.
    #[serde(default)]
    pub stack_status_reason: Option<String>,
    /// Last update time (changes with every update).
    #[serde(default)]
    pub updated_time: Option<String>,
    /// Current parameter values (all strings in Heat's answer).
    #[serde(default)]
    pub parameters: BTreeMap<String, Value>,
    /// Outputs, when Heat includes them.
    #[serde(default)]
    pub outputs: Vec<Value>,
}

impl Stack {
    /// The stack's identity.
    pub fn stack_id(&self) -> StackId {
        StackId {
            name: self.stack_name.clone(),
            id: self.id.clone(),
        }
    }

    /// The status' action part (`UPDATE` of `UPDATE_COMPLETE`).
    pub fn action(&self) -> &str {
        self.stack_status
            .rsplit_once('_')
            .map(|(a, _)| a)
            .unwrap_or(&self.stack_status)
    }

    /// `IN_PROGRESS`, `COMPLETE` or `FAILED`.
    pub fn state(&self) -> &str {
        if self.stack_status.ends_with("_IN_PROGRESS") {
            "IN_PROGRESS"
        } else {
            self.stack_status
                .rsplit_once('_')
                .map(|(_, s)| s)
                .unwrap_or(&self.stack_status)
        }
    }

    /// A parameter as an integer (Heat returns parameter values as strings).
    pub fn int_param(&self, name: &str) -> Option<i64> {
        match self.parameters.get(name)? {
            Value::String(s) => s.trim().parse().ok(),
            Value::Number(n) => n.as_i64(),
            _ => None,
        }
    }
}

/// Refuses to act on a stack that is `*_IN_PROGRESS` ([`CloudError::Busy`])
/// or `*_FAILED` ([`CloudError::Failed`], with `quota` set when the reason
/// names one).
pub fn ensure_settled(stack: &Stack) -> Result<(), CloudError> {
    let what = format!("stack {}", stack.stack_name);
    match stack.state() {
        "IN_PROGRESS" => Err(CloudError::Busy {
            what,
            state: stack.stack_status.clone(),
        }),
        "FAILED" => {
            let reason = stack.stack_status_reason.clone().unwrap_or_default();
            Err(CloudError::Failed {
                what,
                state: stack.stack_status.clone(),
                quota: heat_reason_names_quota(&reason),
                reason: bounded(&reason),
            })
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stack(status: &str, reason: &str) -> Stack {
        serde_json::from_value(json!({
            "id": "3095aefc-09fb-4bc7-b1f0-f21a304e864c",
            "stack_name": "nodes",
            "stack_status": status,
            "stack_status_reason": reason,
            "parameters": {"count": "3"},
        }))
        .unwrap()
    }

    #[test]
    fn settled() {
        assert!(ensure_settled(&stack("CREATE_COMPLETE", "")).is_ok());
        let busy = ensure_settled(&stack("UPDATE_IN_PROGRESS", "")).unwrap_err();
        assert!(busy.is_busy() && busy.is_retryable());
        let failed = ensure_settled(&stack(
            "UPDATE_FAILED",
            "Resource CREATE failed: Forbidden: resources[3]: Quota exceeded for instances",
        ))
        .unwrap_err();
        assert!(failed.is_quota());
        let failed = ensure_settled(&stack("CREATE_FAILED", "image not found")).unwrap_err();
        assert!(!failed.is_quota() && !failed.is_retryable());
        assert_eq!(stack("CHECK_COMPLETE", "").int_param("count"), Some(3));
    }

    #[test]
    fn stack_ids_and_links() {
        assert!(StackId::parse("a/b").is_ok());
        assert!(StackId::parse("a").is_err());
        assert!(StackId::parse("a/b/c").is_err());
        let r: Resource = serde_json::from_value(json!({
            "resource_name": "0",
            "links": [{"href": "http://h:8004/v1/t/stacks/nodes-group-abc/8d1/resources/0", "rel": "self"},
                      {"href": "http://h:8004/v1/t/stacks/nodes-group-abc/8d1", "rel": "stack"}]
        }))
        .unwrap();
        assert_eq!(
            r.owning_stack(),
            Some(StackId {
                name: "nodes-group-abc".into(),
                id: "8d1".into()
            })
        );
    }
}
