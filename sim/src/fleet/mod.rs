//! The simulated fleet: real node agents ([`gearshift_node::Agent`]) with
//! the `sim` gear runtime, all sharing one [`SimWorld`] so that gears move
//! between them and can be counted, and a simulated cloud ([`SimCloud`], a
//! [`Handler`](gearshift_handlers::Handler)) that boots a node agent when the broker agent asks for a
//! node and stops it when it asks for a removal.
//!
//! Every node agent is built the way `gearshift-node run` builds one: a
//! [`NodeConfig`] (a template such as the demo's embedded `node.toml`, with
//! the node's name, state directory, keys and facts filled in) is
//! validated, then [`gearshift_node::setup::agent_config`] loads its key
//! files. Only the gear runtime differs: a [`SimRuntime`] on the shared
//! world. A fleet may also tune the resolved agent configuration (the
//! integration tests shorten timers below what a file may say).
//!
//! The demo and the integration tests of the broker agent both run on this
//! fleet; the benchmark's thousands of nodes are [`crate::lite`] nodes, and
//! the fault campaign runs the agents' binaries ([`crate::harness`]).
//!
//! - [`keys`]: the key files of a simulated installation.
//! - [`cloud`]: the simulated cloud, a [`gearshift_handlers::Handler`].

pub mod cloud;
pub mod keys;

pub use cloud::{CloudEvent, SimCloud};
pub use keys::Keys;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use gearshift_bus::SharedBus;
use gearshift_node::NodeConfig;
use gearshift_node::agent::AgentConfig;
use gearshift_node::runtime::NodeFacts;
use gearshift_node::runtime::sim::{SimRuntime, SimWorld};
use gearshift_proto::msg::{DistrictInfo, GearInfo, GearState};
use gearshift_service::config::Validate;
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Why the fleet could not do what was asked.
#[derive(Debug, Error)]
pub enum FleetError {
    /// A key file could not be written or read.
    #[error("keys: {0}")]
    Keys(#[from] gearshift_service::keys::KeyFileError),
    /// A node's configuration was refused by the node agent's own checks.
    #[error("node {node}: configuration key `{key}`: {reason}")]
    Config {
        /// The node.
        node: String,
        /// The dotted key.
        key: String,
        /// Why.
        reason: String,
    },
    /// The node agent could not be set up or started.
    #[error("node {node}: {reason}")]
    Agent {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// A node of that name is already running.
    #[error("node {0} is already running")]
    Duplicate(String),
}

/// What a simulated node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Host name (also the agent's name on the bus).
    pub name: String,
    /// District UUID (`_none`: the node boots undistricted).
    pub district: String,
    /// Node profile.
    pub profile: String,
    /// `max_active_gears`.
    pub max_active_gears: u32,
    /// The scale-up operation it was booted for.
    pub booted_for: Option<String>,
    /// Started gears put on the node when it joins the world (named
    /// `<node>-g<i>`); 0 for a new, empty node.
    pub gears: u32,
}

impl NodeSpec {
    /// An empty node that no operation booted.
    pub fn new(name: &str, district: &str, profile: &str, max_active_gears: u32) -> NodeSpec {
        NodeSpec {
            name: name.to_string(),
            district: district.to_string(),
            profile: profile.to_string(),
            max_active_gears,
            booted_for: None,
            gears: 0,
        }
    }

    /// With `n` started gears.
    pub fn with_gears(mut self, n: u32) -> NodeSpec {
        self.gears = n;
        self
    }

