//! The node agent: one [`Agent`] per node, built from an [`AgentConfig`], a
//! [`SharedBus`] and a [`SharedRuntime`], run until a token is cancelled.
//!
//! Tasks of a running agent (all stop with the token):
//! - the **command consumer** on the node's durable queue (manual ack);
//! - the **ping responder** on the broadcast key `ping`;
//! - the **reporter**: scans the runtime, reports periodically and at once
//!   on every change;
//! - the **evacuation** in progress, if any (resumed from its checkpoint at start);
//! - the **outbox publisher**, which keeps events while the bus is away;
//! - a **bus watcher** that counts reconnections.

mod commands;
pub mod outbox;
mod report;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::{BusEvent, OutMessage, SharedBus};
use gearshift_proto::msg::{Message, OperationStatus};
use gearshift_proto::{Envelope, KeyPair, Keyring, ReplayGuard, routing};
use thiserror::Error;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::config::{EvacuationSection, RemoveAction, ReportSection};
use crate::evacuate::Abort;
use crate::heat::Signaller;
use crate::metrics::Metrics;
use crate::runtime::{Inventory, SharedRuntime};
use crate::state::journal::Journal;
use crate::state::seq::SeqAllocator;
use crate::state::{NodeState, StateDir, StateError};
use outbox::Outbox;

/// Everything an agent needs, resolved (keys loaded, name known).
#[derive(Clone)]
pub struct AgentConfig {
    /// The node's identity on the bus.
    pub name: String,
    /// The node's signing key (role `node`).
    pub keypair: KeyPair,
    /// Trusted keys (broker, operators, clients).
    pub keyring: Keyring,
    /// Commands whose `ts` is further than this from the clock are refused.
    pub time_window: Duration,
    /// Command ids remembered for replay detection.
    pub replay_capacity: usize,
    /// The state directory.
    pub state_dir: PathBuf,
    /// fsync state changes (the simulator turns it off).
    pub fsync: bool,
    /// Write `status.json` for `gearshift-node status`.
    pub write_status_file: bool,
    /// Region.
    pub region: Option<String>,
    /// Zone.
    pub zone: Option<String>,
    /// The scale-up operation this node was created for.
    pub booted_for: Option<String>,
    /// Never choose this node for scale-down.
    pub do_not_disrupt: bool,
    /// Report timing.
    pub report: ReportSection,
    /// Evacuation defaults.
    pub evacuation: EvacuationSection,
    /// How long in-flight moves may finish after the agent is told to stop.
    pub shutdown_grace: Duration,
    /// Unacknowledged commands in flight.
    pub prefetch: u16,
    /// Events kept while the bus is away.
    pub outbox_capacity: usize,
    /// First delay when re-subscribing or re-publishing.
    pub retry_min: Duration,
    /// Longest such delay.
    pub retry_max: Duration,
    /// What `cmd.remove` does.
    pub remove_action: RemoveAction,
    /// Sends Heat signals; `None` when no credentials are configured.
    pub signaller: Option<Arc<dyn Signaller>>,
    /// The agent's metrics.
    pub metrics: Metrics,
}

impl std::fmt::Debug for AgentConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentConfig")
            .field("name", &self.name)
            .field("key", &self.keypair.id())
            .field("trusted_keys", &self.keyring.len())
            .field("state_dir", &self.state_dir)
            .field("report", &self.report)
            .field("evacuation", &self.evacuation)
            .field("remove_action", &self.remove_action)
            .field("signaller", &self.signaller.is_some())
            .finish_non_exhaustive()
    }
}

impl AgentConfig {
    /// A configuration with every default of `conf/node.toml`.
    pub fn new(
        name: impl Into<String>,
        keypair: KeyPair,
        keyring: Keyring,
        state_dir: impl Into<PathBuf>,
    ) -> Self {
        AgentConfig {
            name: name.into(),
            keypair,
            keyring,
            time_window: Duration::from_secs(300),
            replay_capacity: 10_000,
            state_dir: state_dir.into(),
            fsync: true,
            write_status_file: true,
            region: None,
            zone: None,
            booted_for: None,
            do_not_disrupt: false,
            report: ReportSection::default(),
            evacuation: EvacuationSection::default(),
            shutdown_grace: Duration::from_secs(30),
            prefetch: 16,
            outbox_capacity: 10_000,
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            remove_action: RemoveAction::None,
            signaller: None,
            metrics: Metrics::default(),
        }
    }
}

