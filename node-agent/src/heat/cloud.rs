//! [`HeatSignaller`]: the Heat and Keystone requests, with `gearshift-cloud`.
//!
//! | action | request |
//! | --- | --- |
//! | `scale_up`, `scale_down` | `POST <alarm_url>` (the policy's pre-signed URL; no token, no body) |
//! | `signal` | `POST <signal_url>` with `X-Auth-Token` and a JSON body (`{"host": <node>, "reason": <reason>}` unless `heat.signal_body` says otherwise) |
//! | `mark_unhealthy` | `PATCH <heat>/stacks/{stack_name}/{stack_id}/resources/{member}` with `X-Auth-Token` and `{"mark_unhealthy": true, "resource_status_reason": <reason>}` |
//!
//! Tokens come from Keystone v3 (`POST /v3/auth/tokens`, password or
//! application credential), with credentials from the `OS_*` variables or a
//! `clouds.yaml` entry; the Heat endpoint is the catalog's `orchestration`
//! entry unless `heat.endpoint` overrides it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use gearshift_cloud::http::{HttpClient, HttpOptions, Response, check};
use gearshift_cloud::{CloudError, Credentials, Service, Session, SessionOptions};
use gearshift_proto::msg::HeatAction;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use serde_json::{Value, json};

use super::{SignalError, SignalOutcome, Signaller};
use crate::config::{CredentialSource, HeatSection, NodeConfig, RemoveAction};

/// Characters kept as they are in one URL path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// Sends the configured Heat actions.
pub struct HeatSignaller {
    node: String,
    http: HttpClient,
    session: Result<Session, String>,
    scale_up_url: Option<String>,
    scale_down_url: Option<String>,
    signal_url: Option<String>,
    signal_body: Option<String>,
    stack: Option<(String, String)>,
    member: String,
}

impl std::fmt::Debug for HeatSignaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeatSignaller")
            .field("node", &self.node)
            .field("session", &self.session.as_ref().map(|_| "ok"))
            .field("stack", &self.stack)
            .field("member", &self.member)
            .finish_non_exhaustive()
    }
}

fn to_signal_error(e: CloudError) -> SignalError {
    SignalError {
        message: e.to_string(),
        http_status: e.status(),
        retryable: e.is_retryable(),
    }
}

fn outcome(resp: &Response) -> SignalOutcome {
    let body = String::from_utf8_lossy(&resp.body);
    let mut detail = body.trim().to_string();
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

/// A JSON string's escaped content (no surrounding quotes), for templates.
fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_default();
    quoted[1..quoted.len().saturating_sub(1).max(1)].to_string()
}

impl HeatSignaller {
    /// A signaller for `cfg.heat`, acting for node `node`. Loads credentials
    /// now (no network); a signaller without usable credentials still sends
    /// pre-signed alarm URLs, and reports the credentials problem for the rest.
    pub fn new(heat: &HeatSection, node: &str) -> Result<Self, String> {
        let http_opts = HttpOptions {
            timeout: heat.timeout,
            connect_timeout: heat.timeout.min(std::time::Duration::from_secs(10)),
            ..HttpOptions::default()
        };
        let http = HttpClient::new(&http_opts).map_err(|e| e.to_string())?;
        let creds = match heat.credentials {
            CredentialSource::Env => Credentials::from_env(),
            CredentialSource::AuthEnv => match &heat.auth_env {
                Some(path) => Credentials::from_env_file(path),
                None => Err(gearshift_cloud::CloudError::Config(
                    "heat.auth_env is not set".into(),
                )),
            },
            CredentialSource::CloudsYaml => Credentials::from_clouds_yaml(
                heat.cloud.as_deref().unwrap_or_default(),
                heat.clouds_yaml.as_deref(),
            ),
        };
        let session = creds
            .and_then(|c| {
                let mut overrides = BTreeMap::new();
                if let Some(ep) = &heat.endpoint {
                    overrides.insert("orchestration".to_string(), ep.clone());
                }
                Session::new(
                    c,
                    SessionOptions {
                        http: http_opts.clone(),
                        endpoint_overrides: overrides,
                        ..SessionOptions::default()
                    },
                )
            })
            .map_err(|e| e.to_string());
        Ok(HeatSignaller {
            node: node.to_string(),
            http,
            session,
            scale_up_url: heat.scale_up_url.clone(),
            scale_down_url: heat.scale_down_url.clone(),
            signal_url: heat.signal_url.clone(),
            signal_body: heat.signal_body.clone(),
            stack: heat.stack_name.clone().zip(heat.stack_id.clone()),
            member: heat.member.clone().unwrap_or_else(|| node.to_string()),
        })
    }

