//! `gearshift-sim bench`: the fleet-scale benchmark over a real bus.
//!
//! N lite nodes ([`crate::lite`]) report on the bus while the real broker
//! agent — the `gearshift-broker` binary in its own process, so that its
//! memory is its own — ingests the reports and decides. In the same run a
//! bare lapin consumer bound to the same reports measures what the bus
//! itself delivers. Phases, in order:
//!
//! 1. **join**: every node reports once; the broker agent knows the fleet.
//! 2. **ingest**: the fleet publishes as fast as its connections allow; after
//!    a warm-up, the broker agent's accepted-report counter (its own
//!    Prometheus metric) and the raw consumer's count are read at both ends
//!    of a steady window: `reports_per_s`, `raw_per_s`, `ratio`.
//! 3. **decisions**: the fleet reports at its announced interval; one
//!    district at a time is brought just under `DISTRICT_THRESHOLD`, then one
//!    node's report takes it over. The broker agent's
//!    `decision_latency_seconds` histogram (from the consumption of that
//!    report to the publisher confirm of the decision) gives
//!    `decision_p50_ms` / `decision_p99_ms` as bucket upper bounds; the
//!    benchmark also times report-published to decision-received on the bus
//!    (`decision_e2e_*`, two bus hops more).
//! 4. **drain**: the other districts drop below `COMPACT_THRESHOLD`; the
//!    broker agent drains nodes under its disruption budgets and the lite
//!    nodes move gears at no cost: `moves_per_s` is the orchestration
//!    throughput (gears moved between the first and the last move).
//! 5. **node memory**: a real `gearshift-node` (the `dir` runtime, 100 gears)
//!    runs on the same bus; its resident memory is sampled idle and while
//!    the broker agent evacuates it.
//!
//! The broker agent's resident memory is sampled every 250 ms through the
//! whole run: `broker_rss_mb` is the largest sample.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use gearshift_broker::cli::OperatorKeys;
use gearshift_broker::config::BrokerConfig;
use gearshift_bus::{ConnectOptions, SharedBus};
use gearshift_proto::msg::{AdminRequest, DecisionKind, Message, Role};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::bench_proc::{self, Machine, Proc, bucket_quantile, quantile};
use crate::lite::{LiteFleet, LiteSpec};

/// The default bus.
pub const DEFAULT_BUS: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// Options of `gearshift-sim bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Simulated nodes.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// AMQP URL of the bus.
    #[arg(long, env = "GEARSHIFT_BUS", default_value = DEFAULT_BUS)]
    pub bus: String,
    /// Print one JSON object (otherwise a readable summary).
    #[arg(long)]
    pub json: bool,
    /// Bus connections shared by the lite nodes.
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Offered reports per second in the ingest phase (default: as fast as
    /// the fleet's connections confirm, which saturates a small machine).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Publishers per connection while flooding.
    #[arg(long, default_value_t = 64)]
    pub publishers: usize,
    /// Nodes per district.
    #[arg(long, default_value_t = 50)]
    pub per_district: usize,
    /// Profiles (districts take them in turn).
    #[arg(long, default_value_t = 2)]
    pub profiles: usize,
    /// Report interval the nodes announce and keep outside the flood.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Flood before the ingest window starts.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub warmup: Duration,
    /// Ingest measurement window.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub window: Duration,
    /// Threshold crossings to time (each in its own district).
    #[arg(long, default_value_t = 60)]
    pub decisions: usize,
    /// How long the drain phase runs.
    #[arg(long, default_value = "20s", value_parser = humantime::parse_duration)]
    pub drain_window: Duration,
    /// Skip the real node's memory measurement.
    #[arg(long)]
    pub no_node: bool,
    /// The gearshift-broker binary (default: next to this one).
    #[arg(long)]
    pub broker_bin: Option<PathBuf>,
    /// The gearshift-node binary (default: next to this one).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// Keep the run's directory (configurations, keys, logs).
    #[arg(long)]
    pub keep: bool,
}

