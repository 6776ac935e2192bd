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

pub mod config;
pub mod display;
pub mod ledger;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gearshift_broker::Observed;
use gearshift_broker::status::Status;
use gearshift_bus::{BusUrl, ConnectOptions, Durability, QueueSpec, SharedBus};
use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::Keyring;
use gearshift_proto::msg::{DecisionKind, GearState, NodeProperties, Role};
use gearshift_service::logging::LogFormat;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::Serialize;
use thiserror::Error;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use crate::fleet::{FleetError, Keys, NodeSpec, SimCloud, SimFleet};
use display::{Display, Mode};
use ledger::{Ledger, NodeGears};
use workload::{FleetView, Phase, Placement, Workload};

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

/// The machine-readable result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Every expectation met.
    pub ok: bool,
    /// Expectations not met.
    pub failures: Vec<String>,
    /// `memory`, `amqp` or `stomp`.
    pub transport: String,
    /// The bus URL without its password.
    pub bus: String,
    /// Seed of the workload.
    pub seed: u64,
    /// Time scale.
    pub speed: f64,
    /// Wall time of the run, in seconds (set-up and teardown included).
    pub duration_s: f64,
    /// Phase reached (`done` when the script ran to its end).
    pub phase: String,
    /// Node agents at the start.
    pub nodes_initial: u32,
    /// Nodes at the end.
    pub nodes_final: usize,
    /// Nodes booted by the simulated cloud.
    pub nodes_booted: Vec<String>,
    /// Nodes deleted by the simulated cloud.
    pub nodes_removed: Vec<String>,
    /// Scale-up decisions.
    pub scale_ups: u32,
    /// Scale-ups whose node joined.
    pub scale_ups_joined: u32,
    /// Completed scale-downs: sagas that emptied and removed their node.
    pub scale_downs: u32,
    /// Scale-down decisions (sagas started).
    pub scale_downs_started: u32,
    /// Scale-downs aborted or cancelled.
    pub scale_downs_aborted: u32,
    /// Decisions published by the broker agent.
    pub decisions: u32,
    /// Decisions by kind.
    pub decisions_by_kind: BTreeMap<String, u32>,
    /// Gears when the workload started.
    pub gears_before: u64,
    /// Gears the workload created.
    pub gears_created: u64,
    /// Gears the workload deleted.
    pub gears_deleted: u64,
    /// Gears found in the world at the end.
    pub gears_after: usize,
    /// Gears that should exist at the end (created and not deleted).
    pub gears_expected: usize,
    /// Expected gears found on no node (independent inventory).
    pub gears_lost: usize,
    /// Gears found on more than one node.
    pub gears_duplicated: usize,
    /// Gears found that should not exist.
    pub gears_unexpected: usize,
    /// Gear moves made by evacuations.
    pub gears_moved: u64,
    /// Highest active usage of the fleet, in percent.
    pub peak_usage_pct: f64,
    /// Placement requests sent by the workload.
    pub placement_requests: u64,
    /// Placement requests refused or unanswered.
    pub placement_refused: u64,
    /// Gears per node at the end.
    pub per_node: BTreeMap<String, NodeGears>,
    /// Durable queues of this run deleted at the end (real buses).
    pub queues_deleted: usize,
    /// Messages the broker agent refused, by reason (on a shared broker:
    /// other runs' traffic, signed by keys it does not trust).
    pub refused_messages: BTreeMap<String, u64>,
}

