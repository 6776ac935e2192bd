//! `gearshift-node`: the node agent's command line.
//!
//! Exit codes: 0 success, 1 runtime failure, 2 bad configuration or usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use gearshift_node::config::{DEFAULT_CONFIG_PATH, ENV_PREFIX, NodeConfig};
use gearshift_node::heat::{HeatSignaller, Signaller};
use gearshift_node::metrics::Metrics;
use gearshift_node::{Agent, RunExit, bus_link, runtime, setup, status};
use gearshift_proto::msg::HeatAction;
use gearshift_pushstats::{PushMetrics, PushStatsArgs, Pusher};
use gearshift_service::{http, logging, notify, shutdown::Shutdown};

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

/// A failure with its exit code.
struct Failure {
    code: u8,
    error: anyhow::Error,
}

fn usage(e: impl Into<anyhow::Error>) -> Failure {
    Failure {
        code: 2,
        error: e.into(),
    }
}

fn runtime_failure(e: impl Into<anyhow::Error>) -> Failure {
    Failure {
        code: 1,
        error: e.into(),
    }
}

fn load_config(path: &Path) -> Result<NodeConfig, Failure> {
    gearshift_service::config::load::<NodeConfig>(path, ENV_PREFIX).map_err(usage)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Run { config, log_format } => tokio_main(run(config, log_format)),
        Cmd::CheckConfig { file } => check_config(&file),
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
        Cmd::Keygen { dir, name, force } => keygen(&dir, &name, force),
        Cmd::PushStats(args) => tokio_main(push_stats(args)),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("gearshift-node: {:#}", f.error);
            ExitCode::from(f.code)
        }
    }
}

fn tokio_main(fut: impl std::future::Future<Output = Result<(), Failure>>) -> Result<(), Failure> {
    // One worker thread whatever the host's core count (tokio's default is
    // one per core: 64 on a large node host, each with its stack and
    // queues). The agent handles a few messages a second; file and gear
    // work runs on the blocking pool, which grows on demand.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(runtime_failure)?;
    rt.block_on(fut)
}

