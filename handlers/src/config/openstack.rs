//! The handlers that call OpenStack: `nova`, `heat`, `magnum`, and
//! `heat-via-node` (a node agent calls Heat), with their shared `[auth]`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gearshift_proto::msg::HeatAction;
use gearshift_service::check::{self, absolute, nonempty, positive};
use gearshift_service::config::Invalid;
use serde::{Deserialize, Serialize};

use super::dns_name;

/// Where OpenStack credentials come from (`[handlers.<name>.auth]`).
/// Without `env_file` and `cloud`, the agent's own `OS_*` environment is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct OpenStackAuth {
    /// A file of `export OS_*=...` lines (the seeds' `auth.env`). Default none.
    pub env_file: Option<PathBuf>,
    /// A `clouds.yaml` cloud name. Default none.
    pub cloud: Option<String>,
    /// `clouds.yaml` path; the standard search path when absent. Default none.
    pub clouds_yaml: Option<PathBuf>,
    /// Region, overriding the credentials'. Default none.
    pub region: Option<String>,
    /// `public`, `internal` or `admin`, overriding the credentials'. Default none.
    pub interface: Option<String>,
    /// Endpoints to use instead of the catalog's, by service type
    /// (`compute`, `orchestration`, ...); `{project_id}` is substituted. Default none.
    pub endpoint_overrides: BTreeMap<String, String>,
    /// Bound on one HTTP request. Default `60s`.
    #[serde(with = "humantime_serde::option")]
    pub request_timeout: Option<Duration>,
}

impl OpenStackAuth {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.env_file.is_some() && self.cloud.is_some() {
            return Err(Invalid::new(
                "auth.cloud",
                "give either env_file or cloud, not both",
            ));
        }
        if self.clouds_yaml.is_some() && self.cloud.is_none() {
            return Err(Invalid::new("auth.clouds_yaml", "needs auth.cloud"));
        }
        if let Some(p) = &self.env_file {
            absolute("auth.env_file", p)?;
        }
        if let Some(c) = &self.cloud {
            nonempty("auth.cloud", c)?;
        }
        if let Some(i) = &self.interface {
            gearshift_cloud::auth::Interface::parse(i)
                .map_err(|e| Invalid::new("auth.interface", e.to_string()))?;
        }
        for (ty, url) in &self.endpoint_overrides {
            let u = url::Url::parse(&url.replace("{project_id}", "p")).map_err(|e| {
                Invalid::new(format!("auth.endpoint_overrides.{ty}"), e.to_string())
            })?;
            if !matches!(u.scheme(), "http" | "https") {
                return Err(Invalid::new(
                    format!("auth.endpoint_overrides.{ty}"),
                    "must be an http(s) URL",
                ));
            }
        }
        if let Some(t) = self.request_timeout {
            positive("auth.request_timeout", t)?;
        }
        Ok(())
    }
}

/// `nova`: boots and deletes servers named the seeds' way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NovaConfig {
    /// Credentials. Default: the agent's `OS_*` environment.
    #[serde(default)]
    pub auth: OpenStackAuth,
    /// Base name: Nova name `<base>_<N>`, host `<base>-<N>.<domain>`. Default `openshift-node`.
    #[serde(default = "default_base_name")]
    pub base_name: String,
    /// DNS domain of node hosts. Default `example.com`.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// Highest N (the seeds' `MAX_NODES`). Default `100`.
    #[serde(default = "default_max_nodes")]
    pub max_nodes: u32,
    /// Device name asked for the volume (the seeds' `/dev/vdc`). Default none (Nova picks).
    #[serde(default)]
    pub volume_device: Option<String>,
    /// Delete the node's volume when the node is removed. Default `true`.
    #[serde(default = "default_true")]
    pub delete_volume: bool,
    /// How long a server may take to become ACTIVE (only waited for when a
    /// volume must be attached). Default `10m`.
    #[serde(default = "default_boot_timeout", with = "humantime_serde")]
    pub boot_timeout: Duration,
    /// How long a volume may take to become available. Default `5m`.
    #[serde(default = "default_volume_timeout", with = "humantime_serde")]
    pub volume_timeout: Duration,
    /// How long a deleted server may take to disappear. Default `10m`.
    #[serde(default = "default_boot_timeout", with = "humantime_serde")]
    pub delete_timeout: Duration,
    /// Interval between status polls. Default `5s`.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn default_base_name() -> String {
    "openshift-node".into()
}
fn default_domain() -> String {
    "example.com".into()
}
fn default_max_nodes() -> u32 {
    100
}
fn default_true() -> bool {
    true
}
fn default_boot_timeout() -> Duration {
    Duration::from_secs(600)
}
fn default_volume_timeout() -> Duration {
    Duration::from_secs(300)
}
fn default_poll() -> Duration {
    Duration::from_secs(5)
}

