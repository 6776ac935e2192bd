//! Heat (orchestration API v1) and Heat signals.
//!
//! Calls (paths under the catalog's `orchestration` endpoint, which ends in
//! `/v1/{tenant_id}`):
//! - `GET stacks/{name}[/{id}]`: a stack and its status
//!   ([`Heat::get_stack`]; Heat answers `302` from the name-only form to the
//!   full one, which we follow on the same origin).
//! - `PATCH stacks/{name}/{id}` with `{"parameters": {...}}`: an update that
//!   keeps the template and other parameters ([`Heat::patch_stack`]),
//!   answered `202`. [`Heat::wait_update`] then waits for `UPDATE_COMPLETE`.
//! - `GET stacks/{name}/{id}/resources?nested_depth=N`: resources of the
//!   stack and its nested stacks ([`Heat::list_resources`]).
//! - `PATCH stacks/{name}/{id}/resources/{resource}` with
//!   `{"mark_unhealthy": true, "resource_status_reason": "..."}`
//!   ([`Heat::mark_unhealthy`]).
//! - `POST stacks/{name}/{id}/resources/{resource}/signal`
//!   ([`Heat::signal_resource`]), and a full `signal_url` with a token
//!   ([`post_signal_url`]).
//! - A pre-signed `alarm_url` (heat-api-cfn EC2-signed URL, or a Heat
//!   native pre-signed URL) is POSTed without a token ([`post_alarm_url`]).
//!
//! Before acting on a stack, [`ensure_settled`] refuses with
//! [`CloudError::Busy`] while it is `*_IN_PROGRESS` and with
//! [`CloudError::Failed`] while it is `*_FAILED` (an operator must look).

use std::collections::BTreeMap;
use std::time::Duration;

use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};
use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::auth::Session;
use crate::error::{CloudError, Service, bounded, heat_reason_names_quota};
use crate::http::{HttpClient, Response, check};

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

    fn path(&self) -> String {
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

/// One resource from `GET .../resources`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Resource {
    /// Name within its stack (a group member's name is its index or id).
    pub resource_name: String,
    /// Type (`OS::Nova::Server`, ...).
    #[serde(default)]
    pub resource_type: String,
    /// The underlying object's id (a Nova server id, a nested stack id, ...).
    #[serde(default)]
    pub physical_resource_id: String,
    /// `CREATE_COMPLETE`, `CHECK_FAILED`, ...
    #[serde(default)]
    pub resource_status: String,
    /// Reason for the status.
    #[serde(default)]
    pub resource_status_reason: Option<String>,
    /// Name of the resource in the parent stack that owns this resource's
    /// stack (set for resources of nested stacks).
    #[serde(default)]
    pub parent_resource: Option<String>,
    /// `self` and `stack` links.
    #[serde(default)]
    pub links: Vec<Link>,
}

/// A link in a Heat answer.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Link {
    /// URL.
    pub href: String,
    /// `self`, `stack`, `nested`, ...
    pub rel: String,
}

impl Resource {
    /// The stack this resource belongs to, from its `stack` link
    /// (`.../stacks/{name}/{id}`).
    pub fn owning_stack(&self) -> Option<StackId> {
        let href = &self.links.iter().find(|l| l.rel == "stack")?.href;
        let path = url::Url::parse(href).ok()?.path().to_string();
        let mut parts = path.trim_end_matches('/').rsplit('/');
        let id = parts.next()?;
        let name = parts.next()?;
        let stacks = parts.next()?;
        (stacks == "stacks").then(|| StackId {
            name: percent_encoding::percent_decode_str(name)
                .decode_utf8_lossy()
                .into_owned(),
            id: id.to_string(),
        })
    }
}

/// Heat API client.
#[derive(Debug, Clone)]
pub struct Heat {
    session: Session,
}

impl Heat {
    /// A client on this session.
    pub fn new(session: Session) -> Self {
        Heat { session }
    }

    /// The session.
    pub fn session(&self) -> &Session {
        &self.session
    }

    /// Gets a stack by `name` or `name/id`.
    pub async fn get_stack(&self, stack: &str) -> Result<Stack, CloudError> {
        let path = match stack.split_once('/') {
            Some((n, i)) => format!("stacks/{}/{}", seg(n), seg(i)),
            None => format!("stacks/{}", seg(stack)),
        };
        let resp = self
            .session
            .request(Service::Orchestration, Method::GET, &path, &[], None)
            .await?;
        #[derive(Deserialize)]
        struct Body {
            stack: Stack,
        }
        let body: Body = resp.json(Service::Orchestration, &path)?;
        Ok(body.stack)
    }

    /// `PATCH stacks/{name}/{id}`: an update that keeps everything not in
    /// `body` (`{"parameters": {...}}`, optionally `timeout_mins`, ...).
    pub async fn patch_stack(&self, stack: &StackId, body: &Value) -> Result<(), CloudError> {
        self.session
            .request(
                Service::Orchestration,
                Method::PATCH,
                &stack.path(),
                &[],
                Some(body),
            )
            .await?;
        Ok(())
    }

