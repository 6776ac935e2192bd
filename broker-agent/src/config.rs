//! `conf/broker.toml`: every setting of the broker agent, its default and
//! its checks. Loaded by [`load`] (file, then `GEARSHIFT_BROKER_…`
//! environment overrides, then [`Validate`]) before any network access.
//!
//! Names follow the seeds: `[policy] interval` is the capacity checker's
//! `INTERVAL`, `profile_threshold` its `PROFILE_THRESHOLD`, and so on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gearshift_handlers::{GroupKey, NodeShape};
use gearshift_service::config::{ConfigError, Invalid, Validate, duration};
use gearshift_service::logging::LogFormat;
use serde::{Deserialize, Serialize};

use crate::perkey::PerKey;

/// Prefix of environment overrides: `GEARSHIFT_BROKER_POLICY__INTERVAL=30s`.
pub const ENV_PREFIX: &str = "GEARSHIFT_BROKER";

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize)]
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
    /// Prometheus metrics listener.
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
        }
    }
}

/// `[bus]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BusSection {
    /// `amqp://…`, `amqps://…`, `stomp://…`, `stomp+ssl://…` or `memory://`.
    /// Default `amqp://guest:guest@127.0.0.1:5672/%2f`.
    pub url: String,
    /// Heart-beat interval. Default `10s`.
    #[serde(with = "duration")]
    pub heartbeat: Duration,
    /// How long one bus operation may wait (including a reconnect). Default `30s`.
    #[serde(with = "duration")]
    pub op_timeout: Duration,
    /// PEM CA file for TLS URLs. Default none (system roots).
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate. Default none.
    pub cert_file: Option<PathBuf>,
    /// PEM client key. Default none.
    pub key_file: Option<PathBuf>,
}

impl Default for BusSection {
    fn default() -> Self {
        BusSection {
            url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            heartbeat: Duration::from_secs(10),
            op_timeout: Duration::from_secs(30),
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

/// `[keys]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeysSection {
    /// The broker's private key (PKCS#8 PEM, `gearshift-broker keygen`).
    /// Default `/etc/gearshift/broker.key`.
    pub signing_key: PathBuf,
    /// Every `*.pub` here is trusted as a node key. Default `/etc/gearshift/nodes.d`.
    pub node_keys_dir: PathBuf,
    /// Every `*.pub` here is trusted as an operator key. Default `/etc/gearshift/operators.d`.
    pub operator_keys_dir: PathBuf,
    /// Further trusted keys with their role. Default none.
    pub trust: Vec<TrustEntry>,
    /// Accepted clock skew of received messages. Default `5m`.
    #[serde(with = "duration")]
    pub time_window: Duration,
}

impl Default for KeysSection {
    fn default() -> Self {
        KeysSection {
            signing_key: "/etc/gearshift/broker.key".into(),
            node_keys_dir: "/etc/gearshift/nodes.d".into(),
            operator_keys_dir: "/etc/gearshift/operators.d".into(),
            trust: vec![],
            time_window: Duration::from_secs(300),
        }
    }
}

/// One extra trusted key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustEntry {
    /// `node`, `operator`, `client` or `broker`.
    pub role: gearshift_proto::Role,
    /// SubjectPublicKeyInfo PEM file.
    pub path: PathBuf,
}

/// `[log]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `human` or `json`. Default `human`.
    pub format: LogFormat,
    /// tracing filter. Default `info`.
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

/// `[metrics]`
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Address of the `/metrics` listener; none (the default) disables it.
    pub listen: Option<SocketAddr>,
}

/// How the victim of a scale-down is chosen (inactive nodes always come first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VictimStrategy {
    /// Fewest active gears, then fewest gears (cheapest to empty).
    #[default]
    LeastBusy,
    /// Only nodes without any gear.
    EmptyOnly,
    /// The node whose agent started first.
    Oldest,
    /// The node whose agent started last.
    Newest,
}

impl VictimStrategy {
    /// The configuration name.
    pub fn as_str(self) -> &'static str {
        match self {
            VictimStrategy::LeastBusy => "least_busy",
            VictimStrategy::EmptyOnly => "empty_only",
            VictimStrategy::Oldest => "oldest",
            VictimStrategy::Newest => "newest",
        }
    }
}

