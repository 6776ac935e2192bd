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
//!
//! `[bus]`, `[keys]`, `[log]` and `[metrics]` are the sections both agents
//! share (`gearshift_service::sections`); the node's own keys in `[bus]`
//! and `[keys]` are in `own`, `[runtime]` in `runtime`, `[heat]` in `heat`,
//! `[enroll]` in `enroll`.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_service::bootstrap::ServiceConfig;
use gearshift_service::check;
use gearshift_service::config::{Invalid, Validate, duration};
use serde::{Deserialize, Serialize};

mod enroll;
mod heat;
mod own;
mod runtime;
#[cfg(test)]
mod tests;

pub use enroll::EnrollSection;
pub use gearshift_service::sections::{LogSection, MetricsSection};
pub use heat::{CredentialSource, HeatSection, RemoveAction};
pub use own::{NodeBus, NodeKeys};
pub use runtime::{
    DirSection, ExecSection, FactsSection, OpenshiftSection, RuntimeKind, RuntimeSection,
    SimSection,
};

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "GEARSHIFT_NODE";
/// Where the packaged service reads its configuration.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gearshift/node.toml";

/// `[bus]`: the shared section, with the node's own keys and reconnect defaults.
pub type BusSection = gearshift_service::sections::BusSection<NodeBus>;
/// `[keys]`: the shared section, with the node's trusted keys.
pub type KeysSection = gearshift_service::sections::KeysSection<NodeKeys>;

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
    /// Enrolling the node's own key with a token (off by default).
    pub enroll: EnrollSection,
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

impl NodeSection {
    /// Checks the section; keys in errors start with `node.`.
    fn check(&self) -> Result<(), Invalid> {
        if let Some(name) = &self.name {
            valid_node_name(name).map_err(|r| Invalid::new("node.name", r))?;
        }
        for (key, v) in [("node.region", &self.region), ("node.zone", &self.zone)] {
            if let Some(v) = v
                && (v.is_empty() || v.len() > gearshift_proto::msg::MAX_NAME)
            {
                return Err(Invalid::new(key, "must be 1..=255 bytes long"));
            }
        }
        if let Some(b) = &self.booted_for
            && (b.is_empty() || b.len() > gearshift_proto::envelope::MAX_CORR)
        {
            return Err(Invalid::new(
                "node.booted_for",
                "must be 1..=128 bytes long",
            ));
        }
        Ok(())
    }
}

impl ReportSection {
    /// Checks the section; keys in errors start with `report.`.
    fn check(&self) -> Result<(), Invalid> {
        let hour = Duration::from_secs(3600);
        check::within(
            "report.interval",
            self.interval,
            Duration::from_millis(100),
            hour,
        )?;
        check::within(
            "report.scan_interval",
            self.scan_interval,
            Duration::from_millis(50),
            hour,
        )?;
        check::within(
            "report.min_gap",
            self.min_gap,
            Duration::ZERO,
            self.interval,
        )
    }
}

impl EvacuationSection {
    /// Checks the section; keys in errors start with `evacuation.`.
    fn check(&self) -> Result<(), Invalid> {
        if !(1..=256).contains(&self.parallelism) {
            return Err(Invalid::new("evacuation.parallelism", "must be in 1..=256"));
        }
        if !(1..=100).contains(&self.attempts) {
            return Err(Invalid::new("evacuation.attempts", "must be in 1..=100"));
        }
        check::within(
            "evacuation.backoff_min",
            self.backoff_min,
            Duration::ZERO,
            Duration::from_secs(3600),
        )?;
        check::within(
            "evacuation.backoff_max",
            self.backoff_max,
            self.backoff_min,
            Duration::from_secs(86_400),
        )
    }
}

impl Validate for NodeConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.push_stats.validate()?;
        self.node.check()?;
        self.bus.check()?;
        self.keys.check()?;
        check::names_a_path("state.dir", &self.state.dir, "directory")?;
        self.report.check()?;
        self.runtime.check()?;
        self.evacuation.check()?;
        self.heat.check()?;
        self.enroll.check()?;
        self.log.check()?;
        check::within(
            "service.shutdown_grace",
            self.service.shutdown_grace,
            Duration::ZERO,
            Duration::from_secs(3600),
        )
    }
}

impl ServiceConfig for NodeConfig {
    const ENV_PREFIX: &'static str = ENV_PREFIX;

    fn log(&self) -> &LogSection {
        &self.log
    }
}

impl NodeConfig {
    /// The bus connection options this configuration asks for.
    pub fn connect_options(&self, name: &str) -> gearshift_bus::ConnectOptions {
        self.bus.connect_options(format!("gearshift-node {name}"))
    }
}
