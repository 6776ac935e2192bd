//! What each Heat action does against real Heat (`docs/openstack-conformance.md`):
//! scaling signals checked before and confirmed after (Heat answers 200 to
//! every signal, also those it then ignores), and `mark_unhealthy` on this
//! node's own member, found by its server id in the group's nested stack.

use std::time::Duration;

use gearshift_cloud::heat::members::{MemberKey, find_member};
use gearshift_cloud::heat::removal::Removal;
use gearshift_cloud::heat::scaling::{Prepared, SignalTarget};
use gearshift_cloud::heat::urls::signal_url_target;
use gearshift_cloud::heat::{Heat, post_alarm_url, post_signal_url};
use gearshift_cloud::http::{Method, Response};
use gearshift_cloud::{CloudError, Service};
use gearshift_proto::msg::HeatAction;
use serde_json::Value;

use super::signaller::HeatSignaller;
use super::{SignalError, SignalOutcome};

/// Between two looks at the group while confirming a signal.
const CONFIRM_POLL: Duration = Duration::from_secs(1);

pub(super) fn to_signal_error(e: CloudError) -> SignalError {
    SignalError {
        message: e.to_string(),
        http_status: e.status(),
        retryable: e.is_retryable(),
    }
}

/// What Heat answered, as the node reports it: the status and the body (at
/// most 1 KiB) when it is JSON with content, else the status's name (Heat
/// answers `null` to signals and mark-unhealthy, an HTML page to a stack
/// PATCH, nothing to an alarm URL).
pub(super) fn outcome(resp: &Response) -> SignalOutcome {
    let json = resp
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let body = String::from_utf8_lossy(&resp.body);
    let mut detail = body.trim().to_string();
    if !json || detail == "null" {
        detail.clear();
    }
    if detail.len() > 1024 {
        let mut end = 1024;
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        detail.truncate(end);
    }
    if detail.is_empty() {
        detail = resp
            .status
            .canonical_reason()
            .unwrap_or("accepted")
            .to_string();
    }
    SignalOutcome {
        status: resp.status.as_u16(),
        detail,
    }
}

/// Whether a signal can be watched, and how.
enum Watch<'h> {
    Confirm(&'h Heat, SignalTarget, Box<Prepared>),
    Unconfirmed(String),
}

impl HeatSignaller {
    /// `scale_up`, `scale_down` (`alarm_url`) and `signal` (`signal_url`):
    /// checked, sent, and confirmed started within `confirm_timeout`.
    pub(super) async fn scale_signal(
        &self,
        action: HeatAction,
        url: &str,
        body: Option<&Value>,
    ) -> Result<SignalOutcome, SignalError> {
        let watch = self.watch(url).await?;
        let resp = match action {
            HeatAction::Signal => post_signal_url(self.heat(action)?.session(), url, body).await,
            _ => post_alarm_url(&self.http, url, body).await,
        }
        .map_err(to_signal_error)?;
        let mut out = outcome(&resp);
        match watch {
            Watch::Confirm(heat, target, prepared) => {
                let poll = CONFIRM_POLL.min(self.confirm);
                heat.confirm_signal(&target, &prepared, self.confirm, None, poll)
                    .await
                    .map_err(to_signal_error)?;
                out.detail = format!(
                    "{}; Heat started scaling {target} from {} members",
                    out.detail,
                    prepared.before.members.len()
                );
            }
            Watch::Unconfirmed(why) => {
                out.detail = format!("{} (not confirmed: {why})", out.detail)
            }
        }
        Ok(out)
    }

    async fn watch(&self, url: &str) -> Result<Watch<'_>, SignalError> {
        if self.confirm.is_zero() {
            return Ok(Watch::Unconfirmed("heat.confirm_timeout is 0s".into()));
        }
        let Ok(heat) = &self.heat else {
            return Ok(Watch::Unconfirmed(
                "no Keystone credentials to watch the group".into(),
            ));
        };
        let Some((stack, resource)) = signal_url_target(url) else {
            return Ok(Watch::Unconfirmed("the URL names no stack resource".into()));
        };
        let Some(target) = heat
            .signal_target(&stack, &resource)
            .await
            .map_err(to_signal_error)?
        else {
            return Ok(Watch::Unconfirmed(format!(
                "{resource} is not a scaling policy"
            )));
        };
        let prepared = heat
            .prepare_signal(&target)
            .await
            .map_err(to_signal_error)?;
        Ok(Watch::Confirm(heat, target, Box::new(prepared)))
    }

    /// This node's server id: configured, else Nova's metadata service.
    async fn own_server_id(&self) -> Result<String, SignalError> {
        if let Some(id) = &self.server_id {
            return Ok(id.clone());
        }
        let url = self.metadata_url.as_str();
        let resp = self
            .http
            .send(Service::Compute, Method::GET, url, &[], None)
            .await
            .and_then(|r| gearshift_cloud::http::check(Service::Compute, &Method::GET, url, r))
            .map_err(to_signal_error)?;
        let v: Value = resp.json(Service::Compute, url).map_err(to_signal_error)?;
        v.get("uuid")
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| SignalError::config(format!("{url} has no uuid: set heat.server_id")))
    }

    /// `mark_unhealthy`: find this node's member, mark it, and (with
    /// `mark_unhealthy_removes`) start the update that removes exactly it.
    /// It does not wait for that update: Heat is deleting this very node.
    pub(super) async fn mark_own_member(&self, reason: &str) -> Result<SignalOutcome, SignalError> {
        let heat = self.heat(HeatAction::MarkUnhealthy)?;
        let stack = self.stack.clone().ok_or_else(|| {
            SignalError::config("mark_unhealthy needs heat.stack_name and heat.stack_id")
        })?;
        let server_id;
        let key = match &self.member {
            Some(m) => MemberKey::Name(m),
            None => {
                server_id = self.own_server_id().await?;
                MemberKey::PhysicalId(&server_id)
            }
        };
        let resources = heat
            .list_resources(&stack, 2)
            .await
            .map_err(to_signal_error)?;
        let member =
            find_member(&resources, key, self.group.as_deref()).map_err(to_signal_error)?;
        let name = member.member.resource_name.clone();
        if !self.removes {
            let resp = heat
                .mark_unhealthy(&member.nested, &name, reason)
                .await
                .map_err(to_signal_error)?;
            let mut out = outcome(&resp);
            out.detail = format!(
                "{}; marked member {name} of group {} unhealthy",
                out.detail, member.group
            );
            return Ok(out);
        }
        let how = Removal {
            mark_resource_group: true,
            reason: reason.to_string(),
            ..Removal::default()
        };
        let done = heat
            .remove_member(&member, &how, None)
            .await
            .map_err(to_signal_error)?;
        let detail = match done.plan {
            Some(p) => format!(
                "member {name} of group {}: {}; Heat is removing it",
                member.group, p.summary
            ),
            None => format!("member {name} of group {} is already gone", member.group),
        };
        Ok(SignalOutcome {
            status: 202,
            detail,
        })
    }
}