/// `[policy]`: when to scale. Per-profile keys take `"default, profile: value"`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// `INTERVAL`: time between evaluations. Default `60s`.
    #[serde(with = "duration")]
    pub interval: Duration,
    /// After a report pushes a group over a scale-up threshold, evaluate
    /// this soon instead of waiting for the next interval. Default `1s`.
    #[serde(with = "duration")]
    pub react_delay: Duration,
    /// After the agent starts, hold every decision this long while reports
    /// come in (the fleet model starts empty). Default `30s`.
    #[serde(with = "duration")]
    pub startup_grace: Duration,
    /// `PROFILE_THRESHOLD`: active usage % of a profile at which a node is
    /// added to its district with the most free capacity. Default `80`.
    pub profile_threshold: PerKey,
    /// `DISTRICT_THRESHOLD`: active usage % of one district at which a node is
    /// added to it. Default `90`.
    pub district_threshold: PerKey,
    /// `COMPACT_THRESHOLD`: active usage % of a district below which it is
    /// compacted (a node emptied and removed). Default `50`.
    pub compact_threshold: PerKey,
    /// `GEAR_UP_THRESHOLD`: scale up a profile whose effective available
    /// gears fall below this. Default `none` (off).
    pub gear_up_threshold: PerKey,
    /// `GEAR_UP_SIZE`: gears of capacity to add when `gear_up_threshold`
    /// fires (rounded up to whole nodes). Default `200`.
    pub gear_up_size: PerKey,
    /// `GEAR_DOWN_THRESHOLD`: scale down a profile with at least this many
    /// available gears. Default `none` (off).
    pub gear_down_threshold: PerKey,
    /// `GEAR_EXPECTED_ACTIVE_PERCENT`: share of a node's gears expected to be
    /// active; a new node needs `max_active_gears * 100 / this` free UIDs in
    /// its district. Default `5`.
    pub gear_expected_active_percent: PerKey,
    /// A node is missing after this many of its report intervals without a
    /// report. Default `3`.
    pub stale_after_intervals: u32,
    /// A missing node is forgotten (no longer holds scaling) after this. Default `30m`.
    #[serde(with = "duration")]
    pub forget_missing_after: Duration,
    /// Breaker: all scaling stops while more than this % of nodes are missing. Default `45`.
    pub breaker_stale_percent: u32,
    /// No scale-down in a group this long after a scale-up. Default `10m`.
    #[serde(with = "duration")]
    pub cooldown_after_scale_up: Duration,
    /// No further scale-down in a group this long after a removal. Default `5m`.
    #[serde(with = "duration")]
    pub cooldown_after_scale_down: Duration,
    /// No scale-down in a group this long after a failed (aborted) one. Default `3m`.
    #[serde(with = "duration")]
    pub cooldown_after_failure: Duration,
    /// A group must stay below its compact threshold this long before a
    /// scale-down. Default `10m`.
    #[serde(with = "duration")]
    pub scale_down_stabilization: Duration,
    /// A requested node that has not reported within this is given up. Default `15m`.
    #[serde(with = "duration")]
    pub provision_timeout: Duration,
    /// First wait before a group scales up again after a failed scale-up. Default `5m`.
    #[serde(with = "duration")]
    pub backoff_initial: Duration,
    /// Longest such wait (the wait doubles per consecutive failure). Default `30m`.
    #[serde(with = "duration")]
    pub backoff_max: Duration,
    /// Consecutive quota failures that mark a group exhausted. Default `2`.
    pub exhausted_after_quota_failures: u32,
    /// How often an exhausted group's handler is asked for capacity. Default `5m`.
    #[serde(with = "duration")]
    pub exhaustion_check_interval: Duration,
    /// Disruption budget: nodes draining at once per group, in % of its nodes
    /// (at least 1). Default `10`.
    pub disruption_budget_percent: u32,
    /// Disruption budget: nodes draining at once in the whole fleet, in % of
    /// its nodes (at least 1). Default `10`.
    pub fleet_disruption_budget_percent: u32,
    /// Victim choice after inactive nodes. Default `least_busy`.
    pub victim_strategy: VictimStrategy,
    /// Scale-ups in flight at once per group. Default `3`.
    pub max_scale_ups_in_flight: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            interval: Duration::from_secs(60),
            react_delay: Duration::from_secs(1),
            startup_grace: Duration::from_secs(30),
            profile_threshold: PerKey::all(80),
            district_threshold: PerKey::all(90),
            compact_threshold: PerKey::all(50),
            gear_up_threshold: PerKey::off(),
            gear_up_size: PerKey::all(200),
            gear_down_threshold: PerKey::off(),
            gear_expected_active_percent: PerKey::all(5),
            stale_after_intervals: 3,
            forget_missing_after: Duration::from_secs(30 * 60),
            breaker_stale_percent: 45,
            cooldown_after_scale_up: Duration::from_secs(600),
            cooldown_after_scale_down: Duration::from_secs(300),
            cooldown_after_failure: Duration::from_secs(180),
            scale_down_stabilization: Duration::from_secs(600),
            provision_timeout: Duration::from_secs(900),
            backoff_initial: Duration::from_secs(300),
            backoff_max: Duration::from_secs(1800),
            exhausted_after_quota_failures: 2,
            exhaustion_check_interval: Duration::from_secs(300),
            disruption_budget_percent: 10,
            fleet_disruption_budget_percent: 10,
            victim_strategy: VictimStrategy::LeastBusy,
            max_scale_ups_in_flight: 3,
        }
    }
}

