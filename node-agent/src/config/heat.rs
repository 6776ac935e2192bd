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

/// Nova's metadata service: `uuid` is the server's id.
pub const NOVA_METADATA_URL: &str = "http://169.254.169.254/openstack/latest/meta_data.json";

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
    /// JSON body sent to `signal_url`; `{node}` and `{reason}` are replaced.
    /// Default: Aodh's shape `{"previous": "ok", "current": "alarm",
    /// "reason": "<node>: <reason>", "host": "<node>"}`, the only object
    /// Heat turns into a readable event (others read "Unknown").
    pub signal_body: Option<String>,
    /// Heat endpoint (`https://heat:8004/v1/<tenant>`); from the catalog when absent.
    pub endpoint: Option<String>,
    /// Name of the stack that declares this node's group (the member itself
    /// lives in the group's nested stack and is found there).
    pub stack_name: Option<String>,
    /// Id of that stack.
    pub stack_id: Option<String>,
    /// The group resource in that stack; the one group holding this node's
    /// member when absent.
    pub group_resource: Option<String>,
    /// This node's member, by its resource name in the group (`0`, `1`, ...
    /// or a random id); when absent it is found by `server_id`.
    pub member: Option<String>,
    /// This node's server id (the physical id of its member or of the
    /// server inside it); read from `metadata_url` when absent.
    pub server_id: Option<String>,
    /// Where the server id is read when `server_id` and `member` are
    /// absent: Nova's metadata service (`uuid` of `meta_data.json`).
    pub metadata_url: String,
    /// `mark_unhealthy` then updates the stack so that Heat removes exactly
    /// this member (an AutoScalingGroup only acts on a mark at its next
    /// update or signal, and a scale-down signal would remove one more).
    pub mark_unhealthy_removes: bool,
    /// How long Heat may take to start acting on a `scale_up`, `scale_down`
    /// or `signal` before the agent reports the signal ignored (Heat answers
    /// 200 and drops signals during a cooldown, a scaling, or at a size
    /// limit). Needs credentials; `0s` reports the 200 unconfirmed.
    #[serde(with = "duration")]
    pub confirm_timeout: Duration,
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
            group_resource: None,
            member: None,
            server_id: None,
            metadata_url: NOVA_METADATA_URL.into(),
            mark_unhealthy_removes: true,
            confirm_timeout: Duration::from_secs(30),
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
    /// Mark this node's member unhealthy (and, with
    /// `mark_unhealthy_removes`, have Heat remove exactly it).
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
        check::http_url("heat.metadata_url", &h.metadata_url)?;
        check::within(
            "heat.confirm_timeout",
            h.confirm_timeout,
            Duration::ZERO,
            Duration::from_secs(600),
        )?;
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
