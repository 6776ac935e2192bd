//! The I/O driver around [`Core`]: consumes reports, node events, operator
//! requests and pings from the bus, runs the timers, calls the handlers,
//! journals every change before its effect, and publishes commands,
//! decisions and explanations.
//!
//! ```no_run
//! # async fn f(cfg: gearshift_broker::config::BrokerConfig, bus: gearshift_bus::SharedBus,
//! #            key: gearshift_proto::KeyPair, ring: gearshift_proto::Keyring,
//! #            sim: std::sync::Arc<dyn gearshift_handlers::Handler>) -> anyhow::Result<()> {
//! let agent = gearshift_broker::Agent::builder(cfg, bus)
//!     .signer(key)
//!     .keyring(ring)
//!     .handler("sim", sim)
//!     .build()?;
//! let mut status = agent.status();
//! let token = tokio_util::sync::CancellationToken::new();
//! agent.run(token).await?;
//! # Ok(()) }
//! ```
//!
//! Layout: this file holds the agent and its loop; `build.rs` the builder,
//! `subs.rs` the subscriptions and the placement service, `deliveries.rs`
//! events and pings (through the signed-message gate), `reports.rs` and
//! `intake.rs` reports a batch at a time (coalesced per node),
//! `admin.rs` operator requests, `apply.rs` journaling and carrying out the
//! core's actions, `tick.rs` the timers, evaluations, fleet snapshot and
//! status, `fence.rs` a node's `stale_epoch` refusal (this agent deposed).