impl Summary {
    /// The human-readable summary.
    pub fn render(&self) -> String {
        let kinds: Vec<String> = self
            .decisions_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let nodes: Vec<String> = self
            .per_node
            .iter()
            .map(|(n, g)| format!("{n} ({} gears, {} active)", g.gears, g.active))
            .collect();
        let mut s = String::new();
        s.push_str(&format!(
            "\nSummary ({} bus, seed {}, speed {}, {:.1} s)\n",
            self.transport, self.seed, self.speed, self.duration_s
        ));
        s.push_str(&format!(
            "  scale-ups    {} decided, {} joined{}\n",
            self.scale_ups,
            self.scale_ups_joined,
            if self.nodes_booted.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.nodes_booted.join(", "))
            }
        ));
        s.push_str(&format!(
            "  scale-downs  {} started, {} completed{}, {} aborted; {} gears moved\n",
            self.scale_downs_started,
            self.scale_downs,
            if self.nodes_removed.is_empty() {
                String::new()
            } else {
                format!(" ({} removed)", self.nodes_removed.join(", "))
            },
            self.scale_downs_aborted,
            self.gears_moved
        ));
        s.push_str(&format!(
            "  decisions    {} ({})\n",
            self.decisions,
            kinds.join(", ")
        ));
        s.push_str(&format!(
            "  gears        {} before, {} created, {} deleted, {} after; peak usage {:.1} %\n",
            self.gears_before,
            self.gears_created,
            self.gears_deleted,
            self.gears_after,
            self.peak_usage_pct
        ));
        s.push_str(&format!(
            "  inventory    {} expected, {} lost, {} duplicated, {} unexpected\n",
            self.gears_expected, self.gears_lost, self.gears_duplicated, self.gears_unexpected
        ));
        s.push_str(&format!(
            "  nodes        {} -> {}: {}\n",
            self.nodes_initial,
            self.nodes_final,
            nodes.join(", ")
        ));
        if self.ok {
            s.push_str(
                "  result       OK: the fleet grew, shrank, and every gear is where it should be\n",
            );
        } else {
            s.push_str("  result       FAILED\n");
            for f in &self.failures {
                s.push_str(&format!("    - {f}\n"));
            }
        }
        s
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
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gearshift-sim demo: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
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
                if args.json {
                    match serde_json::to_string(&summary) {
                        Ok(j) => println!("{j}"),
                        Err(e) => {
                            eprintln!("gearshift-sim demo: {e}");
                            return ExitCode::from(2);
                        }
                    }
                } else {
                    print!("{}", summary.render());
                }
                if stop.is_cancelled() {
                    ExitCode::from(130)
                } else if summary.ok {
                    ExitCode::SUCCESS
                } else {
                    ExitCode::from(1)
                }
            }
            Err(e) => {
                eprintln!("gearshift-sim demo: {e}");
                ExitCode::from(2)
            }
        }
    })
}

/// What the demo needs of every decision it sees.
#[derive(Debug, Default)]
struct Tally {
    by_kind: BTreeMap<String, u32>,
    total: u32,
    up_ops: BTreeSet<String>,
    joined: BTreeMap<String, String>,
    down_ops: BTreeSet<String>,
    removed: BTreeMap<String, String>,
    aborted: u32,
    lagged: u64,
}

impl Tally {
    fn add(&mut self, d: &gearshift_proto::msg::Decision) {
        self.total += 1;
        *self
            .by_kind
            .entry(d.decision.as_str().to_string())
            .or_default() += 1;
        let op = d.op.clone().unwrap_or_default();
        let node = d.node.clone().unwrap_or_default();
        match d.decision {
            DecisionKind::ScaleUp => {
                self.up_ops.insert(op);
            }
            DecisionKind::Joined => {
                self.joined.insert(op, node);
            }
            DecisionKind::ScaleDown => {
                self.down_ops.insert(op);
            }
            DecisionKind::Removed => {
                self.removed.insert(op, node);
            }
            DecisionKind::Aborted | DecisionKind::DrainCancelled => self.aborted += 1,
            _ => {}
        }
    }
}

/// The node names of one run: plain on the in-process bus, tagged on a
/// shared broker.
#[derive(Debug, Clone)]
struct Naming {
    suffix: String,
}

impl Naming {
    fn node(&self, i: u32) -> String {
        format!("node-{i}{}", self.suffix)
    }
}

