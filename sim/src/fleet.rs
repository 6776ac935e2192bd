//! The simulated fleet: real node agents ([`gearshift_node::Agent`]) with
//! the `sim` gear runtime, all sharing one [`SimWorld`] so that gears move
//! between them and can be counted, and a simulated cloud ([`SimCloud`], a
//! [`Handler`]) that boots a node agent when the broker agent asks for a
//! node and stops it when it asks for a removal.
//!
//! Every node agent is built the way `gearshift-node run` builds one: a
//! [`NodeConfig`] (the demo's embedded `node.toml`, with the node's name,
//! state directory, bus and facts filled in) is validated, then
//! [`gearshift_node::setup::agent_config`] loads its key files. Only the
//! gear runtime differs: a [`SimRuntime`] on the shared world.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use gearshift_bus::SharedBus;
use gearshift_handlers::{
    CreateOutcome, CreateRequest, GroupKey, Handler, HandlerError, Lookup, Presence, RemoveOutcome,
    RemoveRequest,
};
use gearshift_node::NodeConfig;
use gearshift_node::runtime::NodeFacts;
use gearshift_node::runtime::sim::{SimRuntime, SimWorld};
use gearshift_proto::msg::{DistrictInfo, GearInfo, Role};
use gearshift_proto::{KeyPair, Keyring};
use gearshift_service::config::Validate;
use thiserror::Error;
use tokio::sync::broadcast;
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

/// The key files of a simulated installation, written the way
/// `gearshift-broker keygen` and `gearshift-node keygen` write them: one
/// broker key, one key shared by the simulated nodes, one operator key.
#[derive(Debug, Clone)]
pub struct Keys {
    /// Directory of the key files.
    pub dir: PathBuf,
    /// The broker agent's key.
    pub broker: KeyPair,
    /// The nodes' key.
    pub node: KeyPair,
    /// An operator's key (for `gearshift-broker status --key`).
    pub operator: KeyPair,
}

impl Keys {
    /// Writes fresh key pairs into `dir`.
    pub fn generate(dir: &Path) -> Result<Keys, FleetError> {
        let w = |stem: &str| gearshift_service::keys::write_keypair(dir, stem, true).map(|x| x.2);
        Ok(Keys {
            dir: dir.to_path_buf(),
            broker: w("broker")?,
            node: w("node")?,
            operator: w("operator")?,
        })
    }

    /// The key pairs in `dir` when all three exist there, else fresh ones
    /// written there (keys kept across demo runs for an outside watcher).
    pub fn open_or_generate(dir: &Path) -> Result<Keys, FleetError> {
        let stems = ["broker", "node", "operator"];
        if !stems.iter().all(|s| dir.join(format!("{s}.key")).is_file()) {
            return Keys::generate(dir);
        }
        let load =
            |stem: &str| gearshift_service::keys::load_keypair(&dir.join(format!("{stem}.key")));
        Ok(Keys {
            dir: dir.to_path_buf(),
            broker: load("broker")?,
            node: load("node")?,
            operator: load("operator")?,
        })
    }

    /// Path of `<stem>.key` or `<stem>.pub`.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.join(file)
    }

    /// What the broker agent trusts: itself, the nodes' key, the operator,
    /// loaded from the public key files as `gearshift-broker run` loads them.
    pub fn broker_keyring(&self) -> Result<Keyring, FleetError> {
        let mut ring = Keyring::new();
        ring.add(self.broker.public(), Role::Broker, "own key");
        gearshift_service::keys::trust(&mut ring, &self.path("node.pub"), Role::Node)?;
        gearshift_service::keys::trust(&mut ring, &self.path("operator.pub"), Role::Operator)?;
        Ok(ring)
    }
}

/// What a simulated node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// Host name (also the agent's name on the bus).
    pub name: String,
    /// District UUID.
    pub district: String,
    /// Node profile.
    pub profile: String,
    /// `max_active_gears`.
    pub max_active_gears: u32,
    /// The scale-up operation it was booted for.
    pub booted_for: Option<String>,
}

struct Running {
    token: CancellationToken,
    task: JoinHandle<()>,
}

/// Node agents on one bus sharing one [`SimWorld`].
pub struct SimFleet {
    world: Arc<SimWorld>,
    bus: SharedBus,
    template: NodeConfig,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
        c.runtime.facts.district_uuid = Some(spec.district.clone());
        c.validate().map_err(|i| FleetError::Config {
            node: spec.name.clone(),
            key: i.key,
            reason: i.reason,
        })?;
        Ok(c)
    }

    /// Adds the node to the world (keeping its gears if it is already
    /// there) and returns the configuration its agent will run with.
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
        let acfg = gearshift_node::setup::agent_config(&cfg, Default::default())
            .map_err(|e| agent_err(e.to_string()))?;
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
                if tokio::time::timeout(Duration::from_secs(15), n.task)
                    .await
                    .is_err()
                {
                    tracing::warn!(node = name, "node agent did not stop within 15 s");
                }
                true
            }
            None => false,
        }
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
            if tokio::time::timeout(Duration::from_secs(15), r.task)
                .await
                .is_err()
            {
                tracing::warn!(node = name, "node agent did not stop within 15 s");
            }
        }
    }
}

/// What the simulated cloud did, for a display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloudEvent {
    /// A create request was accepted; the node boots after the delay.
    Booting {
        /// The new node.
        node: String,
        /// The scale-up operation.
        op: String,
    },
    /// The node's agent started.
    Booted {
        /// The node.
        node: String,
    },
    /// The node could not be started.
    BootFailed {
        /// The node.
        node: String,
        /// Why.
        reason: String,
    },
    /// The node was deleted.
    Deleted {
        /// The node.
        node: String,
        /// Gears that were still on it (lost: must be none).
        gears_left: usize,
    },
}