mod admin;
mod answers;
mod apply;
mod build;
mod deliveries;
mod enroll;
mod fence;
mod ha;
mod intake;
mod proof;
mod reload;
pub mod replay;
mod reports;
mod subs;
mod tick;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::SharedBus;
use gearshift_handlers::Handler;
use gearshift_proto::{KeyPair, Keyring};
use gearshift_service::lock::{DirLock, LockError};
use gearshift_service::refusals::RefusalLog;
use thiserror::Error;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use self::build::FleetSnapshot;
pub use self::build::{AgentBuilder, KeySource};
pub use self::reload::Reloader;
use self::subs::{Subs, next};
pub use self::tick::tick_interval;
use crate::config::BrokerConfig;
use crate::core::{Action, CallResult, CallTag, Core};
use crate::journal::{Journal, JournalError};
use crate::metrics::Metrics;
use crate::planner::EvacuationPlanner;
use crate::status::Status;

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Why the agent could not be built or stopped running.
#[derive(Debug, Error)]
pub enum AgentError {
    /// The state directory is locked or unusable.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The journal failed: the agent stops rather than act unrecorded.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// A group names a handler that does not exist or could not be built.
    #[error("handler {name:?}: {reason}")]
    Handler {
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The placement engine could not be built.
    #[error("placement: {0}")]
    Placement(String),
    /// The trusted keys could not be read.
    #[error("keys: {0}")]
    Keys(String),
    /// No signing key was given.
    #[error("no signing key: the broker agent signs its commands")]
    NoSigner,
}

/// What an embedding program can watch besides the status.
#[derive(Debug, Clone)]
pub enum Observed {
    /// A decision was published.
    Decision(gearshift_proto::msg::Decision),
    /// An explanation was published.
    Explanation(gearshift_proto::msg::Explanation),
}

/// The broker agent.
pub struct Agent {
    cfg: Arc<BrokerConfig>,
    bus: SharedBus,
    signer: Arc<KeyPair>,
    keyring: Arc<Keyring>,
    key_source: Option<KeySource>,
    handlers: Arc<BTreeMap<String, Arc<dyn Handler>>>,
    /// The `[paas]` adapter (built at start; a reload keeps it).
    paas: Arc<dyn crate::paas::PaasAdapter>,
    planner: Arc<dyn EvacuationPlanner>,
    engine: gearshift_placement::Engine,
    journal: Journal,
    _lock: DirLock,
    status_tx: watch::Sender<Arc<Status>>,
    observed_tx: broadcast::Sender<Observed>,
    metrics: Metrics,
    reload_tx: mpsc::Sender<reload::ReloadRequest>,
    reload_rx: Option<mpsc::Receiver<reload::ReloadRequest>>,
    /// Handlers the embedding program registered: kept across reloads.
    registered: BTreeMap<String, Arc<dyn Handler>>,
    /// The embedding program chose the planner: reloads keep it.
    custom_planner: bool,
    /// The metrics and dashboard listener, which reloads move.
    listener: Option<gearshift_service::http::Listener>,
    /// Stops the placement service (to restart it after a reload).
    placement_stop: Option<CancellationToken>,
    fleet: Arc<FleetSnapshot>,
    placement_service: bool,
    tracker: TaskTracker,
    state_dir: std::path::PathBuf,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.cfg.agent.name)
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

type Result2<T> = std::result::Result<T, AgentError>;

/// A handler call's answer, with the call's name for the metrics.
type CallDone = (CallTag, &'static str, CallResult);

/// The loop's own state besides the core.
struct RunState {
    /// Refused messages by reason (the status document's `refused`).
    refused: BTreeMap<String, u64>,
    logs: RefusalLogs,
    in_flight_calls: usize,
    /// Operator requests already acted upon (persisted in the state dir).
    replay: replay::PersistedReplay,
    /// The answers to recent operator requests, given again to a redelivery.
    answers: answers::Answers,
    results_tx: mpsc::UnboundedSender<CallDone>,
    last_status: Option<DateTime<Utc>>,
    /// A change not yet in the published status (it was published recently).
    status_dirty: bool,
    /// What building the last status cost: changes publish it at most
    /// every 20 such costs, so that a large fleet's status does not eat the loop.
    status_cost: Duration,
    /// The status document's groups, rebuilt only when they changed.
    status: crate::status::StatusBuilder,
    /// When the fleet snapshot was last refreshed, and what it cost.
    fleet_refreshed: Option<tokio::time::Instant>,
    fleet_cost: Duration,
    /// The report that showed pressure, while the evaluation it caused is applied.
    pressure: Option<DateTime<Utc>>,
    /// The next periodic evaluation.
    next_eval: tokio::time::Instant,
    /// The durable history, unless `[history]` disables it.
    history: Option<crate::history::Sink>,
    /// How the last reload ended.
    reload: Option<crate::status::ReloadStatus>,
    /// The report trace, while `[trace] record` is on.
    trace: Option<crate::trace::Recorder>,
    /// Which explanations are published (changed, or the keep-alive).
    explained: crate::explain::ExplainGate,
    /// The election: leading or standing by.
    ha: ha::Ha,
    /// Report batches' acknowledgements, in order.
    report_acks: deliveries::OrderedAcks,
}

impl RunState {
    /// Appends records to the history (when it is kept).
    fn record(&mut self, records: Vec<crate::history::Record>) {
        if let Some(h) = self.history.as_mut() {
            for r in records {
                h.append(r);
            }
        }
    }

    /// Appends one event that happened at `at`.
    fn record_event(&mut self, at: DateTime<Utc>, event: crate::history::Event) {
        self.record(vec![crate::history::Record { at, event }]);
    }
}

/// One rate-limited refusal log per kind of input.
struct RefusalLogs {
    reports: RefusalLog,
    events: RefusalLog,
    admin: RefusalLog,
    pings: RefusalLog,
}

impl RunState {
    fn new(
        results_tx: mpsc::UnboundedSender<CallDone>,
        next_eval: tokio::time::Instant,
        history: Option<crate::history::Sink>,
        replay: replay::PersistedReplay,
        ha: ha::Ha,
        report_acks: deliveries::OrderedAcks,
    ) -> Self {
        RunState {
            refused: BTreeMap::new(),
            logs: RefusalLogs {
                reports: RefusalLog::new("report"),
                events: RefusalLog::new("event"),
                admin: RefusalLog::new("admin request"),
                pings: RefusalLog::new("ping"),
            },
            in_flight_calls: 0,
            replay,
            answers: answers::Answers::default(),
            results_tx,
            last_status: None,
            status_dirty: false,
            status_cost: Duration::ZERO,
            status: crate::status::StatusBuilder::default(),
            fleet_refreshed: None,
            fleet_cost: Duration::ZERO,
            pressure: None,
            next_eval,
            history,
            reload: None,
            trace: None,
            explained: crate::explain::ExplainGate::default(),
            ha,
            report_acks,
        }
    }
}

impl Agent {
    /// A builder from a validated configuration and a bus.
    pub fn builder(cfg: BrokerConfig, bus: SharedBus) -> AgentBuilder {
        AgentBuilder::new(cfg, bus)
    }

    /// Status snapshots, refreshed after every change.
    pub fn status(&self) -> watch::Receiver<Arc<Status>> {
        self.status_tx.subscribe()
    }

    /// Decisions and explanations as they are published.
    pub fn observe(&self) -> broadcast::Receiver<Observed> {
        self.observed_tx.subscribe()
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Where the journal and the history live.
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state_dir
    }

    /// The tracker every task of the agent is spawned on.
    pub fn tracker(&self) -> TaskTracker {
        self.tracker.clone()
    }

    /// Hands new configurations (SIGHUP) to the running agent.
    pub fn reloader(&self) -> Reloader {
        Reloader(self.reload_tx.clone())
    }

    /// The metrics and dashboard listener, which reloads move to a new
    /// `metrics.listen`.
    pub fn set_listener(&mut self, l: gearshift_service::http::Listener) {
        self.listener = Some(l);
    }

    /// Runs until `token` is cancelled, then lets in-flight handler calls
    /// finish within `agent.shutdown_grace` and returns. Fails only when the
    /// journal fails.
    pub async fn run(mut self, token: CancellationToken) -> Result2<()> {
        let now = Utc::now();
        let mut core = Core::new(self.cfg.clone(), self.planner.clone(), now);
        core.set_handler_kinds(
            self.handlers
                .iter()
                .map(|(name, h)| (name.clone(), h.kind().to_string()))
                .collect(),
        );
        // The journal is loaded when this agent takes the lead (see `ha.rs`);
        // until then it stands by, its epoch the election's floor.
        let seen_epoch = self.journal.load()?.meta.epoch;
        let (results_tx, mut results_rx) = mpsc::unbounded_channel::<CallDone>();
        let history = crate::history::Sink::open(&self.state_dir, &self.cfg.history);
        // Requests are refused as stale outside the time window either way:
        // ids need remembering for twice its length at most.
        let window =
            chrono::Duration::minutes(10).max(crate::core::dur(self.cfg.keys.time_window) * 2);
        let replay = replay::PersistedReplay::open(&self.state_dir, window, now);
        let ha = ha::Ha::new(ha::timing(&self.cfg.agent), seen_epoch);
        let acks = deliveries::OrderedAcks::start(&self.tracker);
        let mut st = RunState::new(
            results_tx,
            tokio::time::Instant::now(),
            history,
            replay,
            ha,
            acks,
        );
        st.trace = crate::trace::Recorder::open(&self.cfg.trace, &self.state_dir);
        let mut subs = Subs::default();
        self.metrics
            .watch_bus(&self.bus, token.clone(), &self.tracker);
        self.metrics.lead(&self.cfg.agent.name, None);
        self.ensure_subs(&mut subs).await;
        tracing::info!(
            agent = %self.cfg.agent.name,
            cluster = %self.cfg.agent.cluster,
            "broker agent running: standing by until it leads"
        );
        let first_eval = self.cfg.policy.interval.min(self.cfg.policy.startup_grace);
        st.next_eval = tokio::time::Instant::now() + first_eval;
        self.serve(&mut core, &mut st, &mut subs, &mut results_rx, &token)
            .await?;
        if let Some(t) = st.trace.as_mut() {
            t.flush();
        }
        self.drain(&mut core, &mut st, &mut results_rx).await
    }

    /// The loop: one input at a time, until `token` is cancelled.
    async fn serve(
        &mut self,
        core: &mut Core,
        st: &mut RunState,
        subs: &mut Subs,
        results_rx: &mut mpsc::UnboundedReceiver<CallDone>,
        token: &CancellationToken,
    ) -> Result2<()> {
        let mut tick_every = tick::tick_interval(&self.cfg);
        let mut tick = tick::ticker(tick_every);
        let mut reloads = self.reload_rx.take();
        loop {
            tokio::select! {
                biased;
                _ = token.cancelled() => return Ok(()),
                i = subs.ha.next() => self.on_ha(core, st, subs, i, token).await?,
                Some(done) = results_rx.recv() => self.on_call_done(core, st, done).await?,
                d = next(&mut subs.events) => match d {
                    Some(d) => {
                        let batch = subs.event_batch(d);
                        self.on_event_deliveries(core, st, batch).await?
                    }
                    None => subs.events = None,
                },
                d = next(&mut subs.admin) => match d {
                    Some(d) => self.on_admin_delivery(core, st, d).await?,
                    None => subs.admin = None,
                },
                _ = tick.tick() => {
                    self.on_tick(core, st, tick_every).await?;
                    if !subs.complete() {
                        self.ensure_subs(subs).await;
                    }
                }
                d = next(&mut subs.reports) => match d {
                    Some(d) => {
                        let batch = subs.report_batch(d).await;
                        self.on_report_batch(core, st, batch).await?
                    }
                    None => subs.reports = None,
                },
                d = next(&mut subs.pings) => match d {
                    Some(d) => self.on_ping(st, d).await,
                    None => subs.pings = None,
                },
                Some(req) = reload::next_reload(&mut reloads) => {
                    self.on_reload(core, st, req, token).await;
                    if tick::tick_interval(&self.cfg) != tick_every {
                        tick_every = tick::tick_interval(&self.cfg);
                        tick = tick::ticker(tick_every);
                    }
                }
            }
        }
    }

    /// A handler call finished.
    async fn on_call_done(
        &self,
        core: &mut Core,
        st: &mut RunState,
        done: CallDone,
    ) -> Result2<()> {
        let (tag, call, res) = done;
        st.in_flight_calls = st.in_flight_calls.saturating_sub(1);
        self.metrics.handler_call(call, res.label());
        let now = Utc::now();
        let acts = core.on_handler_result(tag, res, now);
        self.apply(core, st, acts, now).await
    }

    /// After the loop: handler calls in flight may still finish within the
    /// grace period and be journaled; new effects wait for the next start.
    async fn drain(
        &self,
        core: &mut Core,
        st: &mut RunState,
        results_rx: &mut mpsc::UnboundedReceiver<CallDone>,
    ) -> Result2<()> {
        tracing::info!(
            calls = st.in_flight_calls,
            "stopping: draining in-flight handler calls"
        );
        let deadline = tokio::time::Instant::now() + self.cfg.agent.shutdown_grace;
        while st.in_flight_calls > 0 {
            let Ok(Some((tag, call, res))) =
                tokio::time::timeout_at(deadline, results_rx.recv()).await
            else {
                tracing::warn!(
                    calls = st.in_flight_calls,
                    "grace period over: leaving calls to the next start"
                );
                break;
            };
            st.in_flight_calls -= 1;
            self.metrics.handler_call(call, res.label());
            if !st.ha.leading() {
                continue;
            }
            let now = Utc::now();
            let acts = core.on_handler_result(tag, res, now);
            let ch = core.take_changes();
            self.journal.commit(core, &ch)?;
            st.record(core.take_history());
            for a in acts {
                if let Action::Decide(d) = a {
                    st.record_event(now, crate::history::Event::Decision(d.clone()));
                    self.decide(d, now).await;
                }
            }
        }
        Ok(())
    }
}
