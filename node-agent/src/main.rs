//! `gearshift-node`: the node agent's command line.
//!
//! Exit codes (`gearshift_service::bootstrap`, the same for both agents):
//! 0 success, 1 runtime failure, 2 bad configuration or usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Result, bail};
use clap::{Parser, Subcommand};
use gearshift_node::config::{DEFAULT_CONFIG_PATH, NodeConfig};
use gearshift_node::heat::{HeatSignaller, Signaller};
use gearshift_node::metrics::Metrics;
use gearshift_node::{Agent, RunExit, enroll, runtime, setup, status};
use gearshift_proto::msg::HeatAction;
use gearshift_pushstats::{PushMetrics, PushStatsArgs};
use gearshift_service::bootstrap::{self, Failure, Service};
use gearshift_service::logging;

#[derive(Parser)]
#[command(
    name = "gearshift-node",
    version,
    about = "gearshift node agent: capacity reports, inactive state, crash-safe evacuation, Heat signals"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the agent (as the systemd service does).
    Run {
        /// Configuration file.
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Log format on stderr, human or json (default: `[log] format`).
        #[arg(long)]
        log_format: Option<logging::LogFormat>,
    },
    /// Validate a configuration file without touching the network.
    CheckConfig {
        /// Configuration file.
        #[arg(default_value = DEFAULT_CONFIG_PATH)]
        file: PathBuf,
    },
    /// Show identity, active/inactive, gear counts and the current operation.
    Status {
        /// Configuration file (to find the state directory).
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Read this state directory instead of the configured one.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Send a configured Heat action by hand: scale_up, scale_down, signal or mark_unhealthy.
    HeatSignal {
        /// The action.
        action: String,
        /// Configuration file.
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// Reason sent to Heat where the API takes one.
        #[arg(long, default_value = "gearshift-node heat-signal (operator test)")]
        reason: String,
        /// Print the request that would be sent, without sending it.
        #[arg(long)]
        dry_run: bool,
    },
    /// Push metrics once, like heat-cfntools' cfn-push-stats (CloudWatch-compatible API or Gnocchi).
    PushStats(PushStatsArgs),
    /// Write a new node key pair (<dir>/<name>.key, mode 0600, and <dir>/<name>.pub).
    Keygen {
        /// Directory for the key files.
        #[arg(long, default_value = "/etc/gearshift")]
        dir: PathBuf,
        /// File name stem.
        #[arg(long, default_value = "node")]
        name: String,
        /// Overwrite an existing private key.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run { config, log_format } => tokio_main(run(config, log_format)),
        Cmd::CheckConfig { file } => bootstrap::check_config::<NodeConfig>(&file, |cfg| {
            // With a token, a missing key is made (and enrolled) at start.
            if enroll::makes_key(cfg) {
                setup::load_trusted(cfg).map_err(Failure::config)?;
                return Ok(vec![format!(
                    "keys.signing_key {} does not exist yet: the agent makes it at start and enrolls it with [enroll]'s token",
                    cfg.keys.signing_key.display()
                )]);
            }
            setup::load_keys(cfg).map_err(Failure::config)?;
            Ok(Vec::new())
        }),
        Cmd::Status {
            config,
            state_dir,
            json,
        } => show_status(&config, state_dir, json),
        Cmd::HeatSignal {
            action,
            config,
            reason,
            dry_run,
        } => tokio_main(heat_signal(config, action, reason, dry_run)),
        Cmd::Keygen { dir, name, force } => bootstrap::keygen(
            &dir,
            &name,
            force,
            "Give the public key to the broker agent (its trusted node keys).",
        ),
        Cmd::PushStats(args) => tokio_main(push_stats(args)),
    };
    bootstrap::exit("gearshift-node", r)
}

fn tokio_main(fut: impl std::future::Future<Output = Result<(), Failure>>) -> Result<(), Failure> {
    // One worker thread whatever the host's core count (tokio's default is
    // one per core: 64 on a large node host, each with its stack and
    // queues). The agent handles a few messages a second; file and gear
    // work runs on the blocking pool, which grows on demand.
    bootstrap::block_on(Some(1), fut)
}