/// The simulated cloud: a [`Handler`] that boots a node agent per create
/// request, after a delay, reporting the operation id as `booted_for`, and
/// stops it (and deletes the host from the world) on removal. Idempotent on
/// the operation id, as the sagas expect of a handler.
pub struct SimCloud {
    fleet: Arc<SimFleet>,
    naming: Box<dyn Fn(u32) -> String + Send + Sync>,
    max_active_gears: u32,
    boot_delay: Duration,
    serial: AtomicU32,
    created: Mutex<BTreeMap<String, String>>,
    deleted: Mutex<BTreeSet<String>>,
    lost: Mutex<Vec<GearInfo>>,
    events: broadcast::Sender<CloudEvent>,
    token: CancellationToken,
}

impl std::fmt::Debug for SimCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCloud")
            .field("boot_delay", &self.boot_delay)
            .field("created", &*lock(&self.created))
            .finish_non_exhaustive()
    }
}

impl SimCloud {
    /// A cloud that names its `n`-th new node `naming(n)` (n from
    /// `first_serial`), gives it `max_active_gears`, and starts its agent
    /// `boot_delay` after the request. `token` stops pending boots.
    pub fn new(
        fleet: Arc<SimFleet>,
        naming: impl Fn(u32) -> String + Send + Sync + 'static,
        first_serial: u32,
        max_active_gears: u32,
        boot_delay: Duration,
        token: CancellationToken,
    ) -> Arc<SimCloud> {
        Arc::new(SimCloud {
            fleet,
            naming: Box::new(naming),
            max_active_gears,
            boot_delay,
            serial: AtomicU32::new(first_serial),
            created: Mutex::default(),
            deleted: Mutex::default(),
            lost: Mutex::default(),
            events: broadcast::channel(256).0,
            token,
        })
    }

    /// What the cloud does, as it does it.
    pub fn events(&self) -> broadcast::Receiver<CloudEvent> {
        self.events.subscribe()
    }

    /// Nodes created, by operation id.
    pub fn created(&self) -> BTreeMap<String, String> {
        lock(&self.created).clone()
    }

    /// Nodes deleted.
    pub fn deleted(&self) -> BTreeSet<String> {
        lock(&self.deleted).clone()
    }

    /// Gears that were still on a node when it was deleted.
    pub fn lost(&self) -> Vec<GearInfo> {
        lock(&self.lost).clone()
    }
}

#[async_trait]
impl Handler for SimCloud {
    fn kind(&self) -> &'static str {
        "sim"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let name = {
            let mut created = lock(&self.created);
            if let Some(n) = created.get(&req.op) {
                // A repeated request for the same operation: the same node.
                return Ok(CreateOutcome {
                    node: Some(n.clone()),
                    cloud_id: Some(format!("sim-{n}")),
                    detail: format!("{n} is already booting for {}", req.op),
                });
            }
            let n = (self.naming)(self.serial.fetch_add(1, Ordering::SeqCst));
            created.insert(req.op.clone(), n.clone());
            n
        };
        let spec = NodeSpec {
            name: name.clone(),
            district: req.group.district.clone(),
            profile: req.group.profile.clone(),
            max_active_gears: self.max_active_gears,
            booted_for: Some(req.op.clone()),
        };
        let _ = self.events.send(CloudEvent::Booting {
            node: name.clone(),
            op: req.op.clone(),
        });
        let fleet = self.fleet.clone();
        let events = self.events.clone();
        let delay = self.boot_delay;
        let token = self.token.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = token.cancelled() => return,
            }
            let ev = match fleet.start_node(&spec) {
                Ok(()) => CloudEvent::Booted {
                    node: spec.name.clone(),
                },
                Err(e) => {
                    tracing::error!(node = %spec.name, error = %e, "simulated node did not boot");
                    CloudEvent::BootFailed {
                        node: spec.name.clone(),
                        reason: e.to_string(),
                    }
                }
            };
            let _ = events.send(ev);
        });
        Ok(CreateOutcome {
            node: Some(name.clone()),
            cloud_id: Some(format!("sim-{name}")),
            detail: format!(
                "booting {name} (ready in about {} ms)",
                self.boot_delay.as_millis()
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        if lock(&self.deleted).contains(&req.node) {
            return Ok(RemoveOutcome {
                detail: format!("{} was already deleted", req.node),
                gone: true,
            });
        }
        self.fleet.stop_node(&req.node).await;
        let left = self.fleet.world().remove_node(&req.node);
        let gears_left = left.len();
        if gears_left > 0 {
            tracing::error!(node = %req.node, gears = gears_left, "node deleted with gears on it");
        }
        lock(&self.lost).extend(left);
        lock(&self.deleted).insert(req.node.clone());
        let _ = self.events.send(CloudEvent::Deleted {
            node: req.node.clone(),
            gears_left,
        });
        Ok(RemoveOutcome {
            detail: format!("deleted {}", req.node),
            gone: false,
        })
    }

    async fn lookup(&self, op: &str, group: &GroupKey) -> Result<Lookup, HandlerError> {
        Ok(match lock(&self.created).get(op) {
            Some(n) => Lookup::Found(CreateOutcome {
                node: Some(n.clone()),
                cloud_id: Some(format!("sim-{n}")),
                detail: format!("{n} was created for {op} in {group}"),
            }),
            None => Lookup::NotFound,
        })
    }

    async fn presence(&self, node: &str, _group: &GroupKey) -> Result<Presence, HandlerError> {
        Ok(if self.fleet.world().nodes().iter().any(|n| n == node) {
            Presence::Present
        } else {
            Presence::Gone
        })
    }
}
