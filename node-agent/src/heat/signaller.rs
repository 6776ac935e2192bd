//! [`HeatSignaller`]: the node's Heat signals, sent with `gearshift-cloud`'s
//! Heat client (the one the broker agent's `heat` handler uses).
//!
//! | action | requests |
//! | --- | --- |
//! | `scale_up`, `scale_down` | `POST <alarm_url>` (the policy's pre-signed URL; no token, no body); with credentials, checked before and confirmed after ([`gearshift_cloud::heat::scaling`]) |
//! | `signal` | `POST <signal_url>` with `X-Auth-Token` and a JSON body (Aodh's shape unless `heat.signal_body` says otherwise); confirmed the same way when it names a scaling policy |
//! | `mark_unhealthy` | find this node's member (`GET <heat>/stacks/{stack}/resources?nested_depth=2`, by `server_id` or `member`), `PATCH .../stacks/{nested}/resources/{member}` `{"mark_unhealthy": true, "resource_status_reason": <reason>}`, then (with `mark_unhealthy_removes`) the stack PATCH that makes Heat remove exactly it ([`gearshift_cloud::heat::removal`]) |
//!
//! Tokens come from Keystone v3 (`POST /v3/auth/tokens`, password or
//! application credential), with credentials from the `OS_*` variables,
//! the seeds' `auth.env` file or a `clouds.yaml` entry; the Heat endpoint
//! is the catalog's `orchestration` entry unless `heat.endpoint` overrides it.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use gearshift_cloud::heat::{Heat, StackId, mark_unhealthy_body};
use gearshift_cloud::http::{HttpClient, HttpOptions, redact_url};
use gearshift_cloud::{CloudError, Credentials, CredentialsFrom, Session, SessionOptions};
use gearshift_proto::msg::HeatAction;
use serde_json::{Value, json};

use super::{SignalError, SignalOutcome, Signaller};
use crate::config::{CredentialSource, HeatSection, NodeConfig, RemoveAction};

/// Sends the configured Heat actions.
pub struct HeatSignaller {
    pub(super) node: String,
    /// For pre-signed alarm URLs and the metadata service, which need no credentials.
    pub(super) http: HttpClient,
    /// For the actions that need a token; the credentials' problem otherwise.
    pub(super) heat: Result<Heat, String>,
    pub(super) scale_up_url: Option<String>,
    pub(super) scale_down_url: Option<String>,
    pub(super) signal_url: Option<String>,
    signal_body: Option<String>,
    pub(super) stack: Option<StackId>,
    pub(super) group: Option<String>,
    pub(super) member: Option<String>,
    pub(super) server_id: Option<String>,
    pub(super) metadata_url: String,
    pub(super) removes: bool,
    pub(super) confirm: Duration,
}

impl std::fmt::Debug for HeatSignaller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeatSignaller")
            .field("node", &self.node)
            .field("session", &self.heat.as_ref().map(|_| "ok"))
            .field("stack", &self.stack)
            .field("member", &self.member)
            .field("server_id", &self.server_id)
            .finish_non_exhaustive()
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
    /// pre-signed alarm URLs (unconfirmed), and reports the credentials
    /// problem for the rest.
    pub fn new(heat: &HeatSection, node: &str) -> Result<Self, String> {
        let http_opts = HttpOptions {
            timeout: heat.timeout,
            connect_timeout: heat.timeout.min(Duration::from_secs(10)),
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
            group: heat.group_resource.clone(),
            member: heat.member.clone(),
            server_id: heat.server_id.clone(),
            metadata_url: heat.metadata_url.clone(),
            removes: heat.mark_unhealthy_removes,
            confirm: heat.confirm_timeout,
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

    pub(super) fn heat(&self, action: HeatAction) -> Result<&Heat, SignalError> {
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
            None => Ok(json!({
                "previous": "ok",
                "current": "alarm",
                "reason": format!("{}: {reason}", self.node),
                "host": self.node,
            })),
            Some(t) => {
                let text = t
                    .replace("{node}", &json_escape(&self.node))
                    .replace("{reason}", &json_escape(reason));
                serde_json::from_str(&text)
                    .map_err(|e| SignalError::config(format!("heat.signal_body is not JSON: {e}")))
            }
        }
    }

    pub(super) fn alarm_url(&self, action: HeatAction) -> &str {
        let url = match action {
            HeatAction::ScaleUp => &self.scale_up_url,
            _ => &self.scale_down_url,
        };
        url.as_deref().unwrap_or_default()
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
                "GET <orchestration endpoint>/{}/resources?nested_depth=2 (this node's member: {})\n\
                 PATCH <orchestration endpoint>/stacks/<group's nested stack>/resources/<member>\n\
                 X-Auth-Token: <Keystone token>\nContent-Type: application/json\n\n{}{}",
                self.stack.as_ref().map(StackId::path).unwrap_or_default(),
                self.member_description(),
                mark_unhealthy_body(reason),
                if self.removes {
                    "\nthen PATCH the stack so that Heat removes exactly this member"
                } else {
                    ""
                }
            ),
        })
    }

    fn member_description(&self) -> String {
        match (&self.member, &self.server_id) {
            (Some(m), _) => format!("member {m}"),
            (None, Some(id)) => format!("the member holding server {id}"),
            (None, None) => format!(
                "the member holding the server id from {}",
                self.metadata_url
            ),
        }
    }
}

#[async_trait]
impl Signaller for HeatSignaller {
    async fn signal(&self, action: HeatAction, reason: &str) -> Result<SignalOutcome, SignalError> {
        self.check_configured(action).map_err(SignalError::config)?;
        match action {
            HeatAction::ScaleUp | HeatAction::ScaleDown => {
                self.scale_signal(action, self.alarm_url(action), None)
                    .await
            }
            HeatAction::Signal => {
                let body = self.signal_body(reason)?;
                let url = self.signal_url.as_deref().unwrap_or_default();
                self.scale_signal(action, url, Some(&body)).await
            }
            HeatAction::MarkUnhealthy => self.mark_own_member(reason).await,
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
            json!({"previous": "ok", "current": "alarm", "reason": "n1: r", "host": "n1"})
        );
        assert!(plain.check_configured(HeatAction::ScaleUp).is_err());
    }
}