fn show_status(config: &Path, state_dir: Option<PathBuf>, json: bool) -> Result<(), Failure> {
    let dir = match state_dir {
        Some(d) => d,
        None => bootstrap::load::<NodeConfig>(config)?.state.dir,
    };
    let s = status::read(&dir).map_err(Failure::runtime)?;
    if json {
        let text = serde_json::to_string_pretty(&s).map_err(Failure::runtime)?;
        println!("{text}");
    } else {
        print!("{}", status::render(&s));
    }
    Ok(())
}

async fn heat_signal(
    config: PathBuf,
    action: String,
    reason: String,
    dry_run: bool,
) -> Result<(), Failure> {
    let cfg = bootstrap::load::<NodeConfig>(&config)?;
    let action = HeatAction::from_str_name(&action).map_err(Failure::config)?;
    let name = setup::node_name(&cfg).map_err(Failure::config)?;
    let s = HeatSignaller::new(&cfg.heat, &name).map_err(Failure::config)?;
    s.check_configured(action).map_err(Failure::config)?;
    if dry_run {
        println!(
            "{}",
            s.describe(action, &reason)
                .map_err(|e| Failure::config(e.message))?
        );
        return Ok(());
    }
    match s.signal(action, &reason).await {
        Ok(o) => {
            println!("{}: HTTP {} {}", action.as_str(), o.status, o.detail);
            Ok(())
        }
        Err(e) => Err(Failure::runtime(format!(
            "{} failed{}: {} ({})",
            action.as_str(),
            e.http_status
                .map(|s| format!(" with HTTP {s}"))
                .unwrap_or_default(),
            e.message,
            if e.retryable {
                "may succeed later"
            } else {
                "will not succeed as configured"
            }
        ))),
    }
}

/// `push-stats`: one push, like cfn-push-stats.
async fn push_stats(args: PushStatsArgs) -> Result<(), Failure> {
    match gearshift_pushstats::run_push_stats(&args).await {
        Ok(report) => {
            report.lines().iter().for_each(|l| println!("{l}"));
            Ok(())
        }
        Err(e) if e.is_usage() => Err(Failure::config(e)),
        Err(e) => Err(Failure::runtime(e)),
    }
}

/// Starts the pull-mode pusher when `[push_stats]` is enabled, fed with
/// every report the agent builds; returns its metrics.
fn start_push_stats(
    service: &Service<NodeConfig>,
    cfg: &NodeConfig,
    agent: &Agent,
) -> Result<Option<PushMetrics>, Failure> {
    let push_metrics = PushMetrics::new();
    let token = service.token().clone();
    let Some(pusher) = cfg
        .push_stats
        .start_in(
            Some(agent.name()),
            push_metrics.clone(),
            token.clone(),
            service.tracker(),
        )
        .map_err(Failure::config)?
    else {
        return Ok(None);
    };
    let handle = pusher.handle();
    let mut reports = agent.reports();
    let ps = cfg.push_stats.clone();
    service.spawn(async move {
        loop {
            tokio::select! {
                r = reports.changed() => if r.is_err() { return },
                _ = token.cancelled() => return,
            }
            let latest = reports.borrow_and_update().clone();
            if let Some(r) = latest {
                handle.update(ps.node_samples(&r));
            }
        }
    });
    Ok(Some(push_metrics))
}

/// Serves `/metrics` (with the pusher's counters) when `[metrics] listen` is set.
async fn serve_metrics(
    service: &Service<NodeConfig>,
    cfg: &NodeConfig,
    metrics: &Metrics,
    push_metrics: Option<PushMetrics>,
) -> Result<(), Failure> {
    let Some(addr) = cfg.metrics.listen else {
        return Ok(());
    };
    let registry = metrics.registry();
    if let Some(pm) = &push_metrics {
        let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
        pm.register(r.sub_registry_with_prefix("gearshift_node"));
    }
    let bound = service
        .serve(addr, gearshift_service::http::metrics_router(registry))
        .await?;
    tracing::info!(%bound, "serving /metrics");
    Ok(())
}