/// `[saga]`: deadlines and retries of each step.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SagaConfig {
    /// `expires` of commands sent to nodes. Default `10m`.
    #[serde(with = "duration")]
    pub command_ttl: Duration,
    /// How long a node has to answer `cmd.deactivate`, `cmd.inventory` or
    /// `cmd.activate` before the command is sent again. Default `2m`.
    #[serde(with = "duration")]
    pub command_timeout: Duration,
    /// Sends of one command before the step fails. Default `3`.
    pub command_attempts: u32,
    /// Deadline of one evacuation (the drain deadline). Default `15m`.
    #[serde(with = "duration")]
    pub evacuation_timeout: Duration,
    /// Evacuation rounds (re-plan what is left) before the saga aborts. Default `3`.
    pub evacuation_attempts: u32,
    /// Moves in flight at once on the draining node. Default `4`.
    pub evacuation_parallelism: u32,
    /// How long to wait for a report that shows the node empty. Default `2m`.
    #[serde(with = "duration")]
    pub confirm_empty_timeout: Duration,
    /// How long a removal may take until the node is confirmed gone. Default `15m`.
    #[serde(with = "duration")]
    pub remove_timeout: Duration,
    /// How often the handler is asked whether a removed node is gone. Default `30s`.
    #[serde(with = "duration")]
    pub presence_poll: Duration,
    /// Bound on one handler call. Default `2m`.
    #[serde(with = "duration")]
    pub handler_timeout: Duration,
    /// Create requests per scale-up (retried only when the cloud certainly
    /// created nothing). Default `3`.
    pub create_attempts: u32,
    /// Finished operations kept for `status`. Default `200`.
    pub history: usize,
}

impl Default for SagaConfig {
    fn default() -> Self {
        SagaConfig {
            command_ttl: Duration::from_secs(600),
            command_timeout: Duration::from_secs(120),
            command_attempts: 3,
            evacuation_timeout: Duration::from_secs(900),
            evacuation_attempts: 3,
            evacuation_parallelism: 4,
            confirm_empty_timeout: Duration::from_secs(120),
            remove_timeout: Duration::from_secs(900),
            presence_poll: Duration::from_secs(30),
            handler_timeout: Duration::from_secs(120),
            create_attempts: 3,
            history: 200,
        }
    }
}

/// `[group_defaults]`
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupDefaults {
    /// Handler name. Default `log` (dry run).
    pub handler: String,
    /// Fewest nodes; below it the group scales up. Default `0`.
    pub min_nodes: u32,
    /// Most nodes, booting ones included. Default `20`.
    pub max_nodes: u32,
    /// Cloud shape of new nodes. Default empty.
    pub shape: NodeShape,
}

impl Default for GroupDefaults {
    fn default() -> Self {
        GroupDefaults {
            handler: "log".into(),
            min_nodes: 0,
            max_nodes: 20,
            shape: NodeShape::default(),
        }
    }
}

/// `[[groups]]`: one node group's own settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// District UUID (`_none` for undistricted nodes).
    pub district: String,
    /// Node profile.
    pub profile: String,
    /// Handler name; `group_defaults.handler` when absent.
    #[serde(default)]
    pub handler: Option<String>,
    /// Fewest nodes; `group_defaults.min_nodes` when absent.
    #[serde(default)]
    pub min_nodes: Option<u32>,
    /// Most nodes; `group_defaults.max_nodes` when absent.
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// Victim strategy; `policy.victim_strategy` when absent.
    #[serde(default)]
    pub victim_strategy: Option<VictimStrategy>,
    /// Cloud shape; `group_defaults.shape` when absent.
    #[serde(default)]
    pub shape: Option<NodeShape>,
}