/// Why an agent could not start or stopped abnormally.
#[derive(Debug, Error)]
pub enum AgentError {
    /// The configuration is unusable.
    #[error("invalid agent configuration: {0}")]
    Config(String),
    /// The state directory is locked by another agent or unreadable.
    #[error(transparent)]
    State(#[from] StateError),
}

/// How [`Agent::run`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunExit {
    /// The token was cancelled (SIGTERM, or the simulator stopped the node).
    Stopped,
    /// `cmd.remove` completed: the node is going away.
    Removed,
}

/// The settings [`Agent::reload`] can change while running.
#[derive(Clone)]
struct Settings {
    keyring: Keyring,
    time_window: Duration,
    report: ReportSection,
    evacuation: EvacuationSection,
    remove_action: RemoveAction,
    signaller: Option<Arc<dyn Signaller>>,
    do_not_disrupt: bool,
    booted_for: Option<String>,
    region: Option<String>,
    zone: Option<String>,
}

impl Settings {
    fn from(c: &AgentConfig) -> Self {
        Settings {
            keyring: c.keyring.clone(),
            time_window: c.time_window,
            report: c.report.clone(),
            evacuation: c.evacuation.clone(),
            remove_action: c.remove_action,
            signaller: c.signaller.clone(),
            do_not_disrupt: c.do_not_disrupt,
            booted_for: c.booted_for.clone(),
            region: c.region.clone(),
            zone: c.zone.clone(),
        }
    }
}

struct RunningEvac {
    abort: Arc<Abort>,
}

/// State shared by the agent's tasks.
pub(crate) struct Inner {
    name: String,
    keypair: KeyPair,
    settings: RwLock<Settings>,
    replay_capacity: usize,
    write_status_file: bool,
    shutdown_grace: Duration,
    prefetch: u16,
    retry_min: Duration,
    retry_max: Duration,
    bus: SharedBus,
    runtime: SharedRuntime,
    state: Arc<StateDir>,
    node_state: Mutex<NodeState>,
    journal: Arc<Mutex<Journal>>,
    seq: Mutex<SeqAllocator>,
    outbox: Arc<Outbox>,
    metrics: Metrics,
    started_at: DateTime<Utc>,
    boot: Uuid,
    report_now: Notify,
    evacs: Mutex<HashMap<String, RunningEvac>>,
    operation: Mutex<Option<OperationStatus>>,
    ping_guard: Mutex<ReplayGuard>,
    /// Log budget of refused broadcasts (they are all counted in metrics).
    refusal_log: Mutex<gearshift_service::ratelimit::LogLimiter>,
    inventory: Mutex<Option<Inventory>>,
    bus_connected: AtomicBool,
    heartbeat: AtomicI64,
    /// Cancelled by the agent itself (after `cmd.remove`).
    stop_self: CancellationToken,
    removed: AtomicBool,
    tracker: TaskTracker,
    last_report: Mutex<Option<(u64, DateTime<Utc>)>>,
    snapshot_at: Mutex<Option<std::time::Instant>>,
    /// Serializes writes of `state.json`.
    state_write: tokio::sync::Mutex<()>,
    /// Cancelled when the agent stops; evacuations watch it.
    run_stop: CancellationToken,
    /// The last report built, for observers (the pull-mode pusher).
    reports: tokio::sync::watch::Sender<Option<gearshift_proto::msg::NodeReport>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A node agent.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .finish()
    }
}