    /// Booted for the scale-up operation `op`.
    pub fn booted_for(mut self, op: Option<String>) -> NodeSpec {
        self.booted_for = op;
        self
    }
}

struct Running {
    token: CancellationToken,
    task: JoinHandle<()>,
}

/// Changes a node's resolved agent configuration before it starts.
pub type Tuning = Arc<dyn Fn(&mut AgentConfig) + Send + Sync>;

/// How long a node agent may take to stop.
const STOP_WITHIN: Duration = Duration::from_secs(15);

/// Node agents on one bus sharing one [`SimWorld`].
pub struct SimFleet {
    world: Arc<SimWorld>,
    bus: SharedBus,
    template: NodeConfig,
    tuning: Option<Tuning>,
    keys: Keys,
    dir: PathBuf,
    nodes: Mutex<BTreeMap<String, Running>>,
}

impl std::fmt::Debug for SimFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimFleet")
            .field("dir", &self.dir)
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SimFleet {
    /// A fleet on `bus` whose nodes start from `template` (a validated
    /// `node.toml`), keep their state under `dir` and sign with `keys.node`.
    pub fn new(
        world: Arc<SimWorld>,
        bus: SharedBus,
        template: NodeConfig,
        keys: Keys,
        dir: &Path,
    ) -> Arc<SimFleet> {
        Arc::new(SimFleet {
            world,
            bus,
            template,
            tuning: None,
            keys,
            dir: dir.to_path_buf(),
            nodes: Mutex::default(),
        })
    }

    /// Like [`SimFleet::new`], and `tuning` changes every node's resolved
    /// agent configuration (for values no configuration file may hold).
    pub fn tuned(
        world: Arc<SimWorld>,
        bus: SharedBus,
        template: NodeConfig,
        keys: Keys,
        dir: &Path,
        tuning: impl Fn(&mut AgentConfig) + Send + Sync + 'static,
    ) -> Arc<SimFleet> {
        Arc::new(SimFleet {
            world,
            bus,
            template,
            tuning: Some(Arc::new(tuning)),
            keys,
            dir: dir.to_path_buf(),
            nodes: Mutex::default(),
        })
    }

    /// The shared world of gears.
    pub fn world(&self) -> &Arc<SimWorld> {
        &self.world
    }

    /// The configuration node `spec` runs with: the template with its
    /// identity, state directory, keys and facts, checked like a file.
    pub fn node_config(&self, spec: &NodeSpec) -> Result<NodeConfig, FleetError> {
        let mut c = self.template.clone();
        c.node.name = Some(spec.name.clone());
        c.node.booted_for = spec.booted_for.clone();
        c.state.dir = self.dir.join(&spec.name);
        c.keys.signing_key = self.keys.path("node.key");
        c.keys.broker_keys = vec![self.keys.path("broker.pub")];
        c.keys.operator_keys = vec![self.keys.path("operator.pub")];
        c.runtime.kind = gearshift_node::config::RuntimeKind::Sim;
        c.runtime.facts.profile = spec.profile.clone();
        c.runtime.facts.max_active_gears = spec.max_active_gears;
        // `_none` boots the node undistricted, as a new node's image is.
        c.runtime.facts.district_uuid =
            (spec.district != gearshift_proto::routing::NO_DISTRICT).then(|| spec.district.clone());
        c.validate().map_err(|i| FleetError::Config {
            node: spec.name.clone(),
            key: i.key,
            reason: i.reason,
        })?;
        Ok(c)
    }

    /// Adds the node to the world (keeping its gears if it is already
    /// there, adding `spec.gears` started ones) and returns the
    /// configuration its agent will run with.
    pub fn add_to_world(&self, spec: &NodeSpec) -> Result<NodeConfig, FleetError> {
        let cfg = self.node_config(spec)?;
        let f = &cfg.runtime.facts;
        self.world.add_node(
            &spec.name,
            NodeFacts {
                profile: f.profile.clone(),
                max_active_gears: f.max_active_gears,
                district: f.district_uuid.as_ref().map(|uuid| DistrictInfo {
                    uuid: uuid.clone(),
                    active: true,
                    first_uid: f.district_first_uid,
                    max_uid: f.district_max_uid,
                }),
            },
        );
        self.world
            .set_memory(&spec.name, cfg.runtime.sim.mem_total_mb);
        self.world.populate(&spec.name, spec.gears, 0);
        Ok(cfg)
    }

    /// Adds the node to the world (see [`SimFleet::add_to_world`]) and
    /// starts its agent.
    pub fn start_node(&self, spec: &NodeSpec) -> Result<(), FleetError> {
        let agent_err = |reason: String| FleetError::Agent {
            node: spec.name.clone(),
            reason,
        };
        if lock(&self.nodes).contains_key(&spec.name) {
            return Err(FleetError::Duplicate(spec.name.clone()));
        }
        let cfg = self.add_to_world(spec)?;
        let mut acfg = gearshift_node::setup::agent_config(&cfg, Default::default())
            .map_err(|e| agent_err(e.to_string()))?;
        if let Some(tune) = &self.tuning {
            tune(&mut acfg);
        }
        let runtime = Arc::new(SimRuntime::new(self.world.clone(), &spec.name));
        let agent = gearshift_node::Agent::new(acfg, self.bus.clone(), runtime)
            .map_err(|e| agent_err(e.to_string()))?;
        let token = CancellationToken::new();
        let t = token.clone();
        let task = tokio::spawn(async move {
            let _ = agent.run(t).await;
        });
        lock(&self.nodes).insert(spec.name.clone(), Running { token, task });
        Ok(())
    }

    /// Stops a node agent (its gears stay in the world). False if it was not running.
    pub async fn stop_node(&self, name: &str) -> bool {
        let n = lock(&self.nodes).remove(name);
        match n {
            Some(n) => {
                n.token.cancel();
                await_stop(name, n.task).await;
                true
            }
            None => false,
        }
    }

    /// Stops a node agent and deletes the host from the world, as a cloud
    /// deletes a server; returns the gears that were still on it.
    pub async fn delete_node(&self, name: &str) -> Vec<GearInfo> {
        self.stop_node(name).await;
        self.world.remove_node(name)
    }

    /// Names of the running node agents.
    pub fn running(&self) -> Vec<String> {
        lock(&self.nodes).keys().cloned().collect()
    }

    /// Stops every node agent.
    pub async fn stop_all(&self) {
        let all: Vec<(String, Running)> = std::mem::take(&mut *lock(&self.nodes))
            .into_iter()
            .collect();
        for (_, r) in &all {
            r.token.cancel();
        }
        for (name, r) in all {
            await_stop(&name, r.task).await;
        }
    }

    /// Adds `n` started gears to a node, named `<node>-<tag>-<i>`.
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
}

async fn await_stop(name: &str, task: JoinHandle<()>) {
    if tokio::time::timeout(STOP_WITHIN, task).await.is_err() {
        tracing::warn!(node = name, "node agent did not stop within 15 s");
    }
}
