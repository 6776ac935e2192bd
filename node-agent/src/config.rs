//! The node agent's configuration file (`/etc/gearshift/node.toml`).
//!
//! Every key has a default, so an empty file is valid (it runs the
//! `openshift` runtime against `/`). `conf/node.toml` documents each key.
//! Environment variables override the file: `GEARSHIFT_NODE_` followed by
//! the key path with `__` between levels, for example
//! `GEARSHIFT_NODE_REPORT__INTERVAL=30s`.
//!
//! [`NodeConfig::validate`] checks everything that can be checked without
//! touching the network or the key files, so `gearshift-node check-config`
//! names a bad key before the agent connects anywhere.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use gearshift_proto::msg::HeatAction;
use gearshift_service::config::{Invalid, Validate, duration};
use gearshift_service::logging::LogFormat;
use serde::{Deserialize, Serialize};

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "GEARSHIFT_NODE";
/// Where the packaged service reads its configuration.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gearshift/node.toml";

/// The whole configuration file.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Identity and placement facts of this node.
    pub node: NodeSection,
    /// The message bus.
    pub bus: BusSection,
    /// Signing key and trusted keys.
    pub keys: KeysSection,
    /// The state directory.
    pub state: StateSection,
    /// Capacity reports.
    pub report: ReportSection,
    /// Where gears live and how they move.
    pub runtime: RuntimeSection,
    /// Evacuation defaults.
    pub evacuation: EvacuationSection,
    /// Heat signals (the cfn-push-stats role).
    pub heat: HeatSection,
    /// Prometheus metrics.
    pub metrics: MetricsSection,
    /// Logging.
    pub log: LogSection,
    /// Service behaviour.
    pub service: ServiceSection,
    /// Pull mode: capacity metrics pushed for Heat/Aodh alarms (disabled by default).
    pub push_stats: gearshift_pushstats::PushStatsConfig,
}

/// `[node]`: identity.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    /// The node's identity on the bus; the host's FQDN when absent.
    pub name: Option<String>,
    /// Region, when regions are in use.
    pub region: Option<String>,
    /// Zone, when zones are in use.
    pub zone: Option<String>,
    /// The scale-up operation id this node was created for.
    pub booted_for: Option<String>,
    /// A file holding that operation id (written from the instance's user data).
    pub booted_for_file: Option<PathBuf>,
    /// Never choose this node for scale-down.
    pub do_not_disrupt: bool,
}

/// `[bus]`: the message bus connection.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BusSection {
    /// Bus URL: `amqp://`, `amqps://`, `stomp://`, `stomp+ssl://` or `memory://`.
    pub url: String,
    /// Heart-beat interval proposed to the broker.
    #[serde(with = "duration")]
    pub heartbeat: Duration,
    /// First reconnect delay.
    #[serde(with = "duration")]
    pub reconnect_min: Duration,
    /// Longest reconnect delay.
    #[serde(with = "duration")]
    pub reconnect_max: Duration,
    /// How long one bus operation may take.
    #[serde(with = "duration")]
    pub op_timeout: Duration,
    /// How long one connection attempt may take.
    #[serde(with = "duration")]
    pub connect_timeout: Duration,
    /// Unacknowledged commands in flight from the node's queue.
    pub prefetch: u16,
    /// Events kept while the bus is away; the oldest progress events are
    /// dropped first when it is full.
    pub outbox_capacity: usize,
    /// PEM file of the CA that signed the broker's certificate.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of the client certificate.
    pub key_file: Option<PathBuf>,
    /// Name to check in the broker's certificate.
    pub server_name: Option<String>,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            heartbeat: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(500),
            reconnect_max: Duration::from_secs(30),
            op_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            prefetch: 16,
            outbox_capacity: 10_000,
            ca_file: None,
            cert_file: None,
            key_file: None,
            server_name: None,
        }
    }
}

