//! [`Heat`]: the raw calls, each as real Heat 27 answers it, and the two
//! signal URLs ([`post_signal_url`], [`post_alarm_url`]).

use std::time::Duration;

use reqwest::Method;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::members::Resource;
use super::{Stack, StackId, seg};
use crate::auth::Session;
use crate::error::{
    CloudError, Service, bounded, heat_reason_names_cancel, heat_reason_names_quota,
};
use crate::http::{HttpClient, Response, check, redact_url};

/// Heat API client.
#[derive(Debug, Clone)]
pub struct Heat {
    session: Session,
}

/// One event of `GET .../resources/{r}/events`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Event {
    /// Event id (UUID).
    pub id: String,
    /// `SIGNAL_COMPLETE`, `CREATE_COMPLETE`, ...
    #[serde(default)]
    pub resource_status: String,
    /// For a policy's signal: `alarm state changed from ok to alarm (...)`,
    /// `No signal details provided`, or `Unknown` for other bodies.
    #[serde(default)]
    pub resource_status_reason: Option<String>,
    /// `2026-11-25T14:15:33Z`.
    #[serde(default)]
    pub event_time: Option<String>,
}

/// What `PATCH stacks/{name}/{id}/preview?show_nested=true` says an update
/// would do, by resource. Members of nested stacks carry their group's name
/// in `parent_resource`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct PreviewChanges {
    /// Resources that would be replaced (a new physical resource).
    #[serde(default)]
    pub replaced: Vec<Resource>,
    /// Resources updated in place.
    #[serde(default)]
    pub updated: Vec<Resource>,
    /// Resources added.
    #[serde(default)]
    pub added: Vec<Resource>,
    /// Resources deleted.
    #[serde(default)]
    pub deleted: Vec<Resource>,
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

    async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T, CloudError> {
        let resp = self
            .session
            .request(Service::Orchestration, Method::GET, path, &[], None)
            .await?;
        resp.json(Service::Orchestration, path)
    }

    /// Gets a stack by `name`, `id` or `name/id`.
    pub async fn get_stack(&self, stack: &str) -> Result<Stack, CloudError> {
        let path = match stack.split_once('/') {
            Some((n, i)) => format!("stacks/{}/{}", seg(n), seg(i)),
            None => format!("stacks/{}", seg(stack)),
        };
        #[derive(Deserialize)]
        struct Body {
            stack: Stack,
        }
        Ok(self.get_json::<Body>(&path).await?.stack)
    }

    /// `PATCH stacks/{name}/{id}`: an update that keeps everything not in
    /// `body` (`{"parameters": {...}}`, optionally `timeout_mins`, ...).
    /// Heat's `202` body is an HTML page and is not read. Heat does not
    /// refuse a PATCH while an update runs: check the stack first.
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

    /// What the update `body` would change, nested stacks included.
    pub async fn preview_patch(
        &self,
        stack: &StackId,
        body: &Value,
    ) -> Result<PreviewChanges, CloudError> {
        let path = format!("{}/preview?show_nested=true", stack.path());
        let resp = self
            .session
            .request(
                Service::Orchestration,
                Method::PATCH,
                &path,
                &[],
                Some(body),
            )
            .await?;
        #[derive(Deserialize)]
        struct Body {
            resource_changes: PreviewChanges,
        }
        Ok(resp
            .json::<Body>(Service::Orchestration, &path)?
            .resource_changes)
    }

    /// The stack's template, as Heat stored it (JSON, whatever format it was
    /// given in).
    pub async fn get_template(&self, stack: &StackId) -> Result<Value, CloudError> {
        self.get_json(&format!("{}/template", stack.path())).await
    }

    /// Lists the stack's resources, `nested_depth` levels of nested stacks deep.
    pub async fn list_resources(
        &self,
        stack: &StackId,
        nested_depth: u32,
    ) -> Result<Vec<Resource>, CloudError> {
        #[derive(Deserialize)]
        struct Body {
            resources: Vec<Resource>,
        }
        let path = format!("{}/resources?nested_depth={nested_depth}", stack.path());
        Ok(self.get_json::<Body>(&path).await?.resources)
    }

    /// A resource's metadata (a scaling group's `scaling_in_progress` and
    /// `cooldown_end`).
    pub async fn resource_metadata(
        &self,
        stack: &StackId,
        resource: &str,
    ) -> Result<Value, CloudError> {
        #[derive(Deserialize)]
        struct Body {
            #[serde(default)]
            metadata: Value,
        }
        let path = format!("{}/resources/{}/metadata", stack.path(), seg(resource));
        Ok(self.get_json::<Body>(&path).await?.metadata)
    }

    /// The newest `SIGNAL` events of `resource`, newest first (at most
    /// `limit`). Heat writes one when a signal was handled, and none for a
    /// signal it ignored. When the filter matches no event, Heat 27 answers
    /// `404` `HTTPNotFound` "No events found for resource ..." (a missing
    /// resource is `ResourceNotFound`): that is an empty list.
    pub async fn signal_events(
        &self,
        stack: &StackId,
        resource: &str,
        limit: u32,
    ) -> Result<Vec<Event>, CloudError> {
        #[derive(Deserialize)]
        struct Body {
            events: Vec<Event>,
        }
        let path = format!(
            "{}/resources/{}/events?resource_action=SIGNAL&sort_dir=desc&limit={limit}",
            stack.path(),
            seg(resource)
        );
        match self.get_json::<Body>(&path).await {
            Ok(b) => Ok(b.events),
            Err(e) if e.is_not_found() && e.kind() == Some("HTTPNotFound") => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Marks `resource` of `stack` (the member's own, nested stack)
    /// unhealthy. Heat answers `200` with the body `null`. Alone this
    /// changes nothing: the next update or signal of the group acts on it
    /// (see [`super::removal`]).
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
    /// token. Heat answers `200`, body `null`, before it acts, and also
    /// when it then ignores the signal: see [`super::scaling`].
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
    /// flagged from the reason), except an update another PATCH superseded
    /// ("Stack UPDATE cancelled"), which is [`CloudError::Busy`];
    /// `timeout` gives [`CloudError::Timeout`].
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
                    let what = format!("stack {}", s.stack_name);
                    if heat_reason_names_cancel(&reason) {
                        return Err(CloudError::Busy {
                            what: format!("{what} (another update superseded ours: {reason})"),
                            state: s.stack_status.clone(),
                        });
                    }
                    return Err(CloudError::Failed {
                        what,
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
/// (accepted) answer: `200`, body `null`.
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
/// signature in the query string is the authorization. heat-api-cfn
/// answers `200` with an empty body; a refused signature is XML
/// `AccessDenied` (403) or `IncompleteSignature` (400), returned as
/// [`CloudError::PresignedRefused`].
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
    check(Service::Orchestration, &Method::POST, alarm_url, resp).map_err(|e| match e {
        CloudError::Api {
            status,
            kind: Some(code),
            message,
            ..
        } if matches!(
            code.as_str(),
            "AccessDenied" | "IncompleteSignature" | "SignatureDoesNotMatch"
        ) =>
        {
            CloudError::PresignedRefused {
                url: redact_url(alarm_url),
                status,
                code,
                message,
            }
        }
        other => other,
    })
}

fn check_http_url(u: &str) -> Result<(), CloudError> {
    match url::Url::parse(u) {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        _ => Err(CloudError::Config(format!(
            "{:?} is not an http(s) URL",
            redact_url(u)
        ))),
    }
}
