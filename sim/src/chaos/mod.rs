//! `gearshift-sim chaos`: a bounded fault campaign over real RabbitMQ.
//!
//! The real `gearshift-broker` binary (with the seeds' `exec` handler, whose
//! script appends every request to a file) and real `gearshift-node`
//! binaries (the `dir` runtime: gears are directories, moves copy, verify
//! and delete) run on the real bus. The campaign plays the cloud: for every
//! `create-node` it boots a node agent for that operation, for every
//! `remove-node` it stops the named one. Each round starts a saga — an
//! operator evacuation, or a scale-up caused by new gears — and injects one
//! fault at a random point of it:
//!
//! - SIGKILL of the broker agent (restarted at once);
//! - SIGKILL of the node being drained (restarted a moment later);
//! - `rabbitmqctl close_all_connections`;
//! - a bus outage: `rabbitmqctl stop_app`, a pause, `start_app` (a guard
//!   restarts the app whatever happens, also on panic).
//!
//! After every round it checks the invariants: every gear exists exactly
//! once on a live node (none lost on a removed node, none duplicated); no
//! operation asked the cloud for a node twice (nor to remove one twice);
//! every saga ended (done or aborted) before its deadline; after an outage,
//! the broker agent and every node agent were back within 5 s of the bus,
//! and no scaling decision was taken on the stale figures of the outage.
//! It prints the faults injected and the checks that held, and fails when
//! one did not.

//!
//! ## Layout
//! - `world`: the processes, the gear directories, the cloud played from
//!   the handler's request log.
//! - `rounds`: one round: saga, fault, end of the saga, inventory checks.
//! - `outage`: the bus outage and its reconnection checks.
//! - `ha`: the high-availability campaign (`--brokers 3`): three broker
//!   agents, the leader killed or cut off at random points of drains and
//!   scale-ups, failover times measured.

mod fencing;
mod ha;
mod outage;
mod rounds;
mod world;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::harness::scenario;
use world::World;

/// Options of `gearshift-sim chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// AMQP URL of the bus (RabbitMQ on this machine: the campaign runs rabbitmqctl).
    #[arg(long, env = "GEARSHIFT_BUS", default_value = crate::bench::DEFAULT_BUS)]
    pub bus: String,
    /// Rounds (each a saga and a fault); the fault kinds take turns.
    #[arg(long, default_value_t = 8)]
    pub rounds: usize,
    /// Length of the bus outage.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub outage: Duration,
    /// Seed of the random points (default: random).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// The gearshift-broker binary (default: next to this one).
    #[arg(long)]
    pub broker_bin: Option<PathBuf>,
    /// The gearshift-node binary (default: next to this one).
    #[arg(long)]
    pub node_bin: Option<PathBuf>,
    /// The rabbitmqctl program.
    #[arg(long, default_value = "rabbitmqctl")]
    pub rabbitmqctl: String,
    /// Keep the run's directory.
    #[arg(long)]
    pub keep: bool,
    /// Broker agents: with more than one, the high-availability campaign
    /// (`ha.rs`): the leader SIGKILLed twice per round, or killed once and
    /// its connection closed, during drains and scale-ups.
    #[arg(long, default_value_t = 1)]
    pub brokers: usize,
}

impl ChaosArgs {
    /// Defaults with these rounds and outage (for tests).
    pub fn bounded(bus: &str, rounds: usize, outage: Duration) -> ChaosArgs {
        ChaosArgs {
            bus: bus.to_string(),
            rounds,
            outage,
            seed: None,
            json: false,
            broker_bin: None,
            node_bin: None,
            rabbitmqctl: "rabbitmqctl".into(),
            keep: false,
            brokers: 1,
        }
    }
}

/// The fault kinds, in the order rounds take them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL of the broker agent during a drain.
    KillBrokerDrain,
    /// SIGKILL of the node being drained.
    KillNode,
    /// `rabbitmqctl close_all_connections` during a drain.
    CloseConnections,
    /// SIGKILL of the broker agent during a scale-up.
    KillBrokerScaleUp,
    /// `stop_app`, a pause, `start_app`.
    Outage,
}