/// Candidate nodes for placement, from the broker agent's status (the
/// same figures the broker agent's own placement service uses).
fn candidates(s: &Status) -> Vec<NodeProperties> {
    let district_free: BTreeMap<(String, String), Option<u32>> = s
        .groups
        .iter()
        .map(|g| {
            (
                (g.district.clone(), g.profile.clone()),
                g.stats.district_free_uids,
            )
        })
        .collect();
    s.nodes
        .iter()
        .filter(|n| n.fresh)
        .map(|n| NodeProperties {
            name: n.node.clone(),
            node_consumed_capacity: if n.max_active_gears == 0 {
                100.0
            } else {
                100.0 * f64::from(n.gears_active) / f64::from(n.max_active_gears)
            },
            district_id: Some(n.district.clone()),
            district_available_capacity: district_free
                .get(&(n.district.clone(), n.profile.clone()))
                .copied()
                .flatten(),
            region_id: None,
            zone_id: None,
            profile: Some(n.profile.clone()),
            active: n.active,
            mem_free_mb: None,
            gears_active: Some(n.gears_active),
            max_active_gears: Some(n.max_active_gears),
        })
        .collect()
}

async fn connect(url: &str, name: &str) -> Result<SharedBus, DemoError> {
    let opts = ConnectOptions {
        name: name.to_string(),
        heartbeat: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(10),
        op_timeout: Duration::from_secs(20),
        ..ConnectOptions::default()
    };
    gearshift_bus::connect(url, opts)
        .await
        .map_err(|e| DemoError::Connect {
            url: gearshift_bus::url::redact(url),
            reason: e.to_string(),
        })
}

/// Parameters of the simulated fleet.
const DISTRICT: &str = "east";
const PROFILE: &str = "small";