/// The benchmark's figures.
#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    /// Simulated nodes.
    pub nodes: usize,
    /// Districts.
    pub districts: usize,
    /// Bus connections of the fleet.
    pub connections: usize,
    /// Reports per second the broker agent accepted in the ingest window.
    pub reports_per_s: f64,
    /// Reports per second the bare lapin consumer received in the same window.
    pub raw_per_s: f64,
    /// reports_per_s / raw_per_s.
    pub ratio: f64,
    /// Reports per second the fleet published (confirmed) in the window.
    pub offered_per_s: f64,
    /// Reports published but not yet accepted by the broker agent, at the
    /// start and at the end of the window: a backlog that shrank makes the
    /// window's rate exceed the offered one, one that grew shows the agent
    /// falling behind.
    pub broker_lag_start: f64,
    /// See `broker_lag_start`.
    pub broker_lag_end: f64,
    /// Size of one signed report, in bytes.
    pub report_bytes: usize,
    /// Seconds of the ingest window.
    pub window_s: f64,
    /// Broker agent CPU in the ingest window, % of one core.
    pub broker_cpu_pct: f64,
    /// Broker agent CPU per accepted report in the window, µs.
    pub broker_us_per_report: f64,
    /// Messages the broker agent refused during the run, by reason (a
    /// report overtaken by a newer one of the same node is `stale_seq`).
    pub refused: BTreeMap<String, f64>,
    /// Decision latency samples (threshold crossings that led to a decision).
    pub decisions: usize,
    /// Median decision latency (upper bound of its histogram bucket), ms.
    pub decision_p50_ms: Option<f64>,
    /// 99th percentile decision latency (upper bound of its bucket), ms.
    pub decision_p99_ms: Option<f64>,
    /// Median of report published -> decision received on the bus, ms.
    pub decision_e2e_p50_ms: Option<f64>,
    /// 99th percentile of report published -> decision received, ms.
    pub decision_e2e_p99_ms: Option<f64>,
    /// Crossings without a decision within 10 s.
    pub decisions_missed: usize,
    /// Largest resident memory of the broker agent's process, MiB.
    pub broker_rss_mb: f64,
    /// Its resident memory at the end of the ingest phase, MiB.
    pub broker_rss_after_ingest_mb: f64,
    /// Gears moved per second while drains ran (first to last move).
    pub moves_per_s: f64,
    /// Gears moved per second over the whole drain window (new drains in a
    /// group wait for fresh reports of all its nodes).
    pub moves_per_s_window: f64,
    /// Gears moved in the drain phase.
    pub moves: u64,
    /// Evacuations that emptied their node.
    pub drains: u64,
    /// Most nodes inactive (draining) at once, as sampled.
    pub max_draining: usize,
    /// Real node agent: resident memory after 10 s idle, MiB.
    pub node_rss_idle_mb: Option<f64>,
    /// Real node agent: largest resident memory during its evacuation, MiB.
    pub node_rss_evacuation_mb: Option<f64>,
    /// The larger of the two.
    pub node_rss_mb: Option<f64>,
    /// Of the idle figure, private memory (RssAnon), MiB; the rest is the
    /// binary's code mapped from the page cache.
    pub node_rss_anon_idle_mb: Option<f64>,
    /// Gears the real node moved.
    pub node_moved: Option<usize>,
    /// The machine.
    pub machine: Option<Machine>,
    /// Wall time of the run, s.
    pub elapsed_s: f64,
}

impl BenchReport {
    /// A readable summary.
    pub fn render(&self) -> String {
        let ms = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1} ms"));
        let mb = |v: Option<f64>| v.map_or("-".into(), |x| format!("{x:.1} MiB"));
        format!(
            "nodes {} in {} districts, {} connections\n\
             ingest: broker {:.0}/s, raw consumer {:.0}/s, ratio {:.3} (offered {:.0}/s, {} B/report, {:.0} s window; broker CPU {:.0} %, {:.1} µs/report)\n\
             decisions: {} timed, p50 <= {}, p99 <= {} (bus to bus: p50 {}, p99 {}), {} missed\n\
             broker RSS: peak {:.1} MiB, after ingest {:.1} MiB\n\
             drain: {} gears moved, {:.0} moves/s, {} nodes emptied, up to {} draining at once\n\
             node RSS: idle {}, evacuating {} ({} gears moved)\n",
            self.nodes,
            self.districts,
            self.connections,
            self.reports_per_s,
            self.raw_per_s,
            self.ratio,
            self.offered_per_s,
            self.report_bytes,
            self.window_s,
            self.broker_cpu_pct,
            self.broker_us_per_report,
            self.decisions,
            ms(self.decision_p50_ms),
            ms(self.decision_p99_ms),
            ms(self.decision_e2e_p50_ms),
            ms(self.decision_e2e_p99_ms),
            self.decisions_missed,
            self.broker_rss_mb,
            self.broker_rss_after_ingest_mb,
            self.moves,
            self.moves_per_s,
            self.drains,
            self.max_draining,
            mb(self.node_rss_idle_mb),
            mb(self.node_rss_evacuation_mb),
            self.node_moved.map_or("-".into(), |n| n.to_string()),
        )
    }
}

/// Keys of a run, written where the agents read them.
struct RunKeys {
    broker: KeyPair,
    operator: KeyPair,
    dir: PathBuf,
}

fn write_private(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    std::io::Write::write_all(&mut f, pem.as_bytes())?;
    Ok(())
}

impl RunKeys {
    fn new(dir: &Path) -> anyhow::Result<RunKeys> {
        let keys = RunKeys {
            broker: KeyPair::generate()?,
            operator: KeyPair::generate()?,
            dir: dir.to_path_buf(),
        };
        std::fs::create_dir_all(dir.join("nodes.d"))?;
        std::fs::create_dir_all(dir.join("operators.d"))?;
        write_private(&dir.join("broker.key"), &keys.broker.to_pem())?;
        std::fs::write(dir.join("broker.pub"), keys.broker.public_pem())?;
        write_private(&dir.join("operator.key"), &keys.operator.to_pem())?;
        std::fs::write(
            dir.join("operators.d/operator.pub"),
            keys.operator.public_pem(),
        )?;
        Ok(keys)
    }

