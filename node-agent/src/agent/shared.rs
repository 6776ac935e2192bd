//! What the agent's tasks share: fixed identity and handles, the settings
//! (replaced on reload), and the views each task publishes for the others.
//! Mutable node state is not here: the core task owns it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::{OutMessage, SharedBus};
use gearshift_proto::msg::{Message, NodeReport, OperationStatus};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use uuid::Uuid;

use super::AgentConfig;
use super::outbox::Outbox;
use crate::config::{EvacuationSection, RemoveAction, ReportSection};
use crate::core::CoreConfig;
use crate::heat::Signaller;
use crate::metrics::Metrics;
use crate::runtime::{Inventory, SharedRuntime};
use crate::state::{NodeState, StateDir, StateError};

/// The settings [`Agent::reload`](super::Agent::reload) can change while running.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) keyring: Keyring,
    pub(crate) time_window: Duration,
    pub(crate) report: ReportSection,
    pub(crate) evacuation: EvacuationSection,
    pub(crate) remove_action: RemoveAction,
    pub(crate) signaller: Option<Arc<dyn Signaller>>,
    pub(crate) do_not_disrupt: bool,
    pub(crate) booted_for: Option<String>,
    pub(crate) region: Option<String>,
    pub(crate) zone: Option<String>,
}

impl Settings {
    pub(crate) fn from(c: &AgentConfig) -> Self {
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

    /// The time window as the proto crate counts it.
    pub(crate) fn window(&self) -> chrono::Duration {
        chrono::Duration::from_std(self.time_window).unwrap_or(chrono::Duration::minutes(5))
    }
}

/// What the core task shows the other tasks (reports, pongs, `Agent::is_active`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) active: bool,
    pub(crate) operation: Option<OperationStatus>,
}

/// Settings that do not change while running.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    pub(crate) replay_capacity: usize,
    pub(crate) write_status_file: bool,
    pub(crate) shutdown_grace: Duration,
    pub(crate) prefetch: u16,
    pub(crate) retry_min: Duration,
    pub(crate) retry_max: Duration,
}

/// Shared by the agent's tasks.
pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) keypair: KeyPair,
    pub(crate) bus: SharedBus,
    pub(crate) runtime: SharedRuntime,
    pub(crate) state: Arc<StateDir>,
    pub(crate) state_file: StateFile,
    pub(crate) outbox: Arc<Outbox>,
    pub(crate) metrics: Metrics,
    pub(crate) refusals: super::intake::Refusals,
    pub(crate) limits: Limits,
    pub(crate) settings: watch::Sender<Arc<Settings>>,
    /// Written by the core task only.
    pub(crate) view: watch::Sender<View>,
    /// The last runtime scan (by the reporter or a command).
    pub(crate) inventory: watch::Sender<Option<Inventory>>,
    /// The last report built, for observers (the pull-mode pusher).
    pub(crate) reports: watch::Sender<Option<NodeReport>>,
    pub(crate) report_now: Notify,
    pub(crate) bus_connected: AtomicBool,
    /// Set once the command queue was declared and consumed: no report goes
    /// out before (a command sent right after the first report must find
    /// the queue).
    pub(crate) commands_ready: AtomicBool,
    pub(crate) heartbeat: AtomicI64,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) boot: Uuid,
    pub(crate) tracker: TaskTracker,
    /// Cancelled by the agent itself (after `cmd.remove`).
    pub(crate) stop_self: CancellationToken,
    pub(crate) removed: AtomicBool,
}

impl Shared {
    pub(crate) fn settings(&self) -> Arc<Settings> {
        self.settings.borrow().clone()
    }

    /// The core's configuration under the current settings.
    pub(crate) fn core_config(&self) -> CoreConfig {
        let s = self.settings();
        CoreConfig {
            time_window: s.window(),
            parallelism: s.evacuation.parallelism,
            remove_action: s.remove_action.heat_action(),
            heat: s.signaller.is_some(),
            journal_capacity: self.limits.replay_capacity,
            boot: self.boot,
            started_at: self.started_at,
        }
    }

    /// A signed message from this node.
    pub(crate) fn seal(&self, msg: impl Into<Message>, corr: Option<&str>) -> Vec<u8> {
        let e = Envelope::new(self.name.clone(), msg);
        let e = match corr {
            Some(c) => e.with_corr(c),
            None => e,
        };
        self.keypair.seal(e)
    }

    /// An `event.<node>` message.
    pub(crate) fn event_message(&self, msg: impl Into<Message>, corr: Option<&str>) -> OutMessage {
        OutMessage::new(routing::event(&self.name), self.seal(msg, corr))
    }

    /// Runs blocking state-directory work off the async threads (tracked).
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> Result<T, StateError> + Send + 'static,
    ) -> Result<T, StateError> {
        self.tracker
            .spawn_blocking(f)
            .await
            .map_err(|e| StateError::Io {
                path: self.state.path().to_path_buf(),
                reason: format!("state task failed: {e}"),
            })?
    }
}

/// `state.json`: the persisted flags, written by the core task (active,
/// removed) and the reporter (sequence reservations), one write at a time.
pub(crate) struct StateFile {
    dir: Arc<StateDir>,
    current: tokio::sync::Mutex<NodeState>,
}

impl StateFile {
    pub(crate) fn new(dir: Arc<StateDir>, loaded: NodeState) -> Self {
        StateFile {
            dir,
            current: tokio::sync::Mutex::new(loaded),
        }
    }

    /// Changes the flags with `f` and writes them durably; the change is
    /// kept only once written.
    pub(crate) async fn update(
        &self,
        tracker: &TaskTracker,
        f: impl FnOnce(&mut NodeState),
    ) -> Result<NodeState, StateError> {
        let mut current = self.current.lock().await;
        let mut st = current.clone();
        f(&mut st);
        let dir = self.dir.clone();
        let st2 = st.clone();
        tracker
            .spawn_blocking(move || dir.save_state(&st2))
            .await
            .map_err(|e| StateError::Io {
                path: self.dir.path().to_path_buf(),
                reason: format!("state task failed: {e}"),
            })??;
        *current = st.clone();
        Ok(st)
    }
}
