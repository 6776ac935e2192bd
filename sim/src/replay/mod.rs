//! `gearshift-sim replay`: what a broker configuration would have done.
//!
//! The broker agent's own machines (the policy, the scale-up operations,
//! the scale-down sagas, exhaustion, and the placement engine as evacuation
//! planner) run in virtual time against a trace of node reports: one the
//! agent recorded (`[trace] record = true`, format in
//! [`gearshift_broker::trace`]) or one generated from a small workload
//! description ([`workload`]). The nodes answer commands with the node
//! agent's own decisions, a simulated cloud boots and deletes nodes
//! ([`world`]). The replay prints (or, with `--json`, emits) every decision,
//! the nodes booted and removed, the peak usage of each group, and what the
//! replay cost. Run it with two configurations to compare them before
//! deploying one (docs/replay.md).
//!
//! ## Layout
//! - [`engine`]: the loop in virtual time around the core.
//! - [`world`]: the nodes and the cloud.
//! - [`workload`]: synthetic traces.
//! - [`outcome`]: the result and its rendering.

pub mod engine;
pub mod outcome;
pub mod workload;
pub mod world;

use std::path::PathBuf;
use std::process::ExitCode;

pub use engine::{ReplayOptions, replay};
pub use outcome::Outcome;

use crate::harness::scenario;

/// Lines a recorded trace may hold (a week of 1,000 nodes reporting every minute).
pub const MAX_TRACE_LINES: u64 = 10_080_000;

/// `gearshift-sim replay` options.
#[derive(clap::Args, Debug, Clone)]
pub struct ReplayArgs {
    /// The broker agent's configuration to try (conf/broker.toml's format).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// A trace the broker agent recorded (`[trace] record = true`).
    #[arg(
        long,
        value_name = "FILE",
        conflicts_with = "workload",
        required_unless_present = "workload"
    )]
    pub trace: Option<PathBuf>,
    /// A workload description (TOML, or JSON ending in .json) to generate the trace from.
    #[arg(long, value_name = "FILE")]
    pub workload: Option<PathBuf>,
    /// From a create request to the new node's first report.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    pub boot_delay: std::time::Duration,
    /// max_active_gears of the nodes the replay boots (default: the group's largest).
    #[arg(long)]
    pub max_active: Option<u32>,
    /// Virtual time the replay goes on after the last report for operations to finish.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub settle: std::time::Duration,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `gearshift-sim replay`: exit status 0, 2 for a bad configuration,
/// trace or description, 1 otherwise.
pub fn main(args: ReplayArgs) -> ExitCode {
    match run(&args) {
        Ok(o) => {
            if scenario::emit("replay", args.json, &o, || o.render()) {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("gearshift-sim replay: {e}");
            ExitCode::from(2)
        }
    }
}

/// Loads what `args` name and replays.
pub fn run(args: &ReplayArgs) -> Result<Outcome, String> {
    let cfg = gearshift_broker::config::load(&args.config).map_err(|e| e.to_string())?;
    let dur =
        |d: std::time::Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::days(1));
    let mut opts = ReplayOptions::default();
    opts.cloud.boot_delay = dur(args.boot_delay);
    opts.cloud.max_active = args.max_active;
    opts.settle = dur(args.settle);
    match (&args.trace, &args.workload) {
        (Some(t), _) => {
            let reader =
                gearshift_broker::trace::open(t, MAX_TRACE_LINES).map_err(|e| e.to_string())?;
            replay(cfg, reader, &opts).map_err(|e| format!("{}: {e}", t.display()))
        }
        (None, Some(w)) => {
            let w = workload::Workload::load(w)?;
            opts.cloud.report_interval = dur(w.report_interval);
            replay(cfg, w.lines(), &opts)
        }
        (None, None) => Err("give --trace FILE or --workload FILE".into()),
    }
}

#[cfg(test)]
mod tests;