/// Runs the demo until its script ends, it times out, or `stop` is
/// cancelled, and returns the checked summary. Prints through `mode`.
pub async fn run(
    args: &DemoArgs,
    mode: Mode,
    stop: CancellationToken,
) -> Result<Summary, DemoError> {
    let started = Instant::now();
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let url = args
        .bus
        .clone()
        .unwrap_or_else(|| format!("memory://demo-{tag}"));
    let parsed = BusUrl::parse(&url).map_err(|e| DemoError::Config(format!("--bus: {e}")))?;
    let transport = match &parsed {
        BusUrl::Memory { .. } => "memory",
        BusUrl::Amqp { .. } => "amqp",
        BusUrl::Stomp { .. } => "stomp",
    };
    let shared_broker = transport != "memory";
    let naming = Naming {
        suffix: if shared_broker {
            format!("-{tag}")
        } else {
            String::new()
        },
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let speed = args.speed;
    let n = args.nodes;
    let mut display = Display::new(mode);

    // Files: keys, state directories. Removed when the demo ends.
    let tmp = tempfile::Builder::new()
        .prefix("gearshift-demo-")
        .tempdir()
        .map_err(|e| DemoError::Io(format!("cannot create a temporary directory: {e}")))?;
    let keys = match &args.keys {
        Some(d) => Keys::open_or_generate(d).map_err(FleetError::from)?,
        None => Keys::generate(&tmp.path().join("keys")).map_err(FleetError::from)?,
    };

    // Configurations: the embedded files through the agents' own checks.
    let broker_name = format!("demo-broker{}", naming.suffix);
    let bcfg = config::broker_base().map_err(|e| DemoError::Config(e.to_string()))?;
    let bcfg = config::complete_broker(
        bcfg,
        &config::BrokerSetup {
            name: &broker_name,
            state_dir: &tmp.path().join("broker"),
            bus_url: &url,
            tag: &tag,
            min_nodes: n,
            speed,
            signing_key: &keys.path("broker.key"),
        },
    )
    .map_err(|i| DemoError::Config(format!("<demo broker.toml>: key `{}`: {}", i.key, i.reason)))?;
    let ncfg = config::node_base().map_err(|e| DemoError::Config(e.to_string()))?;
    let ncfg = config::complete_node(ncfg, &url, speed).map_err(|i| {
        DemoError::Config(format!("<demo node.toml>: key `{}`: {}", i.key, i.reason))
    })?;
    let max_active = ncfg.runtime.facts.max_active_gears;
    let report_interval = ncfg.report.interval;

    display.text(format!(
        "gearshift demo: 1 broker agent, {n} node agents ({PROFILE}, {max_active} active gears each, district {DISTRICT}), a simulated cloud, on the {transport} bus {}",
        parsed
    ));
    display.text(format!(
        "  scale up at {} % of a profile's capacity (PROFILE_THRESHOLD), compact a district below {} % (COMPACT_THRESHOLD) after {} stable; seed {seed}\n",
        bcfg.policy.profile_threshold.default.unwrap_or(80),
        bcfg.policy.compact_threshold.default.unwrap_or(50),
        humantime::format_duration(bcfg.policy.scale_down_stabilization)
    ));

    if let (Some(d), true) = (&args.keys, shared_broker) {
        display.text(format!(
            "  watch it from another terminal: gearshift-broker watch --bus <the same URL> --key {}\n",
            d.join("operator.key").display()
        ));
    }

    // The bus: one connection each for the broker agent, the node agents and the workload.
    let broker_bus = connect(&url, &format!("gearshift-demo broker {tag}")).await?;
    let nodes_bus = connect(&url, &format!("gearshift-demo nodes {tag}")).await?;
    let client_bus = connect(&url, &format!("gearshift-demo workload {tag}")).await?;

    let token = CancellationToken::new();
    let world = SimWorld::new();
    world.set_move_time(ncfg.runtime.sim.move_time);
    let fleet = SimFleet::new(
        world.clone(),
        nodes_bus.clone(),
        ncfg,
        keys.clone(),
        &tmp.path().join("nodes"),
    );
    let mut ledger = Ledger::new();
    let initial_active = (max_active as usize * 3).div_ceil(5);
    let initial_idle = (max_active as usize / 5).max(1);
    let mut all_nodes: Vec<String> = vec![];
    for i in 1..=n {
        let spec = NodeSpec {
            name: naming.node(i),
            district: DISTRICT.into(),
            profile: PROFILE.into(),
            max_active_gears: max_active,
            booted_for: None,
            gears: 0,
        };
        fleet.add_to_world(&spec)?;
        for _ in 0..initial_active {
            ledger.create(&world, &spec.name, GearState::Started);
        }
        for _ in 0..initial_idle {
            ledger.create(&world, &spec.name, GearState::Idle);
        }
        fleet.start_node(&spec)?;
        all_nodes.push(spec.name);
    }
    ledger.mark_start();
    let naming2 = naming.clone();
    let cloud = SimCloud::new(
        fleet.clone(),
        move |i| naming2.node(i),
        n + 1,
        max_active,
        config::scaled(Duration::from_millis(1200), speed),
        token.clone(),
    );
    let mut cloud_events = cloud.events();

    // The broker agent.
    let metrics = gearshift_broker::metrics::Metrics::new();
    let agent = gearshift_broker::Agent::builder(bcfg.clone(), broker_bus.clone())
        .signer(keys.broker.clone())
        .keyring(keys.broker_keyring().map_err(FleetError::from)?)
        .handler("cloud", cloud.clone())
        .metrics(metrics.clone())
        .build()
        .map_err(|e| DemoError::Broker(e.to_string()))?;
    let mut status = agent.status();
    let mut observe = agent.observe();
    if let Some(addr) = args.http {
        let dash = gearshift_broker::dashboard::Dashboard::spawn(
            &agent,
            bcfg.agent.name.clone(),
            token.clone(),
        );
        let router =
            gearshift_service::http::metrics_router(metrics.registry.clone()).merge(dash.router());
        let (local, _) = gearshift_service::http::serve(addr, router, token.clone())
            .await
            .map_err(|e| DemoError::Io(format!("--http {addr}: {e}")))?;
        display.text(format!(
            "  dashboard: http://{local}/   metrics: http://{local}/metrics\n"
        ));
    }
    let agent_token = token.child_token();
    let agent_task = {
        let t = agent_token.clone();
        tokio::spawn(async move { agent.run(t).await })
    };

    // The placement service: the broker configuration's engine, signed by
    // the broker key, fed with the broker agent's view of the fleet.
    let placement_key = format!("placement.request.demo.{tag}");
    let engine = gearshift_placement::Engine::new(&bcfg.placement)
        .map_err(|e| DemoError::Config(format!("placement: {e}")))?;
    let ready = Arc::new(tokio::sync::Notify::new());
    {
        let st = status.clone();
        let opts = gearshift_placement::service::ServeOptions {
            queue: QueueSpec {
                name: format!("gearshift.demo.{tag}.placement"),
                bindings: vec![placement_key.clone()],
                durability: Durability::Transient,
                max_length: None,
            },
            fleet: Some(Arc::new(move || candidates(&st.borrow()))),
            ready: Some(ready.clone()),
            ..Default::default()
        };
        let bus = broker_bus.clone();
        let signer = Arc::new(keys.broker.clone());
        let ring = Arc::new(keys.broker_keyring().map_err(FleetError::from)?);
        let name = bcfg.agent.name.clone();
        let t = token.clone();
        tokio::spawn(async move {
            if let Err(e) =
                gearshift_placement::service::serve_with(bus, engine, signer, ring, name, t, opts)
                    .await
            {
                tracing::error!(error = %e, "the demo's placement service stopped");
            }
        });
    }
    if tokio::time::timeout(Duration::from_secs(20), ready.notified())
        .await
        .is_err()
    {
        return Err(DemoError::Broker(
            "the placement service did not start within 20 s".into(),
        ));
    }
    let mut trusted = Keyring::new();
    trusted.add(keys.broker.public(), Role::Broker, "demo broker");
    let placement = Placement {
        bus: client_bus.clone(),
        key: placement_key,
        signer: keys.operator.clone(),
        trusted,
        requests: 0,
        refused: 0,
        last_refusal: None,
    };
    let mut work = Workload::new(
        ledger,
        StdRng::seed_from_u64(seed),
        placement,
        n as usize,
        max_active,
        PROFILE,
        8.0 * speed,
        10.0 * speed,
        report_interval * 3,
    );

    // The main loop.
    let mut tally = Tally::default();
    let mut last_status: Arc<Status> = status.borrow().clone();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deadline = tokio::time::Instant::now() + args.timeout;
    let mut failures = vec![];
    let initial: BTreeSet<String> = all_nodes.iter().cloned().collect();
    display
        .line("node agents started; the broker agent holds its decisions for its start-up grace");
    loop {
        tokio::select! {
            _ = stop.cancelled() => {
                failures.push(format!("interrupted in phase {}", work.phase.name()));
                break;
            }
            _ = tokio::time::sleep_until(deadline) => {
                failures.push(format!(
                    "timed out after {} in phase {}",
                    humantime::format_duration(args.timeout),
                    work.phase.name()
                ));
                break;
            }
            r = observe.recv() => match r {
                Ok(Observed::Decision(d)) => {
                    tally.add(&d);
                    display.decision(&d);
                }
                Ok(Observed::Explanation(x)) => display.explanation(&x),
                Err(RecvError::Lagged(k)) => {
                    tally.lagged += k;
                    tracing::warn!(missed = k, "the demo fell behind the broker agent's decisions");
                }
                Err(RecvError::Closed) => {
                    failures.push("the broker agent stopped".into());
                    break;
                }
            },
            r = cloud_events.recv() => match r {
                Ok(e) => {
                    if let crate::fleet::CloudEvent::Booted { node } = &e {
                        all_nodes.push(node.clone());
                    }
                    display.cloud(&e);
                }
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => {}
            },
            r = status.changed() => {
                if r.is_err() {
                    failures.push("the broker agent stopped".into());
                    break;
                }
                last_status = status.borrow_and_update().clone();
                display.progress(&last_status);
                display.fleet(&fleet_line(&last_status));
            }
            _ = tick.tick() => {
                let view = FleetView {
                    initial_reporting: last_status
                        .nodes
                        .iter()
                        .filter(|x| x.fresh && initial.contains(&x.node))
                        .count(),
                    joined: tally.joined.len(),
                    removed: tally.removed.len(),
                    in_flight: last_status.in_flight().count(),
                    world_nodes: world.nodes().len(),
                };
                for l in work.step(&world, view).await {
                    display.line(l);
                }
                if work.phase == Phase::Done {
                    break;
                }
            }
        }
    }
    display.finish();
    if tally.lagged > 0 {
        failures.push(format!(
            "{} decisions or explanations were missed by the display; counts may be low",
            tally.lagged
        ));
    }

    // Teardown: the broker agent drains, then the nodes stop, then the bus closes.
    agent_token.cancel();
    match tokio::time::timeout(
        bcfg.agent.shutdown_grace + Duration::from_secs(5),
        agent_task,
    )
    .await
    {
        Ok(Ok(Ok(()))) => {}
        Ok(Ok(Err(e))) => failures.push(format!("the broker agent failed: {e}")),
        Ok(Err(e)) => failures.push(format!("the broker agent task failed: {e}")),
        Err(_) => failures.push("the broker agent did not stop within its grace period".into()),
    }
    token.cancel();
    fleet.stop_all().await;
    let mut queues_deleted = 0;
    if shared_broker {
        let mut queues: Vec<String> = all_nodes
            .iter()
            .map(|n| gearshift_proto::routing::node_queue(n))
            .collect();
        queues.push(bcfg.agent.events_queue.clone());
        queues.push(bcfg.agent.admin_queue.clone());
        match cleanup::delete_queues(&parsed, &queues).await {
            Ok(k) => queues_deleted = k,
            Err(e) => {
                tracing::warn!(error = %e, queues = ?queues, "could not delete the demo's durable queues")
            }
        }
    }
    for b in [&broker_bus, &nodes_bus, &client_bus] {
        b.close().await;
    }

    // The independent inventory: the demo's own record against the world.
    let inv = work.ledger.check(&world);
    if !inv.missing.is_empty() {
        failures.push(format!(
            "{} gears lost: {}",
            inv.missing.len(),
            inv.missing
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if !inv.duplicated.is_empty() {
        failures.push(format!("gears on two nodes: {}", inv.duplicated.join("; ")));
    }
    if !inv.unexpected.is_empty() {
        failures.push(format!(
            "{} unexpected gears: {}",
            inv.unexpected.len(),
            inv.unexpected
                .iter()
                .take(10)
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let lost_with_nodes = cloud.lost();
    if !lost_with_nodes.is_empty() {
        failures.push(format!(
            "{} gears were on nodes when the cloud deleted them",
            lost_with_nodes.len()
        ));
    }
    if tally.up_ops.is_empty() {
        failures.push("no scale-up was decided".into());
    } else if tally.joined.is_empty() {
        failures.push("no node booted for a scale-up joined".into());
    }
    if tally.down_ops.is_empty() {
        failures.push("no scale-down was decided".into());
    } else if tally.removed.is_empty() {
        failures.push("no scale-down saga removed its node".into());
    }
    if work.placement.refused > 0 && work.placement.requests == work.placement.refused {
        failures.push(format!(
            "every placement request was refused (last: {})",
            work.placement.last_refusal.clone().unwrap_or_default()
        ));
    }
    let summary = Summary {
        ok: failures.is_empty(),
        failures,
        transport: transport.into(),
        bus: parsed.to_string(),
        seed,
        speed,
        duration_s: (started.elapsed().as_secs_f64() * 10.0).round() / 10.0,
        phase: work.phase.name().into(),
        nodes_initial: n,
        nodes_final: world.nodes().len(),
        nodes_booted: cloud.created().into_values().collect(),
        nodes_removed: cloud.deleted().into_iter().collect(),
        scale_ups: tally.up_ops.len() as u32,
        scale_ups_joined: tally.joined.len() as u32,
        scale_downs: tally.removed.len() as u32,
        scale_downs_started: tally.down_ops.len() as u32,
        scale_downs_aborted: tally.aborted,
        decisions: tally.total,
        decisions_by_kind: tally.by_kind,
        gears_before: work.ledger.before,
        gears_created: work.ledger.created,
        gears_deleted: work.ledger.deleted,
        gears_after: inv.found,
        gears_expected: inv.expected,
        gears_lost: inv.missing.len(),
        gears_duplicated: inv.duplicated.len(),
        gears_unexpected: inv.unexpected.len(),
        gears_moved: world.moves(),
        peak_usage_pct: (work.peak_usage * 10.0).round() / 10.0,
        placement_requests: work.placement.requests,
        placement_refused: work.placement.refused,
        per_node: inv.per_node,
        queues_deleted,
        refused_messages: last_status.refused.clone(),
    };
    drop(tmp);
    Ok(summary)
}

/// The fleet line of the live display.
fn fleet_line(s: &Status) -> String {
    let mut parts = vec![];
    for g in &s.groups {
        let t = &g.stats;
        parts.push(format!(
            "{}/{}: {} nodes ({} inactive{}), {} active gears, usage {:.1} %",
            g.district,
            g.profile,
            t.nodes_active + t.nodes_inactive,
            t.nodes_inactive,
            if t.nodes_missing > 0 {
                format!(", {} missing", t.nodes_missing)
            } else {
                String::new()
            },
            t.gears_active,
            t.usage_pct
        ));
    }
    let ops = s.in_flight().count();
    if ops > 0 {
        parts.push(format!("{ops} operation(s) in flight"));
    }
    if parts.is_empty() {
        "waiting for the first reports".into()
    } else {
        parts.join(" · ")
    }
}

mod cleanup {
    //! Deletes the run's durable queues from RabbitMQ (over AMQP, also when
    //! the demo ran over STOMP: RabbitMQ's STOMP plugin declares ordinary
    //! queues).

    use gearshift_bus::{BusUrl, StompFlavor};
    use lapin::options::QueueDeleteOptions;

    pub(super) async fn delete_queues(url: &BusUrl, queues: &[String]) -> Result<usize, String> {
        let amqp = match url {
            BusUrl::Amqp { url, .. } => url.clone(),
            BusUrl::Stomp {
                host,
                login,
                passcode,
                vhost,
                tls: false,
                flavor: StompFlavor::RabbitMq,
                ..
            } => format!(
                "amqp://{}:{}@{host}:5672/{}",
                enc(login),
                enc(passcode),
                enc(vhost)
            ),
            _ => return Err("not a RabbitMQ broker reachable over plain AMQP".into()),
        };
        let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default())
            .await
            .map_err(|e| e.to_string())?;
        let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
        let mut n = 0;
        for q in queues {
            match ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await
            {
                Ok(_) => n += 1,
                Err(e) => tracing::debug!(queue = %q, error = %e, "queue not deleted"),
            }
        }
        let _ = ch.close(200, "demo done".into()).await;
        let _ = conn.close(200, "demo done".into()).await;
        Ok(n)
    }

    fn enc(s: &str) -> String {
        percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
    }
}
