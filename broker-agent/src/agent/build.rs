//! Building an [`Agent`]: the state directory's lock, the journal, the
//! handlers, the evacuation planner, the task tracker.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use gearshift_bus::SharedBus;
use gearshift_handlers::{FleetView, GroupKey, Handler};
use gearshift_proto::msg::NodeProperties;
use gearshift_proto::{KeyPair, Keyring};
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::task::TaskTracker;

use super::{Agent, AgentError};
use crate::config::BrokerConfig;
use crate::journal::Journal;
use crate::metrics::Metrics;
use crate::planner::{EvacuationPlanner, PlacementPlanner};
use crate::status::Status;

/// The fleet as handlers and the placement service see it (refreshed on ticks).
#[derive(Default)]
pub(super) struct FleetSnapshot {
    pub active: RwLock<BTreeMap<GroupKey, Vec<String>>>,
    pub nodes: RwLock<Vec<NodeProperties>>,
    /// Cordoned nodes, which the placement service never chooses.
    pub cordoned: RwLock<std::collections::BTreeSet<String>>,
}

struct FleetHandle(Arc<FleetSnapshot>);

impl FleetView for FleetHandle {
    fn active_nodes(&self, group: &GroupKey) -> Vec<String> {
        self.0
            .active
            .read()
            .map(|m| m.get(group).cloned().unwrap_or_default())
            .unwrap_or_default()
    }
}

/// `ring` with the agent's own key trusted as a broker's, as the election
/// needs: the agent must recognise its own tokens and journal.
pub(super) fn with_own_key(mut ring: Keyring, signer: &KeyPair) -> Keyring {
    if ring.get(signer.id()).is_none() {
        ring.add(signer.public(), gearshift_proto::Role::Broker, "own key");
    }
    ring
}

/// Builds the trusted keys from a configuration: at start when no keyring is
/// given, and again on every reload (so that a removed `nodes.d` file
/// revokes its node at once).
pub type KeySource = Arc<dyn Fn(&BrokerConfig) -> Result<Keyring, String> + Send + Sync>;

/// Builds an [`Agent`].
pub struct AgentBuilder {
    cfg: BrokerConfig,
    bus: SharedBus,
    signer: Option<KeyPair>,
    keyring: Option<Keyring>,
    key_source: Option<KeySource>,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    planner: Option<Arc<dyn EvacuationPlanner>>,
    state_dir: Option<PathBuf>,
    metrics: Option<Metrics>,
    placement_service: bool,
    tracker: Option<TaskTracker>,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
    pub(super) fn new(cfg: BrokerConfig, bus: SharedBus) -> Self {
        AgentBuilder {
            cfg,
            bus,
            signer: None,
            keyring: None,
            key_source: None,
            handlers: BTreeMap::new(),
            planner: None,
            state_dir: None,
            metrics: None,
            placement_service: true,
            tracker: None,
        }
    }

    /// The key that signs commands, decisions, explanations and replies.
    pub fn signer(mut self, k: KeyPair) -> Self {
        self.signer = Some(k);
        self
    }

    /// Trusted keys (nodes, operators, clients).
    pub fn keyring(mut self, r: Keyring) -> Self {
        self.keyring = Some(r);
        self
    }

    /// Reads the trusted keys from the configuration with `f`, now (unless a
    /// keyring was given) and on every reload.
    pub fn keys_from(mut self, f: KeySource) -> Self {
        self.key_source = Some(f);
        self
    }

    /// Uses `h` for every group whose handler is `name` (replacing a configured one).
    pub fn handler(mut self, name: impl Into<String>, h: Arc<dyn Handler>) -> Self {
        self.handlers.insert(name.into(), h);
        self
    }

    /// Replaces the evacuation planner (default: the placement engine of `[placement]`).
    pub fn planner(mut self, p: Arc<dyn EvacuationPlanner>) -> Self {
        self.planner = Some(p);
        self
    }

    /// Uses this state directory instead of `agent.state_dir`.
    pub fn state_dir(mut self, d: impl Into<PathBuf>) -> Self {
        self.state_dir = Some(d.into());
        self
    }

    /// Registers metrics here instead of a private registry.
    pub fn metrics(mut self, m: Metrics) -> Self {
        self.metrics = Some(m);
        self
    }

    /// Also serve `placement.request` on the bus (default on).
    pub fn placement_service(mut self, on: bool) -> Self {
        self.placement_service = on;
        self
    }

    /// Spawns every task of the agent (handler calls, acks, the placement
    /// service, the bus watch) on `t`, so that a bootstrap that owns it can
    /// wait for all of them at shutdown. Default: a tracker of its own.
    pub fn tracker(mut self, t: TaskTracker) -> Self {
        self.tracker = Some(t);
        self
    }