trait HeatActionExt: Sized {
    fn from_str_name(s: &str) -> Result<Self>;
}

impl HeatActionExt for HeatAction {
    fn from_str_name(s: &str) -> Result<Self> {
        Ok(match s.replace('-', "_").as_str() {
            "scale_up" => HeatAction::ScaleUp,
            "scale_down" => HeatAction::ScaleDown,
            "signal" => HeatAction::Signal,
            "mark_unhealthy" => HeatAction::MarkUnhealthy,
            other => bail!(
                "unknown Heat action {other:?} (expected scale_up, scale_down, signal or mark_unhealthy)"
            ),
        })
    }
}

async fn run(config: PathBuf, log_format: Option<logging::LogFormat>) -> Result<(), Failure> {
    let (service, cfg) = Service::<NodeConfig>::start(&config, log_format)?;
    let metrics = Metrics::default();
    // A token and no key yet: the key is made here, before it is loaded.
    let enrolling = enroll::prepare(&cfg).map_err(Failure::config)?;
    let acfg = setup::agent_config(&cfg, metrics.clone()).map_err(Failure::config)?;
    let name = acfg.name.clone();
    let rt = runtime::from_config(&cfg, &name).map_err(Failure::config)?;
    let bus = service.lazy_bus(cfg.bus.url.clone(), cfg.connect_options(&name));
    let who = (name.clone(), acfg.keypair.clone(), acfg.keyring.clone());
    // Locks the state directory: a second agent stops here, before any work.
    // Hook: the agent spawns its loops on a tracker of its own today; once
    // `Agent::new` takes one, pass `service.tracker().clone()`.
    let agent = Agent::new(acfg, bus.clone(), rt.clone()).map_err(Failure::runtime)?;
    // Beside the agent: its reports are refused until the key is enrolled.
    if let Some(p) = enrolling {
        let run = enroll::run(p, bus.clone(), who, rt, service.token().clone());
        service.tracker().spawn(run);
    }
    let push_metrics = start_push_stats(&service, &cfg, &agent)?;
    serve_metrics(&service, &cfg, &metrics, push_metrics).await?;
    reload_on_sighup(&service, agent.clone(), metrics, cfg.clone());
    let a = agent.clone();
    service.ready(&format!("node {name}: running"), move || a.healthy());
    // The agent runs on this task until SIGTERM or `cmd.remove`, and drains
    // its own in-flight work within service.shutdown_grace.
    let exit = agent.run(service.token().clone()).await;
    service.stop(cfg.service.shutdown_grace).await;
    bus.close().await;
    match exit {
        RunExit::Stopped => tracing::info!("stopped"),
        RunExit::Removed => tracing::info!("node removed: the agent exits"),
    }
    Ok(())
}

/// What the node agent applies on a reload: trusted keys and their time
/// window, reports, evacuation, Heat, and the node's facts. A change to any
/// other key (the bus, the state directory, the gear runtime, the metrics
/// listener, logging, the node's name, its signing key) only applies at
/// start: the reload is refused, naming it.
const RELOADABLE: &[&str] = &[
    "node.region",
    "node.zone",
    "node.booted_for",
    "node.booted_for_file",
    "node.do_not_disrupt",
    "keys.time_window",
    "keys.broker_keys",
    "keys.operator_keys",
    "keys.client_keys",
    "report",
    "evacuation",
    "heat",
];

/// SIGHUP: the new file is checked and its keys loaded before the agent
/// takes it; a change that only applies at start refuses the reload.
fn reload_on_sighup(
    service: &Service<NodeConfig>,
    agent: Agent,
    metrics: Metrics,
    mut current: NodeConfig,
) {
    service.on_reload(move |cfg: NodeConfig| {
        let restart = gearshift_service::reload::needs_restart(&current, &cfg, RELOADABLE);
        if !restart.is_empty() {
            return Err(gearshift_service::reload::restart_message(&restart));
        }
        let acfg = setup::agent_config(&cfg, metrics.clone()).map_err(|e| e.to_string())?;
        agent.reload(acfg);
        current = cfg;
        Ok(())
    });
}