impl Agent {
    /// Opens (and locks) the state directory and loads what it remembers.
    /// Nothing touches the bus until [`Agent::run`].
    pub fn new(
        config: AgentConfig,
        bus: SharedBus,
        runtime: SharedRuntime,
    ) -> Result<Agent, AgentError> {
        crate::config::valid_node_name(&config.name)
            .map_err(|r| AgentError::Config(format!("node name {:?}: {r}", config.name)))?;
        if config.keyring.is_empty() {
            return Err(AgentError::Config(
                "no trusted keys: every command would be refused".into(),
            ));
        }
        let state = Arc::new(StateDir::open(&config.state_dir, config.fsync)?);
        let node_state = state.load_state()?;
        let (journal, warnings) = Journal::load(&state)?;
        for w in warnings {
            tracing::error!(warning = %w, "journal entry set aside");
        }
        let metrics = config.metrics.clone();
        metrics.active.set(i64::from(node_state.active));
        let window =
            chrono::Duration::from_std(config.time_window).unwrap_or(chrono::Duration::minutes(5));
        let inner = Inner {
            name: config.name.clone(),
            keypair: config.keypair.clone(),
            settings: RwLock::new(Settings::from(&config)),
            replay_capacity: config.replay_capacity.max(16),
            write_status_file: config.write_status_file,
            shutdown_grace: config.shutdown_grace,
            prefetch: config.prefetch.max(1),
            retry_min: config.retry_min,
            retry_max: config.retry_max,
            bus,
            runtime,
            seq: Mutex::new(SeqAllocator::new(node_state.seq_reserved)),
            node_state: Mutex::new(node_state),
            state,
            journal: Arc::new(Mutex::new(journal)),
            outbox: Outbox::new(config.outbox_capacity, metrics.clone()),
            metrics,
            started_at: Utc::now(),
            boot: Uuid::new_v4(),
            report_now: Notify::new(),
            evacs: Mutex::default(),
            operation: Mutex::default(),
            ping_guard: Mutex::new(ReplayGuard::new(window * 2, config.replay_capacity.max(16))),
            refusal_log: Mutex::new(gearshift_service::ratelimit::LogLimiter::default()),
            inventory: Mutex::default(),
            bus_connected: AtomicBool::new(false),
            heartbeat: AtomicI64::new(Utc::now().timestamp()),
            stop_self: CancellationToken::new(),
            removed: AtomicBool::new(false),
            tracker: TaskTracker::new(),
            last_report: Mutex::default(),
            snapshot_at: Mutex::default(),
            state_write: tokio::sync::Mutex::new(()),
            run_stop: CancellationToken::new(),
            reports: tokio::sync::watch::channel(None).0,
        };
        Ok(Agent {
            inner: Arc::new(inner),
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The latest report the agent built, for observers such as the
    /// pull-mode pusher (a watch channel: never blocks the reporter).
    pub fn reports(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<gearshift_proto::msg::NodeReport>> {
        self.inner.reports.subscribe()
    }

    /// Whether the node is active (accepts gears).
    pub fn is_active(&self) -> bool {
        lock(&self.inner.node_state).active
    }

    /// The operation in progress, as reports show it.
    pub fn operation(&self) -> Option<OperationStatus> {
        lock(&self.inner.operation).clone()
    }

    /// True while the agent's main loops make progress (for the systemd watchdog).
    pub fn healthy(&self) -> bool {
        let beat = self.inner.heartbeat.load(Ordering::Relaxed);
        let scan = lock_read(&self.inner.settings)
            .report
            .scan_interval
            .as_secs() as i64;
        Utc::now().timestamp() - beat < 120 + 5 * scan
    }

    /// Applies what can change while running (trusted keys, time window,
    /// report and evacuation settings, Heat, node facts); logs what needs a restart.
    pub fn reload(&self, config: AgentConfig) {
        if config.name != self.inner.name {
            tracing::warn!(old = %self.inner.name, new = %config.name, "node.name changes need a restart; keeping the old name");
        }
        if config.state_dir != self.inner.state.path() {
            tracing::warn!("state.dir changes need a restart; keeping the old directory");
        }
        if config.keypair.id() != self.inner.keypair.id() {
            tracing::warn!("keys.signing_key changes need a restart; keeping the old key");
        }
        let mut s = self
            .inner
            .settings
            .write()
            .unwrap_or_else(|p| p.into_inner());
        *s = Settings::from(&config);
        drop(s);
        tracing::info!(
            trusted_keys = config.keyring.len(),
            "configuration reloaded"
        );
        self.inner.report_now.notify_one();
    }

    /// Runs the agent until `token` is cancelled or the node was removed.
    /// On cancellation, moves in flight get the shutdown grace period to
    /// finish and be checkpointed; queued events get a short flush; then the
    /// state directory is unlocked, so that a new [`Agent`] for the same
    /// node can start. Call it once per `Agent`.
    pub async fn run(&self, token: CancellationToken) -> RunExit {
        let inner = self.inner.clone();
        let stop = inner.run_stop.clone();
        let publisher_stop = CancellationToken::new();
        let tracker = inner.tracker.clone();
        let publisher = tokio::spawn(inner.outbox.clone().run(
            inner.bus.clone(),
            publisher_stop.clone(),
            inner.retry_min,
            inner.retry_max,
            Duration::from_secs(5),
        ));
        tracker.spawn(inner.clone().watch_bus(stop.clone()));
        inner.prune_journal();
        inner.clone().resume_evacuations(stop.clone()).await;
        tracker.spawn(inner.clone().report_loop(stop.clone()));
        tracker.spawn(inner.clone().command_loop(stop.clone()));
        tracker.spawn(inner.clone().ping_loop(stop.clone()));
        tracker.spawn(inner.clone().housekeeping(stop.clone()));
        tracing::info!(node = %inner.name, runtime = inner.runtime.kind(), active = self.is_active(),
            "node agent running");

        tokio::select! {
            _ = token.cancelled() => {}
            _ = inner.stop_self.cancelled() => {}
        }
        let exit = if inner.removed.load(Ordering::SeqCst) {
            RunExit::Removed
        } else {
            RunExit::Stopped
        };
        tracing::info!(?exit, "node agent stopping");
        stop.cancel();
        tracker.close();
        let grace = inner.shutdown_grace + Duration::from_secs(5);
        if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
            tracing::warn!("some tasks did not stop within the grace period");
        }
        inner.send_report(true).await;
        publisher_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), publisher).await;
        inner.state.unlock();
        exit
    }
}

fn lock_read<T: Clone>(l: &RwLock<T>) -> T {
    l.read().unwrap_or_else(|p| p.into_inner()).clone()
}

impl Inner {
    fn settings(&self) -> Settings {
        lock_read(&self.settings)
    }

