//! `gearshift-sim demo`: the real broker agent and real node agents on a
//! simulated fleet, a scripted workload that rises and falls, and a summary
//! checked against what must have happened.
//!
//! What runs, all in this process:
//! - the **broker agent** ([`gearshift_broker::Agent`]) with the embedded
//!   [`config::BROKER_TOML`], its handler replaced by the simulated cloud;
//! - **N node agents** ([`gearshift_node::Agent`], `sim` gear runtime) with
//!   the embedded [`config::NODE_TOML`], each with its own state directory,
//!   all sharing one simulated world of gears;
//! - the **simulated cloud** ([`crate::fleet::SimCloud`]): a create request
//!   boots one more node agent after a short delay (its first report carries
//!   the operation id), a remove request stops it and deletes the host;
//! - a **placement service** (the broker agent's placement engine on a
//!   queue of its own) that the workload asks where each new gear goes;
//! - the **workload** ([`workload`]): rise, wait for the new node, fall,
//!   wait for the scale-down saga.
//!
//! All of it talks over one bus: in-process by default, or RabbitMQ with
//! `--bus amqp://…` / `--bus stomp://…` (queue and node names carry a
//! per-run tag so that demos and tests can share one broker; the run's
//! durable queues are deleted at the end).
//!
//! The demo fails (exit status 1) unless the fleet scaled up and the new node
//! joined, a scale-down saga removed a node, and the independent inventory
//! ([`ledger`]) finds every gear created and not deleted exactly once.

//!
//! ## Layout
//! - [`config`]: the embedded configurations, completed per run.
//! - `setup`: the run's plan, bus connections, fleet, cloud, broker agent
//!   and placement service.
//! - [`workload`]: the script; [`ledger`]: the independent inventory.
//! - [`display`]: the live display; [`summary`]: the checked result.

pub mod config;
pub mod display;
pub mod ledger;
mod setup;
pub mod summary;
pub mod workload;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gearshift_broker::Observed;
use gearshift_broker::status::Status;
use gearshift_node::runtime::sim::SimWorld;
use gearshift_service::logging::LogFormat;
use rand::SeedableRng;
use rand::rngs::StdRng;
use thiserror::Error;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::fleet::{CloudEvent, FleetError, SimCloud, SimFleet};
use crate::harness::{bus, scenario};
use display::{Display, Mode};
use ledger::Ledger;
use setup::{Broker, Buses, PROFILE, Plan, start_broker, start_fleet, start_placement};
pub use summary::Summary;
use summary::Tally;
use workload::{FleetView, Phase, Workload};

/// `gearshift-sim demo` options.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Initial node agents (the fleet never shrinks below this).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..=12))]
    pub nodes: u32,
    /// Seed of the workload's random choices (default: random, printed in the summary).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Time scale: 2 runs twice as fast, 0.5 half as fast (0.25 to 4).
    #[arg(long, default_value_t = 1.0, value_parser = parse_speed)]
    pub speed: f64,
    /// Bus URL: memory:// (default, in-process), amqp://user:pass@host:5672/%2f
    /// or stomp://user:pass@host:61613 to run the same demo over RabbitMQ.
    #[arg(long, value_name = "URL")]
    pub bus: Option<String>,
    /// Print one JSON summary object on stdout and nothing else (logs go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Serve the broker agent's dashboard and /metrics here while the demo runs
    /// (for example 127.0.0.1:9464).
    #[arg(long, value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// Keep the run's keys in this directory (reused when present), so that
    /// `gearshift-broker watch --bus URL --key DIR/operator.key` can verify
    /// what the demo publishes (default: a temporary directory).
    #[arg(long, value_name = "DIR")]
    pub keys: Option<std::path::PathBuf>,
    /// Record the node reports the broker agent receives to this trace file
    /// (`[trace]`), and write the demo's broker configuration beside it as
    /// `FILE.broker.toml`: `gearshift-sim replay --config FILE.broker.toml
    /// --trace FILE` replays the run.
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<std::path::PathBuf>,
    /// Give up after this long.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Log format on stderr: human or json.
    #[arg(long, default_value = "human")]
    pub log_format: LogFormat,
    /// Log filter on stderr (RUST_LOG wins), for example info or
    /// gearshift_broker=debug. Default: warnings, except lapin's own
    /// (gearshift's AMQP transport reports what matters) and, on a shared
    /// broker, the broker agent's per-message refusals of other runs' traffic
    /// (the summary counts them).
    #[arg(long)]
    pub log_level: Option<String>,
}

