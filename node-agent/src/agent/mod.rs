//! The node agent: one [`Agent`] per node, built from an [`AgentConfig`], a
//! [`SharedBus`] and a [`SharedRuntime`], run until a token is cancelled.
//!
//! Tasks of a running agent (all stop with the token; all spawned on the
//! agent's [`TaskTracker`]):
//! - the **core task** (`driver`): owns the node's [`NodeCore`], carries
//!   out its actions (journal, state file, checkpoints, moves, events, acks);
//! - the **command consumer** and the **ping responder** (`intake`): take
//!   deliveries, run the [`gearshift_proto::Gate`] and hand them to the core task;
//! - the **reporter** (`report`): scans the runtime, reports periodically
//!   and at once on every change;
//! - the **moves** of an evacuation, one task per gear in flight;
//! - the **outbox publisher** ([`outbox`]), which keeps events while the bus is away;
//! - a **bus watcher** that counts reconnections.

mod driver;
mod intake;
pub mod outbox;
mod report;
mod shared;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::SharedBus;
use gearshift_proto::msg::OperationStatus;
use gearshift_proto::{KeyPair, Keyring};
use thiserror::Error;
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use crate::config::{EvacuationSection, RemoveAction, ReportSection};
use crate::core::NodeCore;
use crate::heat::Signaller;
use crate::metrics::Metrics;
use crate::runtime::SharedRuntime;
use crate::state::journal::JournalFiles;
use crate::state::{StateDir, StateError};
use outbox::Outbox;
use shared::{Limits, Settings, Shared, StateFile, View};

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
    /// Tracks every task the agent spawns, so that a process can wait for
    /// all of them at exit (default: a tracker of its own).
    pub tracker: TaskTracker,
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
            tracker: TaskTracker::new(),
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

