//! [`HeatSignaller`]: the node's Heat signals, sent with `gearshift-cloud`'s
//! Heat client (the one the broker agent's `heat` handler uses).
//!
//! | action | request |
//! | --- | --- |
//! | `scale_up`, `scale_down` | `POST <alarm_url>` (the policy's pre-signed URL; no token, no body) |
//! | `signal` | `POST <signal_url>` with `X-Auth-Token` and a JSON body (`{"host": <node>, "reason": <reason>}` unless `heat.signal_body` says otherwise) |
//! | `mark_unhealthy` | `PATCH <heat>/stacks/{stack_name}/{stack_id}/resources/{member}` with `X-Auth-Token` and `{"mark_unhealthy": true, "resource_status_reason": <reason>}` |
//!
//! Tokens come from Keystone v3 (`POST /v3/auth/tokens`, password or
//! application credential), with credentials from the `OS_*` variables,
//! the seeds' `auth.env` file or a `clouds.yaml` entry; the Heat endpoint
//! is the catalog's `orchestration` entry unless `heat.endpoint` overrides it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use gearshift_cloud::heat::{
    Heat, StackId, mark_unhealthy_body, mark_unhealthy_path, post_alarm_url, post_signal_url,
};
use gearshift_cloud::http::{HttpClient, HttpOptions, Response, redact_url};
use gearshift_cloud::{CloudError, Credentials, CredentialsFrom, Session, SessionOptions};
use gearshift_proto::msg::HeatAction;
use serde_json::{Value, json};

use super::{SignalError, SignalOutcome, Signaller};
use crate::config::{CredentialSource, HeatSection, NodeConfig, RemoveAction};

/// Sends the configured Heat actions.
pub struct HeatSignaller {
    node: String,
    /// For pre-signed alarm URLs, which need no credentials.
    http: HttpClient,
    /// For the actions that need a token; the credentials' problem otherwise.
    heat: Result<Heat, String>,
    scale_up_url: Option<String>,
    scale_down_url: Option<String>,
    signal_url: Option<String>,
    signal_body: Option<String>,
    stack: Option<StackId>,
    member: String,
}

impl std::fmt::Debug for HeatSignaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeatSignaller")
            .field("node", &self.node)
            .field("session", &self.heat.as_ref().map(|_| "ok"))
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

/// What Heat answered, as the node reports it: the status and the body
/// (at most 1 KiB), or the status's name for an empty body.
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

/// Where `[heat]` takes credentials from.
fn credentials(heat: &HeatSection) -> Result<Credentials, CloudError> {
    let from = match heat.credentials {
        CredentialSource::Env => CredentialsFrom::Env,
        CredentialSource::AuthEnv => match &heat.auth_env {
            Some(path) => CredentialsFrom::EnvFile(path),
            None => return Err(CloudError::Config("heat.auth_env is not set".into())),
        },
        CredentialSource::CloudsYaml => CredentialsFrom::CloudsYaml {
            cloud: heat.cloud.as_deref().unwrap_or_default(),
            path: heat.clouds_yaml.as_deref(),
        },
    };
    Credentials::load(from)
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
        let mut overrides = BTreeMap::new();
        if let Some(ep) = &heat.endpoint {
            overrides.insert("orchestration".to_string(), ep.clone());
        }
        let options = SessionOptions {
            http: http_opts,
            endpoint_overrides: overrides,
            ..SessionOptions::default()
        };
        let heat_client = credentials(heat)
            .and_then(|c| Session::new(c, options))
            .map(Heat::new)
            .map_err(|e| e.to_string());
        Ok(HeatSignaller {
            node: node.to_string(),
            http,
            heat: heat_client,
            scale_up_url: heat.scale_up_url.clone(),
            scale_down_url: heat.scale_down_url.clone(),
            signal_url: heat.signal_url.clone(),
            signal_body: heat.signal_body.clone(),
            stack: heat
                .stack_name
                .clone()
                .zip(heat.stack_id.clone())
                .map(|(name, id)| StackId { name, id }),
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
            && let Err(e) = &self.heat
        {
            return Err(format!(
                "{} needs Keystone credentials: {e}",
                action.as_str()
            ));
        }
        Ok(())
    }

    fn heat(&self, action: HeatAction) -> Result<&Heat, SignalError> {
        self.heat.as_ref().map_err(|e| {
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

    fn alarm_url(&self, action: HeatAction) -> &str {
        let url = match action {
            HeatAction::ScaleUp => &self.scale_up_url,
            _ => &self.scale_down_url,
        };
        url.as_deref().unwrap_or_default()
    }

    fn stack(&self) -> StackId {
        self.stack.clone().unwrap_or(StackId {
            name: String::new(),
            id: String::new(),
        })
    }

    /// The request `action` would send, for `heat-signal --dry-run`
    /// (pre-signed query strings and tokens are not shown).
    pub fn describe(&self, action: HeatAction, reason: &str) -> Result<String, SignalError> {
        Ok(match action {
            HeatAction::ScaleUp | HeatAction::ScaleDown => format!(
                "POST {} (pre-signed, no token, no body)",
                redact_url(self.alarm_url(action))
            ),
            HeatAction::Signal => format!(
                "POST {}\nX-Auth-Token: <Keystone token>\nContent-Type: application/json\n\n{}",
                redact_url(self.signal_url.as_deref().unwrap_or_default()),
                self.signal_body(reason)?
            ),
            HeatAction::MarkUnhealthy => format!(
                "PATCH <orchestration endpoint>/{}\nX-Auth-Token: <Keystone token>\nContent-Type: application/json\n\n{}",
                mark_unhealthy_path(&self.stack(), &self.member),
                mark_unhealthy_body(reason)
            ),
        })
    }
}

#[async_trait]
impl Signaller for HeatSignaller {
    async fn signal(&self, action: HeatAction, reason: &str) -> Result<SignalOutcome, SignalError> {
        self.check_configured(action).map_err(SignalError::config)?;
        let resp = match action {
            HeatAction::ScaleUp | HeatAction::ScaleDown => {
                post_alarm_url(&self.http, self.alarm_url(action), None).await
            }
            HeatAction::Signal => {
                let url = self.signal_url.as_deref().unwrap_or_default();
                let body = self.signal_body(reason)?;
                post_signal_url(self.heat(action)?.session(), url, Some(&body)).await
            }
            HeatAction::MarkUnhealthy => {
                self.heat(action)?
                    .mark_unhealthy(&self.stack(), &self.member, reason)
                    .await
            }
        };
        resp.map(|r| outcome(&r)).map_err(to_signal_error)
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
        let seg = gearshift_cloud::heat::seg;
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