/// A group's effective settings.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSettings {
    /// Handler name.
    pub handler: String,
    /// Fewest nodes.
    pub min_nodes: u32,
    /// Most nodes.
    pub max_nodes: u32,
    /// Victim strategy.
    pub victim_strategy: VictimStrategy,
    /// Cloud shape.
    pub shape: NodeShape,
}

impl BrokerConfig {
    /// The built-in defaults (what an empty file gives).
    pub fn defaults() -> BrokerConfig {
        toml::from_str("").unwrap_or_else(|_| unreachable_defaults())
    }

    /// The configuration as TOML (what `check-config` reads back).
    pub fn to_toml(&self) -> Result<String, String> {
        toml::to_string(self).map_err(|e| e.to_string())
    }

    /// The effective settings of a group.
    pub fn group(&self, key: &GroupKey) -> GroupSettings {
        let own = self
            .groups
            .iter()
            .find(|g| g.district == key.district && g.profile == key.profile);
        let d = &self.group_defaults;
        GroupSettings {
            handler: own
                .and_then(|g| g.handler.clone())
                .unwrap_or_else(|| d.handler.clone()),
            min_nodes: own.and_then(|g| g.min_nodes).unwrap_or(d.min_nodes),
            max_nodes: own.and_then(|g| g.max_nodes).unwrap_or(d.max_nodes),
            victim_strategy: own
                .and_then(|g| g.victim_strategy)
                .unwrap_or(self.policy.victim_strategy),
            shape: own
                .and_then(|g| g.shape.clone())
                .unwrap_or_else(|| d.shape.clone()),
        }
    }

    /// Groups named in the configuration.
    pub fn configured_groups(&self) -> Vec<GroupKey> {
        self.groups
            .iter()
            .map(|g| GroupKey {
                district: g.district.clone(),
                profile: g.profile.clone(),
            })
            .collect()
    }

    /// Whether a handler of this name exists (`log` always does).
    pub fn has_handler(&self, name: &str) -> bool {
        name == "log" || self.handlers.contains_key(name)
    }
}

fn unreachable_defaults() -> BrokerConfig {
    // Every section has a default; an empty document always deserializes.
    BrokerConfig {
        agent: AgentSection::default(),
        bus: BusSection::default(),
        keys: KeysSection::default(),
        log: LogSection::default(),
        metrics: MetricsSection::default(),
        policy: PolicyConfig::default(),
        saga: SagaConfig::default(),
        group_defaults: GroupDefaults::default(),
        groups: vec![],
        handlers: BTreeMap::new(),
        placement: Default::default(),
        push_stats: Default::default(),
        history: Default::default(),
    }
}

fn check_percent(key: &str, v: &PerKey, lo: u32, hi: u32) -> Result<(), Invalid> {
    for (who, x) in v.values() {
        if x < lo || x > hi {
            return Err(Invalid::new(
                key,
                format!("{who}: {x} is outside {lo}..={hi}"),
            ));
        }
    }
    Ok(())
}

fn check_min(key: &str, d: Duration, min: Duration) -> Result<(), Invalid> {
    if d < min {
        return Err(Invalid::new(
            key,
            format!(
                "{} is shorter than the minimum {}",
                humantime::format_duration(d),
                humantime::format_duration(min)
            ),
        ));
    }
    Ok(())
}

