//! `conf/broker.toml`: every setting of the broker agent, its default and
//! its checks. Loaded by [`load`] (file, then `GEARSHIFT_BROKER_…`
//! environment overrides, then [`Validate`]) before any network access.
//!
//! Names follow the seeds: `[policy] interval` is the capacity checker's
//! `INTERVAL`, `profile_threshold` its `PROFILE_THRESHOLD`, and so on.
//!
//! `[bus]`, `[keys]`, `[log]` and `[metrics]` are the sections both agents
//! share (`gearshift_service::sections`); the broker agent's own keys in
//! `[bus]` and `[keys]` are in `own`, `[policy]` in `policy`, `[saga]` in
//! `saga`, node groups in `groups`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gearshift_service::bootstrap::ServiceConfig;
use gearshift_service::config::{ConfigError, Invalid, Validate, duration};
use serde::{Deserialize, Serialize};

mod groups;
mod own;
mod policy;
mod saga;
#[cfg(test)]
mod tests;

pub use gearshift_service::sections::{LogSection, MetricsSection};
pub use groups::{GroupConfig, GroupDefaults, GroupSettings};
pub use own::{BrokerBus, BrokerKeys, TrustEntry};
pub use policy::{PolicyConfig, VictimStrategy};
pub use saga::SagaConfig;

/// Prefix of environment overrides: `GEARSHIFT_BROKER_POLICY__INTERVAL=30s`.
pub const ENV_PREFIX: &str = "GEARSHIFT_BROKER";

/// The shortest period or deadline any `[policy]` or `[saga]` key accepts.
const MIN_PERIOD: Duration = Duration::from_millis(50);

/// `[bus]`: the shared section, with the broker agent's reconnect defaults.
pub type BusSection = gearshift_service::sections::BusSection<BrokerBus>;
/// `[keys]`: the shared section, with the broker agent's trusted keys.
pub type KeysSection = gearshift_service::sections::KeysSection<BrokerKeys>;

/// The whole configuration.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Who the agent is and where it keeps its state.
    #[serde(default)]
    pub agent: AgentSection,
    /// The message bus.
    #[serde(default)]
    pub bus: BusSection,
    /// Signing key and trusted keys.
    #[serde(default)]
    pub keys: KeysSection,
    /// Logging.
    #[serde(default)]
    pub log: LogSection,
    /// Prometheus metrics listener (and the dashboard).
    #[serde(default)]
    pub metrics: MetricsSection,
    /// When to scale (the seeds' thresholds and the peer autoscalers' guards).
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Deadlines and retries of the scale-up and scale-down sagas.
    #[serde(default)]
    pub saga: SagaConfig,
    /// Settings every node group starts from.
    #[serde(default)]
    pub group_defaults: GroupDefaults,
    /// Node groups with settings of their own.
    #[serde(default)]
    pub groups: Vec<GroupConfig>,
    /// Named handlers; groups refer to them by name. `log` always exists.
    #[serde(default)]
    pub handlers: BTreeMap<String, HandlerConfig>,
    /// Gear placement (the seed's plugin) and the evacuation planner.
    #[serde(default)]
    pub placement: gearshift_placement::PlacementConfig,
    /// Pull mode: fleet figures pushed for Heat/Aodh alarms (disabled by default).
    #[serde(default)]
    pub push_stats: gearshift_pushstats::PushStatsConfig,
    /// The durable history of decisions, saga steps and explanations.
    #[serde(default)]
    pub history: crate::history::HistoryConfig,
    /// Recording the reports received, for what-if replays (off by default).
    #[serde(default)]
    pub trace: crate::trace::TraceConfig,
    /// The PaaS the sagas tell about districts and gear moves (`none` by default).
    #[serde(default)]
    pub paas: crate::paas::PaasConfig,
}

/// Handler settings, as the handlers crate defines them (`type = "exec"`, ...).
pub type HandlerConfig = gearshift_handlers::HandlerConfig;

