//! Handler configuration: one [`HandlerConfig`] per `[handlers.<name>]`
//! table of `conf/broker.toml`, checked by [`HandlerConfig::validate`]
//! without touching the network or the disk.
//!
//! `docs/handlers.md` documents every field with an example; the doc
//! comments below give each field's default.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use gearshift_proto::msg::HeatAction;
use serde::{Deserialize, Serialize};

/// A configuration problem: the key (relative to the handler's table) and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {reason}")]
pub struct ConfigError {
    /// The offending key, for example `smtp.port` or `base_name`.
    pub key: String,
    /// What is wrong with it.
    pub reason: String,
}

impl ConfigError {
    /// A new error.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            key: key.into(),
            reason: reason.into(),
        }
    }
}

/// One handler's settings, selected by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case", deny_unknown_fields)]
pub enum HandlerConfig {
    /// `type = "log"`: the dry run; no settings.
    Log {},
    /// `type = "exec"`: the seeds' `event` script contract.
    Exec(ExecConfig),
    /// `type = "spool"`: one JSON file per event in a directory.
    Spool(SpoolConfig),
    /// `type = "email"`: one message per event over SMTP.
    Email(EmailConfig),
    /// `type = "nova"`: Keystone v3 + Nova (+ Cinder) with the seeds' naming.
    Nova(NovaConfig),
    /// `type = "heat"`: a Heat stack's scaling policy or ResourceGroup.
    Heat(HeatConfig),
    /// `type = "magnum"`: a Magnum cluster's node group resize.
    Magnum(MagnumConfig),
    /// `type = "heat-via-node"`: a node agent sends the Heat signal.
    HeatViaNode(HeatViaNodeConfig),
}

impl HandlerConfig {
    /// The `type` name.
    pub fn kind(&self) -> &'static str {
        match self {
            HandlerConfig::Log {} => "log",
            HandlerConfig::Exec(_) => "exec",
            HandlerConfig::Spool(_) => "spool",
            HandlerConfig::Email(_) => "email",
            HandlerConfig::Nova(_) => "nova",
            HandlerConfig::Heat(_) => "heat",
            HandlerConfig::Magnum(_) => "magnum",
            HandlerConfig::HeatViaNode(_) => "heat-via-node",
        }
    }

    /// The longest one create or remove call may legitimately take with these
    /// settings (the handler's own waits for a server, a volume, a stack update,
    /// a resize, a node's answer); `None` for handlers that return at once.
    /// The broker agent never times a call out before this.
    pub fn longest_call(&self) -> Option<Duration> {
        match self {
            HandlerConfig::Log {} | HandlerConfig::Spool(_) => None,
            HandlerConfig::Exec(c) => Some(c.timeout),
            HandlerConfig::Email(c) => Some(c.timeout),
            HandlerConfig::Nova(c) => {
                Some((c.volume_timeout + c.boot_timeout).max(c.delete_timeout))
            }
            HandlerConfig::Heat(c) => Some(c.update_timeout),
            HandlerConfig::Magnum(c) => Some(c.resize_timeout),
            // A removal may send two actions (mark unhealthy, then scale down),
            // each trying up to `max_nodes_tried` nodes.
            HandlerConfig::HeatViaNode(c) => Some(c.node_timeout * c.max_nodes_tried.max(1) * 2),
        }
    }

    /// Checks the settings (no network, no files read).
    pub fn validate(&self) -> Result<(), ConfigError> {
        match self {
            HandlerConfig::Log {} => Ok(()),
            HandlerConfig::Exec(c) => c.validate(),
            HandlerConfig::Spool(c) => c.validate(),
            HandlerConfig::Email(c) => c.validate(),
            HandlerConfig::Nova(c) => c.validate(),
            HandlerConfig::Heat(c) => c.validate(),
            HandlerConfig::Magnum(c) => c.validate(),
            HandlerConfig::HeatViaNode(c) => c.validate(),
        }
    }
}

fn positive(key: &str, d: Duration) -> Result<(), ConfigError> {
    if d.is_zero() {
        Err(ConfigError::new(key, "must be greater than zero"))
    } else {
        Ok(())
    }
}

fn nonempty(key: &str, s: &str) -> Result<(), ConfigError> {
    if s.trim().is_empty() {
        Err(ConfigError::new(key, "must not be empty"))
    } else {
        Ok(())
    }
}