impl NovaConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.auth.validate()?;
        dns_name("base_name", &self.base_name, false)?;
        dns_name("domain", &self.domain, true)?;
        if !(1..=100_000).contains(&self.max_nodes) {
            return Err(Invalid::new("max_nodes", "must be in 1..=100000"));
        }
        if let Some(d) = &self.volume_device
            && !d.starts_with("/dev/")
        {
            return Err(Invalid::new("volume_device", "must be a /dev/ path"));
        }
        positive("boot_timeout", self.boot_timeout)?;
        positive("volume_timeout", self.volume_timeout)?;
        positive("delete_timeout", self.delete_timeout)?;
        positive("poll_interval", self.poll_interval)
    }
}

/// How the `heat` handler adds a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum HeatScaleUp {
    /// Signal the scale-up policy (`scale_up_alarm_url`, else `scale_up_policy`). The default.
    #[default]
    Signal,
    /// Raise the ResourceGroup's count parameter by one (stack PATCH).
    Count,
}

/// How the `heat` handler removes a chosen node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum HeatRemove {
    /// Stack PATCH: count - 1 and `removal_policies: [{resource_list: [member]}]`
    /// (a ResourceGroup; an AutoScalingGroup member is marked and removed
    /// as with `mark-unhealthy`). The default.
    #[default]
    RemovalPolicies,
    /// Mark the member unhealthy, then the stack update that makes Heat drop
    /// exactly it (AutoScalingGroup: `{"parameters": {}}`, or its
    /// `desired_capacity` parameter lowered; ResourceGroup: as
    /// `removal-policies`). Never the scale-down signal: after a mark, Heat
    /// removes the marked member *and* the oldest healthy one.
    MarkUnhealthy,
}

/// How a node's host name maps to its Nova server name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum ServerName {
    /// The first label of the host name (`node-3` for `node-3.example.com`). The default.
    #[default]
    Short,
    /// The full host name.
    Fqdn,
}