/// `[keys]`: who we are and whom we trust.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KeysSection {
    /// This node's private key (PKCS#8 PEM, role `node`).
    pub signing_key: PathBuf,
    /// Public keys of broker agents (role `broker`).
    pub broker_keys: Vec<PathBuf>,
    /// Public keys of operators (role `operator`).
    pub operator_keys: Vec<PathBuf>,
    /// Public keys of third-party clients (role `client`: they may only ping).
    pub client_keys: Vec<PathBuf>,
    /// Commands whose `ts` is further than this from our clock are refused.
    #[serde(with = "duration")]
    pub time_window: Duration,
    /// Command ids remembered for replay detection (oldest forgotten first).
    pub replay_capacity: usize,
}

impl Default for KeysSection {
    fn default() -> Self {
        KeysSection {
            signing_key: "/etc/gearshift/node.key".into(),
            broker_keys: vec!["/etc/gearshift/broker.pub".into()],
            operator_keys: vec![],
            client_keys: vec![],
            time_window: Duration::from_secs(300),
            replay_capacity: 10_000,
        }
    }
}

/// `[state]`: the state directory.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StateSection {
    /// Directory for the inactive flag, the command journal and checkpoints.
    pub dir: PathBuf,
    /// fsync every state change (only the simulator turns this off).
    pub fsync: bool,
}

impl Default for StateSection {
    fn default() -> Self {
        StateSection {
            dir: "/var/lib/gearshift-node".into(),
            fsync: true,
        }
    }
}

/// `[report]`: capacity reports.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReportSection {
    /// Period of the capacity report.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// How often the runtime is scanned for changes (a change is reported at once).
    #[serde(with = "duration")]
    pub scan_interval: Duration,
    /// Shortest gap between two reports (coalesces bursts of changes).
    #[serde(with = "duration")]
    pub min_gap: Duration,
}

impl Default for ReportSection {
    fn default() -> Self {
        ReportSection {
            interval: Duration::from_secs(10),
            scan_interval: Duration::from_secs(2),
            min_gap: Duration::from_millis(250),
        }
    }
}

/// Which gear runtime the node uses.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// An OpenShift v2 node host.
    #[default]
    Openshift,
    /// Gears are directories of files; moves copy, verify, then delete.
    Dir,
    /// Operator commands print the gear list and move gears.
    Exec,
    /// In memory (simulation).
    Sim,
}

/// `[runtime]`: where gears live.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeSection {
    /// `openshift`, `dir`, `exec` or `sim`.
    pub kind: RuntimeKind,
    /// Node facts for runtimes that do not read them from the host.
    pub facts: FactsSection,
    /// `openshift` runtime settings.
    pub openshift: OpenshiftSection,
    /// `dir` runtime settings.
    pub dir: DirSection,
    /// `exec` runtime settings.
    pub exec: ExecSection,
    /// `sim` runtime settings.
    pub sim: SimSection,
}

/// `[runtime.facts]`: facts for `dir`, `exec` and `sim`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct FactsSection {
    /// Node profile (size class).
    pub profile: String,
    /// Most active gears the node may hold.
    pub max_active_gears: u32,
    /// District UUID; no district when absent.
    pub district_uuid: Option<String>,
    /// First UID of the district.
    pub district_first_uid: Option<u32>,
    /// Last UID of the district.
    pub district_max_uid: Option<u32>,
}

impl Default for FactsSection {
    fn default() -> Self {
        FactsSection {
            profile: "small".into(),
            max_active_gears: 100,
            district_uuid: None,
            district_first_uid: None,
            district_max_uid: None,
        }
    }
}

/// `[runtime.openshift]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct OpenshiftSection {
    /// Root of the node's file system (`/` on a real node; a copy in tests).
    pub root: PathBuf,
    /// Gear base directory below `root` (`GEAR_BASE_DIR` in `node.conf`).
    pub gear_base_dir: PathBuf,
    /// `resource_limits.conf` below `root`.
    pub resource_limits: PathBuf,
    /// The district info file below `root`.
    pub district_info: PathBuf,
    /// Move command, one argument per element, with `{gear}` and `{target}`.
    pub move_command: Vec<String>,
    /// How long one move command may run.
    #[serde(with = "duration")]
    pub move_timeout: Duration,
    /// A gear holding this file (in its home directory) opted out of scale-down.
    pub do_not_disrupt_marker: String,
}