impl Validate for BrokerConfig {
    fn validate(&self) -> Result<(), Invalid> {
        self.push_stats.validate()?;
        self.history.validate()?;
        gearshift_service::logging::check_level(&self.log.level)
            .map_err(|e| Invalid::new("log.level", e))?;
        let name = &self.agent.name;
        if name.is_empty() || name.len() > gearshift_proto::msg::MAX_NAME {
            return Err(Invalid::new("agent.name", "must be 1..=255 bytes"));
        }
        if self.agent.state_dir.as_os_str().is_empty() {
            return Err(Invalid::new("agent.state_dir", "must not be empty"));
        }
        for (key, v) in [
            ("agent.events_queue", &self.agent.events_queue),
            ("agent.admin_queue", &self.agent.admin_queue),
            ("agent.admin_key", &self.agent.admin_key),
            ("agent.placement_queue", &self.agent.placement_queue),
            ("agent.placement_key", &self.agent.placement_key),
        ] {
            // AMQP short strings; STOMP destinations cannot carry '/'.
            if v.is_empty() || v.len() > 255 || v.contains('/') || v.chars().any(char::is_control) {
                return Err(Invalid::new(
                    key,
                    format!("{v:?}: must be 1..=255 bytes without '/' or control characters"),
                ));
            }
        }
        gearshift_bus::BusUrl::parse(&self.bus.url)
            .map_err(|e| Invalid::new("bus.url", e.to_string()))?;
        let p = &self.policy;
        let ms = Duration::from_millis(50);
        check_min("policy.interval", p.interval, ms)?;
        check_percent("policy.profile_threshold", &p.profile_threshold, 1, 100)?;
        check_percent("policy.district_threshold", &p.district_threshold, 1, 100)?;
        check_percent("policy.compact_threshold", &p.compact_threshold, 0, 99)?;
        check_percent(
            "policy.gear_expected_active_percent",
            &p.gear_expected_active_percent,
            1,
            100,
        )?;
        check_percent("policy.gear_up_size", &p.gear_up_size, 1, 1_000_000)?;
        // Compacting must stop well before a scale-up starts, or the agent flaps.
        for (who, compact) in p.compact_threshold.values() {
            let prof = match who {
                "default" => p.profile_threshold.default,
                k => p.profile_threshold.get(k, k),
            };
            if let Some(up) = prof
                && compact >= up
            {
                return Err(Invalid::new(
                    "policy.compact_threshold",
                    format!(
                        "{who}: {compact} must be below profile_threshold {up}, or scale-down and scale-up would flap"
                    ),
                ));
            }
        }
        if let (Some(up), Some(down)) = (p.gear_up_threshold.default, p.gear_down_threshold.default)
            && down <= up
        {
            return Err(Invalid::new(
                "policy.gear_down_threshold",
                format!("{down} must be above gear_up_threshold {up}, or scaling would flap"),
            ));
        }
        if p.stale_after_intervals == 0 {
            return Err(Invalid::new(
                "policy.stale_after_intervals",
                "must be at least 1",
            ));
        }
        if p.breaker_stale_percent == 0 || p.breaker_stale_percent > 100 {
            return Err(Invalid::new(
                "policy.breaker_stale_percent",
                "must be 1..=100",
            ));
        }
        if p.backoff_max < p.backoff_initial {
            return Err(Invalid::new(
                "policy.backoff_max",
                "must not be shorter than backoff_initial",
            ));
        }
        if p.exhausted_after_quota_failures == 0 {
            return Err(Invalid::new(
                "policy.exhausted_after_quota_failures",
                "must be at least 1",
            ));
        }
        check_min(
            "policy.exhaustion_check_interval",
            p.exhaustion_check_interval,
            ms,
        )?;
        check_min("policy.provision_timeout", p.provision_timeout, ms)?;
        if p.disruption_budget_percent > 100 || p.fleet_disruption_budget_percent > 100 {
            return Err(Invalid::new(
                "policy.disruption_budget_percent",
                "budgets are percentages (0..=100; at least one node may always drain)",
            ));
        }
        if p.max_scale_ups_in_flight == 0 {
            return Err(Invalid::new(
                "policy.max_scale_ups_in_flight",
                "must be at least 1",
            ));
        }
        let s = &self.saga;
        check_min("saga.command_ttl", s.command_ttl, ms)?;
        check_min("saga.command_timeout", s.command_timeout, ms)?;
        check_min("saga.evacuation_timeout", s.evacuation_timeout, ms)?;
        check_min("saga.confirm_empty_timeout", s.confirm_empty_timeout, ms)?;
        check_min("saga.remove_timeout", s.remove_timeout, ms)?;
        check_min("saga.presence_poll", s.presence_poll, ms)?;
        check_min("saga.handler_timeout", s.handler_timeout, ms)?;
        if s.command_attempts == 0 || s.evacuation_attempts == 0 || s.create_attempts == 0 {
            return Err(Invalid::new(
                "saga.command_attempts",
                "command_attempts, evacuation_attempts and create_attempts must be at least 1",
            ));
        }
        if !(1..=256).contains(&s.evacuation_parallelism) {
            return Err(Invalid::new(
                "saga.evacuation_parallelism",
                "must be 1..=256",
            ));
        }
        if !self.has_handler(&self.group_defaults.handler) {
            return Err(Invalid::new(
                "group_defaults.handler",
                format!(
                    "no handler named {:?} in [handlers]",
                    self.group_defaults.handler
                ),
            ));
        }
        if self.group_defaults.min_nodes > self.group_defaults.max_nodes {
            return Err(Invalid::new(
                "group_defaults.min_nodes",
                "must not exceed group_defaults.max_nodes",
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, g) in self.groups.iter().enumerate() {
            let key = |f: &str| format!("groups[{i}].{f}");
            if g.district.is_empty() || g.profile.is_empty() {
                return Err(Invalid::new(
                    key("district"),
                    "district and profile are required",
                ));
            }
            if !seen.insert((g.district.clone(), g.profile.clone())) {
                return Err(Invalid::new(
                    key("district"),
                    format!("group {}/{} is configured twice", g.district, g.profile),
                ));
            }
            if let Some(h) = &g.handler
                && !self.has_handler(h)
            {
                return Err(Invalid::new(
                    key("handler"),
                    format!("no handler named {h:?} in [handlers]"),
                ));
            }
            let s = self.group(&GroupKey {
                district: g.district.clone(),
                profile: g.profile.clone(),
            });
            if s.min_nodes > s.max_nodes {
                return Err(Invalid::new(key("min_nodes"), "must not exceed max_nodes"));
            }
        }
        self.placement
            .validate()
            .map_err(|e| Invalid::new(format!("placement.{}", e.key), e.reason))?;
        for (name, h) in &self.handlers {
            h.validate()
                .map_err(|e| Invalid::new(format!("handlers.{name}.{}", e.key), e.reason))?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_file_gives_the_seed_defaults() {
        let c = load_str("").unwrap();
        assert_eq!(c.policy.interval, Duration::from_secs(60));
        assert_eq!(c.policy.profile_threshold.for_profile("x"), Some(80));
        assert_eq!(c.policy.district_threshold.for_profile("x"), Some(90));
        assert_eq!(c.policy.compact_threshold.for_profile("x"), Some(50));
        assert_eq!(c.policy.gear_up_size.for_profile("x"), Some(200));
        assert_eq!(
            c.policy.gear_expected_active_percent.for_profile("x"),
            Some(5)
        );
        assert_eq!(c.policy.gear_up_threshold.for_profile("x"), None);
        assert_eq!(c.policy.breaker_stale_percent, 45);
        assert_eq!(c.group_defaults.handler, "log");
    }

    #[test]
    fn bad_keys_are_named() {
        let e = load_str("[policy]\nprofile_threshold = \"80, small: lots\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policy.profile_threshold") && e.contains("lots"),
            "{e}"
        );
        let e = load_str("[policy]\nintervall = \"1s\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("intervall"), "{e}");
        let e = load_str("[policy]\ncompact_threshold = 85\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policy.compact_threshold") && e.contains("flap"),
            "{e}"
        );
        let e = load_str("[policy]\nprofile_threshold = 180\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.profile_threshold"), "{e}");
        let e = load_str("[group_defaults]\nhandler = \"nova\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("group_defaults.handler") && e.contains("nova"),
            "{e}"
        );
        let e = load_str("[policy]\ninterval = \"soon\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("policy.interval"), "{e}");
        let e = load_str("[agent]\nplacement_queue = \"a/b\"\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("agent.placement_queue"), "{e}");
        let c =
            load_str("[agent]\nplacement_queue = \"q.demo\"\nplacement_key = \"demo.placement\"\n")
                .unwrap();
        assert_eq!(c.agent.placement_queue, "q.demo");
    }

    #[test]
    fn group_settings_fall_back_to_defaults() {
        let c = load_str(
            "[group_defaults]\nmax_nodes = 7\n[[groups]]\ndistrict = \"d1\"\nprofile = \"small\"\nmin_nodes = 2\n",
        )
        .unwrap();
        let g = c.group(&GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        });
        assert_eq!(
            (g.min_nodes, g.max_nodes, g.handler.as_str()),
            (2, 7, "log")
        );
        let other = c.group(&GroupKey {
            district: "d2".into(),
            profile: "small".into(),
        });
        assert_eq!(other.min_nodes, 0);
    }

    #[test]
    fn shipped_config_is_valid() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/broker.toml");
        let c = gearshift_service::config::load_str::<BrokerConfig>(
            &std::fs::read_to_string(&path).unwrap(),
            &path,
            ENV_PREFIX,
            std::iter::empty(),
        )
        .unwrap();
        let d = BrokerConfig::defaults();
        // The shipped file states the defaults: keep both in step.
        assert_eq!(c.policy.interval, d.policy.interval);
        assert_eq!(c.policy.profile_threshold, d.policy.profile_threshold);
        assert_eq!(c.saga.remove_timeout, d.saga.remove_timeout);
        assert_eq!(c.policy.provision_timeout, d.policy.provision_timeout);
    }
}