fn absolute(key: &str, p: &std::path::Path) -> Result<(), ConfigError> {
    if p.as_os_str().is_empty() {
        return Err(ConfigError::new(key, "must not be empty"));
    }
    if !p.is_absolute() {
        return Err(ConfigError::new(
            key,
            format!("{} is not an absolute path", p.display()),
        ));
    }
    Ok(())
}

/// A DNS label or dotted name (`[a-z0-9-]`, labels 1..=63, total <= 253).
fn dns_name(key: &str, s: &str, dotted: bool) -> Result<(), ConfigError> {
    let bad = |why: &str| Err(ConfigError::new(key, format!("{s:?} {why}")));
    if s.is_empty() || s.len() > 253 {
        return bad("must be 1..=253 characters");
    }
    for label in s.split('.') {
        if !dotted && s.contains('.') {
            return bad("must be a single DNS label (no dots)");
        }
        if label.is_empty() || label.len() > 63 {
            return bad("has an empty or over-long label");
        }
        if !label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            || label.starts_with('-')
            || label.ends_with('-')
        {
            return bad("may hold only letters, digits and inner hyphens");
        }
    }
    Ok(())
}

/// `exec`: runs `<dir>/<program> create-node --profile=P --district=D` and
/// `<dir>/<program> remove-node --host=H --district=D`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecConfig {
    /// Directory of the handler (the seeds' `/opt/rh/openshift/nodemgr/<handler>`). Required.
    pub dir: PathBuf,
    /// Program in `dir`. Default `event`.
    #[serde(default = "default_event")]
    pub program: String,
    /// Longest run; the process group is killed after it. Default `10m`.
    #[serde(default = "default_exec_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Exit code meaning "the cloud is out of quota". Default `3`.
    #[serde(default = "default_quota_code")]
    pub quota_exit_code: i32,
    /// Exit code meaning "busy, try later". Default `4`.
    #[serde(default = "default_busy_code")]
    pub busy_exit_code: i32,
    /// Exit codes meaning "temporary failure, retry". Default `[75]` (EX_TEMPFAIL).
    #[serde(default = "default_retry_codes")]
    pub retry_exit_codes: Vec<i32>,
    /// Extra environment variables. Default none.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Bytes of stdout and of stderr kept for the log. Default `65536`.
    #[serde(default = "default_max_output")]
    pub max_output: usize,
}

fn default_event() -> String {
    "event".into()
}
fn default_exec_timeout() -> Duration {
    Duration::from_secs(600)
}
fn default_quota_code() -> i32 {
    3
}
fn default_busy_code() -> i32 {
    4
}
fn default_retry_codes() -> Vec<i32> {
    vec![75]
}
fn default_max_output() -> usize {
    64 * 1024
}

impl ExecConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        absolute("dir", &self.dir)?;
        nonempty("program", &self.program)?;
        if self.program.contains('/') {
            return Err(ConfigError::new(
                "program",
                "must be a file name inside dir",
            ));
        }
        positive("timeout", self.timeout)?;
        for (k, c) in [
            ("quota_exit_code", self.quota_exit_code),
            ("busy_exit_code", self.busy_exit_code),
        ] {
            if !(1..=255).contains(&c) {
                return Err(ConfigError::new(k, "must be an exit code in 1..=255"));
            }
        }
        if self.quota_exit_code == self.busy_exit_code {
            return Err(ConfigError::new(
                "busy_exit_code",
                "must differ from quota_exit_code",
            ));
        }
        for c in &self.retry_exit_codes {
            if !(1..=255).contains(c) || *c == self.quota_exit_code || *c == self.busy_exit_code {
                return Err(ConfigError::new(
                    "retry_exit_codes",
                    format!("{c} must be in 1..=255 and differ from the quota and busy codes"),
                ));
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') || k.starts_with("GEARSHIFT_") {
                return Err(ConfigError::new(
                    format!("env.{k}"),
                    "must be a variable name, not starting with GEARSHIFT_ (reserved)",
                ));
            }
        }
        if !(1024..=16 * 1024 * 1024).contains(&self.max_output) {
            return Err(ConfigError::new("max_output", "must be in 1024..=16777216"));
        }
        Ok(())
    }
}

/// `spool`: writes one JSON file per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// The spool directory (created with mode 0750 if missing). Required.
    pub dir: PathBuf,
}

impl SpoolConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        absolute("dir", &self.dir)
    }
}

/// How the SMTP connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum SmtpSecurity {
    /// Plain SMTP (a local relay). The default.
    #[default]
    None,
    /// Plain, then `STARTTLS` (required: fails if the server does not offer it).
    Starttls,
    /// TLS from the first byte (SMTPS, usually port 465).
    Tls,
}

