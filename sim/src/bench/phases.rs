//! The benchmark run, phase by phase (see the module doc of
//! [`crate::bench`]): each phase is a method of [`Bench`] returning its
//! figures, and [`run_in`] puts them into the report.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gearshift_bus::Subscription;
use gearshift_proto::msg::{DecisionKind, Message};
use gearshift_proto::{Envelope, KeyPair, routing};
use tokio_util::sync::CancellationToken;

use super::probes::{RawConsumer, RssSampler, Settled, wait_settled};
use super::real_node::{RealNode, evacuate_real_node, start_real_node};
use super::{BenchArgs, BenchReport};
use crate::fleet::Keys;
use crate::harness::broker::{BrokerProc, process_config};
use crate::harness::bus;
use crate::harness::metrics::{self, bucket_quantile, quantile};
use crate::harness::process::{self, Proc};
use crate::harness::scenario::round1;
use crate::lite::{LiteFleet, LiteSpec};

const LATENCY: &str = "gearshift_broker_decision_latency_seconds";
const REPORTS: &str = "gearshift_broker_reports_total";
const SUPERSEDED: &str = "gearshift_broker_reports_superseded_total";
const NODES: &str = "gearshift_broker_nodes";
const REFUSED: &str = "gearshift_broker_refused_total";

/// One run's fleet, broker agent and probes.
struct Bench {
    args: BenchArgs,
    dir: PathBuf,
    tag: String,
    spec: LiteSpec,
    keys: Keys,
    port: u16,
    fleet: Arc<LiteFleet>,
    districts: Vec<String>,
    broker: BrokerProc,
    broker_pid: u32,
    rss: RssSampler,
    raw: RawConsumer,
    decisions: Subscription,
    stop_all: CancellationToken,
    real_name: String,
    real_key: KeyPair,
}

/// The ingest window's figures.
struct Ingest {
    reports_per_s: f64,
    superseded_per_s: f64,
    raw_per_s: f64,
    offered_per_s: f64,
    lag_start: f64,
    lag_end: f64,
    secs: f64,
    cpu_pct: f64,
    us_per_report: f64,
    rss_after: f64,
}

/// The threshold crossings' figures.
struct Decisions {
    e2e: Vec<f64>,
    missed: usize,
    p50: Option<f64>,
    p99: Option<f64>,
}

/// The drain phase's figures.
#[derive(Default)]
struct Drain {
    moves: u64,
    moves_per_s: f64,
    drains: u64,
    max_draining: usize,
}

/// The real node's figures.
#[derive(Default)]
struct RealFigures {
    rss_idle: Option<f64>,
    rss_anon_idle: Option<f64>,
    rss_evacuation: Option<f64>,
    moved: Option<usize>,
}

/// Runs every phase in `dir`.
pub(super) async fn run_in(
    args: BenchArgs,
    dir: &Path,
    broker_bin: &Path,
    node_bin: Option<&Path>,
) -> anyhow::Result<BenchReport> {
    let mut b = Bench::start(args, dir, broker_bin).await?;
    let cmd_task = {
        let f = b.fleet.clone();
        let s = b.stop_all.clone();
        tokio::spawn(async move { f.serve_commands(s).await })
    };
    let report_bytes = b.join().await?;
    // Paced reports from the end of the flood on, or from the start in the
    // realistic-rate mode.
    let (ingest, pace) = match b.args.rate_interval {
        Some(iv) => {
            let pace = b.pace(iv);
            (b.steady().await?, pace)
        }
        None => {
            let i = b.ingest().await?;
            (i, b.pace(b.args.interval))
        }
    };
    let decisions = b.decisions().await?;
    let rate_mode = b.args.rate_interval.is_some();
    let node_bin = node_bin.filter(|_| !rate_mode);
    let mut node_proc = match node_bin {
        Some(bin) => Some(b.start_real_node(bin)?),
        None => None,
    };
    let node_started = Instant::now();
    let drain = if rate_mode {
        Drain::default()
    } else {
        b.drain().await?
    };
    let real = match node_proc.as_mut() {
        Some(np) => b.measure_real_node(np, node_started).await?,
        None => RealFigures::default(),
    };
    let refused = refused(b.port).await;
    b.stop_all.cancel();
    let _ = pace.await;
    cmd_task.abort();
    let broker_rss_mb = b.rss.peak_mb();
    if let Some(mut np) = node_proc {
        np.terminate(Duration::from_secs(5));
    }
    b.stop().await;
    let mut r = report(&b, report_bytes, ingest, decisions, drain, real);
    r.broker_rss_mb = round1(broker_rss_mb);
    r.refused = refused;
    Ok(r)
}