impl Default for DemoArgs {
    fn default() -> Self {
        DemoArgs {
            nodes: 3,
            seed: None,
            speed: 1.0,
            bus: None,
            json: false,
            http: None,
            keys: None,
            record_trace: None,
            timeout: Duration::from_secs(120),
            log_format: LogFormat::Human,
            log_level: None,
        }
    }
}

fn parse_speed(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v.is_finite() && (0.25..=4.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} is outside 0.25..=4"))
    }
}

/// Why the demo could not run at all (as opposed to running and failing
/// its expectations, which the [`Summary`] reports).
#[derive(Debug, Error)]
pub enum DemoError {
    /// The embedded configuration, completed for this run, was refused.
    #[error("configuration: {0}")]
    Config(String),
    /// The bus could not be reached.
    #[error("cannot connect to {url}: {reason}")]
    Connect {
        /// The URL, without its password.
        url: String,
        /// Why.
        reason: String,
    },
    /// The simulated fleet could not be set up.
    #[error(transparent)]
    Fleet(#[from] FleetError),
    /// The broker agent could not be built.
    #[error("broker agent: {0}")]
    Broker(String),
    /// Local files or listeners.
    #[error("{0}")]
    Io(String),
}

impl DemoError {
    /// A stable label for the JSON error object (`config`, `connect`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            DemoError::Config(_) => "config",
            DemoError::Connect { .. } => "connect",
            DemoError::Fleet(_) => "fleet",
            DemoError::Broker(_) => "broker",
            DemoError::Io(_) => "io",
        }
    }
}

/// Runs the demo as the command line does: logging, runtime, Ctrl-C,
/// output, exit status (0 ok, 1 expectations not met, 2 could not run,
/// 130 interrupted).
pub fn main(args: DemoArgs) -> ExitCode {
    let shared = args
        .bus
        .as_deref()
        .is_some_and(|u| !u.starts_with("memory:"));
    let level = args.log_level.clone().unwrap_or_else(|| {
        if shared {
            "warn,lapin=off,gearshift_broker::agent=error".into()
        } else {
            "warn,lapin=off".into()
        }
    });
    gearshift_service::logging::init(args.log_format, &level);
    let rt = match scenario::runtime("demo", 2) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let mode = Mode::detect(args.json);
    rt.block_on(async move {
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                s.cancel();
            }
        });
        match run(&args, mode, stop.clone()).await {
            Ok(summary) => {
                if !scenario::emit("demo", args.json, &summary, || summary.render()) {
                    ExitCode::from(2)
                } else if stop.is_cancelled() {
                    ExitCode::from(130)
                } else if summary.ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => scenario::fail("demo", args.json, e.kind(), &e.to_string(), 2),
        }
    })
}