/// `email`: one message per event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailConfig {
    /// SMTP server host. Default `127.0.0.1`.
    #[serde(default = "default_smtp_host")]
    pub smtp_host: String,
    /// SMTP port. Default `25` (`none`, `starttls`) — set 587 or 465 as your relay needs.
    #[serde(default = "default_smtp_port")]
    pub smtp_port: u16,
    /// `none`, `starttls` or `tls`. Default `none`.
    #[serde(default)]
    pub security: SmtpSecurity,
    /// PEM CA file to trust for the server's certificate. Default none (system roots).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// SMTP AUTH user name. Default none (no AUTH).
    #[serde(default)]
    pub username: Option<String>,
    /// File holding the SMTP AUTH password (first line). Default none.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Sender address. Required.
    pub from: String,
    /// Recipients. Required, at least one.
    pub to: Vec<String>,
    /// Subject prefix. Default `[gearshift]`.
    #[serde(default = "default_subject_prefix")]
    pub subject_prefix: String,
    /// Bound on one delivery. Default `30s`.
    #[serde(default = "default_smtp_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn default_smtp_host() -> String {
    "127.0.0.1".into()
}
fn default_smtp_port() -> u16 {
    25
}
fn default_subject_prefix() -> String {
    "[gearshift]".into()
}
fn default_smtp_timeout() -> Duration {
    Duration::from_secs(30)
}

fn is_loopback(host: &str) -> bool {
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .map(|ip| ip.is_loopback())
            .unwrap_or(false)
}