    /// Lists the stack's resources, `nested_depth` levels of nested stacks deep.
    pub async fn list_resources(
        &self,
        stack: &StackId,
        nested_depth: u32,
    ) -> Result<Vec<Resource>, CloudError> {
        let path = format!("{}/resources?nested_depth={nested_depth}", stack.path());
        let resp = self
            .session
            .request(Service::Orchestration, Method::GET, &path, &[], None)
            .await?;
        #[derive(Deserialize)]
        struct Body {
            resources: Vec<Resource>,
        }
        let body: Body = resp.json(Service::Orchestration, &path)?;
        Ok(body.resources)
    }

    /// Marks `resource` of `stack` unhealthy, so the next update of its
    /// group replaces or (on scale-down) removes exactly it. Returns Heat's
    /// (accepted) answer.
    pub async fn mark_unhealthy(
        &self,
        stack: &StackId,
        resource: &str,
        reason: &str,
    ) -> Result<Response, CloudError> {
        let body = mark_unhealthy_body(reason);
        self.session
            .request(
                Service::Orchestration,
                Method::PATCH,
                &mark_unhealthy_path(stack, resource),
                &[],
                Some(&body),
            )
            .await
    }

    /// Signals `resource` (a scaling policy, a wait condition) with the
    /// token. Returns Heat's (accepted) answer.
    pub async fn signal_resource(
        &self,
        stack: &StackId,
        resource: &str,
        details: Option<&Value>,
    ) -> Result<Response, CloudError> {
        let path = format!("{}/resources/{}/signal", stack.path(), seg(resource));
        self.session
            .request(Service::Orchestration, Method::POST, &path, &[], details)
            .await
    }

    /// Polls the stack until its update (one that began after `before`,
    /// the `updated_time` read before the PATCH) is `UPDATE_COMPLETE`.
    /// `UPDATE_FAILED` and rollbacks are [`CloudError::Failed`] (quota
    /// flagged from the reason); `timeout` gives [`CloudError::Timeout`].
    pub async fn wait_update(
        &self,
        stack: &StackId,
        before: Option<&str>,
        timeout: Duration,
        poll: Duration,
    ) -> Result<Stack, CloudError> {
        let start = tokio::time::Instant::now();
        loop {
            let s = self.get_stack(&stack.to_string()).await?;
            let last = s.stack_status.clone();
            let new_update = s.updated_time.as_deref() != before || before.is_none();
            match s.stack_status.as_str() {
                "UPDATE_COMPLETE" if new_update => return Ok(s),
                "UPDATE_FAILED" | "ROLLBACK_COMPLETE" | "ROLLBACK_FAILED" if new_update => {
                    let reason = s.stack_status_reason.clone().unwrap_or_default();
                    return Err(CloudError::Failed {
                        what: format!("stack {}", s.stack_name),
                        state: s.stack_status.clone(),
                        quota: heat_reason_names_quota(&reason),
                        reason: bounded(&reason),
                    });
                }
                _ => {}
            }
            if start.elapsed() >= timeout {
                return Err(CloudError::Timeout {
                    what: format!("stack {stack} to reach UPDATE_COMPLETE"),
                    waited: timeout,
                    last_state: last,
                });
            }
            tracing::debug!(stack = %stack, status = %last, "waiting for the stack update");
            tokio::time::sleep(poll.min(timeout.saturating_sub(start.elapsed()))).await;
        }
    }
}

/// The path (under the orchestration endpoint) that marks `resource` of
/// `stack` unhealthy.
pub fn mark_unhealthy_path(stack: &StackId, resource: &str) -> String {
    format!("{}/resources/{}", stack.path(), seg(resource))
}

/// The body that marks a resource unhealthy, with Heat's reason.
pub fn mark_unhealthy_body(reason: &str) -> Value {
    json!({ "mark_unhealthy": true, "resource_status_reason": reason })
}

/// POSTs a Heat `signal_url` (a resource's signal URL) with the session's
/// token; `details` becomes the JSON body when given. Returns Heat's
/// (accepted) answer.
pub async fn post_signal_url(
    session: &Session,
    signal_url: &str,
    details: Option<&Value>,
) -> Result<Response, CloudError> {
    check_http_url(signal_url)?;
    session
        .request(
            Service::Orchestration,
            Method::POST,
            signal_url,
            &[],
            details,
        )
        .await
}

/// POSTs a pre-signed `alarm_url` (a scaling policy's URL, signed for
/// heat-api-cfn or Heat's pre-signed native form). No token is sent: the
/// signature in the query string is the authorization. Returns Heat's
/// (accepted) answer.
pub async fn post_alarm_url(
    http: &HttpClient,
    alarm_url: &str,
    details: Option<&Value>,
) -> Result<Response, CloudError> {
    check_http_url(alarm_url)?;
    let resp = http
        .send(
            Service::Orchestration,
            Method::POST,
            alarm_url,
            &[],
            details,
        )
        .await?;
    check(Service::Orchestration, &Method::POST, alarm_url, resp)
}

fn check_http_url(u: &str) -> Result<(), CloudError> {
    match url::Url::parse(u) {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        _ => Err(CloudError::Config(format!(
            "{:?} is not an http(s) URL",
            crate::http::redact_url(u)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
