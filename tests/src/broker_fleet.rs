//! A test fleet for the broker agent: real node agents (`gearshift_node`
//! with the `sim` gear runtime) on a real bus, a simulated cloud as the
//! broker agent's handler (it boots a node agent for each create request and
//! stops it on removal), and a watcher of the broker's signed decisions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use gearshift_broker::config::BrokerConfig;
use gearshift_bus::SharedBus;
use gearshift_handlers::{
    CreateOutcome, CreateRequest, GroupKey, Handler, HandlerError, Presence, RemoveOutcome,
    RemoveRequest,
};
use gearshift_node::agent::AgentConfig;
use gearshift_node::runtime::NodeFacts;
use gearshift_node::runtime::sim::{SimRuntime, SimWorld};
use gearshift_proto::msg::{
    Decision, DecisionKind, DistrictInfo, GearInfo, GearState, Message, Role,
};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest wait of any step of these tests.
pub const WAIT: Duration = Duration::from_secs(60);

/// Keys of a broker test: broker, nodes (one shared node key), operator.
#[derive(Debug, Clone)]
pub struct BrokerKeys {
    /// The broker agent's key.
    pub broker: KeyPair,
    /// The nodes' key.
    pub node: KeyPair,
    /// An operator's key.
    pub operator: KeyPair,
}

impl BrokerKeys {
    /// Fresh keys.
    pub fn new() -> Self {
        let k = || KeyPair::generate().expect("key");
        BrokerKeys {
            broker: k(),
            node: k(),
            operator: k(),
        }
    }

    /// What the broker agent trusts.
    pub fn broker_keyring(&self) -> Keyring {
        let mut r = Keyring::new();
        r.add(self.broker.public(), Role::Broker, "broker");
        r.add(self.node.public(), Role::Node, "nodes");
        r.add(self.operator.public(), Role::Operator, "operator");
        r
    }

    /// What a node trusts.
    pub fn node_keyring(&self) -> Keyring {
        let mut r = Keyring::new();
        r.add(self.broker.public(), Role::Broker, "broker");
        r.add(self.operator.public(), Role::Operator, "operator");
        r
    }
}

impl Default for BrokerKeys {
    fn default() -> Self {
        Self::new()
    }
}

struct RunningNode {
    token: CancellationToken,
    task: JoinHandle<()>,
}

/// Node agents on one bus, sharing one simulated world of gears.
pub struct SimFleet {
    /// The gears.
    pub world: Arc<SimWorld>,
    bus: SharedBus,
    keys: BrokerKeys,
    dir: PathBuf,
    nodes: Mutex<BTreeMap<String, RunningNode>>,
    /// Report interval of the node agents.
    pub report_interval: Duration,
}

impl SimFleet {
    /// A fleet on `bus`, with node state directories under `dir`.
    pub fn new(bus: SharedBus, keys: BrokerKeys, dir: &Path) -> Arc<SimFleet> {
        Arc::new(SimFleet {
            world: SimWorld::new(),
            bus,
            keys,
            dir: dir.to_path_buf(),
            nodes: Mutex::default(),
            report_interval: Duration::from_secs(1),
        })
    }

    /// Starts a node agent with `gears` started gears.
    pub fn start_node(
        &self,
        name: &str,
        district: &str,
        profile: &str,
        max: u32,
        gears: u32,
        booted_for: Option<String>,
    ) {
        self.world.add_node(
            name,
            NodeFacts {
                profile: profile.into(),
                max_active_gears: max,
                district: Some(DistrictInfo {
                    uuid: district.into(),
                    active: true,
                    first_uid: None,
                    max_uid: None,
                }),
            },
        );
        self.world.populate(name, gears, 0);
        let mut cfg = AgentConfig::new(
            name,
            self.keys.node.clone(),
            self.keys.node_keyring(),
            self.dir.join(name),
        );
        cfg.fsync = false;
        cfg.write_status_file = false;
        cfg.booted_for = booted_for;
        cfg.report.interval = self.report_interval;
        cfg.report.scan_interval = Duration::from_millis(100);
        cfg.report.min_gap = Duration::from_millis(20);
        cfg.retry_min = Duration::from_millis(50);
        cfg.retry_max = Duration::from_millis(500);
        cfg.shutdown_grace = Duration::from_secs(2);
        let runtime = Arc::new(SimRuntime::new(self.world.clone(), name));
        let agent = gearshift_node::Agent::new(cfg, self.bus.clone(), runtime).expect("node agent");
        let token = CancellationToken::new();
        let t = token.clone();
        let task = tokio::spawn(async move {
            let _ = agent.run(t).await;
        });
        self.nodes
            .lock()
            .unwrap()
            .insert(name.to_string(), RunningNode { token, task });
    }