/// Runs the demo until its script ends, it times out, or `stop` is
/// cancelled, and returns the checked summary. Prints through `mode`.
pub async fn run(
    args: &DemoArgs,
    mode: Mode,
    stop: CancellationToken,
) -> Result<Summary, DemoError> {
    let started = Instant::now();
    let plan = Plan::new(args)?;
    let display = Display::new(mode);
    plan.announce(args, &display);
    let buses = Buses::connect(&plan).await?;
    let token = CancellationToken::new();
    let world = SimWorld::new();
    world.set_move_time(plan.ncfg.runtime.sim.move_time);
    let mut ledger = Ledger::new();
    let (fleet, all_nodes) =
        start_fleet(&plan, args.nodes, buses.nodes.clone(), &world, &mut ledger)?;
    ledger.mark_start();
    let cloud = SimCloud::new(
        fleet.clone(),
        plan.naming(),
        args.nodes + 1,
        plan.max_active(),
        config::scaled(Duration::from_millis(1200), args.speed),
        token.clone(),
    );
    let cloud_events = cloud.events();
    let mut broker = start_broker(
        &plan,
        buses.broker.clone(),
        cloud.clone(),
        args.http,
        &token,
        &display,
    )
    .await?;
    let placement = start_placement(
        &plan,
        buses.broker.clone(),
        buses.client.clone(),
        broker.status.clone(),
        &token,
    )
    .await?;
    let work = Workload::new(
        ledger,
        StdRng::seed_from_u64(plan.seed),
        placement,
        args.nodes as usize,
        plan.max_active(),
        PROFILE,
        8.0 * args.speed,
        10.0 * args.speed,
        plan.ncfg.report.interval * 3,
    );
    let mut lp = Loop {
        display,
        work,
        tally: Tally::default(),
        initial: all_nodes.iter().cloned().collect(),
        all_nodes,
        failures: vec![],
        last_status: broker.status.borrow().clone(),
    };
    lp.run(args, &stop, &mut broker, cloud_events, &world).await;
    let queues_deleted = teardown(&plan, broker, &token, &fleet, &buses, &mut lp).await;
    let summary = lp.summary(&plan, args, &world, &cloud, queues_deleted, started);
    drop(plan);
    Ok(summary)
}

/// The main loop's state: what it displays, the script, what it saw.
struct Loop {
    display: Display,
    work: Workload,
    tally: Tally,
    initial: BTreeSet<String>,
    all_nodes: Vec<String>,
    failures: Vec<String>,
    last_status: Arc<Status>,
}

impl Loop {
    /// Feeds the display and the script until the script ends, the run
    /// times out or is interrupted, or the broker agent stops.
    async fn run(
        &mut self,
        args: &DemoArgs,
        stop: &CancellationToken,
        broker: &mut Broker,
        mut cloud_events: broadcast::Receiver<CloudEvent>,
        world: &Arc<SimWorld>,
    ) {
        let Broker {
            status, observe, ..
        } = broker;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let deadline = tokio::time::Instant::now() + args.timeout;
        self.display.line(
            "node agents started; the broker agent holds its decisions for its start-up grace",
        );
        let phase = |w: &Workload| w.phase.name();
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    self.failures.push(format!("interrupted in phase {}", phase(&self.work)));
                    break;
                }
                _ = tokio::time::sleep_until(deadline) => {
                    self.failures.push(format!(
                        "timed out after {} in phase {}",
                        humantime::format_duration(args.timeout),
                        phase(&self.work)
                    ));
                    break;
                }
                r = observe.recv() => if !self.observed(r) { break },
                r = cloud_events.recv() => self.cloud_event(r),
                r = status.changed() => {
                    if r.is_err() {
                        self.failures.push("the broker agent stopped".into());
                        break;
                    }
                    self.last_status = status.borrow_and_update().clone();
                    self.display.progress(&self.last_status);
                    self.display.fleet(&display::fleet_line(&self.last_status));
                }
                _ = tick.tick() => if self.step(world).await { break },
            }
        }
        self.display.finish();
        if self.tally.lagged > 0 {
            self.failures.push(format!(
                "{} decisions or explanations were missed by the display; counts may be low",
                self.tally.lagged
            ));
        }
    }

    /// A decision or explanation of the broker agent; false once it stopped.
    fn observed(&mut self, r: Result<Observed, RecvError>) -> bool {
        match r {
            Ok(Observed::Decision(d)) => {
                self.tally.add(&d);
                self.display.decision(&d);
            }
            Ok(Observed::Explanation(x)) => self.display.explanation(&x),
            Err(RecvError::Lagged(k)) => {
                self.tally.lagged += k;
                tracing::warn!(
                    missed = k,
                    "the demo fell behind the broker agent's decisions"
                );
            }
            Err(RecvError::Closed) => {
                self.failures.push("the broker agent stopped".into());
                return false;
            }
        }
        true
    }

    fn cloud_event(&mut self, r: Result<CloudEvent, RecvError>) {
        if let Ok(e) = r {
            if let CloudEvent::Booted { node } = &e {
                self.all_nodes.push(node.clone());
            }
            self.display.cloud(&e);
        }
    }

    /// One step of the script; true when it is done.
    async fn step(&mut self, world: &Arc<SimWorld>) -> bool {
        let s = &self.last_status;
        let view = FleetView {
            initial_reporting: s
                .nodes
                .iter()
                .filter(|x| x.fresh && self.initial.contains(&x.node))
                .count(),
            joined: self.tally.joined.len(),
            removed: self.tally.removed.len(),
            in_flight: s.in_flight().count(),
            world_nodes: world.nodes().len(),
        };
        for l in self.work.step(world, view).await {
            self.display.line(l);
        }
        self.work.phase == Phase::Done
    }

    /// The checked summary of the run.
    fn summary(
        mut self,
        plan: &Plan,
        args: &DemoArgs,
        world: &SimWorld,
        cloud: &SimCloud,
        queues_deleted: usize,
        started: Instant,
    ) -> Summary {
        // The independent inventory: the demo's own record against the world.
        let inv = self.work.ledger.check(world);
        self.failures
            .extend(summary::inventory_failures(&inv, &cloud.lost()));
        self.failures
            .extend(summary::script_failures(&self.tally, &self.work.placement));
        let (t, w) = (self.tally, self.work);
        Summary {
            ok: self.failures.is_empty(),
            failures: self.failures,
            transport: plan.transport.into(),
            bus: plan.parsed.to_string(),
            seed: plan.seed,
            speed: args.speed,
            duration_s: scenario::round1(started.elapsed().as_secs_f64()),
            phase: w.phase.name().into(),
            nodes_initial: args.nodes,
            nodes_final: world.nodes().len(),
            nodes_booted: cloud.created().into_values().collect(),
            nodes_removed: cloud.deleted().into_iter().collect(),
            scale_ups: t.up_ops.len() as u32,
            scale_ups_joined: t.joined.len() as u32,
            scale_downs: t.removed.len() as u32,
            scale_downs_started: t.down_ops.len() as u32,
            scale_downs_aborted: t.aborted,
            decisions: t.total,
            decisions_by_kind: t.by_kind,
            gears_before: w.ledger.before,
            gears_created: w.ledger.created,
            gears_deleted: w.ledger.deleted,
            gears_after: inv.found,
            gears_expected: inv.expected,
            gears_lost: inv.missing.len(),
            gears_duplicated: inv.duplicated.len(),
            gears_unexpected: inv.unexpected.len(),
            gears_moved: world.moves(),
            peak_usage_pct: scenario::round1(w.peak_usage),
            placement_requests: w.placement.requests,
            placement_refused: w.placement.refused,
            per_node: inv.per_node,
            queues_deleted,
            refused_messages: self.last_status.refused.clone(),
        }
    }
}