const FAULTS: [Fault; 5] = [
    Fault::KillBrokerDrain,
    Fault::KillNode,
    Fault::CloseConnections,
    Fault::Outage,
    Fault::KillBrokerScaleUp,
];

/// One invariant check.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Round.
    pub round: usize,
    /// Which invariant.
    pub name: String,
    /// Whether it held.
    pub ok: bool,
    /// Details.
    pub detail: String,
}

/// The campaign's outcome.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosReport {
    /// Rounds played.
    pub rounds: usize,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Faults injected in all.
    pub faults_injected: usize,
    /// Checks made.
    pub checks: usize,
    /// Checks that held.
    pub checks_held: usize,
    /// Every check.
    pub details: Vec<Check>,
    /// Seed of the random points.
    pub seed: u64,
    /// Wall time, s.
    pub elapsed_s: f64,
    /// Failover times (high-availability campaign): from the leader's
    /// SIGKILL or closed connection to the next leader's first
    /// announcement, in ms.
    pub failover_ms: Vec<u64>,
}

impl ChaosReport {
    /// Records one check (and says so on stderr when it failed).
    pub fn check(&mut self, round: usize, name: &str, ok: bool, detail: String) {
        if !ok {
            eprintln!("chaos: round {round}: {name} FAILED: {detail}");
        }
        self.checks += 1;
        self.checks_held += usize::from(ok);
        self.details.push(Check {
            round,
            name: name.into(),
            ok,
            detail,
        });
    }

    /// Whether every check held.
    pub fn ok(&self) -> bool {
        self.checks > 0 && self.checks == self.checks_held
    }

    /// A readable summary.
    pub fn render(&self) -> String {
        let mut s = String::new();
        for c in &self.details {
            s.push_str(&format!(
                "round {:>2} {:<4} {:<28} {}\n",
                c.round,
                if c.ok { "ok" } else { "FAIL" },
                c.name,
                c.detail
            ));
        }
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        s.push_str(&format!(
            "{} rounds, {} faults injected ({}), {} of {} invariant checks held, {:.0} s\n",
            self.rounds,
            self.faults_injected,
            faults.join(", "),
            self.checks_held,
            self.checks,
            self.elapsed_s
        ));
        if !self.failover_ms.is_empty() {
            let mut v: Vec<f64> = self.failover_ms.iter().map(|&x| x as f64).collect();
            let p50 = crate::harness::metrics::quantile(&mut v, 0.5).unwrap_or(0.0);
            let max = self.failover_ms.iter().max().copied().unwrap_or(0);
            s.push_str(&format!(
                "{} failovers: p50 {p50:.0} ms, max {max} ms\n",
                self.failover_ms.len()
            ));
        }
        s
    }
}

/// Runs the campaign.
pub async fn run(args: ChaosArgs) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let tmp = scenario::run_dir()?;
    let tag = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    eprintln!("chaos: run directory {}, seed {seed}", tmp.path().display());
    let (mut w, mut watch) = World::start(&args, tmp.path(), &tag).await?;
    let mut report = ChaosReport {
        seed,
        ..Default::default()
    };
    let result = match w.boot_initial().await {
        Ok(()) if args.brokers > 1 => ha::campaign(&args, &mut w, &mut rng, &mut report).await,
        Ok(()) => rounds::campaign(&args, &mut w, &mut rng, &mut report, &mut watch).await,
        Err(e) => Err(e),
    };
    // Stop everything, then judge.
    w.stop().await;
    if args.keep || result.is_err() || !report.ok() {
        eprintln!("chaos: run directory kept: {}", tmp.keep().display());
    }
    result?;
    report.elapsed_s = scenario::round1(started.elapsed().as_secs_f64());
    Ok(report)
}

/// `gearshift-sim chaos`: runs the campaign and prints its outcome (exit
/// status 0 when every check held, 1 when one did not, 2 when it could not
/// run).
pub fn main(args: ChaosArgs) -> ExitCode {
    let rt = match scenario::runtime("chaos", 1) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let json = args.json;
    match rt.block_on(run(args)) {
        Ok(r) => {
            scenario::emit("chaos", json, &r, || r.render());
            if r.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("gearshift-sim chaos: {e:#}");
            ExitCode::from(2)
        }
    }
}