impl Default for OpenshiftSection {
    fn default() -> Self {
        OpenshiftSection {
            root: "/".into(),
            gear_base_dir: "var/lib/openshift".into(),
            resource_limits: "etc/openshift/resource_limits.conf".into(),
            district_info: "var/lib/openshift/.settings/district.info".into(),
            move_command: vec![
                "oo-admin-move".into(),
                "--gear_uuid".into(),
                "{gear}".into(),
                "-i".into(),
                "{target}".into(),
            ],
            move_timeout: Duration::from_secs(1800),
            do_not_disrupt_marker: ".gearshift-do-not-disrupt".into(),
        }
    }
}

/// `[runtime.dir]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DirSection {
    /// Directory holding this node's gears, one sub-directory each.
    pub root: PathBuf,
    /// A target node's gear directory; `{target}` is replaced by its name.
    pub target_root: String,
    /// Copy bandwidth limit in bytes per second; 0 means unlimited.
    pub max_bytes_per_sec: u64,
    /// A gear holding this file opted out of scale-down.
    pub do_not_disrupt_marker: String,
}

impl Default for DirSection {
    fn default() -> Self {
        DirSection {
            root: "/srv/gearshift/gears".into(),
            target_root: "/srv/gearshift/nodes/{target}/gears".into(),
            max_bytes_per_sec: 0,
            do_not_disrupt_marker: ".gearshift-do-not-disrupt".into(),
        }
    }
}

/// `[runtime.exec]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ExecSection {
    /// Command that prints the gear list as JSON.
    pub list_command: Vec<String>,
    /// Move command with `{gear}` and `{target}`.
    pub move_command: Vec<String>,
    /// How long the list command may run.
    #[serde(with = "duration")]
    pub list_timeout: Duration,
    /// How long one move may run.
    #[serde(with = "duration")]
    pub move_timeout: Duration,
}

impl Default for ExecSection {
    fn default() -> Self {
        ExecSection {
            list_command: vec!["/usr/libexec/gearshift/list-gears".into()],
            move_command: vec![
                "/usr/libexec/gearshift/move-gear".into(),
                "{gear}".into(),
                "{target}".into(),
            ],
            list_timeout: Duration::from_secs(60),
            move_timeout: Duration::from_secs(1800),
        }
    }
}

/// `[runtime.sim]`: a stand-alone simulated node.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct SimSection {
    /// Gears the simulated node starts with.
    pub gears: u32,
    /// Of those, the share (percent) that are idle.
    pub idle_percent: u8,
    /// Simulated time per move.
    #[serde(with = "duration")]
    pub move_time: Duration,
    /// Simulated memory in MiB.
    pub mem_total_mb: u64,
}

impl Default for SimSection {
    fn default() -> Self {
        SimSection {
            gears: 0,
            idle_percent: 50,
            move_time: Duration::from_millis(50),
            mem_total_mb: 8192,
        }
    }
}

/// `[evacuation]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EvacuationSection {
    /// Moves in flight at once when the command does not say.
    pub parallelism: u32,
    /// Attempts per gear before it is reported failed.
    pub attempts: u32,
    /// Delay before the second attempt; doubles each time.
    #[serde(with = "duration")]
    pub backoff_min: Duration,
    /// Longest delay between attempts.
    #[serde(with = "duration")]
    pub backoff_max: Duration,
}

impl Default for EvacuationSection {
    fn default() -> Self {
        EvacuationSection {
            parallelism: 4,
            attempts: 3,
            backoff_min: Duration::from_secs(2),
            backoff_max: Duration::from_secs(60),
        }
    }
}

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

/// `[metrics]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Address for `/metrics`; off when absent.
    pub listen: Option<SocketAddr>,
}

/// `[log]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `human` or `json`.
    pub format: LogFormat,
    /// Filter directive, for example `info` or `gearshift_node=debug,info`.
    pub level: String,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            format: LogFormat::Human,
            level: "info".into(),
        }
    }
}

/// `[service]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServiceSection {
    /// On SIGTERM, how long in-flight moves may take to finish and be checkpointed.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
}