/// The broker agent drains, then the nodes stop, then the run's durable
/// queues are deleted (shared broker) and the bus closes. Returns how many
/// queues were deleted.
async fn teardown(
    plan: &Plan,
    broker: Broker,
    token: &CancellationToken,
    fleet: &SimFleet,
    buses: &Buses,
    lp: &mut Loop,
) -> usize {
    broker.token.cancel();
    let grace = plan.bcfg.agent.shutdown_grace + Duration::from_secs(5);
    match tokio::time::timeout(grace, broker.task).await {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => lp.failures.push(format!("the broker agent failed: {e}")),
        Ok(Err(e)) => lp
            .failures
            .push(format!("the broker agent task failed: {e}")),
        Err(_) => lp
            .failures
            .push("the broker agent did not stop within its grace period".into()),
    }
    token.cancel();
    fleet.stop_all().await;
    let mut queues_deleted = 0;
    if plan.shared_broker {
        let mut queues: Vec<String> = lp
            .all_nodes
            .iter()
            .map(|n| gearshift_proto::routing::node_queue(n))
            .collect();
        queues.push(plan.bcfg.agent.events_queue.clone());
        queues.push(plan.bcfg.agent.admin_queue.clone());
        match bus::delete_queues(&plan.url, &queues).await {
            Ok(k) => queues_deleted = k,
            Err(e) => {
                tracing::warn!(error = %e, queues = ?queues, "could not delete the demo's durable queues")
            }
        }
    }
    buses.close().await;
    queues_deleted
}