    /// Whether `action` needs a Keystone token.
    pub fn needs_token(action: HeatAction) -> bool {
        matches!(action, HeatAction::Signal | HeatAction::MarkUnhealthy)
    }

    /// Checks that `action` is configured (URLs, stack, credentials).
    pub fn check_configured(&self, action: HeatAction) -> Result<(), String> {
        let missing = |what: &str| Err(format!("{} needs {what} in [heat]", action.as_str()));
        match action {
            HeatAction::ScaleUp if self.scale_up_url.is_none() => return missing("scale_up_url"),
            HeatAction::ScaleDown if self.scale_down_url.is_none() => {
                return missing("scale_down_url");
            }
            HeatAction::Signal if self.signal_url.is_none() => return missing("signal_url"),
            HeatAction::MarkUnhealthy if self.stack.is_none() => {
                return missing("stack_name and stack_id");
            }
            _ => {}
        }
        if Self::needs_token(action)
            && let Err(e) = &self.session
        {
            return Err(format!(
                "{} needs Keystone credentials: {e}",
                action.as_str()
            ));
        }
        Ok(())
    }

    fn session(&self, action: HeatAction) -> Result<&Session, SignalError> {
        self.session.as_ref().map_err(|e| {
            SignalError::config(format!(
                "{} needs Keystone credentials: {e}",
                action.as_str()
            ))
        })
    }

    /// The JSON body sent to `signal_url`.
    pub fn signal_body(&self, reason: &str) -> Result<Value, SignalError> {
        match &self.signal_body {
            None => Ok(json!({ "host": self.node, "reason": reason })),
            Some(t) => {
                let text = t
                    .replace("{node}", &json_escape(&self.node))
                    .replace("{reason}", &json_escape(reason));
                serde_json::from_str(&text)
                    .map_err(|e| SignalError::config(format!("heat.signal_body is not JSON: {e}")))
            }
        }
    }

    /// The request `action` would send, for `heat-signal --dry-run`
    /// (pre-signed query strings and tokens are not shown).
    pub fn describe(&self, action: HeatAction, reason: &str) -> Result<String, SignalError> {
        let redact = gearshift_cloud::http::redact_url;
        Ok(match action {
            HeatAction::ScaleUp | HeatAction::ScaleDown => {
                let url = if action == HeatAction::ScaleUp {
                    &self.scale_up_url
                } else {
                    &self.scale_down_url
                };
                format!(
                    "POST {} (pre-signed, no token, no body)",
                    redact(url.as_deref().unwrap_or_default())
                )
            }
            HeatAction::Signal => format!(
                "POST {}\nX-Auth-Token: <Keystone token>\nContent-Type: application/json\n\n{}",
                redact(self.signal_url.as_deref().unwrap_or_default()),
                self.signal_body(reason)?
            ),
            HeatAction::MarkUnhealthy => {
                let (name, id) = self.stack.clone().unwrap_or_default();
                format!(
                    "PATCH <orchestration endpoint>/stacks/{}/{}/resources/{}\nX-Auth-Token: <Keystone token>\nContent-Type: application/json\n\n{}",
                    seg(&name),
                    seg(&id),
                    seg(&self.member),
                    json!({ "mark_unhealthy": true, "resource_status_reason": reason })
                )
            }
        })
    }