/// `--policy-interval`, or at a realistic rate the agent's own default (the
/// flood keeps [`process_config`]'s 1 s).
fn policy_interval(args: &BenchArgs) -> Option<Duration> {
    args.policy_interval.or_else(|| {
        args.rate_interval.map(|_| {
            gearshift_broker::config::BrokerConfig::defaults()
                .policy
                .interval
        })
    })
}

/// The lite fleet's shape for `args`.
fn lite_spec(args: &BenchArgs, tag: &str) -> LiteSpec {
    LiteSpec {
        nodes: args.nodes,
        per_district: args.per_district,
        profiles: (0..args.profiles.max(1)).map(|p| format!("p{p}")).collect(),
        max_active: 100,
        gears: 60,
        interval: args.rate_interval.unwrap_or(args.interval),
        tag: tag.to_string(),
    }
}

impl Bench {
    /// Keys and configuration; the fleet's connections, the raw consumer
    /// and a decision watcher; the broker agent, started and answering.
    async fn start(args: BenchArgs, dir: &Path, broker_bin: &Path) -> anyhow::Result<Bench> {
        let tag = format!("b{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let keys = Keys::generate(&dir.join("keys"))?;
        let spec = lite_spec(&args, &tag);
        for i in 0..spec.nodes {
            keys.trust_node(
                &crate::lite::node_name(&tag, i),
                &crate::lite::node_key(&tag, i),
            )?;
        }
        let real_key = KeyPair::generate()?;
        let real_name = format!("{tag}-real");
        keys.trust_node(&real_name, &real_key)?;
        let port = metrics::free_port()?;
        let mut cfg = process_config(&args.bus, dir, &keys, &tag, port);
        if let Some(every) = policy_interval(&args) {
            cfg.policy.interval = every;
        }
        let buses = bus::connect_many(&args.bus, args.connections, "gearshift-sim bench").await?;
        let control = bus::connect(&args.bus, "gearshift-sim bench control 0").await?;
        let fleet = LiteFleet::new(spec.clone(), buses, keys.broker_only());
        let raw = RawConsumer::start(&args.bus, format!("report.{tag}-")).await?;
        let decisions = control.subscribe(routing::ALL_DECISIONS).await?;
        let op = keys.operator_keys();
        let mut broker = BrokerProc::new(broker_bin, cfg, dir, control, op, "gearshift-sim")?;
        broker.proc.start()?;
        let broker_pid = broker.proc.pid().context("broker pid")?;
        let rss = RssSampler::start(broker_pid, Duration::from_millis(250));
        broker.wait_ready().await?;
        eprintln!("bench: broker agent ready (pid {broker_pid})");
        Ok(Bench {
            districts: fleet.districts(),
            args,
            dir: dir.to_path_buf(),
            tag,
            spec,
            keys,
            port,
            fleet,
            broker,
            broker_pid,
            rss,
            raw,
            decisions,
            stop_all: CancellationToken::new(),
            real_name,
            real_key,
        })
    }

    /// Phase 1, join: every node reports; the broker agent's report queue is
    /// bounded (`report_backlog`), so when it falls behind the oldest
    /// reports are dropped and their nodes report again in the next round,
    /// as their periodic reports would. Returns the size of one report.
    async fn join(&self) -> anyhow::Result<usize> {
        let all: Vec<usize> = (0..self.spec.nodes).collect();
        let t = Instant::now();
        let mut round = 0;
        loop {
            round += 1;
            self.fleet.report_all(&all, 512).await;
            let want = self.spec.nodes as f64;
            match wait_settled(self.port, NODES, want, Duration::from_secs(120)).await? {
                Settled::Reached => break,
                Settled::Stalled(v) if round < 5 => {
                    eprintln!("bench: join round {round}: the broker agent knows {v} nodes; again")
                }
                Settled::Stalled(v) => {
                    bail!(
                        "after {round} rounds the broker agent knows {v} of {} nodes",
                        self.spec.nodes
                    )
                }
            }
        }
        eprintln!(
            "bench: {} nodes joined in {:.1} s",
            self.spec.nodes,
            t.elapsed().as_secs_f64()
        );
        Ok(self.fleet.report_message(0).payload.len())
    }

    /// Phase 2, ingest: the fleet floods; after the warm-up, the broker agent's
    /// accepted reports and the raw consumer's count over the window. Then
    /// lets the broker agent catch up (or stops waiting once it no longer
    /// gains: reports its bounded queue dropped never arrive).
    async fn ingest(&self) -> anyhow::Result<Ingest> {
        let flood_stop = CancellationToken::new();
        let flood = {
            let f = self.fleet.clone();
            let s = flood_stop.clone();
            let (per, rate) = (self.args.publishers, self.args.rate);
            tokio::spawn(async move { f.flood(per, rate, s).await })
        };
        tokio::time::sleep(self.args.warmup).await;
        let (i, m1) = self.window().await?;
        flood_stop.cancel();
        let _ = flood.await;
        let published = self.fleet.counters.reports.load(Ordering::Relaxed);
        let want = published as f64 - m1.sum(REFUSED);
        let _ = wait_settled(self.port, REPORTS, want, Duration::from_secs(120)).await;
        Ok(i)
    }

    /// Phase 2 of the realistic-rate mode: the paced fleet's reports, after
    /// the warm-up, over the window (the broker agent's CPU share at the
    /// rate a fleet of this size offers).
    async fn steady(&self) -> anyhow::Result<Ingest> {
        tokio::time::sleep(self.args.warmup).await;
        Ok(self.window().await?.0)
    }

    /// Paced reports (every node once per `interval`, spread evenly, and at
    /// once when its state changes) until the end of the run.
    fn pace(&self, interval: Duration) -> tokio::task::JoinHandle<()> {
        let f = self.fleet.clone();
        let s = self.stop_all.clone();
        tokio::spawn(async move { f.pace(interval, s).await })
    }

    /// The broker agent's handled reports, the raw consumer's count and the
    /// broker process's CPU over one window; the metrics at its end.
    async fn window(&self) -> anyhow::Result<(Ingest, metrics::Metrics)> {
        let pid = self.broker_pid;
        let published = || self.fleet.counters.reports.load(Ordering::Relaxed);
        let handled = |m: &metrics::Metrics| m.get(REPORTS) + m.get(SUPERSEDED);
        let m0 = metrics::scrape(self.port).await?;
        let cpu0 = process::cpu_seconds(pid).unwrap_or(0.0);
        let (raw0, pub0, t0) = (self.raw.count(), published(), Instant::now());
        tokio::time::sleep(self.args.window).await;
        let m1 = metrics::scrape(self.port).await?;
        let cpu1 = process::cpu_seconds(pid).unwrap_or(0.0);
        let (raw1, pub1, t1) = (self.raw.count(), published(), Instant::now());
        let secs = (t1 - t0).as_secs_f64();
        let reports_per_s = (handled(&m1) - handled(&m0)) / secs;
        let i = Ingest {
            reports_per_s,
            superseded_per_s: (m1.get(SUPERSEDED) - m0.get(SUPERSEDED)) / secs,
            raw_per_s: (raw1 - raw0) as f64 / secs,
            offered_per_s: (pub1 - pub0) as f64 / secs,
            lag_start: (pub0 as f64 - handled(&m0)).max(0.0),
            lag_end: (pub1 as f64 - handled(&m1)).max(0.0),
            secs,
            cpu_pct: (cpu1 - cpu0) / secs * 100.0,
            us_per_report: if reports_per_s > 0.0 {
                (cpu1 - cpu0) / (reports_per_s * secs) * 1e6
            } else {
                0.0
            },
            rss_after: self.broker.proc.rss_mb().unwrap_or(0.0),
        };
        eprintln!(
            "bench: ingest {:.0}/s ({:.0}/s superseded), raw {:.0}/s, offered {:.0}/s, broker CPU {:.1} %",
            i.reports_per_s, i.superseded_per_s, i.raw_per_s, i.offered_per_s, i.cpu_pct
        );
        Ok((i, m1))
    }

    /// Nodes of district `k`.
    fn district_nodes(&self, k: usize) -> Vec<usize> {
        let per = self.args.per_district;
        (k * per..((k + 1) * per).min(self.spec.nodes)).collect()
    }

    /// Phase 3, decisions: districts 0.. (one each; the last district is kept
    /// for the real node) brought just under `DISTRICT_THRESHOLD`, then
    /// one report takes each over.
    async fn decisions(&mut self) -> anyhow::Result<Decisions> {
        let n_dec = self
            .args
            .decisions
            .min(self.districts.len().saturating_sub(2) / 2);
        let h0 = metrics::scrape(self.port).await?.buckets(LATENCY);
        let mut e2e = vec![];
        let mut missed = 0;
        for k in 0..n_dec {
            match self.crossing(k).await? {
                Some(ms) => e2e.push(ms),
                None => missed += 1,
            }
        }
        let h1 = metrics::scrape(self.port).await?.buckets(LATENCY);
        let p = |q| bucket_quantile(&h0, &h1, q).map(|s| s * 1000.0);
        let (p50, p99) = (p(0.5), p(0.99));
        eprintln!(
            "bench: {} decisions, p50 <= {p50:?} ms, p99 <= {p99:?} ms",
            e2e.len()
        );
        Ok(Decisions {
            e2e,
            missed,
            p50,
            p99,
        })
    }

    /// One threshold crossing in district `k`: milliseconds from the
    /// crossing report's publication to the scale-up decision on the bus,
    /// `None` without one within 10 s.
    async fn crossing(&mut self, k: usize) -> anyhow::Result<Option<f64>> {
        let district = self.districts[k].clone();
        let nodes = self.district_nodes(k);
        let (last, rest) = nodes.split_last().context("empty district")?;
        // Just under DISTRICT_THRESHOLD (90 %): 49 nodes at 90 % and one at 40 %.
        for &i in rest {
            self.fleet.set_load(i, 90, 90);
        }
        self.fleet.set_load(*last, 40, 40);
        self.fleet.report_all(&nodes, 64).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        while self
            .decisions
            .next_timeout(Duration::from_millis(1))
            .await
            .is_ok()
        {}
        // The crossing report.
        self.fleet.set_load(*last, 100, 100);
        self.fleet.report(*last).await;
        let sent = Instant::now();
        let deadline = sent + Duration::from_secs(10);
        while Instant::now() < deadline {
            let left = deadline.saturating_duration_since(Instant::now());
            let Ok(Some(d)) = self.decisions.next_timeout(left).await else {
                break;
            };
            // Timing only: the decision's signature is not the question here.
            if let Ok(dec) = Envelope::decode(&d.payload)
                && let Message::Decision(x) = dec.envelope.msg
                && x.decision == DecisionKind::ScaleUp
                && x.district == district
            {
                return Ok(Some(sent.elapsed().as_secs_f64() * 1000.0));
            }
        }
        Ok(None)
    }

    /// Phase 5a, the real node, in the last district (started before the drain,
    /// measured idle after it).
    fn start_real_node(&self, bin: &Path) -> anyhow::Result<Proc> {
        let last = self.districts.len() - 1;
        let district = self.districts.last().cloned().context("no district")?;
        let profile = self.spec.profiles[last % self.spec.profiles.len()].clone();
        // The dir runtime copies into its targets' gear directories.
        for i in last * self.args.per_district..self.spec.nodes {
            let t = crate::lite::node_name(&self.tag, i);
            let targets = self.dir.join("real-node/targets").join(t).join("gears");
            std::fs::create_dir_all(targets)?;
        }
        let node = RealNode {
            name: &self.real_name,
            key: &self.real_key,
            district: &district,
            profile: &profile,
        };
        start_real_node(bin, &self.dir, &self.args.bus, &node, &self.keys)
    }

    /// Phase 4, drain: every district but the decision ones and the real node's
    /// falls below `COMPACT_THRESHOLD`; the broker agent drains nodes under
    /// its disruption budgets.
    async fn drain(&self) -> anyhow::Result<Drain> {
        let n_dec = self
            .args
            .decisions
            .min(self.districts.len().saturating_sub(2) / 2);
        let mut drain_nodes = vec![];
        for d in n_dec..self.districts.len() - 1 {
            for i in self.district_nodes(d) {
                self.fleet.set_load(i, 20, 20);
                drain_nodes.push(i);
            }
        }
        let fleet = &self.fleet;
        fleet.reset_move_window();
        let drained0 = fleet.counters.drained.load(Ordering::Relaxed);
        let gears_before = fleet.total_gears();
        fleet.report_all(&drain_nodes, 512).await;
        let drain_end = Instant::now() + self.args.drain_window;
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
        Ok(Drain {
            moves,
            moves_per_s,
            drains,
            max_draining,
        })
    }

    /// Phase 5b, the real node: idle (10 s after its start), then evacuated.
    async fn measure_real_node(
        &self,
        np: &mut Proc,
        started: Instant,
    ) -> anyhow::Result<RealFigures> {
        let idle_for = Duration::from_secs(10).saturating_sub(started.elapsed());
        tokio::time::sleep(idle_for).await;
        if !np.running() {
            bail!("gearshift-node exited:\n{}", np.log_tail(30));
        }
        let rss_idle = np.rss_mb();
        let rss_anon_idle = np.pid().and_then(process::rss_anon_mb);
        let (rss_evac, moved) =
            evacuate_real_node(np, &self.broker, &self.real_name, &self.dir).await?;
        Ok(RealFigures {
            rss_idle,
            rss_anon_idle,
            rss_evacuation: Some(rss_evac),
            moved: Some(moved),
        })
    }

    /// Stops the broker agent and the raw consumer, deletes the queues.
    async fn stop(&mut self) {
        self.broker.proc.terminate(Duration::from_secs(10));
        self.raw.stop();
        let mut queues = self.broker.queues();
        queues.push(routing::node_queue(&self.real_name));
        bus::cleanup_queues(&self.args.bus, &queues).await;
    }
}

/// Messages the broker agent refused, by reason.
async fn refused(port: u16) -> BTreeMap<String, f64> {
    metrics::scrape(port)
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
        .unwrap_or_default()
}

/// The report of the phases' figures.
fn report(
    b: &Bench,
    report_bytes: usize,
    i: Ingest,
    d: Decisions,
    drain: Drain,
    real: RealFigures,
) -> BenchReport {
    let node_rss_mb = match (real.rss_idle, real.rss_evacuation) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, b) => a.or(b),
    };
    let mut e2e = d.e2e.clone();
    BenchReport {
        mode: if b.args.rate_interval.is_some() {
            "rate".into()
        } else {
            "flood".into()
        },
        rate_interval_s: b.args.rate_interval.map(|d| d.as_secs_f64()),
        policy_interval_s: b.broker.cfg.policy.interval.as_secs_f64(),
        superseded_per_s: round1(i.superseded_per_s),
        nodes: b.spec.nodes,
        districts: b.districts.len(),
        connections: b.args.connections,
        reports_per_s: round1(i.reports_per_s),
        raw_per_s: round1(i.raw_per_s),
        ratio: if i.raw_per_s > 0.0 {
            (i.reports_per_s / i.raw_per_s * 1000.0).round() / 1000.0
        } else {
            0.0
        },
        offered_per_s: round1(i.offered_per_s),
        broker_lag_start: i.lag_start,
        broker_lag_end: i.lag_end,
        report_bytes,
        window_s: round1(i.secs),
        broker_cpu_pct: round1(i.cpu_pct),
        broker_us_per_report: round1(i.us_per_report),
        decisions: d.e2e.len(),
        decision_p50_ms: d.p50,
        decision_p99_ms: d.p99,
        decision_e2e_p50_ms: quantile(&mut e2e, 0.5).map(round1),
        decision_e2e_p99_ms: quantile(&mut e2e, 0.99).map(round1),
        decisions_missed: d.missed,
        broker_rss_after_ingest_mb: round1(i.rss_after),
        moves_per_s: round1(drain.moves_per_s),
        moves_per_s_window: round1(
            drain.moves as f64 / b.args.drain_window.as_secs_f64().max(0.001),
        ),
        moves: drain.moves,
        drains: drain.drains,
        max_draining: drain.max_draining,
        node_rss_idle_mb: real.rss_idle.map(round1),
        node_rss_evacuation_mb: real.rss_evacuation.map(round1),
        node_rss_mb: node_rss_mb.map(round1),
        node_rss_anon_idle_mb: real.rss_anon_idle.map(round1),
        node_moved: real.moved,
        ..BenchReport::default()
    }
}