/// `heat`: a stack whose group holds the node hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatConfig {
    /// Credentials. Default: the agent's `OS_*` environment.
    #[serde(default)]
    pub auth: OpenStackAuth,
    /// The stack, `name` or `name/id`. Required.
    pub stack: String,
    /// The group resource in the stack (ResourceGroup or AutoScalingGroup). Default `group`.
    #[serde(default = "default_group")]
    pub group_resource: String,
    /// `signal` or `count`. Default `signal`.
    #[serde(default)]
    pub scale_up: HeatScaleUp,
    /// `removal-policies` or `mark-unhealthy`. Default `removal-policies`.
    #[serde(default)]
    pub remove: HeatRemove,
    /// Scale-up policy resource (signalled with a token). Default `scale_up`.
    #[serde(default = "default_up_policy")]
    pub scale_up_policy: String,
    /// Scale-down policy resource. Default `scale_down`.
    #[serde(default = "default_down_policy")]
    pub scale_down_policy: String,
    /// A pre-signed scale-up `alarm_url`, used instead of the policy when set. Default none.
    #[serde(default)]
    pub scale_up_alarm_url: Option<String>,
    /// A pre-signed scale-down `alarm_url`, used instead of the policy when set. Default none.
    #[serde(default)]
    pub scale_down_alarm_url: Option<String>,
    /// The stack parameter feeding the ResourceGroup's `count`. Default `count`.
    #[serde(default = "default_count_param")]
    pub count_param: String,
    /// The stack parameter (type json) feeding its `removal_policies`. Default `removal_policies`.
    #[serde(default = "default_removal_param")]
    pub removal_policies_param: String,
    /// With `scale_up = "count"`: a stack parameter set to the operation id
    /// in the same PATCH, for the template to hand to new members (in their
    /// user data) so that the new node reports it as `booted_for`. Heat
    /// replaces every existing member whose properties change under a
    /// replace-on-update policy (`OS::Nova::Server` `user_data` with the
    /// default `user_data_update_policy: REPLACE`): each such PATCH is
    /// previewed first and refused when it would replace a member (set the
    /// server's `user_data_update_policy: IGNORE`). Default none.
    #[serde(default)]
    pub op_param: Option<String>,
    /// How host names map to Nova server names. Default `short`.
    #[serde(default)]
    pub server_name: ServerName,
    /// Flavor for the quota pre-flight (`capacity`); the group shape's
    /// flavor when absent; no pre-flight when neither is set. Default none.
    #[serde(default)]
    pub flavor: Option<String>,
    /// Bound on one whole call: the stack update, or a signal's resize
    /// until the policy's event. Default `15m`.
    #[serde(default = "default_update_timeout", with = "humantime_serde")]
    pub update_timeout: Duration,
    /// How long Heat may take to *start* acting on a scaling signal
    /// (group metadata `scaling_in_progress`, a new nested-stack update or
    /// the policy's event) before the signal counts as ignored: Heat answers
    /// 200 to every signal and drops those that come during a cooldown, a
    /// scaling or at a size limit without a trace. Measured start: 2 to 7 s.
    /// Part of the same wait, so at most `update_timeout`. Default `60s`.
    #[serde(default = "default_signal_timeout", with = "humantime_serde")]
    pub signal_timeout: Duration,
    /// Interval between status polls. Default `5s`.
    #[serde(default = "default_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn default_group() -> String {
    "group".into()
}
fn default_up_policy() -> String {
    "scale_up".into()
}
fn default_down_policy() -> String {
    "scale_down".into()
}
fn default_count_param() -> String {
    "count".into()
}
fn default_removal_param() -> String {
    "removal_policies".into()
}
fn default_update_timeout() -> Duration {
    Duration::from_secs(900)
}
fn default_signal_timeout() -> Duration {
    Duration::from_secs(60)
}

impl HeatConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.auth.validate()?;
        nonempty("stack", &self.stack)?;
        if self.stack.matches('/').count() > 1
            || self.stack.starts_with('/')
            || self.stack.ends_with('/')
        {
            return Err(Invalid::new("stack", "must be <name> or <name>/<id>"));
        }
        nonempty("group_resource", &self.group_resource)?;
        nonempty("scale_up_policy", &self.scale_up_policy)?;
        nonempty("scale_down_policy", &self.scale_down_policy)?;
        nonempty("count_param", &self.count_param)?;
        nonempty("removal_policies_param", &self.removal_policies_param)?;
        if let Some(p) = &self.op_param {
            nonempty("op_param", p)?;
            if self.scale_up != HeatScaleUp::Count {
                return Err(Invalid::new(
                    "op_param",
                    "needs scale_up = \"count\" (a signal carries no parameters)",
                ));
            }
        }
        if let Some(u) = &self.scale_up_alarm_url {
            check::http_url("scale_up_alarm_url", u)?;
        }
        if let Some(u) = &self.scale_down_alarm_url {
            check::http_url("scale_down_alarm_url", u)?;
        }
        positive("update_timeout", self.update_timeout)?;
        positive("signal_timeout", self.signal_timeout)?;
        positive("poll_interval", self.poll_interval)
    }
}