/// `[agent]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentSection {
    /// The agent's identity on the bus (`from` of what it publishes). Default `broker`.
    pub name: String,
    /// Where the journal and the lock live. Default `/var/lib/gearshift-broker`.
    pub state_dir: PathBuf,
    /// How long SIGTERM waits for in-flight work. Default `30s`.
    #[serde(with = "duration")]
    pub shutdown_grace: Duration,
    /// Durable queue of node events (bound to `event.#`). Default
    /// `gearshift.broker.events`; change it only to run several broker
    /// agents on one bus (tests).
    pub events_queue: String,
    /// Durable queue of operator requests. Default `gearshift.broker.admin`.
    pub admin_queue: String,
    /// Routing key operator requests are published with. Default `admin.request`.
    pub admin_key: String,
    /// Serve `placement.request` on the bus. Default `true`.
    pub placement_service: bool,
    /// Durable queue of placement requests. Default `gearshift.broker.placement`.
    pub placement_queue: String,
    /// Routing key placement requests are published with. Default `placement.request`.
    pub placement_key: String,
    /// At most this many node reports wait for the agent on the bus. Reports
    /// are read from this process's own transient queue (bound to
    /// `report.#`, acknowledged, 1,024 in flight); when the agent falls
    /// behind, the oldest waiting reports are dropped there (a node's next
    /// report supersedes them) instead of piling up in the agent's memory.
    /// `0`: no bound (an unacknowledged subscription). Default `50000`.
    pub report_backlog: u32,
    /// The broker agents that elect one leader among them share this name
    /// (`docs/ha.md`): their leader queue is `gearshift.broker.leader.<cluster>`,
    /// their tokens, announcements and replicated journal go on
    /// `broker.{candidate,leader,journal}.<cluster>`. 1..=64 ASCII letters,
    /// digits, `-` or `_`. Default `main`.
    pub cluster: String,
    /// How often each agent publishes its candidate token, and the leader its
    /// announcement. Default `1s`.
    #[serde(with = "duration")]
    pub lead_period: Duration,
    /// A leader that got none of its own tokens back for this long steps
    /// down (at least twice `lead_period`). Default `10s`: a backstop (a
    /// dropped connection steps the leader down at once) that a leader busy
    /// with a large backlog must not trip.
    #[serde(with = "duration")]
    pub lead_lease: Duration,
}

impl Default for AgentSection {
    fn default() -> Self {
        AgentSection {
            name: "broker".into(),
            state_dir: "/var/lib/gearshift-broker".into(),
            shutdown_grace: Duration::from_secs(30),
            events_queue: "gearshift.broker.events".into(),
            admin_queue: "gearshift.broker.admin".into(),
            admin_key: gearshift_proto::routing::ADMIN.into(),
            placement_service: true,
            placement_queue: gearshift_placement::service::QUEUE.into(),
            placement_key: gearshift_proto::routing::PLACEMENT.into(),
            report_backlog: 50_000,
            cluster: "main".into(),
            lead_period: Duration::from_secs(1),
            lead_lease: Duration::from_secs(10),
        }
    }
}

impl AgentSection {
    /// A valid `cluster` made of `tag` (other characters become `_`, at
    /// most 64): for tests and runs that share one bus.
    pub fn cluster_of(tag: &str) -> String {
        let c: String = tag
            .chars()
            .take(64)
            .map(|ch| {
                if ch.is_ascii_alphanumeric() || ch == '-' {
                    ch
                } else {
                    '_'
                }
            })
            .collect();
        if c.is_empty() { "_".into() } else { c }
    }