    /// A new envelope from this node.
    fn envelope(&self, msg: impl Into<Message>, corr: Option<&str>) -> Envelope {
        let e = Envelope::new(self.name.clone(), msg);
        match corr {
            Some(c) => e.with_corr(c),
            None => e,
        }
    }

    fn seal(&self, env: Envelope) -> Vec<u8> {
        self.keypair.seal(env)
    }

    /// An `event.<node>` message.
    fn event_message(&self, msg: impl Into<Message>, corr: Option<&str>) -> OutMessage {
        OutMessage::new(
            routing::event(&self.name),
            self.seal(self.envelope(msg, corr)),
        )
    }

    /// Queues an event for publication.
    fn emit(&self, msg: impl Into<Message>, corr: Option<&str>, droppable: bool) {
        self.outbox.event(self.event_message(msg, corr), droppable);
    }

    /// Runs blocking state-directory work off the async threads.
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| StateError::Io {
                path: self.state.path().to_path_buf(),
                reason: format!("state task failed: {e}"),
            })?
    }

    fn prune_journal(&self) {
        let s = self.settings();
        let retention =
            chrono::Duration::from_std(s.time_window * 2).unwrap_or(chrono::Duration::minutes(10));
        let mut j = lock(&self.journal);
        match j.prune(Utc::now(), retention, self.replay_capacity, self.boot) {
            Ok(0) => {}
            Ok(n) => tracing::debug!(removed = n, "journal pruned"),
            Err(e) => tracing::warn!(error = %e, "cannot prune the journal"),
        }
    }

    async fn housekeeping(self: Arc<Self>, stop: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(60));
        tick.tick().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let me = self.clone();
                    let _ = tokio::task::spawn_blocking(move || me.prune_journal()).await;
                }
                _ = stop.cancelled() => return,
            }
        }
    }

    async fn watch_bus(self: Arc<Self>, stop: CancellationToken) {
        let mut events = self.bus.events();
        loop {
            tokio::select! {
                e = events.recv() => match e {
                    Ok(BusEvent::Connected { reconnects }) => {
                        let was = self.bus_connected.swap(true, Ordering::SeqCst);
                        if reconnects > 0 || was {
                            self.metrics.bus_reconnects.inc();
                        }
                        tracing::info!(reconnects, "bus connected");
                        self.report_now.notify_one();
                    }
                    Ok(BusEvent::Disconnected { reason }) => {
                        self.bus_connected.store(false, Ordering::SeqCst);
                        tracing::warn!(%reason, "bus disconnected; local work continues");
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                        // Transports without events (memory) are always connected.
                        self.bus_connected.store(true, Ordering::SeqCst);
                        stop.cancelled().await;
                        return;
                    }
                },
                _ = stop.cancelled() => return,
            }
        }
    }
}
