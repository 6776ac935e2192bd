//! `[heat]`: the cfn-push-stats role (signals to Heat with the node's own
//! credentials), with its checks.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_proto::msg::HeatAction;
use gearshift_service::check;
use gearshift_service::config::{Invalid, duration};
use serde::{Deserialize, Serialize};

/// Where Heat credentials come from.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CredentialSource {
    /// `OS_*` environment variables (the seeds' `auth.env`).
    #[default]
    Env,
    /// The seeds' `auth.env` file itself (`export OS_X=value` lines), read by
    /// the agent without a shell: `heat.auth_env`.
    AuthEnv,
    /// A cloud entry of `clouds.yaml`.
    CloudsYaml,
}

/// `[heat]`: the cfn-push-stats role.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HeatSection {
    /// What `cmd.remove` does: `none`, `scale_down`, `signal` or `mark_unhealthy`.
    pub remove_action: RemoveAction,
    /// Pre-signed `alarm_url` of the scale-up policy.
    pub scale_up_url: Option<String>,
    /// Pre-signed `alarm_url` of the scale-down policy.
    pub scale_down_url: Option<String>,
    /// Resource signal URL, POSTed with a Keystone token.
    pub signal_url: Option<String>,
    /// JSON body sent to `signal_url` (`{"host": ...}` style); `{node}` and
    /// `{reason}` are replaced.
    pub signal_body: Option<String>,
    /// Heat endpoint (`https://heat:8004/v1/<tenant>`); from the catalog when absent.
    pub endpoint: Option<String>,
    /// Name of the stack that holds this node's group member.
    pub stack_name: Option<String>,
    /// Id of that stack.
    pub stack_id: Option<String>,
    /// This node's member (resource name) in that stack; the node name when absent.
    pub member: Option<String>,
    /// Where credentials come from: `env`, `auth_env` or `clouds_yaml`.
    pub credentials: CredentialSource,
    /// The `auth.env` file for `credentials = "auth_env"`.
    pub auth_env: Option<PathBuf>,
    /// The `clouds.yaml` entry.
    pub cloud: Option<String>,
    /// An explicit `clouds.yaml`; the standard search path when absent.
    pub clouds_yaml: Option<PathBuf>,
    /// Timeout of one HTTP request.
    #[serde(with = "duration")]
    pub timeout: Duration,
}

impl Default for HeatSection {
    fn default() -> Self {
        HeatSection {
            remove_action: RemoveAction::None,
            scale_up_url: None,
            scale_down_url: None,
            signal_url: None,
            signal_body: None,
            endpoint: None,
            stack_name: None,
            stack_id: None,
            member: None,
            credentials: CredentialSource::Env,
            auth_env: None,
            cloud: None,
            clouds_yaml: None,
            timeout: Duration::from_secs(30),
        }
    }
}

/// What `cmd.remove` does before the agent stops.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RemoveAction {
    /// Nothing: report and stop (the broker agent's handler removes the host).
    #[default]
    None,
    /// POST the scale-down policy's `alarm_url`.
    ScaleDown,
    /// POST `signal_url` with a token.
    Signal,
    /// Mark this node's member unhealthy.
    MarkUnhealthy,
}

impl RemoveAction {
    /// The Heat action this removal runs, if any.
    pub fn heat_action(self) -> Option<HeatAction> {
        match self {
            RemoveAction::None => None,
            RemoveAction::ScaleDown => Some(HeatAction::ScaleDown),
            RemoveAction::Signal => Some(HeatAction::Signal),
            RemoveAction::MarkUnhealthy => Some(HeatAction::MarkUnhealthy),
        }
    }
}

impl HeatSection {
    /// Checks the section; keys in errors start with `heat.`.
    pub fn check(&self) -> Result<(), Invalid> {
        let h = self;
        check::optional_http_url("heat.scale_up_url", h.scale_up_url.as_deref())?;
        check::optional_http_url("heat.scale_down_url", h.scale_down_url.as_deref())?;
        check::optional_http_url("heat.signal_url", h.signal_url.as_deref())?;
        check::optional_http_url("heat.endpoint", h.endpoint.as_deref())?;
        if let Some(body) = &h.signal_body {
            let probe = body.replace("{node}", "n").replace("{reason}", "r");
            serde_json::from_str::<serde_json::Value>(&probe)
                .map_err(|e| Invalid::new("heat.signal_body", format!("not JSON: {e}")))?;
        }
        check::within(
            "heat.timeout",
            h.timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        match h.remove_action {
            RemoveAction::None => {}
            RemoveAction::ScaleDown if h.scale_down_url.is_none() => {
                return Err(Invalid::new(
                    "heat.remove_action",
                    "scale_down needs heat.scale_down_url",
                ));
            }
            RemoveAction::Signal if h.signal_url.is_none() => {
                return Err(Invalid::new(
                    "heat.remove_action",
                    "signal needs heat.signal_url",
                ));
            }
            RemoveAction::MarkUnhealthy if h.stack_name.is_none() || h.stack_id.is_none() => {
                return Err(Invalid::new(
                    "heat.remove_action",
                    "mark_unhealthy needs heat.stack_name and heat.stack_id",
                ));
            }
            _ => {}
        }
        if h.credentials == CredentialSource::AuthEnv && h.auth_env.is_none() {
            return Err(Invalid::new(
                "heat.auth_env",
                "credentials = \"auth_env\" needs the file's path",
            ));
        }
        if h.credentials == CredentialSource::CloudsYaml && h.cloud.is_none() {
            return Err(Invalid::new(
                "heat.cloud",
                "credentials = \"clouds_yaml\" needs the cloud's name",
            ));
        }
        Ok(())
    }
}