/// `magnum`: resizes a cluster's node group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MagnumConfig {
    /// Credentials. Default: the agent's `OS_*` environment.
    #[serde(default)]
    pub auth: OpenStackAuth,
    /// Cluster name or uuid. Required.
    pub cluster: String,
    /// Node group name or uuid; the default worker group when absent. Default none.
    #[serde(default)]
    pub nodegroup: Option<String>,
    /// How host names map to Nova server names. Default `short`.
    #[serde(default)]
    pub server_name: ServerName,
    /// Bound on waiting for the resize. Default `30m`.
    #[serde(default = "default_resize_timeout", with = "humantime_serde")]
    pub resize_timeout: Duration,
    /// Interval between status polls. Default `10s`.
    #[serde(default = "default_magnum_poll", with = "humantime_serde")]
    pub poll_interval: Duration,
}

fn default_resize_timeout() -> Duration {
    Duration::from_secs(1800)
}
fn default_magnum_poll() -> Duration {
    Duration::from_secs(10)
}

impl MagnumConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.auth.validate()?;
        nonempty("cluster", &self.cluster)?;
        if let Some(n) = &self.nodegroup {
            nonempty("nodegroup", n)?;
        }
        positive("resize_timeout", self.resize_timeout)?;
        positive("poll_interval", self.poll_interval)
    }
}

/// `heat-via-node`: the PEP's path; a node agent signals Heat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeatViaNodeConfig {
    /// Action asked of an active node to add a node. Default `scale_up`.
    #[serde(default = "default_up_action")]
    pub scale_up_action: HeatAction,
    /// Remove a node by asking it to mark its own group member unhealthy
    /// (`mark_unhealthy`): the node then updates the stack so that Heat
    /// removes exactly that member, and no scale-down signal is sent (after
    /// a mark it would remove one more). Default `true`.
    #[serde(default = "default_true")]
    pub mark_unhealthy_first: bool,
    /// Without `mark_unhealthy_first`: asked (of the node being removed,
    /// else of another active node) to shrink the group; Heat picks the
    /// victim. Default `scale_down`.
    #[serde(default = "default_down_action")]
    pub scale_down_action: HeatAction,
    /// How long one node may take to answer. Default `60s`.
    #[serde(default = "default_node_timeout", with = "humantime_serde")]
    pub node_timeout: Duration,
    /// Nodes tried before giving up. Default `3`.
    #[serde(default = "default_attempts")]
    pub max_nodes_tried: u32,
    /// Lifetime of the signed command. Default `5m`.
    #[serde(default = "default_cmd_ttl", with = "humantime_serde")]
    pub command_ttl: Duration,
}

fn default_up_action() -> HeatAction {
    HeatAction::ScaleUp
}
fn default_down_action() -> HeatAction {
    HeatAction::ScaleDown
}
fn default_node_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_attempts() -> u32 {
    3
}
fn default_cmd_ttl() -> Duration {
    Duration::from_secs(300)
}

impl HeatViaNodeConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), Invalid> {
        positive("node_timeout", self.node_timeout)?;
        positive("command_ttl", self.command_ttl)?;
        if self.command_ttl < self.node_timeout {
            return Err(Invalid::new("command_ttl", "must be at least node_timeout"));
        }
        if !(1..=50).contains(&self.max_nodes_tried) {
            return Err(Invalid::new("max_nodes_tried", "must be in 1..=50"));
        }
        if self.scale_up_action == HeatAction::MarkUnhealthy {
            return Err(Invalid::new(
                "scale_up_action",
                "mark_unhealthy does not add a node",
            ));
        }
        Ok(())
    }
}
