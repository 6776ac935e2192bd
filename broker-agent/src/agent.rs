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

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::{
    BusError, ConsumeOptions, Delivery, OutMessage, QueueSpec, SharedBus, Subscription,
};
use gearshift_handlers::{FleetView, GroupKey, Handler, HandlerError};
use gearshift_proto::msg::{AdminReply, AdminRequest, Message, NodeProperties, Pong, Role};
use gearshift_proto::sign::{Keyring, TimePolicy, authenticate};
use gearshift_proto::{Envelope, KeyPair, ReplayGuard, routing};
use gearshift_service::lock::{DirLock, LockError};
use gearshift_service::ratelimit::{LogLimiter, Verdict};
use thiserror::Error;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::config::BrokerConfig;
use crate::core::{Action, CallResult, CallTag, Core, HandlerCall, dur};
use crate::journal::{Journal, JournalError};
use crate::metrics::Metrics;
use crate::planner::{EvacuationPlanner, PlacementPlanner};
use crate::status::Status;

/// The agent's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Most node events handled in one journal commit.
const EVENT_BATCH: usize = 256;
/// Reports in flight from the bounded report queue (see `report_backlog`).
const REPORT_PREFETCH: u16 = 1024;

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

/// The fleet as handlers and the placement service see it (refreshed on ticks).
#[derive(Default)]
struct FleetSnapshot {
    active: RwLock<BTreeMap<GroupKey, Vec<String>>>,
    nodes: RwLock<Vec<NodeProperties>>,
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

/// Builds an [`Agent`].
pub struct AgentBuilder {
    cfg: BrokerConfig,
    bus: SharedBus,
    signer: Option<KeyPair>,
    keyring: Option<Keyring>,
    handlers: BTreeMap<String, Arc<dyn Handler>>,
    planner: Option<Arc<dyn EvacuationPlanner>>,
    state_dir: Option<PathBuf>,
    metrics: Option<Metrics>,
    reloads: Option<watch::Receiver<Arc<BrokerConfig>>>,
    placement_service: bool,
}

impl std::fmt::Debug for AgentBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentBuilder")
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl AgentBuilder {
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

    /// New configurations (SIGHUP reloads) arrive here.
    pub fn reloads(mut self, r: watch::Receiver<Arc<BrokerConfig>>) -> Self {
        self.reloads = Some(r);
        self
    }

    /// Also serve `placement.request` on the bus (default on).
    pub fn placement_service(mut self, on: bool) -> Self {
        self.placement_service = on;
        self
    }

    /// Locks the state directory, opens the journal, builds the handlers.
    pub fn build(self) -> Result<Agent, AgentError> {
        let signer = Arc::new(self.signer.ok_or(AgentError::NoSigner)?);
        let keyring = Arc::new(self.keyring.unwrap_or_default());
        let state_dir = self
            .state_dir
            .unwrap_or_else(|| self.cfg.agent.state_dir.clone());
        let lock = gearshift_service::lock::lock_dir(&state_dir)?;
        let journal = Journal::open(&state_dir)?;
        let fleet = Arc::new(FleetSnapshot::default());
        let mut handlers = self.handlers;
        let ctx = gearshift_handlers::HandlerContext {
            bus: Some(self.bus.clone()),
            signer: Some(signer.clone()),
            keyring: Some(keyring.clone()),
            agent: self.cfg.agent.name.clone(),
            bus_url: self.cfg.bus.url.clone(),
            fleet: Arc::new(FleetHandle(fleet.clone())),
        };
        for (name, hc) in &self.cfg.handlers {
            if handlers.contains_key(name) {
                continue;
            }
            let h = gearshift_handlers::build(name, hc, &ctx).map_err(|e| AgentError::Handler {
                name: name.clone(),
                reason: e.to_string(),
            })?;
            handlers.insert(name.clone(), h);
        }
        handlers
            .entry("log".into())
            .or_insert_with(|| Arc::new(gearshift_handlers::log::LogHandler));
        let engine = gearshift_placement::Engine::new(&self.cfg.placement)
            .map_err(|e| AgentError::Placement(e.to_string()))?;
        let planner = self
            .planner
            .unwrap_or_else(|| Arc::new(PlacementPlanner::new(engine.clone())));
        let cfg = Arc::new(self.cfg);
        check_handlers(&cfg, &handlers)?;
        let (status_tx, _) = watch::channel(Arc::new(Status::default()));
        let (observed_tx, _) = broadcast::channel(1024);
        Ok(Agent {
            cfg,
            bus: self.bus,
            signer,
            keyring,
            handlers: Arc::new(handlers),
            planner,
            engine,
            journal,
            _lock: lock,
            status_tx,
            observed_tx,
            metrics: self.metrics.unwrap_or_default(),
            reloads: self.reloads,
            fleet,
            placement_service: self.placement_service,
        })
    }
}

fn check_handlers(
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

/// The broker agent.
pub struct Agent {
    cfg: Arc<BrokerConfig>,
    bus: SharedBus,
    signer: Arc<KeyPair>,
    keyring: Arc<Keyring>,
    handlers: Arc<BTreeMap<String, Arc<dyn Handler>>>,
    planner: Arc<dyn EvacuationPlanner>,
    engine: gearshift_placement::Engine,
    journal: Journal,
    _lock: DirLock,
    status_tx: watch::Sender<Arc<Status>>,
    observed_tx: broadcast::Sender<Observed>,
    metrics: Metrics,
    reloads: Option<watch::Receiver<Arc<BrokerConfig>>>,
    fleet: Arc<FleetSnapshot>,
    placement_service: bool,
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

struct Subs {
    reports: Option<Subscription>,
    events: Option<Subscription>,
    admin: Option<Subscription>,
    pings: Option<Subscription>,
}

async fn next(s: &mut Option<Subscription>) -> Option<Delivery> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

impl Agent {
    /// A builder from a validated configuration and a bus.
    pub fn builder(cfg: BrokerConfig, bus: SharedBus) -> AgentBuilder {
        AgentBuilder {
            cfg,
            bus,
            signer: None,
            keyring: None,
            handlers: BTreeMap::new(),
            planner: None,
            state_dir: None,
            metrics: None,
            reloads: None,
            placement_service: true,
        }
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

    /// Runs until `token` is cancelled, then lets in-flight handler calls
    /// finish within `agent.shutdown_grace` and returns. Fails only when the
    /// journal fails.
    pub async fn run(mut self, token: CancellationToken) -> Result2<()> {
        let now = Utc::now();
        let mut core = Core::new(self.cfg.clone(), self.planner.clone(), now);
        core.restore(self.journal.load()?);
        let (results_tx, mut results_rx) =
            mpsc::unbounded_channel::<(CallTag, &'static str, CallResult)>();
        let mut st = RunState {
            refused: BTreeMap::new(),
            refusal_log: LogLimiter::default(),
            in_flight_calls: 0,
            replay: ReplayGuard::new(chrono::Duration::minutes(10), 100_000),
            results_tx,
            last_status: None,
            status_dirty: false,
            status_cost: Duration::ZERO,
            fleet_refreshed: None,
            fleet_cost: Duration::ZERO,
            pressure: None,
        };
        let mut subs = Subs {
            reports: None,
            events: None,
            admin: None,
            pings: None,
        };
        self.metrics.watch_bus(&self.bus, token.clone());
        self.ensure_subs(&mut subs).await;
        tracing::info!(
            agent = %self.cfg.agent.name,
            ops = core.ops().filter(|o| !o.is_done()).count(),
            "broker agent running"
        );
        let acts = core.resume(now);
        self.apply(&mut core, &mut st, acts, now).await?;
        if self.placement_service && self.cfg.agent.placement_service {
            self.spawn_placement(token.clone());
        }
        let tick_every = tick_interval(&self.cfg);
        let mut tick = tokio::time::interval(tick_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut next_eval = tokio::time::Instant::now()
            + self.cfg.policy.interval.min(self.cfg.policy.startup_grace);
        let mut reloads = self.reloads.take();
        loop {
            tokio::select! {
                biased;
                _ = token.cancelled() => break,
                Some((tag, call, res)) = results_rx.recv() => {
                    st.in_flight_calls = st.in_flight_calls.saturating_sub(1);
                    self.metrics.handler_call(call, result_label(&res));
                    let now = Utc::now();
                    let acts = core.on_handler_result(tag, res, now);
                    self.apply(&mut core, &mut st, acts, now).await?;
                }
                d = next(&mut subs.events) => match d {
                    Some(d) => {
                        // Group commit: the events already received share one
                        // journal commit (each is acked after it).
                        let mut batch = vec![d];
                        if let Some(s) = subs.events.as_mut() {
                            while batch.len() < EVENT_BATCH {
                                match futures::FutureExt::now_or_never(s.next()) {
                                    Some(Some(d)) => batch.push(d),
                                    _ => break,
                                }
                            }
                        }
                        self.on_event_deliveries(&mut core, &mut st, batch).await?
                    }
                    None => subs.events = None,
                },
                d = next(&mut subs.admin) => match d {
                    Some(d) => self.on_admin_delivery(&mut core, &mut st, d).await?,
                    None => subs.admin = None,
                },
                _ = tick.tick() => {
                    let now = Utc::now();
                    let acts = core.tick(now);
                    self.apply(&mut core, &mut st, acts, now).await?;
                    let due_early = core.evaluation_due().is_some_and(|t| now >= t);
                    if due_early || tokio::time::Instant::now() >= next_eval {
                        next_eval = tokio::time::Instant::now() + self.cfg.policy.interval;
                        self.evaluate(&mut core, &mut st, now).await?;
                    }
                    self.refresh_fleet_paced(&core, &mut st, now, tick_every);
                    self.publish_status(&core, &mut st, now, true);
                    if subs.reports.is_none() || subs.events.is_none() || subs.admin.is_none() || subs.pings.is_none() {
                        self.ensure_subs(&mut subs).await;
                    }
                }
                d = next(&mut subs.reports) => match d {
                    Some(d) => {
                        self.on_report_delivery(&mut core, &mut st, &d).await?;
                        // A report is soft state: handled or refused, it is
                        // done. The ack goes out on its own task: waiting for
                        // the transport to write it would hold up the loop.
                        tokio::spawn(ack(d));
                        // A report that showed pressure with no delay to wait:
                        // evaluate now rather than at the next tick.
                        let now = Utc::now();
                        if core.evaluation_due().is_some_and(|t| now >= t) {
                            next_eval = tokio::time::Instant::now() + self.cfg.policy.interval;
                            self.evaluate(&mut core, &mut st, now).await?;
                        }
                    }
                    None => subs.reports = None,
                },
                d = next(&mut subs.pings) => match d {
                    Some(d) => self.on_ping(&mut st, d).await,
                    None => subs.pings = None,
                },
                Some(()) = async {
                    match reloads.as_mut() {
                        Some(r) => r.changed().await.ok(),
                        None => std::future::pending().await,
                    }
                } => {
                    if let Some(r) = reloads.as_ref() {
                        let new = r.borrow().clone();
                        tracing::info!("configuration reloaded");
                        self.cfg = new.clone();
                        core.set_config(new);
                    }
                }
            }
        }
        // Drain: handler calls in flight may still finish and be journaled.
        tracing::info!(
            calls = st.in_flight_calls,
            "stopping: draining in-flight handler calls"
        );
        let deadline = tokio::time::Instant::now() + self.cfg.agent.shutdown_grace;
        while st.in_flight_calls > 0 {
            match tokio::time::timeout_at(deadline, results_rx.recv()).await {
                Ok(Some((tag, call, res))) => {
                    st.in_flight_calls -= 1;
                    self.metrics.handler_call(call, result_label(&res));
                    let now = Utc::now();
                    let acts = core.on_handler_result(tag, res, now);
                    // Journal the outcome; new effects wait for the next start.
                    let ch = core.take_changes();
                    self.journal.commit(&core, &ch)?;
                    let decisions: Vec<Action> = acts
                        .into_iter()
                        .filter(|a| matches!(a, Action::Decide(_)))
                        .collect();
                    for a in decisions {
                        self.publish(a, now).await;
                    }
                }
                _ => {
                    tracing::warn!(
                        calls = st.in_flight_calls,
                        "grace period over: leaving calls to the next start"
                    );
                    break;
                }
            }
        }
        Ok(())
    }

    async fn ensure_subs(&self, subs: &mut Subs) {
        let bus = &self.bus;
        if subs.events.is_none() {
            let spec = QueueSpec::durable(
                &self.cfg.agent.events_queue,
                vec![routing::ALL_EVENTS.into()],
            );
            match bus.consume(&spec, ConsumeOptions { prefetch: 256 }).await {
                Ok(s) => subs.events = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot consume node events yet; retrying"),
            }
        }
        if subs.admin.is_none() {
            let spec = QueueSpec::durable(
                &self.cfg.agent.admin_queue,
                vec![self.cfg.agent.admin_key.clone()],
            );
            match bus.consume(&spec, ConsumeOptions { prefetch: 16 }).await {
                Ok(s) => subs.admin = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume operator requests yet; retrying")
                }
            }
        }
        if subs.reports.is_none() {
            let backlog = self.cfg.agent.report_backlog;
            let bounded = if backlog == 0 {
                None
            } else {
                let spec = QueueSpec::transient(
                    format!(
                        "gearshift.broker.reports.{}",
                        &uuid::Uuid::new_v4().simple().to_string()[..12]
                    ),
                    vec![routing::ALL_REPORTS.into()],
                )
                .with_max_length(backlog);
                match bus
                    .consume(
                        &spec,
                        ConsumeOptions {
                            prefetch: REPORT_PREFETCH,
                        },
                    )
                    .await
                {
                    Ok(s) => Some(Ok(s)),
                    // A bus that cannot bind a queue of its own (ActiveMQ over
                    // STOMP) keeps the plain subscription.
                    Err(BusError::Invalid(why)) => {
                        tracing::warn!(
                            reason = %why,
                            "reports are read without a backlog bound on this bus"
                        );
                        None
                    }
                    Err(e) => Some(Err(e)),
                }
            };
            let r = match bounded {
                Some(r) => r,
                None => bus.subscribe(routing::ALL_REPORTS).await,
            };
            match r {
                Ok(s) => subs.reports = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to reports yet; retrying"),
            }
        }
        if subs.pings.is_none() {
            match bus.subscribe(routing::PING).await {
                Ok(s) => subs.pings = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to pings yet; retrying"),
            }
        }
    }

    fn spawn_placement(&self, token: CancellationToken) {
        let fleet = self.fleet.clone();
        let opts = gearshift_placement::service::ServeOptions {
            queue: gearshift_bus::QueueSpec::durable(
                self.cfg.agent.placement_queue.clone(),
                vec![self.cfg.agent.placement_key.clone()],
            ),
            fleet: Some(Arc::new(move || {
                fleet.nodes.read().map(|n| n.clone()).unwrap_or_default()
            })),
            ..Default::default()
        };
        let bus = self.bus.clone();
        let engine = self.engine.clone();
        let signer = self.signer.clone();
        let keyring = self.keyring.clone();
        let name = self.cfg.agent.name.clone();
        tokio::spawn(async move {
            loop {
                let r = gearshift_placement::service::serve_with(
                    bus.clone(),
                    engine.clone(),
                    signer.clone(),
                    keyring.clone(),
                    name.clone(),
                    token.clone(),
                    opts.clone(),
                )
                .await;
                if token.is_cancelled() {
                    break;
                }
                if let Err(e) = r {
                    tracing::warn!(error = %e, "placement service stopped; restarting");
                }
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }

    fn refuse(&self, st: &mut RunState, reason: &str, detail: &str) {
        *st.refused.entry(reason.to_string()).or_default() += 1;
        self.metrics.refused(reason);
        // Every refusal is counted; the log gets a bounded sample per reason.
        match st.refusal_log.check(reason, std::time::Instant::now()) {
            Verdict::Log { suppressed: 0 } => tracing::warn!(reason, detail, "message refused"),
            Verdict::Log { suppressed } => tracing::warn!(
                reason,
                detail,
                suppressed,
                "message refused ({suppressed} more refused for this reason were not logged)"
            ),
            Verdict::Suppress => tracing::debug!(reason, detail, "message refused"),
        }
    }

    fn time_policy(&self) -> TimePolicy {
        TimePolicy {
            window: dur(self.cfg.keys.time_window),
        }
    }

    async fn on_report_delivery(
        &self,
        core: &mut Core,
        st: &mut RunState,
        d: &Delivery,
    ) -> Result2<()> {
        let now = Utc::now();
        let decoded = match Envelope::decode(&d.payload) {
            Ok(x) => x,
            Err(e) => {
                self.refuse(st, e.reason_label(), &e.to_string());
                return Ok(());
            }
        };
        if let Err(e) = authenticate(&self.keyring, &self.time_policy(), &decoded, now) {
            self.refuse(
                st,
                e.reason_label(),
                &format!("report from {}: {e}", decoded.envelope.from),
            );
            return Ok(());
        }
        let env = decoded.envelope;
        let Message::Report(r) = env.msg else {
            self.refuse(
                st,
                "unexpected_kind",
                &format!("{} on a report key", env.msg.kind()),
            );
            return Ok(());
        };
        if r.node != env.from {
            self.refuse(
                st,
                "identity",
                &format!("{} sent a report for {}", env.from, r.node),
            );
            return Ok(());
        }
        match core.on_report(r, now) {
            Ok(acts) => {
                self.metrics.report();
                self.apply(core, st, acts, now).await
            }
            Err(e) => {
                self.refuse(st, e.label(), &format!("{e:?}"));
                Ok(())
            }
        }
    }

    /// Node events, in order: their changes are journaled in one commit,
    /// then their actions carried out, then each is acknowledged.
    async fn on_event_deliveries(
        &self,
        core: &mut Core,
        st: &mut RunState,
        batch: Vec<Delivery>,
    ) -> Result2<()> {
        let now = Utc::now();
        let mut acts = vec![];
        let mut done = Vec::with_capacity(batch.len());
        for d in batch {
            let decoded = match Envelope::decode(&d.payload) {
                Ok(x) => x,
                Err(e) => {
                    self.refuse(st, e.reason_label(), &e.to_string());
                    done.push(d);
                    continue;
                }
            };
            // Events wait in a durable queue: their age is no reason to refuse
            // them, and their effects are idempotent on the command id.
            if let Err(e) = self.keyring.verify_signature(&decoded) {
                self.refuse(
                    st,
                    e.reason_label(),
                    &format!("event from {}: {e}", decoded.envelope.from),
                );
                done.push(d);
                continue;
            }
            let env = decoded.envelope;
            if env.kind().is_node_event() {
                acts.extend(core.on_event(&env.from, env.corr.as_deref(), &env.msg, now));
            }
            done.push(d);
        }
        // apply journals before it acts; ack only after that.
        self.apply(core, st, acts, now).await?;
        for d in done {
            ack(d).await;
        }
        Ok(())
    }

    async fn on_admin_delivery(
        &self,
        core: &mut Core,
        st: &mut RunState,
        d: Delivery,
    ) -> Result2<()> {
        let now = Utc::now();
        let decoded = match Envelope::decode(&d.payload) {
            Ok(x) => x,
            Err(e) => {
                self.refuse(st, e.reason_label(), &e.to_string());
                ack(d).await;
                return Ok(());
            }
        };
        let auth =
            authenticate(&self.keyring, &self.time_policy(), &decoded, now).and_then(|role| {
                st.replay
                    .check_and_record(decoded.envelope.id, decoded.envelope.ts, now)
                    .map(|_| role)
            });
        let env = decoded.envelope;
        let reply_to = d.reply_to.clone();
        let corr = d.correlation_id.clone();
        let (reply, acts) = match auth {
            Err(e) => {
                self.refuse(
                    st,
                    e.reason_label(),
                    &format!("admin request from {}: {e}", env.from),
                );
                (
                    AdminReply {
                        ok: false,
                        message: format!("refused: {e}"),
                        data: serde_json::Value::Null,
                    },
                    vec![],
                )
            }
            Ok(role) if role != Role::Operator && role != Role::Broker => (
                AdminReply {
                    ok: false,
                    message: format!("refused: role {role} may not send operator requests"),
                    data: serde_json::Value::Null,
                },
                vec![],
            ),
            Ok(_) => match env.msg {
                Message::AdminRequest(req) => self.admin(core, st, &env.from, req, now),
                _ => (
                    AdminReply {
                        ok: false,
                        message: "not an admin.request".into(),
                        data: serde_json::Value::Null,
                    },
                    vec![],
                ),
            },
        };
        self.apply(core, st, acts, now).await?;
        if let Some(q) = reply_to {
            let mut e =
                Envelope::new(&self.cfg.agent.name, reply).with_ttl(Duration::from_secs(60));
            if let Some(c) = env.corr.clone() {
                e = e.with_corr(c);
            }
            let mut m = OutMessage::new(q.clone(), self.signer.seal(e)).transient();
            m.correlation_id = corr;
            if let Err(e) = self.bus.send_to_queue(&q, m).await {
                tracing::warn!(error = %e, "cannot send the admin reply");
            }
        }
        ack(d).await;
        Ok(())
    }

    fn admin(
        &self,
        core: &mut Core,
        st: &RunState,
        from: &str,
        req: AdminRequest,
        now: DateTime<Utc>,
    ) -> (AdminReply, Vec<Action>) {
        let ok = |message: String, data: serde_json::Value| AdminReply {
            ok: true,
            message,
            data,
        };
        let no = |message: String| AdminReply {
            ok: false,
            message,
            data: serde_json::Value::Null,
        };
        match req {
            AdminRequest::Status => {
                let s = Status::of(core, &self.cfg.agent.name, now, &st.refused);
                (
                    ok(
                        "status".into(),
                        serde_json::to_value(&s).unwrap_or_default(),
                    ),
                    vec![],
                )
            }
            AdminRequest::Evacuate { node } => match core.operator_evacuate(&node, from, now) {
                Ok((op, acts)) => (
                    ok(
                        format!("evacuating {node} as {op}"),
                        serde_json::json!({ "op": op }),
                    ),
                    acts,
                ),
                Err(e) => (no(e), vec![]),
            },
            AdminRequest::Abort { op } => match core.operator_abort(&op, from, now) {
                Ok(acts) => (
                    ok(format!("aborting {op}"), serde_json::json!({ "op": op })),
                    acts,
                ),
                Err(e) => (no(e), vec![]),
            },
            AdminRequest::DoNotDisrupt { node, on } => {
                core.set_do_not_disrupt(&node, on);
                (
                    ok(
                        format!(
                            "{node} is {}marked do-not-disrupt",
                            if on { "" } else { "no longer " }
                        ),
                        serde_json::Value::Null,
                    ),
                    vec![],
                )
            }
        }
    }

    async fn on_ping(&self, st: &mut RunState, d: Delivery) {
        let now = Utc::now();
        let Ok(decoded) = Envelope::decode(&d.payload) else {
            self.refuse(st, "malformed", "ping");
            return;
        };
        if let Err(e) = authenticate(&self.keyring, &self.time_policy(), &decoded, now) {
            self.refuse(st, e.reason_label(), "ping");
            return;
        }
        let Some(q) = d.reply_to.clone() else { return };
        let pong = Pong {
            agent: self.cfg.agent.name.clone(),
            role: "broker".into(),
            version: VERSION.into(),
            started_at: now,
            received_at: now,
            ping: decoded.envelope.id,
            active: None,
        };
        let e = Envelope::new(&self.cfg.agent.name, pong).with_ttl(Duration::from_secs(60));
        let mut m = OutMessage::new(q.clone(), self.signer.seal(e)).transient();
        m.correlation_id = d.correlation_id.clone();
        let _ = self.bus.send_to_queue(&q, m).await;
    }

    /// One evaluation of every group; the decision latency runs from the
    /// report that showed pressure to the confirmed publication of the first
    /// decision (see `apply`).
    async fn evaluate(
        &self,
        core: &mut Core,
        st: &mut RunState,
        now: DateTime<Utc>,
    ) -> Result2<()> {
        st.pressure = core.take_pressure_seen();
        let acts = core.evaluate(now);
        self.metrics.evaluation();
        let r = self.apply(core, st, acts, now).await;
        st.pressure = None;
        r
    }

    /// Refreshes the fleet snapshot every tick, or less often when a refresh
    /// costs more than a twentieth of the time between them (large fleets).
    fn refresh_fleet_paced(
        &self,
        core: &Core,
        st: &mut RunState,
        now: DateTime<Utc>,
        tick: Duration,
    ) {
        let gap = tick.max(st.fleet_cost * 20);
        if st.fleet_refreshed.is_some_and(|t| t.elapsed() < gap) {
            return;
        }
        let t = tokio::time::Instant::now();
        self.refresh_fleet(core, now);
        st.fleet_cost = t.elapsed();
        st.fleet_refreshed = Some(t);
    }

    /// Journals the core's changes, then carries out the actions.
    async fn apply(
        &self,
        core: &mut Core,
        st: &mut RunState,
        acts: Vec<Action>,
        now: DateTime<Utc>,
    ) -> Result2<()> {
        let ch = core.take_changes();
        if !ch.is_empty() {
            self.journal.commit(core, &ch)?;
        }
        let changed = !acts.is_empty() || !ch.is_empty();
        let mut explanations = vec![];
        for a in acts {
            match a {
                Action::Call { tag, handler, call } => self.spawn_call(st, tag, handler, call),
                Action::Explain(x) => explanations.push(x),
                d @ Action::Decide(_) => {
                    self.publish(d, now).await;
                    if let Some(p) = st.pressure.take() {
                        let secs =
                            (Utc::now() - p).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6;
                        self.metrics.latency(secs.max(0.0));
                    }
                }
                other => self.publish(other, now).await,
            }
        }
        // Explanations (one per group) are best effort: after the decisions
        // and commands, all in flight at once.
        futures::future::join_all(
            explanations
                .into_iter()
                .map(|x| self.publish(Action::Explain(x), now)),
        )
        .await;
        if changed {
            st.status_dirty = true;
            self.publish_status(core, st, now, false);
        }
        Ok(())
    }

    /// `saga.handler_timeout`, or longer for a handler whose own waits (a
    /// server booting with its volume, a stack update) may legitimately last
    /// longer: timing such a call out early would make the saga retry a request
    /// the cloud is still carrying out.
    fn call_timeout(&self, handler: &str) -> std::time::Duration {
        let base = self.cfg.saga.handler_timeout;
        match self
            .cfg
            .handlers
            .get(handler)
            .and_then(|h| h.longest_call())
        {
            Some(longest) => base.max(longest + std::time::Duration::from_secs(30)),
            None => base,
        }
    }

    fn spawn_call(&self, st: &mut RunState, tag: CallTag, handler: String, call: HandlerCall) {
        let Some(h) = self.handlers.get(&handler).cloned() else {
            tracing::error!(handler, "no such handler");
            let res = failed_result(
                &call,
                HandlerError::Permanent(format!("no handler named {handler:?}")),
            );
            let _ = st.results_tx.send((tag, call.name(), res));
            st.in_flight_calls += 1;
            return;
        };
        let timeout = self.call_timeout(&handler);
        let tx = st.results_tx.clone();
        st.in_flight_calls += 1;
        tracing::info!(handler, call = call.name(), tag = ?tag, "handler call");
        tokio::spawn(async move {
            let name = call.name();
            let fut = run_call(h, call.clone());
            let res = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => failed_result(
                    &call,
                    HandlerError::Transient(format!(
                        "no answer within {}",
                        humantime::format_duration(timeout)
                    )),
                ),
            };
            let _ = tx.send((tag, name, res));
        });
    }

    async fn publish(&self, a: Action, now: DateTime<Utc>) {
        let name = &self.cfg.agent.name;
        match a {
            Action::Send {
                node,
                corr,
                id,
                msg,
            } => {
                let kind = msg.kind();
                let mut e = Envelope::new_at(name, msg, now)
                    .with_corr(corr.clone())
                    .with_ttl(self.cfg.saga.command_ttl);
                e.id = id;
                let m = OutMessage::new(routing::command(&node), self.signer.seal(e));
                match self.bus.publish(m).await {
                    Ok(()) => tracing::info!(node, op = corr, %kind, cmd = %id, "command sent"),
                    Err(e) => {
                        tracing::warn!(node, op = corr, %kind, error = %e, "command not sent; the step's timeout sends it again")
                    }
                }
            }
            Action::Decide(d) => {
                tracing::info!(
                    decision = d.decision.as_str(),
                    district = %d.district,
                    profile = %d.profile,
                    op = ?d.op,
                    node = ?d.node,
                    reason = %d.reason,
                    "decision"
                );
                let key = routing::decision(d.decision, &d.district, &d.profile);
                let mut e = Envelope::new_at(name, d.clone(), now);
                if let Some(op) = &d.op {
                    e = e.with_corr(op.clone());
                }
                let m = OutMessage::new(key, self.signer.seal(e));
                if let Err(e) = self.bus.publish(m).await {
                    tracing::warn!(error = %e, "decision not published");
                }
                self.metrics.decision(d.decision.as_str());
                let _ = self.observed_tx.send(Observed::Decision(d));
            }
            Action::Explain(x) => {
                tracing::debug!(district = %x.district, profile = %x.profile, outcome = ?x.outcome, summary = %x.summary, "explanation");
                let key = routing::explain(&x.district, &x.profile);
                let e = Envelope::new_at(name, x.clone(), now);
                let m = OutMessage::new(key, self.signer.seal(e)).transient();
                if let Err(e) = self.bus.publish(m).await {
                    tracing::debug!(error = %e, "explanation not published");
                }
                let _ = self.observed_tx.send(Observed::Explanation(x));
            }
            Action::Call { .. } => {}
        }
    }

    fn refresh_fleet(&self, core: &Core, now: DateTime<Utc>) {
        let intervals = core.config().policy.stale_after_intervals;
        let mut active: BTreeMap<GroupKey, Vec<(u32, String)>> = BTreeMap::new();
        for e in core.fleet().nodes() {
            if e.report.active && e.is_fresh(now, intervals) {
                active
                    .entry(e.group())
                    .or_default()
                    .push((e.active_gears(), e.report.node.clone()));
            }
        }
        let active = active
            .into_iter()
            .map(|(g, mut v)| {
                v.sort();
                (g, v.into_iter().map(|x| x.1).collect())
            })
            .collect();
        if let Ok(mut a) = self.fleet.active.write() {
            *a = active;
        }
        let mut nodes = vec![];
        for g in core.fleet().groups() {
            nodes.extend(core.candidates(&g, "", now));
        }
        if let Ok(mut n) = self.fleet.nodes.write() {
            *n = nodes;
        }
    }

    fn publish_status(&self, core: &Core, st: &mut RunState, now: DateTime<Utc>, periodic: bool) {
        if let Some(t) = st.last_status {
            let since = (now - t).to_std().unwrap_or_default();
            // Periodic: every 500 ms, and any change not yet published.
            if periodic && !st.status_dirty && since < Duration::from_millis(500) {
                return;
            }
            // Changes: at once, unless the status of a large fleet was built
            // very recently (the next tick publishes it).
            if since < st.status_cost * 20 {
                return;
            }
        }
        st.last_status = Some(now);
        st.status_dirty = false;
        let t = std::time::Instant::now();
        self.metrics.refresh(core);
        let s = Status::of(core, &self.cfg.agent.name, now, &st.refused);
        let _ = self.status_tx.send(Arc::new(s));
        st.status_cost = t.elapsed();
    }
}

struct RunState {
    refused: BTreeMap<String, u64>,
    refusal_log: LogLimiter,
    in_flight_calls: usize,
    replay: ReplayGuard,
    results_tx: mpsc::UnboundedSender<(CallTag, &'static str, CallResult)>,
    last_status: Option<DateTime<Utc>>,
    /// A change not yet in the published status (it was published recently).
    status_dirty: bool,
    /// What building the last status cost: changes publish it at most
    /// every 20 such costs, so that a large fleet's status does not eat the loop.
    status_cost: Duration,
    /// When the fleet snapshot was last refreshed, and what it cost.
    fleet_refreshed: Option<tokio::time::Instant>,
    fleet_cost: Duration,
    /// The report that showed pressure, while the evaluation it caused is applied.
    pressure: Option<DateTime<Utc>>,
}

async fn ack(d: Delivery) {
    if let Err(e) = d.ack().await {
        tracing::warn!(error = %e, "ack failed; the message will come again");
    }
}

fn tick_interval(cfg: &BrokerConfig) -> Duration {
    let s = &cfg.saga;
    let p = &cfg.policy;
    let shortest = [
        p.interval,
        s.command_timeout,
        s.presence_poll,
        p.react_delay.max(Duration::from_millis(20)),
    ]
    .into_iter()
    .min()
    .unwrap_or(Duration::from_secs(1));
    (shortest / 4).clamp(Duration::from_millis(20), Duration::from_secs(1))
}

async fn run_call(h: Arc<dyn Handler>, call: HandlerCall) -> CallResult {
    match call {
        HandlerCall::Create(r) => CallResult::Create(h.create_node(&r).await),
        HandlerCall::Remove(r) => CallResult::Remove(h.remove_node(&r).await),
        HandlerCall::Lookup { op, group } => CallResult::Lookup(h.lookup(&op, &group).await),
        HandlerCall::Presence { node, group } => {
            CallResult::Presence(h.presence(&node, &group).await)
        }
        HandlerCall::Capacity { group, shape } => {
            CallResult::Capacity(h.capacity(&group, &shape).await)
        }
    }
}

fn failed_result(call: &HandlerCall, e: HandlerError) -> CallResult {
    match call {
        HandlerCall::Create(_) => CallResult::Create(Err(e)),
        HandlerCall::Remove(_) => CallResult::Remove(Err(e)),
        HandlerCall::Lookup { .. } => CallResult::Lookup(Err(e)),
        HandlerCall::Presence { .. } => CallResult::Presence(Err(e)),
        HandlerCall::Capacity { .. } => CallResult::Capacity(Err(e)),
    }
}

fn result_label(r: &CallResult) -> &'static str {
    let e = match r {
        CallResult::Create(r) => r.as_ref().err(),
        CallResult::Remove(r) => r.as_ref().err(),
        CallResult::Lookup(r) => r.as_ref().err(),
        CallResult::Presence(r) => r.as_ref().err(),
        CallResult::Capacity(r) => r.as_ref().err(),
    };
    e.map_or("ok", HandlerError::label)
}
