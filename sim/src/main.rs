//! `gearshift-sim`: the fleet simulator's command line. One module of the
//! library per subcommand; this file only parses and dispatches.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "gearshift-sim",
    version,
    about = "gearshift fleet simulator: the real agents on a simulated fleet"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// The demo: a fleet scales up under a rising workload, then drains and
    /// removes a node when it falls, with live progress and a summary.
    Demo(gearshift_sim::demo::DemoArgs),
    /// The fleet-scale benchmark: N simulated nodes report on a real bus to
    /// the real broker agent; prints ingest rate, decision latency, memory
    /// and evacuation throughput.
    Bench(gearshift_sim::bench::BenchArgs),
    /// The fault campaign over real RabbitMQ: SIGKILLs of the agents at
    /// random points of sagas, closed connections and a bus outage, with the
    /// invariants checked after every round.
    Chaos(gearshift_sim::chaos::ChaosArgs),
    /// What-if: the broker agent's real policy and sagas in virtual time
    /// against a recorded (or synthetic) report trace, with a simulated
    /// cloud; prints every decision, the nodes booted and removed, the peak
    /// usage.
    Replay(gearshift_sim::replay::ReplayArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_error(e),
    };
    match cli.cmd {
        Cmd::Demo(args) => gearshift_sim::demo::main(args),
        Cmd::Bench(args) => gearshift_sim::bench::main(args),
        Cmd::Chaos(args) => gearshift_sim::chaos::main(args),
        Cmd::Replay(args) => gearshift_sim::replay::main(args),
    }
}

/// A command line clap refused: its message and exit status, and with
/// `--json` among the arguments also the JSON error object every
/// subcommand prints on a failure (help and version print as usual).
fn usage_error(e: clap::Error) -> ExitCode {
    let json = std::env::args_os().any(|a| a == "--json");
    if !json || !e.use_stderr() {
        e.exit();
    }
    let name = std::env::args().nth(1).unwrap_or_default();
    let name = if ["demo", "bench", "chaos"].contains(&name.as_str()) {
        name
    } else {
        String::new()
    };
    let message = e.render().to_string();
    let code = u8::try_from(e.exit_code()).unwrap_or(2);
    let _ = e.print();
    gearshift_sim::harness::scenario::json_error(&name, "usage", message.trim_end(), code);
    ExitCode::from(code)
}