    /// Locks the state directory, opens the journal, builds the handlers.
    pub fn build(self) -> Result<Agent, AgentError> {
        let signer = Arc::new(self.signer.ok_or(AgentError::NoSigner)?);
        let keyring = match (self.keyring, &self.key_source) {
            (Some(r), _) => r,
            (None, Some(f)) => f(&self.cfg).map_err(AgentError::Keys)?,
            (None, None) => Keyring::new(),
        };
        let keyring = Arc::new(with_own_key(keyring, &signer));
        let state_dir = self
            .state_dir
            .unwrap_or_else(|| self.cfg.agent.state_dir.clone());
        let lock = gearshift_service::lock::lock_dir(&state_dir)?;
        let journal = Journal::open(&state_dir)?;
        let fleet = Arc::new(FleetSnapshot::default());
        let ctx = handler_context(&self.cfg, &self.bus, &signer, keyring.clone(), &fleet);
        let registered = self.handlers;
        let handlers = build_handlers(&self.cfg, registered.clone(), &ctx)?;
        let engine = gearshift_placement::Engine::new(&self.cfg.placement)
            .map_err(|e| AgentError::Placement(e.to_string()))?;
        let custom_planner = self.planner.is_some();
        let planner = self
            .planner
            .unwrap_or_else(|| Arc::new(PlacementPlanner::new(engine.clone())));
        let cfg = Arc::new(self.cfg);
        check_handlers(&cfg, &handlers)?;
        let paas = crate::paas::build(&cfg.paas);
        let (status_tx, _) = watch::channel(Arc::new(Status::default()));
        let (observed_tx, _) = broadcast::channel(1024);
        let (reload_tx, reload_rx) = mpsc::channel(1);
        Ok(Agent {
            cfg,
            bus: self.bus,
            signer,
            keyring,
            key_source: self.key_source,
            handlers: Arc::new(handlers),
            paas,
            planner,
            engine,
            journal,
            _lock: lock,
            status_tx,
            observed_tx,
            metrics: self.metrics.unwrap_or_default(),
            reload_tx,
            reload_rx: Some(reload_rx),
            registered,
            custom_planner,
            listener: None,
            placement_stop: None,
            fleet,
            placement_service: self.placement_service,
            tracker: self.tracker.unwrap_or_default(),
            state_dir,
        })
    }
}

impl Agent {
    /// What a handler built now may use: the bus, the signer, `keyring`, the fleet.
    pub(super) fn handler_context(
        &self,
        keyring: Arc<Keyring>,
    ) -> gearshift_handlers::HandlerContext {
        handler_context(&self.cfg, &self.bus, &self.signer, keyring, &self.fleet)
    }
}

fn handler_context(
    cfg: &BrokerConfig,
    bus: &SharedBus,
    signer: &Arc<KeyPair>,
    keyring: Arc<Keyring>,
    fleet: &Arc<FleetSnapshot>,
) -> gearshift_handlers::HandlerContext {
    gearshift_handlers::HandlerContext {
        bus: Some(bus.clone()),
        signer: Some(signer.clone()),
        keyring: Some(keyring),
        agent: cfg.agent.name.clone(),
        bus_url: cfg.bus.url.clone(),
        fleet: Arc::new(FleetHandle(fleet.clone())),
    }
}

/// The registered handlers, plus every configured one not registered, plus `log`.
pub(super) fn build_handlers(
    cfg: &BrokerConfig,
    mut handlers: BTreeMap<String, Arc<dyn Handler>>,
    ctx: &gearshift_handlers::HandlerContext,
) -> Result<BTreeMap<String, Arc<dyn Handler>>, AgentError> {
    for (name, hc) in &cfg.handlers {
        if handlers.contains_key(name) {
            continue;
        }
        let h = gearshift_handlers::build(name, hc, ctx).map_err(|e| AgentError::Handler {
            name: name.clone(),
            reason: e.to_string(),
        })?;
        handlers.insert(name.clone(), h);
    }
    handlers
        .entry("log".into())
        .or_insert_with(|| Arc::new(gearshift_handlers::log::LogHandler));
    Ok(handlers)
}

pub(super) fn check_handlers(
    cfg: &BrokerConfig,
    handlers: &BTreeMap<String, Arc<dyn Handler>>,
) -> Result<(), AgentError> {
    let mut names = vec![cfg.group_defaults.handler.clone()];
    names.extend(cfg.groups.iter().filter_map(|g| g.handler.clone()));
    for n in names {
        if !handlers.contains_key(&n) {
            return Err(AgentError::Handler {
                name: n,
                reason: "no such handler (configure it in [handlers] or register it)".into(),
            });
        }
    }
    Ok(())
}