    /// Checks the section; keys in errors start with `agent.`.
    fn check(&self) -> Result<(), Invalid> {
        let name = &self.name;
        if name.is_empty() || name.len() > gearshift_proto::msg::MAX_NAME {
            return Err(Invalid::new("agent.name", "must be 1..=255 bytes"));
        }
        if self.state_dir.as_os_str().is_empty() {
            return Err(Invalid::new("agent.state_dir", "must not be empty"));
        }
        for (key, v) in [
            ("agent.events_queue", &self.events_queue),
            ("agent.admin_queue", &self.admin_queue),
            ("agent.admin_key", &self.admin_key),
            ("agent.placement_queue", &self.placement_queue),
            ("agent.placement_key", &self.placement_key),
        ] {
            // AMQP short strings; STOMP destinations cannot carry '/'.
            if v.is_empty() || v.len() > 255 || v.contains('/') || v.chars().any(char::is_control) {
                return Err(Invalid::new(
                    key,
                    format!("{v:?}: must be 1..=255 bytes without '/' or control characters"),
                ));
            }
        }
        let c = &self.cluster;
        if c.is_empty()
            || c.len() > 64
            || !c
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_')
        {
            return Err(Invalid::new(
                "agent.cluster",
                format!("{c:?}: must be 1..=64 ASCII letters, digits, '-' or '_'"),
            ));
        }
        if self.lead_period < Duration::from_millis(50)
            || self.lead_period > Duration::from_secs(60)
        {
            return Err(Invalid::new("agent.lead_period", "must be 50ms..=60s"));
        }
        if self.lead_lease < self.lead_period * 2 {
            return Err(Invalid::new(
                "agent.lead_lease",
                "must be at least twice agent.lead_period",
            ));
        }
        Ok(())
    }
}

/// What a reload (SIGHUP) applies while running: the policy, the sagas'
/// settings, the groups, the handlers, placement, the trusted keys and the
/// metrics listener's address. A change anywhere else only applies at start
/// and makes the reload refused, naming the key.
pub const RELOADABLE: &[&str] = &[
    "policy",
    "saga",
    "group_defaults",
    "groups",
    "handlers",
    "placement",
    "keys.time_window",
    "keys.node_keys_dir",
    "keys.operator_keys_dir",
    "keys.trust",
    "metrics.listen",
];

impl BrokerConfig {
    /// The keys changed from `self` to `new` that a reload cannot apply
    /// (outside [`RELOADABLE`]), as dotted paths.
    pub fn restart_keys(&self, new: &BrokerConfig) -> Vec<String> {
        gearshift_service::reload::needs_restart(self, new, RELOADABLE)
    }

    /// The built-in defaults (what an empty file gives).
    pub fn defaults() -> BrokerConfig {
        BrokerConfig::default()
    }

    /// The configuration as TOML (what `check-config` reads back).
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }
}

impl Validate for BrokerConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.push_stats.validate()?;
        self.history.validate()?;
        self.trace.validate()?;
        self.log.check()?;
        self.agent.check()?;
        self.bus.check()?;
        self.keys.check()?;
        self.policy.check()?;
        self.saga.check()?;
        self.paas.check()?;
        self.check_groups()?;
        self.placement
            .validate()
            .map_err(|e| Invalid::new(format!("placement.{}", e.key), e.reason))?;
        for (name, h) in &self.handlers {
            h.validate()
                .map_err(|e| e.under(&format!("handlers.{name}")))?;
        }
        Ok(())
    }
}

impl ServiceConfig for BrokerConfig {
    const ENV_PREFIX: &'static str = ENV_PREFIX;

    fn log(&self) -> &LogSection {
        &self.log
    }
}

/// Loads and validates a configuration file (with environment overrides).
pub fn load(path: &Path) -> Result<BrokerConfig, ConfigError> {
    gearshift_service::config::load(path, ENV_PREFIX)
}

/// Loads a configuration from text (for tests and embedding).
pub fn load_str(text: &str) -> Result<BrokerConfig, ConfigError> {
    gearshift_service::config::load_str(text, Path::new("<inline>"), ENV_PREFIX, std::iter::empty())
}
