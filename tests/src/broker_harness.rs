//! What the broker agent's integration tests share: the simulator's fleet
//! and cloud ([`gearshift_sim::fleet`]) with test timers, a fast broker
//! configuration, and a watcher of the broker's signed decisions.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use gearshift_broker::config::BrokerConfig;
use gearshift_bus::SharedBus;
use gearshift_node::NodeConfig;
use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::gate::{Expect, Gate};
use gearshift_proto::msg::{Decision, DecisionKind, Kind, Message, Role};
use gearshift_proto::sign::TimePolicy;
use gearshift_proto::{KeyPair, Keyring, routing};
use gearshift_sim::fleet::{Keys, SimCloud, SimFleet};
use tokio_util::sync::CancellationToken;

/// Longest wait of any step of these tests.
pub const WAIT: Duration = Duration::from_secs(60);

/// Fresh key files of a test installation in `dir/keys` (see
/// [`Keys`]: broker, one shared node key, operator, and the broker's trust
/// directories).
pub fn test_keys(dir: &Path) -> Keys {
    Keys::generate(&dir.join("keys")).expect("test keys")
}

/// A [`SimFleet`] for fast tests on `bus`: a fresh world, the node
/// defaults of `conf/node.toml`, node state under `dir`, and timers shorter
/// than a configuration file may hold (reports every second, scans every
/// 100 ms, quick retries, a 2 s shutdown grace, no fsync, no status file).
pub fn fast_fleet(bus: SharedBus, keys: &Keys, dir: &Path) -> Arc<SimFleet> {
    SimFleet::tuned(
        SimWorld::new(),
        bus,
        NodeConfig::default(),
        keys.clone(),
        dir,
        |a| {
            a.fsync = false;
            a.write_status_file = false;
            a.report.interval = Duration::from_secs(1);
            a.report.scan_interval = Duration::from_millis(100);
            a.report.min_gap = Duration::from_millis(20);
            a.retry_min = Duration::from_millis(50);
            a.retry_max = Duration::from_millis(500);
            a.shutdown_grace = Duration::from_secs(2);
        },
    )
}

/// A simulated cloud that boots a node named `<prefix>-new-<n>` (n from 1)
/// with `max_active` gears at once for each new scale-up operation.
pub fn instant_cloud(fleet: Arc<SimFleet>, prefix: &str, max_active: u32) -> Arc<SimCloud> {
    let prefix = prefix.to_string();
    SimCloud::new(
        fleet,
        move |n| format!("{prefix}-new-{n}"),
        1,
        max_active,
        Duration::ZERO,
        CancellationToken::new(),
    )
}

/// What every broker test starts from: a unique tag (queue, node and
/// district names), a temporary directory, key files, the node agents' bus
/// connection and a [`fast_fleet`] on it.
pub struct TestBed {
    /// Unique tag of this test.
    pub tag: String,
    /// Bus URL.
    pub url: String,
    /// Keys, broker state, node state.
    pub dir: tempfile::TempDir,
    /// The installation's keys (in `dir/keys`).
    pub keys: Keys,
    /// The node agents' connection.
    pub nodes_bus: SharedBus,
    /// The node agents, state under `dir/nodes`.
    pub fleet: Arc<SimFleet>,
}

impl TestBed {
    /// A test bed tagged `<prefix><random>`, on the bus `url(tag)`.
    pub async fn new(prefix: &str, url: impl FnOnce(&str) -> String) -> TestBed {
        crate::init_logging();
        let tag = crate::unique(prefix);
        let url = url(&tag);
        let dir = tempfile::tempdir().expect("temporary directory");
        let keys = test_keys(dir.path());
        let nodes_bus = crate::connect(&url, &format!("{tag}-nodes")).await;
        let fleet = fast_fleet(nodes_bus.clone(), &keys, &dir.path().join("nodes"));
        TestBed {
            tag,
            url,
            dir,
            keys,
            nodes_bus,
            fleet,
        }
    }

    /// Another connection to the bus, named after this test and `who`.
    pub async fn connect(&self, who: &str) -> SharedBus {
        crate::connect(&self.url, &format!("{}-{who}", self.tag)).await
    }

    /// A path in the test's directory.
    pub fn path(&self, rel: &str) -> std::path::PathBuf {
        self.dir.path().join(rel)
    }
}