fn check_config(file: &Path) -> Result<(), Failure> {
    let cfg = load_config(file)?;
    // Files the agent will need: warn, but the file itself is valid.
    let mut warnings = Vec::new();
    let mut check = |key: &str, p: &Path| {
        if !p.exists() {
            warnings.push(format!("{key}: {} does not exist (yet)", p.display()));
        }
    };
    check("keys.signing_key", &cfg.keys.signing_key);
    for p in &cfg.keys.broker_keys {
        check("keys.broker_keys", p);
    }
    for p in &cfg.keys.operator_keys {
        check("keys.operator_keys", p);
    }
    for p in &cfg.keys.client_keys {
        check("keys.client_keys", p);
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    println!("{}: ok", file.display());
    Ok(())
}

fn show_status(config: &Path, state_dir: Option<PathBuf>, json: bool) -> Result<(), Failure> {
    let dir = match state_dir {
        Some(d) => d,
        None => load_config(config)?.state.dir,
    };
    let s = status::read(&dir).map_err(runtime_failure)?;
    if json {
        let text = serde_json::to_string_pretty(&s).map_err(runtime_failure)?;
        println!("{text}");
    } else {
        print!("{}", status::render(&s));
    }
    Ok(())
}

fn keygen(dir: &Path, name: &str, force: bool) -> Result<(), Failure> {
    let (key, public, pair) =
        gearshift_service::keys::write_keypair(dir, name, force).map_err(runtime_failure)?;
    println!("private key: {} (mode 0600)", key.display());
    println!("public key:  {}", public.display());
    println!("key id:      {}", pair.id());
    println!("Give the public key to the broker agent (its trusted node keys).");
    Ok(())
}

async fn heat_signal(
    config: PathBuf,
    action: String,
    reason: String,
    dry_run: bool,
) -> Result<(), Failure> {
    let cfg = load_config(&config)?;
    let action = HeatAction::from_str_name(&action).map_err(usage)?;
    let name = setup::node_name(&cfg).map_err(usage)?;
    let s = HeatSignaller::new(&cfg.heat, &name).map_err(|e| usage(anyhow::anyhow!(e)))?;
    s.check_configured(action)
        .map_err(|e| usage(anyhow::anyhow!(e)))?;
    if dry_run {
        println!(
            "{}",
            s.describe(action, &reason)
                .map_err(|e| usage(anyhow::anyhow!(e.message)))?
        );
        return Ok(());
    }
    match s.signal(action, &reason).await {
        Ok(o) => {
            println!("{}: HTTP {} {}", action.as_str(), o.status, o.detail);
            Ok(())
        }
        Err(e) => Err(runtime_failure(anyhow::anyhow!(
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

async fn push_stats(args: PushStatsArgs) -> Result<(), Failure> {
    match gearshift_pushstats::run_push_stats(&args).await {
        Ok(report) => {
            for line in &report.dry_run {
                println!("{line}");
            }
            for t in &report.targets {
                println!(
                    "{}: {} samples pushed ({} attempts)",
                    t.target, t.samples, t.attempts
                );
            }
            Ok(())
        }
        Err(e) if e.is_usage() => Err(usage(e)),
        Err(e) => Err(runtime_failure(e)),
    }
}

/// Starts the pull-mode pusher when `[push_stats]` is enabled, fed with
/// every report the agent builds.
fn start_push_stats(
    cfg: &NodeConfig,
    agent: &Agent,
    token: &tokio_util::sync::CancellationToken,
) -> Result<Option<(Pusher, PushMetrics)>, Failure> {
    let push_metrics = PushMetrics::new();
    let Some(pusher) = cfg
        .push_stats
        .start(Some(agent.name()), push_metrics.clone(), token.clone())
        .map_err(usage)?
    else {
        return Ok(None);
    };
    let handle = pusher.handle();
    let mut reports = agent.reports();
    let ps = cfg.push_stats.clone();
    let token = token.clone();
    tokio::spawn(async move {
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
    Ok(Some((pusher, push_metrics)))
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
    let cfg = load_config(&config)?;
    logging::init(log_format.unwrap_or(cfg.log.format), &cfg.log.level);
    let metrics = Metrics::default();
    let acfg = setup::agent_config(&cfg, metrics.clone()).map_err(usage)?;
    let name = acfg.name.clone();
    let rt = runtime::from_config(&cfg, &name).map_err(usage)?;
    let shutdown = Shutdown::new();
    shutdown
        .listen_for_signals()
        .context("cannot install signal handlers")
        .map_err(runtime_failure)?;
    let bus = bus_link::LazyBus::spawn(
        cfg.bus.url.clone(),
        cfg.connect_options(&name),
        shutdown.token.clone(),
    );
    // Locks the state directory: a second agent stops here, before any work.
    let agent = Agent::new(acfg, bus.clone(), rt).map_err(runtime_failure)?;
    let push_stats = start_push_stats(&cfg, &agent, &shutdown.token)?;
    if let Some(addr) = cfg.metrics.listen {
        let registry = metrics.registry();
        if let Some((_, pm)) = &push_stats {
            let mut r = registry.lock().unwrap_or_else(|p| p.into_inner());
            pm.register(r.sub_registry_with_prefix("gearshift_node"));
        }
        let router = http::metrics_router(registry);
        let (bound, _task) = http::serve(addr, router, shutdown.token.clone())
            .await
            .with_context(|| format!("metrics.listen {addr}"))
            .map_err(runtime_failure)?;
        tracing::info!(%bound, "serving /metrics");
    }
    spawn_reloader(
        &shutdown,
        config.clone(),
        agent.clone(),
        metrics.clone(),
        cfg.clone(),
    );
    let a = agent.clone();
    notify::spawn_watchdog(shutdown.token.clone(), move || a.healthy());
    notify::ready(&format!("node {name}: running"));
    let exit = agent.run(shutdown.token.clone()).await;
    notify::stopping();
    bus.close().await;
    match exit {
        RunExit::Stopped => tracing::info!("stopped"),
        RunExit::Removed => tracing::info!("node removed: the agent exits"),
    }
    Ok(())
}

fn spawn_reloader(
    shutdown: &Shutdown,
    path: PathBuf,
    agent: Agent,
    metrics: Metrics,
    mut current: NodeConfig,
) {
    let mut reloads = shutdown.reloads();
    let token = shutdown.token.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = reloads.changed() => if r.is_err() { return },
                _ = token.cancelled() => return,
            }
            let loaded = gearshift_service::config::load::<NodeConfig>(&path, ENV_PREFIX)
                .map_err(|e| e.to_string())
                .and_then(|cfg| {
                    setup::agent_config(&cfg, metrics.clone())
                        .map(|a| (cfg, a))
                        .map_err(|e| e.to_string())
                });
            match loaded {
                Ok((cfg, acfg)) => {
                    for (section, changed) in [
                        ("[bus]", cfg.bus != current.bus),
                        ("[state]", cfg.state != current.state),
                        ("[runtime]", cfg.runtime != current.runtime),
                        ("[metrics]", cfg.metrics != current.metrics),
                        ("[log]", cfg.log != current.log),
                        ("[service]", cfg.service != current.service),
                    ] {
                        if changed {
                            tracing::warn!(section, "changed, but only applies after a restart");
                        }
                    }
                    agent.reload(acfg);
                    current = cfg;
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload refused: keeping the running configuration")
                }
            }
        }
    });
}