/// A node agent.
#[derive(Clone)]
pub struct Agent {
    shared: Arc<Shared>,
    /// The core and the persisted report reservation, taken by [`Agent::run`].
    start: Arc<Mutex<Option<(NodeCore, u64)>>>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.shared.name)
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
        let (journal, warnings) = JournalFiles::new(&state).load()?;
        for w in warnings {
            tracing::error!(warning = %w, "journal entry set aside");
        }
        let metrics = config.metrics.clone();
        metrics.active.set(i64::from(node_state.active));
        let core = NodeCore::new(node_state.active, journal).with_epoch(node_state.epoch);
        let view = View {
            active: node_state.active,
            operation: None,
        };
        let seq_reserved = node_state.seq_reserved;
        let shared = Shared {
            name: config.name.clone(),
            keypair: config.keypair.clone(),
            bus,
            runtime,
            state_file: StateFile::new(state.clone(), node_state),
            state,
            outbox: Outbox::new(config.outbox_capacity, metrics.clone()),
            metrics,
            refusals: Default::default(),
            limits: Limits {
                replay_capacity: config.replay_capacity.max(16),
                write_status_file: config.write_status_file,
                shutdown_grace: config.shutdown_grace,
                prefetch: config.prefetch.max(1),
                retry_min: config.retry_min,
                retry_max: config.retry_max,
            },
            settings: watch::channel(Arc::new(Settings::from(&config))).0,
            view: watch::channel(view).0,
            inventory: watch::channel(None).0,
            reports: watch::channel(None).0,
            report_now: Notify::new(),
            bus_connected: AtomicBool::new(false),
            commands_ready: AtomicBool::new(false),
            heartbeat: AtomicI64::new(Utc::now().timestamp()),
            started_at: Utc::now(),
            boot: Uuid::new_v4(),
            tracker: config.tracker.clone(),
            stop_self: CancellationToken::new(),
            removed: AtomicBool::new(false),
        };
        Ok(Agent {
            shared: Arc::new(shared),
            start: Arc::new(Mutex::new(Some((core, seq_reserved)))),
        })
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The tracker of every task the agent spawns.
    pub fn tracker(&self) -> &TaskTracker {
        &self.shared.tracker
    }

    /// The latest report the agent built, for observers such as the
    /// pull-mode pusher (a watch channel: never blocks the reporter).
    pub fn reports(
        &self,
    ) -> tokio::sync::watch::Receiver<Option<gearshift_proto::msg::NodeReport>> {
        self.shared.reports.subscribe()
    }

    /// Whether the node is active (accepts gears).
    pub fn is_active(&self) -> bool {
        self.shared.view.borrow().active
    }

    /// The operation in progress, as reports show it.
    pub fn operation(&self) -> Option<OperationStatus> {
        self.shared.view.borrow().operation.clone()
    }

    /// True while the agent's main loops make progress (for the systemd watchdog).
    pub fn healthy(&self) -> bool {
        let beat = self.shared.heartbeat.load(Ordering::Relaxed);
        let scan = self.shared.settings().report.scan_interval.as_secs() as i64;
        Utc::now().timestamp() - beat < 120 + 5 * scan
    }

    /// Applies what can change while running (trusted keys, time window,
    /// report and evacuation settings, Heat, node facts); logs what needs a restart.
    pub fn reload(&self, config: AgentConfig) {
        let sh = &self.shared;
        if config.name != sh.name {
            tracing::warn!(old = %sh.name, new = %config.name, "node.name changes need a restart; keeping the old name");
        }
        if config.state_dir != sh.state.path() {
            tracing::warn!("state.dir changes need a restart; keeping the old directory");
        }
        if config.keypair.id() != sh.keypair.id() {
            tracing::warn!("keys.signing_key changes need a restart; keeping the old key");
        }
        sh.settings.send_replace(Arc::new(Settings::from(&config)));
        tracing::info!(
            trusted_keys = config.keyring.len(),
            "configuration reloaded"
        );
        sh.report_now.notify_one();
    }

    /// Runs the agent until `token` is cancelled or the node was removed.
    /// On cancellation, moves in flight get the shutdown grace period to
    /// finish and be checkpointed; queued events get a short flush; then the
    /// state directory is unlocked, so that a new [`Agent`] for the same
    /// node can start. Call it once per `Agent`.
    pub async fn run(&self, token: CancellationToken) -> RunExit {
        let taken = self.start.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some((core, seq_reserved)) = taken else {
            tracing::error!("Agent::run called twice; the second call does nothing");
            return RunExit::Stopped;
        };
        let sh = self.shared.clone();
        let tracker = sh.tracker.clone();
        let stop = CancellationToken::new();
        let publisher_stop = CancellationToken::new();
        let publisher = tracker.spawn(sh.outbox.clone().run(
            sh.bus.clone(),
            publisher_stop.clone(),
            sh.limits.retry_min,
            sh.limits.retry_max,
            Duration::from_secs(5),
        ));
        let watcher = tracker.spawn(intake::watch_bus(sh.clone(), stop.clone()));
        let (tx, rx) = tokio::sync::mpsc::channel(256);
        let mut driver = driver::Driver::new(sh.clone(), core, tx.clone(), rx);
        driver.start().await;
        let core_task = tracker.spawn(driver.run(stop.clone()));
        let reporter =
            tracker.spawn(report::Reporter::new(sh.clone(), seq_reserved).run(stop.clone()));
        let commands = tracker.spawn(intake::command_loop(sh.clone(), tx.clone(), stop.clone()));
        let pings = tracker.spawn(intake::ping_loop(sh.clone(), tx, stop.clone()));
        tracing::info!(node = %sh.name, runtime = sh.runtime.kind(), active = self.is_active(),
            "node agent running");

        tokio::select! {
            _ = token.cancelled() => {}
            _ = sh.stop_self.cancelled() => {}
        }
        let exit = if sh.removed.load(Ordering::SeqCst) {
            RunExit::Removed
        } else {
            RunExit::Stopped
        };
        tracing::info!(?exit, "node agent stopping");
        stop.cancel();
        let grace = sh.limits.shutdown_grace + Duration::from_secs(5);
        let loops = async {
            let _ = tokio::join!(commands, pings, watcher, core_task);
        };
        if tokio::time::timeout(grace, loops).await.is_err() {
            tracing::warn!("some tasks did not stop within the grace period");
        }
        if let Ok(Ok(mut reporter)) = tokio::time::timeout(Duration::from_secs(5), reporter).await {
            reporter.send_report(true).await;
        }
        publisher_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), publisher).await;
        sh.state.unlock();
        exit
    }
}
