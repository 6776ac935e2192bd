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
//!    a warm-up, the broker agent's handled-report counters (its own
//!    Prometheus metrics: accepted and superseded) and the raw consumer's
//!    count are read at both ends of a steady window: `reports_per_s`,
//!    `raw_per_s`, `ratio`. With `--rate-interval` (realistic rate) every
//!    node reports once per that interval instead, spread evenly, and the
//!    window gives the broker agent's CPU share at that rate; phases 4 and
//!    5 are skipped.
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

//!
//! ## Layout
//! - `phases`: the run, phase by phase.
//! - `probes`: the raw consumer, the memory sampler, settled metrics.
//! - `real_node`: the real `gearshift-node` and its evacuation.

mod phases;
mod probes;
mod real_node;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::harness::metrics::Machine;
use crate::harness::{process, scenario};

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
    /// Realistic rate instead of the flood: every node reports once per
    /// this interval (announced as its report interval), spread evenly,
    /// plus the threshold crossings; the window measures the broker's CPU
    /// share at that rate. No drain phase and no real node in this mode.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub rate_interval: Option<Duration>,
    /// The broker agent's `policy.interval` (its periodic evaluation of
    /// every group; a threshold crossing is evaluated at once whatever it
    /// is). Default: 1 s in the flood mode, the agent's own default (60 s)
    /// at a realistic rate.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub policy_interval: Option<Duration>,
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
    /// `flood`, or `rate` (`--rate-interval`).
    pub mode: String,
    /// The report interval of the realistic-rate mode, s.
    pub rate_interval_s: Option<f64>,
    /// The broker agent's `policy.interval`, s.
    pub policy_interval_s: f64,
    /// Reports per second the broker agent handled in the ingest window:
    /// accepted, or superseded by a newer one of the same node in the same
    /// batch (dropped unverified).
    pub reports_per_s: f64,
    /// Of `reports_per_s`, the superseded ones.
    pub superseded_per_s: f64,
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
            "nodes {} in {} districts, {} connections, {} mode\n\
             ingest: broker {:.0}/s ({:.0}/s superseded), raw consumer {:.0}/s, ratio {:.3} (offered {:.0}/s, {} B/report, {:.0} s window; broker CPU {:.1} % of a core, {:.1} µs/report)\n\
             decisions: {} timed, p50 <= {}, p99 <= {} (bus to bus: p50 {}, p99 {}), {} missed\n\
             broker RSS: peak {:.1} MiB, after ingest {:.1} MiB\n\
             drain: {} gears moved, {:.0} moves/s, {} nodes emptied, up to {} draining at once\n\
             node RSS: idle {}, evacuating {} ({} gears moved)\n",
            self.nodes,
            self.districts,
            self.connections,
            self.mode,
            self.reports_per_s,
            self.superseded_per_s,
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

/// Runs the benchmark.
pub async fn run(args: BenchArgs) -> anyhow::Result<BenchReport> {
    if args.nodes < args.per_district * 3 {
        anyhow::bail!(
            "--nodes {} is too small: at least 3 districts of --per-district {} are needed",
            args.nodes,
            args.per_district
        );
    }
    let started = Instant::now();
    let machine = Machine::probe();
    let broker_bin = process::sibling_binary(args.broker_bin.as_deref(), "gearshift-broker")?;
    let node_bin = if args.no_node {
        None
    } else {
        Some(process::sibling_binary(
            args.node_bin.as_deref(),
            "gearshift-node",
        )?)
    };
    let tmp = scenario::run_dir()?;
    eprintln!("bench: run directory {}", tmp.path().display());
    let keep = args.keep;
    let r = phases::run_in(args, tmp.path(), &broker_bin, node_bin.as_deref()).await;
    if keep || r.is_err() {
        eprintln!("bench: run directory kept: {}", tmp.keep().display());
    }
    let mut report = r?;
    report.machine = Some(machine);
    report.elapsed_s = scenario::round1(started.elapsed().as_secs_f64());
    Ok(report)
}

/// `gearshift-sim bench`: runs the benchmark and prints its figures (exit
/// status 1 when it could not run).
pub fn main(args: BenchArgs) -> ExitCode {
    let rt = match scenario::runtime("bench", 1) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let json = args.json;
    match rt.block_on(run(args)) {
        Ok(r) => {
            scenario::emit("bench", json, &r, || r.render());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gearshift-sim bench: {e:#}");
            ExitCode::from(1)
        }
    }
}