/// A broker configuration for fast tests: short intervals, short windows,
/// unique queues so that several broker agents can share one RabbitMQ.
pub fn fast_config(url: &str, state_dir: &Path, handler: &str, tag: &str) -> BrokerConfig {
    let mut c = BrokerConfig::defaults();
    let ms = Duration::from_millis;
    c.agent.name = format!("broker-{tag}");
    c.agent.state_dir = state_dir.to_path_buf();
    c.agent.events_queue = format!("gearshift.test.broker-events.{tag}");
    c.agent.cluster = gearshift_broker::config::AgentSection::cluster_of(tag);
    c.agent.admin_queue = format!("gearshift.test.broker-admin.{tag}");
    c.agent.admin_key = format!("admin.test.{tag}");
    c.agent.placement_service = false;
    c.agent.shutdown_grace = Duration::from_secs(2);
    c.bus.url = url.to_string();
    c.policy.interval = ms(300);
    c.policy.react_delay = ms(50);
    c.policy.startup_grace = ms(1500);
    c.policy.scale_down_stabilization = ms(500);
    c.policy.cooldown_after_scale_up = ms(500);
    c.policy.cooldown_after_scale_down = ms(500);
    c.policy.cooldown_after_failure = Duration::from_secs(30);
    c.policy.provision_timeout = Duration::from_secs(30);
    c.policy.backoff_initial = Duration::from_secs(5);
    c.policy.backoff_max = Duration::from_secs(10);
    c.saga.command_timeout = Duration::from_secs(5);
    c.saga.confirm_empty_timeout = Duration::from_secs(5);
    c.saga.presence_poll = ms(200);
    c.saga.handler_timeout = Duration::from_secs(10);
    c.saga.remove_timeout = Duration::from_secs(20);
    c.saga.evacuation_timeout = Duration::from_secs(30);
    c.group_defaults.handler = handler.to_string();
    c
}

/// Signed decisions of one broker agent, as a third party sees them on the bus.
pub struct DecisionWatch {
    sub: gearshift_bus::Subscription,
    trust: Keyring,
    /// Every decision seen so far.
    pub seen: Vec<Decision>,
}

impl DecisionWatch {
    /// Subscribes to `decision.#` (subscribe before starting the agent).
    pub async fn new(bus: &SharedBus, broker: &KeyPair) -> DecisionWatch {
        let sub = bus
            .subscribe(routing::ALL_DECISIONS)
            .await
            .expect("subscribe decisions");
        let mut trust = Keyring::new();
        trust.add(broker.public(), Role::Broker, "broker");
        DecisionWatch {
            sub,
            trust,
            seen: vec![],
        }
    }

    /// Waits for a decision matching `pred`, failing after [`WAIT`].
    pub async fn until(&mut self, what: &str, mut pred: impl FnMut(&Decision) -> bool) -> Decision {
        if let Some(d) = self.seen.iter().find(|d| pred(d)) {
            return d.clone();
        }
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let d = match tokio::time::timeout_at(deadline, self.sub.next()).await {
                Ok(Some(d)) => d,
                Ok(None) => panic!("bus closed while waiting for {what}"),
                Err(_) => panic!(
                    "no {what} within {WAIT:?}; decisions seen: {:#?}",
                    self.seen
                        .iter()
                        .map(|d| (d.decision, d.node.clone(), d.reason.clone()))
                        .collect::<Vec<_>>()
                ),
            };
            // Only this broker's decisions count (others may share the bus).
            let gate = Gate::new(&self.trust, TimePolicy::default());
            let expect = Expect::kinds(|k| k == Kind::Decision).any_age();
            let Ok(dec) = gate.admit(&d.payload, expect, Utc::now()) else {
                continue;
            };
            if let Message::Decision(x) = dec.envelope.msg {
                self.seen.push(x.clone());
                if pred(&x) {
                    return x;
                }
            }
        }
    }

    /// Kinds seen so far.
    pub fn kinds(&self) -> Vec<DecisionKind> {
        self.seen.iter().map(|d| d.decision).collect()
    }
}

/// Waits until `f` is true, polling; panics with `what` after [`WAIT`].
pub async fn eventually(what: &str, f: impl FnMut() -> bool) {
    crate::node_harness::wait_until(WAIT, what, f).await
}