impl EmailConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        nonempty("smtp_host", &self.smtp_host)?;
        if self.smtp_port == 0 {
            return Err(ConfigError::new("smtp_port", "must not be 0"));
        }
        self.from.parse::<lettre::message::Mailbox>().map_err(|e| {
            ConfigError::new("from", format!("{:?} is not an address: {e}", self.from))
        })?;
        if self.to.is_empty() {
            return Err(ConfigError::new("to", "needs at least one recipient"));
        }
        for (i, t) in self.to.iter().enumerate() {
            t.parse::<lettre::message::Mailbox>().map_err(|e| {
                ConfigError::new(format!("to[{i}]"), format!("{t:?} is not an address: {e}"))
            })?;
        }
        if self.username.is_some() != self.password_file.is_some() {
            return Err(ConfigError::new(
                "password_file",
                "username and password_file go together",
            ));
        }
        if self.username.is_some()
            && self.security == SmtpSecurity::None
            && !is_loopback(&self.smtp_host)
        {
            return Err(ConfigError::new(
                "security",
                "SMTP AUTH over an unencrypted connection to another host would expose the password; use starttls or tls",
            ));
        }
        if let Some(p) = &self.password_file {
            absolute("password_file", p)?;
        }
        if let Some(p) = &self.ca_file {
            absolute("ca_file", p)?;
        }
        if self.subject_prefix.contains(['\r', '\n']) {
            return Err(ConfigError::new("subject_prefix", "must be one line"));
        }
        positive("timeout", self.timeout)
    }
}

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
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.env_file.is_some() && self.cloud.is_some() {
            return Err(ConfigError::new(
                "auth.cloud",
                "give either env_file or cloud, not both",
            ));
        }
        if self.clouds_yaml.is_some() && self.cloud.is_none() {
            return Err(ConfigError::new("auth.clouds_yaml", "needs auth.cloud"));
        }
        if let Some(p) = &self.env_file {
            absolute("auth.env_file", p)?;
        }
        if let Some(c) = &self.cloud {
            nonempty("auth.cloud", c)?;
        }
        if let Some(i) = &self.interface {
            gearshift_cloud::auth::Interface::parse(i)
                .map_err(|e| ConfigError::new("auth.interface", e.to_string()))?;
        }
        for (ty, url) in &self.endpoint_overrides {
            let u = url::Url::parse(&url.replace("{project_id}", "p")).map_err(|e| {
                ConfigError::new(format!("auth.endpoint_overrides.{ty}"), e.to_string())
            })?;
            if !matches!(u.scheme(), "http" | "https") {
                return Err(ConfigError::new(
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.auth.validate()?;
        dns_name("base_name", &self.base_name, false)?;
        dns_name("domain", &self.domain, true)?;
        if !(1..=100_000).contains(&self.max_nodes) {
            return Err(ConfigError::new("max_nodes", "must be in 1..=100000"));
        }
        if let Some(d) = &self.volume_device
            && !d.starts_with("/dev/")
        {
            return Err(ConfigError::new("volume_device", "must be a /dev/ path"));
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
    /// Stack PATCH: count - 1 and `removal_policies: [{resource_list: [member]}]`. The default.
    #[default]
    RemovalPolicies,
    /// Mark the member unhealthy, then signal the scale-down policy.
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
    /// user data) so that the new node reports it as `booted_for`. Default none.
    #[serde(default)]
    pub op_param: Option<String>,
    /// How host names map to Nova server names. Default `short`.
    #[serde(default)]
    pub server_name: ServerName,
    /// Flavor for the quota pre-flight (`capacity`); the group shape's
    /// flavor when absent; no pre-flight when neither is set. Default none.
    #[serde(default)]
    pub flavor: Option<String>,
    /// Bound on waiting for UPDATE_COMPLETE. Default `15m`.
    #[serde(default = "default_update_timeout", with = "humantime_serde")]
    pub update_timeout: Duration,
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

fn http_url(key: &str, u: &str) -> Result<(), ConfigError> {
    match url::Url::parse(u) {
        Ok(p) if matches!(p.scheme(), "http" | "https") && p.host().is_some() => Ok(()),
        _ => Err(ConfigError::new(key, "must be an http(s) URL")),
    }
}

impl HeatConfig {
    /// Checks the settings.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.auth.validate()?;
        nonempty("stack", &self.stack)?;
        if self.stack.matches('/').count() > 1
            || self.stack.starts_with('/')
            || self.stack.ends_with('/')
        {
            return Err(ConfigError::new("stack", "must be <name> or <name>/<id>"));
        }
        nonempty("group_resource", &self.group_resource)?;
        nonempty("scale_up_policy", &self.scale_up_policy)?;
        nonempty("scale_down_policy", &self.scale_down_policy)?;
        nonempty("count_param", &self.count_param)?;
        nonempty("removal_policies_param", &self.removal_policies_param)?;
        if let Some(p) = &self.op_param {
            nonempty("op_param", p)?;
            if self.scale_up != HeatScaleUp::Count {
                return Err(ConfigError::new(
                    "op_param",
                    "needs scale_up = \"count\" (a signal carries no parameters)",
                ));
            }
        }
        if let Some(u) = &self.scale_up_alarm_url {
            http_url("scale_up_alarm_url", u)?;
        }
        if let Some(u) = &self.scale_down_alarm_url {
            http_url("scale_down_alarm_url", u)?;
        }
        positive("update_timeout", self.update_timeout)?;
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
    pub fn validate(&self) -> Result<(), ConfigError> {
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
    /// First ask the node being removed to mark its own group member
    /// unhealthy (`mark_unhealthy`), so Heat removes exactly it. Default `true`.
    #[serde(default = "default_true")]
    pub mark_unhealthy_first: bool,
    /// Then asked (of the node being removed, else of another active node)
    /// to shrink the group. Default `scale_down`.
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        positive("node_timeout", self.node_timeout)?;
        positive("command_ttl", self.command_ttl)?;
        if self.command_ttl < self.node_timeout {
            return Err(ConfigError::new(
                "command_ttl",
                "must be at least node_timeout",
            ));
        }
        if !(1..=50).contains(&self.max_nodes_tried) {
            return Err(ConfigError::new("max_nodes_tried", "must be in 1..=50"));
        }
        if self.scale_up_action == HeatAction::MarkUnhealthy {
            return Err(ConfigError::new(
                "scale_up_action",
                "mark_unhealthy does not add a node",
            ));
        }
        Ok(())
    }
}

impl From<ConfigError> for crate::BuildError {
    fn from(e: ConfigError) -> Self {
        crate::BuildError::Invalid(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<HandlerConfig, String> {
        toml::from_str::<HandlerConfig>(toml_text).map_err(|e| e.to_string())
    }

    #[test]
    fn every_type_parses_with_defaults() {
        let c = parse("type = \"exec\"\ndir = \"/opt/h\"\n").unwrap();
        let HandlerConfig::Exec(e) = &c else { panic!() };
        assert_eq!(
            (e.program.as_str(), e.quota_exit_code, e.timeout),
            ("event", 3, Duration::from_secs(600))
        );
        c.validate().unwrap();
        parse("type = \"log\"\n").unwrap().validate().unwrap();
        parse("type = \"spool\"\ndir = \"/var/spool/gearshift\"\n")
            .unwrap()
            .validate()
            .unwrap();
        parse("type = \"email\"\nfrom = \"gearshift@example.com\"\nto = [\"ops@example.com\"]\n")
            .unwrap()
            .validate()
            .unwrap();
        let n = parse("type = \"nova\"\n[auth]\nenv_file = \"/etc/gearshift/auth.env\"\n").unwrap();
        let HandlerConfig::Nova(nc) = &n else {
            panic!()
        };
        assert_eq!(
            (nc.base_name.as_str(), nc.max_nodes),
            ("openshift-node", 100)
        );
        n.validate().unwrap();
        parse("type = \"heat\"\nstack = \"paas\"\nremove = \"mark-unhealthy\"\nupdate_timeout = \"20m\"\n")
            .unwrap()
            .validate()
            .unwrap();
        parse("type = \"magnum\"\ncluster = \"c1\"\nnodegroup = \"default-worker\"\n")
            .unwrap()
            .validate()
            .unwrap();
        let h = parse("type = \"heat-via-node\"\n").unwrap();
        assert_eq!(h.kind(), "heat-via-node");
        h.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_types_are_refused() {
        assert!(
            parse("type = \"spool\"\ndir = \"/x\"\ndri = \"/y\"\n")
                .unwrap_err()
                .contains("dri")
        );
        assert!(
            parse("type = \"nova\"\n[auth]\nenvfile = \"/x\"\n")
                .unwrap_err()
                .contains("envfile")
        );
        assert!(parse("type = \"ftp\"\n").is_err());
    }

    #[test]
    fn validation_names_the_key() {
        let bad = |t: &str, key: &str| {
            let e = parse(t).unwrap().validate().unwrap_err();
            assert_eq!(e.key, key, "{e}");
        };
        bad("type = \"exec\"\ndir = \"relative\"\n", "dir");
        bad(
            "type = \"exec\"\ndir = \"/x\"\nquota_exit_code = 4\n",
            "busy_exit_code",
        );
        bad(
            "type = \"exec\"\ndir = \"/x\"\n[env]\nGEARSHIFT_OP = \"x\"\n",
            "env.GEARSHIFT_OP",
        );
        bad(
            "type = \"email\"\nfrom = \"not an address\"\nto = [\"a@b.c\"]\n",
            "from",
        );
        bad("type = \"email\"\nfrom = \"a@b.c\"\nto = []\n", "to");
        bad(
            "type = \"email\"\nsmtp_host = \"mail.example.com\"\nfrom = \"a@b.c\"\nto = [\"a@b.c\"]\nusername = \"u\"\npassword_file = \"/p\"\n",
            "security",
        );
        bad("type = \"nova\"\nbase_name = \"node_x\"\n", "base_name");
        bad("type = \"nova\"\nmax_nodes = 0\n", "max_nodes");
        bad(
            "type = \"nova\"\n[auth]\ncloud = \"c\"\nenv_file = \"/e\"\n",
            "auth.cloud",
        );
        bad(
            "type = \"nova\"\n[auth]\ninterface = \"private\"\n",
            "auth.interface",
        );
        bad("type = \"heat\"\nstack = \"a/b/c\"\n", "stack");
        bad(
            "type = \"heat\"\nstack = \"s\"\nscale_up_alarm_url = \"ftp://x\"\n",
            "scale_up_alarm_url",
        );
        bad(
            "type = \"heat\"\nstack = \"s\"\npoll_interval = \"0s\"\n",
            "poll_interval",
        );
        bad("type = \"magnum\"\ncluster = \"\"\n", "cluster");
        bad(
            "type = \"heat-via-node\"\nscale_up_action = \"mark_unhealthy\"\n",
            "scale_up_action",
        );
    }
}

#[cfg(test)]
mod longest_call_tests {
    use super::*;

    fn parse(t: &str) -> HandlerConfig {
        toml::from_str(t).unwrap()
    }

    #[test]
    fn longest_call_follows_the_handler_waits() {
        assert_eq!(parse("type = \"log\"").longest_call(), None);
        let nova = parse(
            "type = \"nova\"\nbase_name = \"openshift-node\"\ndomain = \"example.com\"\nboot_timeout = \"10m\"\nvolume_timeout = \"5m\"\ndelete_timeout = \"3m\"\n",
        );
        assert_eq!(nova.longest_call(), Some(Duration::from_secs(15 * 60)));
        let heat = parse("type = \"heat\"\nstack = \"paas\"\nupdate_timeout = \"20m\"\n");
        assert_eq!(heat.longest_call(), Some(Duration::from_secs(20 * 60)));
    }
}