    /// Stops a node agent (its gears stay in the world).
    pub async fn stop_node(&self, name: &str) -> bool {
        let n = self.nodes.lock().unwrap().remove(name);
        match n {
            Some(n) => {
                n.token.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), n.task).await;
                true
            }
            None => false,
        }
    }

    /// Adds `n` started gears to a node (names unique per call).
    pub fn add_gears(&self, node: &str, n: u32, tag: &str) {
        for i in 0..n {
            self.world.add_gear(
                node,
                GearInfo {
                    id: format!("{node}-{tag}-{i}"),
                    app: None,
                    state: GearState::Started,
                    uid: None,
                    bytes: None,
                    do_not_disrupt: false,
                },
            );
        }
    }

    /// Every gear id in the world with the nodes holding it.
    pub fn gear_locations(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for n in self.world.nodes() {
            for g in self.world.gears_of(&n) {
                out.entry(g.id).or_default().push(n.clone());
            }
        }
        out
    }

    /// Names of the running node agents.
    pub fn running(&self) -> Vec<String> {
        self.nodes.lock().unwrap().keys().cloned().collect()
    }

    /// Stops every node agent.
    pub async fn stop_all(&self) {
        for n in self.running() {
            self.stop_node(&n).await;
        }
    }
}

/// The simulated cloud: a `Handler` that boots a node agent per create
/// request (reporting the operation id) and stops it on removal.
pub struct SimCloud {
    /// The fleet it adds to and removes from.
    pub fleet: Arc<SimFleet>,
    /// Node name prefix.
    pub prefix: String,
    /// `max_active_gears` of new nodes.
    pub max_active: u32,
    /// Create requests received.
    pub creates: AtomicU32,
    /// Remove requests received, by node.
    pub removes: Mutex<Vec<String>>,
    /// Gears found on a node when it was removed (must stay empty).
    pub lost: Mutex<Vec<GearInfo>>,
}

impl SimCloud {
    /// A cloud adding nodes named `<prefix>-new-<n>`.
    pub fn new(fleet: Arc<SimFleet>, prefix: &str, max_active: u32) -> Arc<SimCloud> {
        Arc::new(SimCloud {
            fleet,
            prefix: prefix.into(),
            max_active,
            creates: AtomicU32::new(0),
            removes: Mutex::default(),
            lost: Mutex::default(),
        })
    }
}

#[async_trait]
impl Handler for SimCloud {
    fn kind(&self) -> &'static str {
        "sim"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let n = self.creates.fetch_add(1, Ordering::SeqCst) + 1;
        let name = format!("{}-new-{n}", self.prefix);
        self.fleet.start_node(
            &name,
            &req.group.district,
            &req.group.profile,
            self.max_active,
            0,
            Some(req.op.clone()),
        );
        Ok(CreateOutcome {
            node: Some(name.clone()),
            cloud_id: Some(format!("sim-{n}")),
            detail: format!("booted {name}"),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        self.removes.lock().unwrap().push(req.node.clone());
        self.fleet.stop_node(&req.node).await;
        let left = self.fleet.world.remove_node(&req.node);
        self.lost.lock().unwrap().extend(left);
        Ok(RemoveOutcome {
            detail: format!("deleted {}", req.node),
            gone: false,
        })
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(if self.fleet.world.nodes().iter().any(|n| n == node) {
            Presence::Present
        } else {
            Presence::Gone
        })
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
            let Ok(dec) = Envelope::decode(&d.payload) else {
                continue;
            };
            // Only this broker's decisions count (others may share the bus).
            if self.trust.verify_signature(&dec).is_err() {
                continue;
            }
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
pub async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