impl Default for ServiceSection {
    fn default() -> Self {
        ServiceSection {
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

fn check_duration(key: &str, d: Duration, min: Duration, max: Duration) -> Result<(), Invalid> {
    if d < min || d > max {
        return Err(Invalid::new(
            key,
            format!(
                "{} is outside {}..={}",
                humantime::format_duration(d),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    Ok(())
}

fn check_url(key: &str, v: &Option<String>) -> Result<(), Invalid> {
    if let Some(u) = v {
        let parsed =
            url::Url::parse(u).map_err(|e| Invalid::new(key, format!("not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(Invalid::new(key, "must be an http:// or https:// URL"));
        }
    }
    Ok(())
}

fn check_template(key: &str, argv: &[String], placeholders: &[&str]) -> Result<(), Invalid> {
    if argv.is_empty() || argv[0].trim().is_empty() {
        return Err(Invalid::new(key, "must name a program"));
    }
    for p in placeholders {
        if !argv.iter().any(|a| a.contains(p)) {
            return Err(Invalid::new(key, format!("must contain {p}")));
        }
    }
    Ok(())
}

/// Whether `name` is acceptable as a node name (a host name).
pub fn valid_node_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > gearshift_proto::msg::MAX_NAME {
        return Err(format!(
            "must be 1..={} bytes long",
            gearshift_proto::msg::MAX_NAME
        ));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return Err("may only contain letters, digits, '.', '-' and '_'".into());
    }
    if name.starts_with(['.', '-']) {
        return Err("must not start with '.' or '-'".into());
    }
    Ok(())
}

impl Validate for NodeConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.push_stats.validate()?;
        if let Some(name) = &self.node.name {
            valid_node_name(name).map_err(|r| Invalid::new("node.name", r))?;
        }
        for (key, v) in [
            ("node.region", &self.node.region),
            ("node.zone", &self.node.zone),
        ] {
            if let Some(v) = v
                && (v.is_empty() || v.len() > gearshift_proto::msg::MAX_NAME)
            {
                return Err(Invalid::new(key, "must be 1..=255 bytes long"));
            }
        }
        if let Some(b) = &self.node.booted_for
            && (b.is_empty() || b.len() > gearshift_proto::envelope::MAX_CORR)
        {
            return Err(Invalid::new(
                "node.booted_for",
                "must be 1..=128 bytes long",
            ));
        }
        gearshift_bus::BusUrl::parse(&self.bus.url)
            .map_err(|e| Invalid::new("bus.url", e.to_string()))?;
        let b = &self.bus;
        check_duration(
            "bus.heartbeat",
            b.heartbeat,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
        check_duration(
            "bus.reconnect_min",
            b.reconnect_min,
            Duration::from_millis(10),
            Duration::from_secs(600),
        )?;
        check_duration(
            "bus.reconnect_max",
            b.reconnect_max,
            b.reconnect_min,
            Duration::from_secs(3600),
        )?;
        check_duration(
            "bus.op_timeout",
            b.op_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check_duration(
            "bus.connect_timeout",
            b.connect_timeout,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        if b.prefetch == 0 {
            return Err(Invalid::new("bus.prefetch", "must be at least 1"));
        }
        if !(16..=1_000_000).contains(&b.outbox_capacity) {
            return Err(Invalid::new(
                "bus.outbox_capacity",
                "must be in 16..=1000000",
            ));
        }
        if b.cert_file.is_some() != b.key_file.is_some() {
            return Err(Invalid::new(
                "bus.cert_file",
                "bus.cert_file and bus.key_file go together",
            ));
        }
        let k = &self.keys;
        if k.signing_key.as_os_str().is_empty() {
            return Err(Invalid::new("keys.signing_key", "must name a file"));
        }
        if k.broker_keys.is_empty() && k.operator_keys.is_empty() {
            return Err(Invalid::new(
                "keys.broker_keys",
                "no trusted key: every command would be refused",
            ));
        }
        check_duration(
            "keys.time_window",
            k.time_window,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        )?;
        if !(16..=10_000_000).contains(&k.replay_capacity) {
            return Err(Invalid::new(
                "keys.replay_capacity",
                "must be in 16..=10000000",
            ));
        }
        if self.state.dir.as_os_str().is_empty() {
            return Err(Invalid::new("state.dir", "must name a directory"));
        }
        let r = &self.report;
        check_duration(
            "report.interval",
            r.interval,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        check_duration(
            "report.scan_interval",
            r.scan_interval,
            Duration::from_millis(50),
            Duration::from_secs(3600),
        )?;
        check_duration("report.min_gap", r.min_gap, Duration::ZERO, r.interval)?;
        self.validate_runtime()?;
        let e = &self.evacuation;
        if !(1..=256).contains(&e.parallelism) {
            return Err(Invalid::new("evacuation.parallelism", "must be in 1..=256"));
        }
        if !(1..=100).contains(&e.attempts) {
            return Err(Invalid::new("evacuation.attempts", "must be in 1..=100"));
        }
        check_duration(
            "evacuation.backoff_min",
            e.backoff_min,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
        check_duration(
            "evacuation.backoff_max",
            e.backoff_max,
            e.backoff_min,
            Duration::from_secs(86_400),
        )?;
        self.validate_heat()?;
        gearshift_service::logging::check_level(&self.log.level)
            .map_err(|e| Invalid::new("log.level", e))?;
        check_duration(
            "service.shutdown_grace",
            self.service.shutdown_grace,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
        Ok(())
    }
}

impl NodeConfig {
    fn validate_runtime(&self) -> Result<(), Invalid> {
        let rt = &self.runtime;
        let f = &rt.facts;
        if f.profile.is_empty() || f.profile.len() > gearshift_proto::msg::MAX_NAME {
            return Err(Invalid::new(
                "runtime.facts.profile",
                "must be 1..=255 bytes long",
            ));
        }
        if let Some(u) = &f.district_uuid
            && (u.is_empty() || !u.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        {
            return Err(Invalid::new(
                "runtime.facts.district_uuid",
                "must be letters, digits and '-'",
            ));
        }
        if let (Some(a), Some(b)) = (f.district_first_uid, f.district_max_uid)
            && b < a
        {
            return Err(Invalid::new(
                "runtime.facts.district_max_uid",
                "must not be below district_first_uid",
            ));
        }
        match rt.kind {
            RuntimeKind::Openshift => {
                let o = &rt.openshift;
                check_template(
                    "runtime.openshift.move_command",
                    &o.move_command,
                    &["{gear}", "{target}"],
                )?;
                check_duration(
                    "runtime.openshift.move_timeout",
                    o.move_timeout,
                    Duration::from_secs(1),
                    Duration::from_secs(86_400),
                )?;
                for (key, p) in [
                    ("runtime.openshift.gear_base_dir", &o.gear_base_dir),
                    ("runtime.openshift.resource_limits", &o.resource_limits),
                    ("runtime.openshift.district_info", &o.district_info),
                ] {
                    if p.as_os_str().is_empty() {
                        return Err(Invalid::new(key, "must name a path"));
                    }
                }
            }
            RuntimeKind::Dir => {
                let d = &rt.dir;
                if d.root.as_os_str().is_empty() {
                    return Err(Invalid::new("runtime.dir.root", "must name a directory"));
                }
                if !d.target_root.contains("{target}") {
                    return Err(Invalid::new(
                        "runtime.dir.target_root",
                        "must contain {target}",
                    ));
                }
                if d.do_not_disrupt_marker.contains('/') {
                    return Err(Invalid::new(
                        "runtime.dir.do_not_disrupt_marker",
                        "must be a file name",
                    ));
                }
            }
            RuntimeKind::Exec => {
                let x = &rt.exec;
                check_template("runtime.exec.list_command", &x.list_command, &[])?;
                check_template(
                    "runtime.exec.move_command",
                    &x.move_command,
                    &["{gear}", "{target}"],
                )?;
                check_duration(
                    "runtime.exec.list_timeout",
                    x.list_timeout,
                    Duration::from_millis(100),
                    Duration::from_secs(3600),
                )?;
                check_duration(
                    "runtime.exec.move_timeout",
                    x.move_timeout,
                    Duration::from_millis(100),
                    Duration::from_secs(86_400),
                )?;
            }
            RuntimeKind::Sim => {
                if rt.sim.idle_percent > 100 {
                    return Err(Invalid::new(
                        "runtime.sim.idle_percent",
                        "must be at most 100",
                    ));
                }
                if rt.sim.gears > 100_000 {
                    return Err(Invalid::new("runtime.sim.gears", "must be at most 100000"));
                }
            }
        }
        Ok(())
    }

    fn validate_heat(&self) -> Result<(), Invalid> {
        let h = &self.heat;
        check_url("heat.scale_up_url", &h.scale_up_url)?;
        check_url("heat.scale_down_url", &h.scale_down_url)?;
        check_url("heat.signal_url", &h.signal_url)?;
        check_url("heat.endpoint", &h.endpoint)?;
        if let Some(body) = &h.signal_body {
            let probe = body.replace("{node}", "n").replace("{reason}", "r");
            serde_json::from_str::<serde_json::Value>(&probe)
                .map_err(|e| Invalid::new("heat.signal_body", format!("not JSON: {e}")))?;
        }
        check_duration(
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

    /// The bus connection options this configuration asks for.
    pub fn connect_options(&self, name: &str) -> gearshift_bus::ConnectOptions {
        gearshift_bus::ConnectOptions {
            name: format!("gearshift-node {name}"),
            tls: gearshift_bus::TlsOptions {
                ca_file: self.bus.ca_file.clone(),
                cert_file: self.bus.cert_file.clone(),
                key_file: self.bus.key_file.clone(),
                server_name: self.bus.server_name.clone(),
            },
            heartbeat: self.bus.heartbeat,
            reconnect_min: self.bus.reconnect_min,
            reconnect_max: self.bus.reconnect_max,
            op_timeout: self.bus.op_timeout,
            connect_timeout: self.bus.connect_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn load(text: &str) -> Result<NodeConfig, gearshift_service::config::ConfigError> {
        gearshift_service::config::load_str(text, Path::new("node.toml"), ENV_PREFIX, Vec::new())
    }

    #[test]
    fn empty_file_is_valid_with_defaults() {
        let c = load("").unwrap();
        assert_eq!(c, NodeConfig::default());
        assert_eq!(c.evacuation.parallelism, 4);
        assert_eq!(c.report.interval, Duration::from_secs(10));
    }

    #[test]
    fn shipped_file_is_valid() {
        let text = include_str!("../../conf/node.toml");
        let c = load(text).unwrap();
        assert_eq!(c.runtime.kind, RuntimeKind::Openshift);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key) in [
            ("[evacuation]\nparallelism = 0\n", "evacuation.parallelism"),
            ("[report]\ninterval = \"soon\"\n", "report.interval"),
            ("[report]\ninterval = \"1ms\"\n", "report.interval"),
            ("[bus]\nurl = \"http://x\"\n", "bus.url"),
            (
                "[runtime]\nkind = \"dir\"\n[runtime.dir]\ntarget_root = \"/x\"\n",
                "runtime.dir.target_root",
            ),
            ("[runtime]\nkinds = \"dir\"\n", "kinds"),
            (
                "[heat]\nremove_action = \"scale_down\"\n",
                "heat.remove_action",
            ),
            ("[heat]\nsignal_url = \"ftp://x\"\n", "heat.signal_url"),
            ("[node]\nname = \"a b\"\n", "node.name"),
            ("[keys]\nbroker_keys = []\n", "keys.broker_keys"),
            ("[heat]\ncredentials = \"auth_env\"\n", "heat.auth_env"),
            ("[heat]\ncredentials = \"openrc\"\n", "heat.credentials"),
        ] {
            let e = load(text).unwrap_err().to_string();
            assert!(e.contains(key), "{text:?} gave {e}");
        }
    }

    #[test]
    fn env_overrides() {
        let c: NodeConfig = gearshift_service::config::load_str(
            "",
            Path::new("node.toml"),
            ENV_PREFIX,
            vec![
                (
                    "GEARSHIFT_NODE_REPORT__INTERVAL".to_string(),
                    "30s".to_string(),
                ),
                (
                    "GEARSHIFT_NODE_EVACUATION__PARALLELISM".to_string(),
                    "8".to_string(),
                ),
            ],
        )
        .unwrap();
        assert_eq!(c.report.interval, Duration::from_secs(30));
        assert_eq!(c.evacuation.parallelism, 8);
    }
}