    fn trust_node(&self, name: &str, key: &KeyPair) -> anyhow::Result<()> {
        std::fs::write(
            self.dir.join("nodes.d").join(format!("{name}.pub")),
            key.public_pem(),
        )?;
        Ok(())
    }

    /// What the lite nodes obey.
    fn broker_ring(&self) -> Keyring {
        let mut r = Keyring::new();
        r.add(self.broker.public(), Role::Broker, "broker");
        r
    }

    fn operator(&self) -> OperatorKeys {
        OperatorKeys {
            signer: self.operator.clone(),
            brokers: self.broker_ring(),
        }
    }
}

/// The broker agent's configuration for a benchmark or campaign run.
pub fn broker_config(url: &str, dir: &Path, keys: &Path, tag: &str, port: u16) -> BrokerConfig {
    let mut c = BrokerConfig::defaults();
    c.agent.name = format!("broker-{tag}");
    c.agent.state_dir = dir.join("broker-state");
    c.agent.events_queue = format!("gearshift.bench.events.{tag}");
    c.agent.admin_queue = format!("gearshift.bench.admin.{tag}");
    c.agent.admin_key = format!("admin.bench.{tag}");
    c.agent.placement_service = false;
    c.agent.shutdown_grace = Duration::from_secs(2);
    c.bus.url = url.to_string();
    c.keys.signing_key = keys.join("broker.key");
    c.keys.node_keys_dir = keys.join("nodes.d");
    c.keys.operator_keys_dir = keys.join("operators.d");
    c.metrics.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    c.log.level = "warn".into();
    let p = &mut c.policy;
    p.interval = Duration::from_secs(1);
    // Evaluate as soon as a report shows pressure: the benchmark times the
    // decision path itself, not the configurable debounce.
    p.react_delay = Duration::ZERO;
    p.startup_grace = Duration::from_secs(2);
    p.scale_down_stabilization = Duration::ZERO;
    p.cooldown_after_scale_up = Duration::ZERO;
    p.cooldown_after_scale_down = Duration::ZERO;
    p.provision_timeout = Duration::from_secs(3600);
    c.saga.command_timeout = Duration::from_secs(30);
    c.saga.confirm_empty_timeout = Duration::from_secs(30);
    c.group_defaults.max_nodes = 100_000;
    c.group_defaults.handler = "log".into();
    c
}

fn write_broker_config(cfg: &BrokerConfig, path: &Path) -> anyhow::Result<()> {
    let text = cfg
        .to_toml()
        .map_err(|e| anyhow::anyhow!("broker configuration: {e}"))?;
    std::fs::write(path, text)?;
    gearshift_broker::config::load(path)
        .map_err(|e| anyhow::anyhow!("generated broker configuration refused: {e}"))?;
    Ok(())
}

/// Connects `n` bus connections.
pub async fn connect_many(url: &str, n: usize, name: &str) -> anyhow::Result<Vec<SharedBus>> {
    let mut v = vec![];
    for i in 0..n.max(1) {
        let opts = ConnectOptions {
            name: format!("{name} {i}"),
            ..Default::default()
        };
        v.push(
            gearshift_bus::connect(url, opts)
                .await
                .with_context(|| format!("cannot connect to {url}"))?,
        );
    }
    Ok(v)
}

/// A bare lapin consumer of every report on its own thread and runtime.
struct RawConsumer {
    count: Arc<AtomicU64>,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl RawConsumer {
    /// Counts the reports whose routing key starts with `prefix` (this run's
    /// fleet: other publishers may share the bus).
    async fn start(url: &str, prefix: String) -> anyhow::Result<RawConsumer> {
        let count = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (c, s, u) = (count.clone(), stop.clone(), url.to_string());
        let thread = std::thread::Builder::new()
            .name("raw-consumer".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(raw_consume(u, prefix, c, s, ready_tx))
            })?;
        ready_rx
            .await
            .context("the raw consumer did not start")?
            .map_err(|e| anyhow::anyhow!("raw consumer: {e}"))?;
        Ok(RawConsumer {
            count,
            stop,
            thread: Some(thread),
        })
    }

    fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn stop(mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn raw_consume(
    url: String,
    prefix: String,
    count: Arc<AtomicU64>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) -> anyhow::Result<()> {
    use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let setup = async {
        let conn = lapin::Connection::connect(
            &url,
            lapin::ConnectionProperties::default()
                .with_connection_name("gearshift-sim bench raw consumer".into()),
        )
        .await?;
        let ch = conn.create_channel().await?;
        let q = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        ch.queue_bind(
            q.name().clone(),
            routing::EXCHANGE.into(),
            routing::ALL_REPORTS.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let consumer = ch
            .basic_consume(
                q.name().clone(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok::<_, lapin::Error>((conn, consumer))
    };
    let (conn, mut consumer) = match setup.await {
        Ok(x) => {
            let _ = ready.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return Ok(());
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            d = consumer.next() => match d {
                Some(Ok(d)) => {
                    if d.routing_key.as_str().starts_with(&prefix) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => break,
            },
        }
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// Samples a process's resident memory; the largest sample wins.
struct RssSampler {
    peak_kb: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl RssSampler {
    fn start(pid: u32, every: Duration) -> RssSampler {
        let peak_kb = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (p, s) = (peak_kb.clone(), stop.clone());
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = s.cancelled() => break,
                    _ = t.tick() => {
                        if let Some(mb) = bench_proc::rss_mb(pid) {
                            p.fetch_max((mb * 1024.0) as u64, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        RssSampler { peak_kb, stop }
    }

    fn peak_mb(&self) -> f64 {
        self.peak_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

const LATENCY: &str = "gearshift_broker_decision_latency_seconds";
const REPORTS: &str = "gearshift_broker_reports_total";
const NODES: &str = "gearshift_broker_nodes";
const REFUSED: &str = "gearshift_broker_refused_total";

/// Runs the benchmark.
pub async fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    if args.nodes < args.per_district * 3 {
        bail!(
            "--nodes {} is too small: at least 3 districts of --per-district {} are needed",
            args.nodes,
            args.per_district
        );
    }
    let started = Instant::now();
    let machine = Machine::probe();
    let broker_bin = bench_proc::sibling_binary(args.broker_bin.as_deref(), "gearshift-broker")?;
    let node_bin = if args.no_node {
        None
    } else {
        Some(bench_proc::sibling_binary(
            args.node_bin.as_deref(),
            "gearshift-node",
        )?)
    };
    let tmp = tempfile_dir()?;
    let dir = tmp.path.clone();
    eprintln!("bench: run directory {}", dir.display());
    let keep = args.keep;
    let r = run_in(args, &dir, broker_bin, node_bin, machine, started).await;
    if keep || r.is_err() {
        eprintln!("bench: run directory kept: {}", dir.display());
        tmp.keep();
    }
    r
}

async fn run_in(
    args: BenchArgs,
    dir: &Path,
    broker_bin: PathBuf,
    node_bin: Option<PathBuf>,
    machine: Machine,
    started: Instant,
) -> anyhow::Result<BenchReport> {
    let dir = dir.to_path_buf();
    let tag = format!("b{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);

    // Keys and configuration.
    let keys = RunKeys::new(&dir.join("keys"))?;
    let spec = LiteSpec {
        nodes: args.nodes,
        per_district: args.per_district,
        profiles: (0..args.profiles.max(1)).map(|p| format!("p{p}")).collect(),
        max_active: 100,
        gears: 60,
        interval: args.interval,
        tag: tag.clone(),
    };
    for i in 0..spec.nodes {
        keys.trust_node(
            &crate::lite::node_name(&tag, i),
            &crate::lite::node_key(&tag, i),
        )?;
    }
    let real_node_key = KeyPair::generate()?;
    let real_node = format!("{tag}-real");
    keys.trust_node(&real_node, &real_node_key)?;
    let port = bench_proc::free_port()?;
    let cfg = broker_config(&args.bus, &dir, &keys.dir, &tag, port);
    let cfg_path = dir.join("broker.toml");
    write_broker_config(&cfg, &cfg_path)?;

    // The bus side: fleet connections, the raw consumer, a decision watcher.
    let buses = connect_many(&args.bus, args.connections, "gearshift-sim bench").await?;
    let control = connect_many(&args.bus, 1, "gearshift-sim bench control")
        .await?
        .remove(0);
    let fleet = LiteFleet::new(spec.clone(), buses, keys.broker_ring());
    let districts = fleet.districts();
    let raw = RawConsumer::start(&args.bus, format!("report.{tag}-")).await?;
    let mut decisions_sub = control.subscribe(routing::ALL_DECISIONS).await?;

    // The broker agent.
    let mut broker = Proc::new(
        "gearshift-broker",
        &broker_bin,
        &["run", "--config", &cfg_path.to_string_lossy()],
        &dir.join("broker.log"),
    );
    broker.start()?;
    let broker_pid = broker.pid().context("broker pid")?;
    let rss = RssSampler::start(broker_pid, Duration::from_millis(250));
    let op = keys.operator();
    wait_ready(&control, &op, &cfg.agent.admin_key, &mut broker).await?;
    eprintln!("bench: broker agent ready (pid {broker_pid})");

    let stop_all = CancellationToken::new();
    let cmd_task = {
        let f = fleet.clone();
        let s = stop_all.clone();
        tokio::spawn(async move { f.serve_commands(s).await })
    };

    // 1. join.
    let all: Vec<usize> = (0..spec.nodes).collect();
    let t = Instant::now();
    // Every node reports; the broker agent's report queue is bounded
    // (`report_backlog`), so when it falls behind the oldest reports are
    // dropped and their nodes report again in the next round, as their
    // periodic reports would.
    let mut round = 0;
    loop {
        round += 1;
        fleet.report_all(&all, 512).await;
        match wait_settled(port, NODES, spec.nodes as f64, Duration::from_secs(120)).await? {
            Settled::Reached => break,
            Settled::Stalled(v) if round < 5 => {
                eprintln!("bench: join round {round}: the broker agent knows {v} nodes; again")
            }
            Settled::Stalled(v) => {
                bail!(
                    "after {round} rounds the broker agent knows {v} of {} nodes",
                    spec.nodes
                )
            }
        }
    }
    eprintln!(
        "bench: {} nodes joined in {:.1} s",
        spec.nodes,
        t.elapsed().as_secs_f64()
    );
    let report_bytes = fleet.report_message(0).payload.len();

    // 2. ingest.
    let flood_stop = CancellationToken::new();
    let flood = {
        let f = fleet.clone();
        let s = flood_stop.clone();
        let per = args.publishers;
        let rate = args.rate;
        tokio::spawn(async move { f.flood(per, rate, s).await })
    };
    tokio::time::sleep(args.warmup).await;
    let m0 = bench_proc::scrape(port).await?;
    let cpu0 = bench_proc::cpu_seconds(broker_pid).unwrap_or(0.0);
    let (raw0, pub0, t0) = (
        raw.count(),
        fleet.counters.reports.load(Ordering::Relaxed),
        Instant::now(),
    );
    tokio::time::sleep(args.window).await;
    let m1 = bench_proc::scrape(port).await?;
    let cpu1 = bench_proc::cpu_seconds(broker_pid).unwrap_or(0.0);
    let (raw1, pub1, t1) = (
        raw.count(),
        fleet.counters.reports.load(Ordering::Relaxed),
        Instant::now(),
    );
    flood_stop.cancel();
    let _ = flood.await;
    let secs = (t1 - t0).as_secs_f64();
    let reports_per_s = (m1.get(REPORTS) - m0.get(REPORTS)) / secs;
    let broker_cpu_pct = (cpu1 - cpu0) / secs * 100.0;
    let broker_us_per_report = if reports_per_s > 0.0 {
        (cpu1 - cpu0) / (reports_per_s * secs) * 1e6
    } else {
        0.0
    };
    let raw_per_s = (raw1 - raw0) as f64 / secs;
    let offered_per_s = (pub1 - pub0) as f64 / secs;
    let lag_start = (pub0 as f64 - m0.get(REPORTS)).max(0.0);
    let lag_end = (pub1 as f64 - m1.get(REPORTS)).max(0.0);
    let rss_after_ingest = broker.rss_mb().unwrap_or(0.0);
    eprintln!(
        "bench: ingest {reports_per_s:.0}/s, raw {raw_per_s:.0}/s, offered {offered_per_s:.0}/s"
    );
    // Let the broker agent catch up before timing decisions (or stop
    // waiting once it no longer gains: reports its bounded queue dropped
    // never arrive).
    let published = fleet.counters.reports.load(Ordering::Relaxed) as f64;
    let _ = wait_settled(
        port,
        REPORTS,
        published - m1.sum(REFUSED),
        Duration::from_secs(120),
    )
    .await;

    // Paced reports from here on.
    let pace = {
        let f = fleet.clone();
        let s = stop_all.clone();
        let iv = args.interval;
        tokio::spawn(async move { f.pace(iv, s).await })
    };

    // 3. decisions: districts 0.. (one each), the last district kept for the real node.
    let n_dec = args.decisions.min(districts.len().saturating_sub(2) / 2);
    let per = args.per_district;
    let h0 = bench_proc::scrape(port).await?.buckets(LATENCY);
    let mut e2e = vec![];
    let mut missed = 0;
    for (k, district) in districts.iter().take(n_dec).enumerate() {
        let nodes: Vec<usize> = (k * per..((k + 1) * per).min(spec.nodes)).collect();
        let (last, rest) = nodes.split_last().context("empty district")?;
        // Just under DISTRICT_THRESHOLD (90 %): 49 nodes at 90 % and one at 40 %.
        for &i in rest {
            fleet.set_load(i, 90, 90);
        }
        fleet.set_load(*last, 40, 40);
        fleet.report_all(&nodes, 64).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        while decisions_sub
            .next_timeout(Duration::from_millis(1))
            .await
            .is_ok()
        {}
        // The crossing report.
        fleet.set_load(*last, 100, 100);
        fleet.report(*last).await;
        let sent = Instant::now();
        let deadline = sent + Duration::from_secs(10);
        let mut got = false;
        while Instant::now() < deadline {
            let Ok(Some(d)) = decisions_sub
                .next_timeout(deadline.saturating_duration_since(Instant::now()))
                .await
            else {
                break;
            };
            if let Ok(dec) = Envelope::decode(&d.payload)
                && let Message::Decision(x) = dec.envelope.msg
                && x.decision == DecisionKind::ScaleUp
                && &x.district == district
            {
                e2e.push(sent.elapsed().as_secs_f64() * 1000.0);
                got = true;
                break;
            }
        }
        if !got {
            missed += 1;
        }
    }
    let h1 = bench_proc::scrape(port).await?.buckets(LATENCY);
    let p = |q| bucket_quantile(&h0, &h1, q).map(|s| s * 1000.0);
    let (decision_p50_ms, decision_p99_ms) = (p(0.5), p(0.99));
    eprintln!(
        "bench: {} decisions, p50 <= {decision_p50_ms:?} ms, p99 <= {decision_p99_ms:?} ms",
        e2e.len()
    );

    // 5a. the real node (started before the drain, measured idle after it).
    let mut node_proc = None;
    let real_district = districts.last().cloned().context("no district")?;
    let real_profile = spec.profiles[(districts.len() - 1) % spec.profiles.len()].clone();
    if let Some(bin) = &node_bin {
        // The dir runtime copies into its targets' gear directories.
        for i in (districts.len() - 1) * per..spec.nodes {
            let t = crate::lite::node_name(&tag, i);
            std::fs::create_dir_all(dir.join("real-node/targets").join(t).join("gears"))?;
        }
        let p = start_real_node(
            bin,
            &dir,
            &args.bus,
            &real_node,
            &real_node_key,
            &keys,
            &real_district,
            &real_profile,
        )?;
        node_proc = Some(p);
    }
    let node_started = Instant::now();

    // 4. drain: every district but the decision ones and the real node's.
    let drain_districts: Vec<usize> = (n_dec..districts.len() - 1).collect();
    let mut drain_nodes = vec![];
    for d in &drain_districts {
        for i in d * per..((d + 1) * per).min(spec.nodes) {
            fleet.set_load(i, 20, 20);
            drain_nodes.push(i);
        }
    }
    fleet.reset_move_window();
    let drained0 = fleet.counters.drained.load(Ordering::Relaxed);
    let gears_before = fleet.total_gears();
    fleet.report_all(&drain_nodes, 512).await;
    let drain_end = Instant::now() + args.drain_window;
    let mut max_draining = 0;
    while Instant::now() < drain_end {
        tokio::time::sleep(Duration::from_millis(500)).await;
        max_draining = max_draining.max(fleet.inactive());
    }
    let (span, moves) = fleet.move_window();
    let moves_per_s = if span.is_zero() {
        0.0
    } else {
        moves as f64 / span.as_secs_f64()
    };
    let drains = fleet.counters.drained.load(Ordering::Relaxed) - drained0;
    let gears_after = fleet.total_gears();
    if gears_before != gears_after {
        bail!(
            "the lite fleet lost or gained gears: {gears_before} before the drain, {gears_after} after"
        );
    }
    eprintln!("bench: drain {moves} moves, {moves_per_s:.0}/s, {drains} nodes emptied");

    // 5b. the real node: idle, then evacuated.
    let mut node_rss_idle_mb = None;
    let mut node_rss_anon_idle_mb = None;
    let mut node_rss_evacuation_mb = None;
    let mut node_moved = None;
    if let Some(np) = node_proc.as_mut() {
        let idle_for = Duration::from_secs(10).saturating_sub(node_started.elapsed());
        tokio::time::sleep(idle_for).await;
        if !np.running() {
            bail!("gearshift-node exited:\n{}", np.log_tail(30));
        }
        node_rss_idle_mb = np.rss_mb();
        node_rss_anon_idle_mb = np.pid().and_then(bench_proc::rss_anon_mb);
        let (rss_evac, moved) =
            evacuate_real_node(np, &control, &op, &cfg.agent.admin_key, &real_node, &dir).await?;
        node_rss_evacuation_mb = Some(rss_evac);
        node_moved = Some(moved);
    }

    let refused: BTreeMap<String, f64> = bench_proc::scrape(port)
        .await
        .map(|m| {
            m.samples
                .iter()
                .filter_map(|(k, v)| {
                    let label = k.strip_prefix(REFUSED)?.strip_prefix("{reason=\"")?;
                    Some((label.trim_end_matches("\"}").to_string(), *v))
                })
                .collect()
        })
        .unwrap_or_default();
    stop_all.cancel();
    let _ = pace.await;
    cmd_task.abort();
    let broker_rss_mb = rss.peak_mb();
    if let Some(mut np) = node_proc {
        np.terminate(Duration::from_secs(5));
    }
    broker.terminate(Duration::from_secs(10));
    raw.stop();
    cleanup_queues(&args.bus, &cfg, &[routing::node_queue(&real_node)]).await;

    let node_rss_mb = match (node_rss_idle_mb, node_rss_evacuation_mb) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut e2e2 = e2e.clone();
    Ok(BenchReport {
        nodes: spec.nodes,
        districts: districts.len(),
        connections: args.connections,
        reports_per_s: round1(reports_per_s),
        raw_per_s: round1(raw_per_s),
        ratio: if raw_per_s > 0.0 {
            (reports_per_s / raw_per_s * 1000.0).round() / 1000.0
        } else {
            0.0
        },
        offered_per_s: round1(offered_per_s),
        broker_lag_start: lag_start,
        broker_lag_end: lag_end,
        report_bytes,
        window_s: round1(secs),
        broker_cpu_pct: round1(broker_cpu_pct),
        broker_us_per_report: round1(broker_us_per_report),
        refused,
        decisions: e2e.len(),
        decision_p50_ms,
        decision_p99_ms,
        decision_e2e_p50_ms: quantile(&mut e2e2, 0.5).map(round1),
        decision_e2e_p99_ms: quantile(&mut e2e2, 0.99).map(round1),
        decisions_missed: missed,
        broker_rss_mb: round1(broker_rss_mb),
        broker_rss_after_ingest_mb: round1(rss_after_ingest),
        moves_per_s: round1(moves_per_s),
        moves_per_s_window: round1(moves as f64 / args.drain_window.as_secs_f64().max(0.001)),
        moves,
        drains,
        max_draining,
        node_rss_idle_mb: node_rss_idle_mb.map(round1),
        node_rss_evacuation_mb: node_rss_evacuation_mb.map(round1),
        node_rss_mb: node_rss_mb.map(round1),
        node_rss_anon_idle_mb: node_rss_anon_idle_mb.map(round1),
        node_moved,
        machine: Some(machine),
        elapsed_s: round1(started.elapsed().as_secs_f64()),
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A run directory under the system's temporary directory, removed on drop
/// unless kept.
pub struct RunDir {
    /// Its path.
    pub path: PathBuf,
    keep: bool,
}

impl RunDir {
    /// Keeps the directory.
    pub fn keep(mut self) {
        self.keep = true;
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// A fresh run directory.
pub fn tempfile_dir() -> anyhow::Result<RunDir> {
    let path = std::env::temp_dir().join(format!(
        "gearshift-sim-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ));
    std::fs::create_dir_all(&path)?;
    Ok(RunDir { path, keep: false })
}

/// Waits until the broker agent answers a status request.
pub async fn wait_ready(
    bus: &SharedBus,
    op: &OperatorKeys,
    admin_key: &str,
    broker: &mut Proc,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if !broker.running() {
            bail!("gearshift-broker exited:\n{}", broker.log_tail(30));
        }
        let r = gearshift_broker::cli::admin_on(
            bus,
            op,
            "gearshift-sim",
            admin_key,
            AdminRequest::Status,
            Duration::from_secs(2),
        )
        .await;
        if matches!(r, Ok(ref x) if x.ok) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the broker agent did not answer within 120 s: {r:?}\n{}",
                broker.log_tail(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

enum Settled {
    Reached,
    /// The figure stopped growing (for 3 s) at this value.
    Stalled(f64),
}

/// Polls metric `name` until it reaches `at_least`, or returns once it has
/// not grown for 3 s; fails after `within`.
async fn wait_settled(
    port: u16,
    name: &str,
    at_least: f64,
    within: Duration,
) -> anyhow::Result<Settled> {
    let deadline = Instant::now() + within;
    let (mut last, mut since) = (-1.0, Instant::now());
    loop {
        let v = bench_proc::scrape(port)
            .await
            .map(|m| m.get(name))
            .unwrap_or(0.0);
        if v >= at_least {
            return Ok(Settled::Reached);
        }
        if v > last {
            (last, since) = (v, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(3) {
            return Ok(Settled::Stalled(v));
        }
        if Instant::now() >= deadline {
            bail!("{name} reached {v}, not {at_least}, within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[allow(clippy::too_many_arguments)]
fn start_real_node(
    bin: &Path,
    dir: &Path,
    url: &str,
    name: &str,
    key: &KeyPair,
    keys: &RunKeys,
    district: &str,
    profile: &str,
) -> anyhow::Result<Proc> {
    use gearshift_node::config::{NodeConfig, RuntimeKind};
    let base = dir.join("real-node");
    let gears = base.join("gears");
    std::fs::create_dir_all(&gears)?;
    for k in 0..100 {
        let g = gears.join(format!("real{k:04}"));
        std::fs::create_dir_all(&g)?;
        std::fs::write(g.join("data"), format!("gear {k}\n").repeat(64))?;
    }
    write_private(&base.join("node.key"), &key.to_pem())?;
    let mut c = NodeConfig::default();
    c.node.name = Some(name.to_string());
    c.bus.url = url.to_string();
    c.keys.signing_key = base.join("node.key");
    c.keys.broker_keys = vec![keys.dir.join("broker.pub")];
    c.state.dir = base.join("state");
    c.report.interval = Duration::from_secs(10);
    c.runtime.kind = RuntimeKind::Dir;
    c.runtime.facts.profile = profile.to_string();
    c.runtime.facts.max_active_gears = 100;
    c.runtime.facts.district_uuid = Some(district.to_string());
    c.runtime.facts.district_first_uid = Some(1000);
    c.runtime.facts.district_max_uid = Some(1000 + 50_000 - 1);
    c.runtime.dir.root = gears;
    c.runtime.dir.target_root = format!("{}/targets/{{target}}/gears", base.display());
    c.log.level = "warn".into();
    let text = toml::to_string(&c).context("node configuration")?;
    let path = base.join("node.toml");
    std::fs::write(&path, text)?;
    let mut p = Proc::new(
        "gearshift-node",
        bin,
        &["run", "--config", &path.to_string_lossy()],
        &base.join("node.log"),
    );
    // The environment the packaged systemd unit gives the agent.
    for (k, v) in unit_environment(NODE_UNIT) {
        p = p.env(&k, &v);
    }
    p.start()?;
    Ok(p)
}

/// The node agent's systemd unit, as packaged.
const NODE_UNIT: &str = include_str!("../../packaging/systemd/gearshift-node.service");

/// The `Environment=` assignments of a systemd unit, in order: `KEY=value`
/// words separated by spaces, a word in double quotes may hold spaces.
fn unit_environment(unit: &str) -> Vec<(String, String)> {
    let mut out = vec![];
    for line in unit.lines() {
        let Some(rest) = line.trim().strip_prefix("Environment=") else {
            continue;
        };
        let mut words = vec![String::new()];
        let mut quoted = false;
        for c in rest.chars() {
            match c {
                '"' => quoted = !quoted,
                c if c.is_whitespace() && !quoted => words.push(String::new()),
                c => words.last_mut().into_iter().for_each(|w| w.push(c)),
            }
        }
        out.extend(words.iter().filter_map(|w| {
            let (k, v) = w.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        }));
    }
    out
}

/// Asks the broker agent to evacuate the real node and samples its memory
/// every 20 ms until its gear directory is empty. (peak MiB, gears moved)
async fn evacuate_real_node(
    np: &mut Proc,
    bus: &SharedBus,
    op: &OperatorKeys,
    admin_key: &str,
    node: &str,
    dir: &Path,
) -> anyhow::Result<(f64, usize)> {
    let gears = dir.join("real-node/gears");
    let count = || {
        std::fs::read_dir(&gears)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                    .count()
            })
            .unwrap_or(0)
    };
    let before = count();
    let r = gearshift_broker::cli::admin_on(
        bus,
        op,
        "gearshift-sim",
        admin_key,
        AdminRequest::Evacuate {
            node: node.to_string(),
        },
        Duration::from_secs(10),
    )
    .await
    .context("evacuate request")?;
    if !r.ok {
        bail!("the broker agent refused to evacuate {node}: {}", r.message);
    }
    let mut peak = np.rss_mb().unwrap_or(0.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while count() > 0 {
        if Instant::now() >= deadline {
            bail!(
                "{node} still holds {} gears after 120 s:\n{}",
                count(),
                np.log_tail(30)
            );
        }
        if let Some(m) = np.rss_mb() {
            peak = peak.max(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A little longer: the final events and report.
    for _ in 0..25 {
        if let Some(m) = np.rss_mb() {
            peak = peak.max(m);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((peak, before))
}

/// Deletes the durable queues a run declared.
pub async fn cleanup_queues(url: &str, cfg: &BrokerConfig, extra: &[String]) {
    let r = async {
        let conn = lapin::Connection::connect(url, lapin::ConnectionProperties::default()).await?;
        let ch = conn.create_channel().await?;
        for q in [&cfg.agent.events_queue, &cfg.agent.admin_queue]
            .into_iter()
            .chain(extra)
        {
            let _ = ch
                .queue_delete(
                    q.as_str().into(),
                    lapin::options::QueueDeleteOptions::default(),
                )
                .await;
        }
        let _ = conn.close(200, "done".into()).await;
        Ok::<_, lapin::Error>(())
    };
    if let Err(e) = tokio::time::timeout(Duration::from_secs(10), r).await {
        tracing::warn!(error = %e, "cannot delete the run's queues");
    }
}

/// `gearshift-sim bench`: runs the benchmark and prints its figures.
pub fn main(args: BenchArgs) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gearshift-sim bench: cannot start the runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let json = args.json;
    match rt.block_on(run(args)) {
        Ok(r) => {
            if json {
                println!("{}", serde_json::to_string(&r).unwrap_or_default());
            } else {
                print!("{}", r.render());
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gearshift-sim bench: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_node_runs_with_its_units_environment() {
        let unit =
            "[Service]\nEnvironment=A=1 \"B=x y\"\nEnvironmentFile=-/etc/x\n  Environment=C=3\n";
        let pairs = |v: &[(&str, &str)]| -> Vec<(String, String)> {
            v.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(
            super::unit_environment(unit),
            pairs(&[("A", "1"), ("B", "x y"), ("C", "3")])
        );
        assert!(
            super::unit_environment(super::NODE_UNIT)
                .iter()
                .any(|(k, v)| k == "MALLOC_ARENA_MAX" && v == "1"),
            "the packaged unit sets MALLOC_ARENA_MAX"
        );
    }
}