    async fn post_alarm(&self, url: &str) -> Result<SignalOutcome, SignalError> {
        let resp = self
            .http
            .send(Service::Orchestration, Method::POST, url, &[], None)
            .await
            .map_err(to_signal_error)?;
        let resp =
            check(Service::Orchestration, &Method::POST, url, resp).map_err(to_signal_error)?;
        Ok(outcome(&resp))
    }
}

#[async_trait]
impl Signaller for HeatSignaller {
    async fn signal(&self, action: HeatAction, reason: &str) -> Result<SignalOutcome, SignalError> {
        self.check_configured(action).map_err(SignalError::config)?;
        match action {
            HeatAction::ScaleUp => {
                self.post_alarm(self.scale_up_url.as_deref().unwrap_or_default())
                    .await
            }
            HeatAction::ScaleDown => {
                self.post_alarm(self.scale_down_url.as_deref().unwrap_or_default())
                    .await
            }
            HeatAction::Signal => {
                let url = self.signal_url.as_deref().unwrap_or_default();
                let body = self.signal_body(reason)?;
                let resp = self
                    .session(action)?
                    .request(Service::Orchestration, Method::POST, url, &[], Some(&body))
                    .await
                    .map_err(to_signal_error)?;
                Ok(outcome(&resp))
            }
            HeatAction::MarkUnhealthy => {
                let (name, id) = self.stack.clone().unwrap_or_default();
                let path = format!(
                    "stacks/{}/{}/resources/{}",
                    seg(&name),
                    seg(&id),
                    seg(&self.member)
                );
                let body = json!({ "mark_unhealthy": true, "resource_status_reason": reason });
                let resp = self
                    .session(action)?
                    .request(
                        Service::Orchestration,
                        Method::PATCH,
                        &path,
                        &[],
                        Some(&body),
                    )
                    .await
                    .map_err(to_signal_error)?;
                Ok(outcome(&resp))
            }
        }
    }
}

/// Whether `[heat]` configures anything at all.
pub fn configured(heat: &HeatSection) -> bool {
    heat.scale_up_url.is_some()
        || heat.scale_down_url.is_some()
        || heat.signal_url.is_some()
        || heat.stack_name.is_some()
        || heat.remove_action != RemoveAction::None
}

/// The signaller the configuration asks for: `None` when `[heat]` is empty;
/// an error when the removal action cannot work (checked at start, not at
/// the moment of removal).
pub fn signaller_from_config(
    cfg: &NodeConfig,
    node: &str,
) -> Result<Option<std::sync::Arc<dyn Signaller>>, String> {
    if !configured(&cfg.heat) {
        return Ok(None);
    }
    let s = HeatSignaller::new(&cfg.heat, node)?;
    if let Some(a) = cfg.heat.remove_action.heat_action() {
        s.check_configured(a)
            .map_err(|e| format!("remove_action: {e}"))?;
    }
    Ok(Some(std::sync::Arc::new(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_and_bodies() {
        assert_eq!(seg("node-1.example.com"), "node-1.example.com");
        assert_eq!(seg("a b/c"), "a%20b%2Fc");
        let heat = HeatSection {
            signal_body: Some(r#"{"node": "{node}", "why": "{reason}", "n": 1}"#.into()),
            ..HeatSection::default()
        };
        let s = HeatSignaller::new(&heat, "n\"1").unwrap();
        assert_eq!(
            s.signal_body("say \"hi\"").unwrap(),
            json!({"node": "n\"1", "why": "say \"hi\"", "n": 1})
        );
        let plain = HeatSignaller::new(&HeatSection::default(), "n1").unwrap();
        assert_eq!(
            plain.signal_body("r").unwrap(),
            json!({"host": "n1", "reason": "r"})
        );
        assert!(plain.check_configured(HeatAction::ScaleUp).is_err());
    }
}
