//! `gearshift-broker`: the broker agent and its operator commands.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use gearshift_broker::cli::{self, OperatorKeys};
use gearshift_broker::config::{self, BrokerConfig};
use gearshift_broker::{Agent, metrics::Metrics};
use gearshift_bus::{ConnectOptions, SharedBus, TlsOptions};
use gearshift_proto::msg::{AdminRequest, Role};
use gearshift_proto::sign::Keyring;
use gearshift_service::shutdown::Shutdown;
use tokio_util::sync::CancellationToken;

#[derive(Parser, Debug)]
#[command(
    name = "gearshift-broker",
    version,
    about = "gearshift broker agent: fleet capacity, scaling decisions, scale-down sagas"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(clap::Args, Debug, Clone)]
struct OpArgs {
    /// Broker configuration file: the bus URL and the broker key are taken from it.
    #[arg(long, short = 'c', env = "GEARSHIFT_BROKER_CONFIG")]
    config: Option<PathBuf>,
    /// Bus URL (overrides the configuration's).
    #[arg(long, env = "GEARSHIFT_BUS")]
    bus: Option<String>,
    /// Key that signs the request: an operator key, or the broker key
    /// (default: the configuration's signing key, else /etc/gearshift/operator.key).
    #[arg(long, env = "GEARSHIFT_OPERATOR_KEY")]
    key: Option<PathBuf>,
    /// The broker agent's public key, to check its answers (default:
    /// broker.pub next to --key, else the signing key itself).
    #[arg(long)]
    broker_pub: Option<PathBuf>,
    /// Sender name of the request.
    #[arg(long, default_value = "gearshift-operator")]
    from: String,
    /// How long to wait for answers.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Run the broker agent.
    Run {
        /// Configuration file.
        #[arg(long, short = 'c', default_value = "/etc/gearshift/broker.toml")]
        config: PathBuf,
        /// Log format on stderr, human or json (default: `[log] format`).
        #[arg(long)]
        log_format: Option<gearshift_service::logging::LogFormat>,
    },
    /// Check a configuration file (no network access); exit 0 when valid.
    CheckConfig {
        /// The file.
        file: PathBuf,
    },
    /// Write a new Ed25519 key pair (<name>.key, <name>.pub).
    Keygen {
        /// Directory.
        #[arg(long, default_value = "/etc/gearshift")]
        dir: PathBuf,
        /// File stem.
        #[arg(long, default_value = "broker")]
        name: String,
        /// Overwrite existing files.
        #[arg(long)]
        force: bool,
    },
    /// Fleet figures per district and profile, operations in flight, exhausted groups.
    Status {
        #[command(flatten)]
        op: OpArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Live decisions, explanations and evacuation progress.
    Watch {
        #[command(flatten)]
        op: OpArgs,
        /// Leave out explanations.
        #[arg(long)]
        no_explain: bool,
    },
    /// Every agent on the bus with its round trip.
    Ping {
        #[command(flatten)]
        op: OpArgs,
        /// How long to gather answers.
        #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
        window: Duration,
    },
    /// Empty a node and remove it.
    Evacuate {
        #[command(flatten)]
        op: OpArgs,
        /// The node's host name.
        node: String,
    },
    /// Abort an operation (a draining node is re-activated).
    Abort {
        #[command(flatten)]
        op: OpArgs,
        /// Operation id.
        op_id: String,
    },
    /// Mark a node do-not-disrupt (never chosen for scale-down), or unmark it.
    DoNotDisrupt {
        #[command(flatten)]
        op: OpArgs,
        /// The node.
        node: String,
        /// Remove the mark.
        #[arg(long)]
        off: bool,
    },
    /// Stop scaling decisions for the fleet, or for one group (D/P).
    Pause {
        #[command(flatten)]
        op: OpArgs,
        /// DISTRICT/PROFILE; without it, the whole fleet.
        group: Option<String>,
        /// Why (shown in every explanation while paused).
        #[arg(long, default_value = "")]
        reason: String,
        /// Lift the pause after this long (e.g. 2h).
        #[arg(long = "for", value_parser = humantime::parse_duration)]
        for_: Option<Duration>,
        /// Lift the pause at this instant (RFC 3339).
        #[arg(long)]
        until: Option<chrono::DateTime<chrono::Utc>>,
    },
    /// Lift a pause of the fleet, or of one group (D/P).
    Resume {
        #[command(flatten)]
        op: OpArgs,
        /// DISTRICT/PROFILE; without it, the whole fleet.
        group: Option<String>,
    },
    /// Take a node out of placement and scale-down choice (not removed).
    Cordon {
        #[command(flatten)]
        op: OpArgs,
        /// The node.
        node: String,
        /// Why.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Put a cordoned node back into placement and scale-down choice.
    Uncordon {
        #[command(flatten)]
        op: OpArgs,
        /// The node.
        node: String,
    },
    /// Send cmd.activate to a node left inactive (and lift its cordon).
    Activate {
        #[command(flatten)]
        op: OpArgs,
        /// The node.
        node: String,
    },
    /// Empty a node: with --keep for maintenance (left inactive and cordoned), else as evacuate.
    Drain {
        #[command(flatten)]
        op: OpArgs,
        /// Keep the emptied node instead of removing it.
        #[arg(long)]
        keep: bool,
        /// The node.
        node: String,
    },
    /// Decisions, saga steps, changed explanations and operator requests
    /// from the state directory's history (no bus needed).
    History {
        /// Configuration file (for its state directory).
        #[arg(long, short = 'c', default_value = "/etc/gearshift/broker.toml")]
        config: PathBuf,
        /// Read this state directory instead of the configuration's.
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// How far back.
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        since: Duration,
        /// Only DISTRICT/PROFILE (and fleet-wide records).
        #[arg(long)]
        group: Option<String>,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Ask the placement service where a gear would go.
    Place(gearshift_placement::cli::PlaceArgs),
    /// Push metrics once, like heat-cfntools' cfn-push-stats (the F18
    /// template's notify-scale-up: --heartbeat --watch ALARM).
    PushStats(gearshift_pushstats::PushStatsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // check-config and keygen run without a runtime or network.
    match &cli.cmd {
        Cmd::CheckConfig { file } => {
            return match config::load(file) {
                Ok(_) => {
                    println!("{}: ok", file.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(2)
                }
            };
        }
        Cmd::Keygen { dir, name, force } => {
            return match gearshift_service::keys::write_keypair(dir, name, *force) {
                Ok((k, p, pair)) => {
                    println!(
                        "wrote {} and {} (key id {})",
                        k.display(),
                        p.display(),
                        pair.id()
                    );
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("{e}");
                    ExitCode::from(1)
                }
            };
        }
        _ => {}
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gearshift-broker: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Run { config, log_format } => run_agent(&config, log_format)
            .await
            .map(|_| ExitCode::SUCCESS),
        Cmd::Status { op, json } => {
            let (bus, keys) = operator(&op).await?;
            let s = cli::status(&bus, &keys, &op.from, op.timeout).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Watch { op, no_explain } => {
            let (bus, keys) = operator(&op).await?;
            let stop = CancellationToken::new();
            let s = stop.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                s.cancel();
            });
            cli::watch(&bus, &keys.brokers, !no_explain, |l| println!("{l}"), stop).await?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Ping { op, window } => {
            let (bus, keys) = operator(&op).await?;
            let answers = cli::ping(&bus, &keys.signer, &op.from, window, None).await?;
            for a in &answers {
                println!(
                    "{:<40} {:<7} time={:.1} ms",
                    a.agent,
                    a.role,
                    a.rtt.as_secs_f64() * 1000.0
                );
            }
            let n = answers.len();
            println!("\n---- ping statistics ----");
            if n > 0 {
                let ms: Vec<f64> = answers
                    .iter()
                    .map(|a| a.rtt.as_secs_f64() * 1000.0)
                    .collect();
                let min = ms.iter().copied().fold(f64::MAX, f64::min);
                let max = ms.iter().copied().fold(0.0, f64::max);
                let avg = ms.iter().sum::<f64>() / n as f64;
                println!("{n} replies, min/avg/max = {min:.1}/{avg:.1}/{max:.1} ms");
                Ok(ExitCode::SUCCESS)
            } else {
                println!("no replies");
                Ok(ExitCode::from(1))
            }
        }
        Cmd::Evacuate { op, node } => admin(&op, AdminRequest::Evacuate { node }).await,
        Cmd::Abort { op, op_id } => admin(&op, AdminRequest::Abort { op: op_id }).await,
        Cmd::DoNotDisrupt { op, node, off } => {
            admin(&op, AdminRequest::DoNotDisrupt { node, on: !off }).await
        }
        Cmd::Pause {
            op,
            group,
            reason,
            for_,
            until,
        } => {
            let req =
                cli::controls::pause(group.as_deref(), &reason, for_, until, chrono::Utc::now())?;
            admin(&op, req).await
        }
        Cmd::Resume { op, group } => admin(&op, cli::controls::resume(group.as_deref())?).await,
        Cmd::Cordon { op, node, reason } => {
            admin(&op, cli::controls::cordon(&node, true, &reason)).await
        }
        Cmd::Uncordon { op, node } => admin(&op, cli::controls::cordon(&node, false, "")).await,
        Cmd::Activate { op, node } => admin(&op, cli::controls::activate(&node)).await,
        Cmd::Drain { op, keep, node } => admin(&op, cli::controls::drain(&node, keep)).await,
        Cmd::History {
            config,
            state_dir,
            since,
            group,
            json,
        } => {
            let lines = cli::controls::history_of(
                &config,
                state_dir.as_deref(),
                since,
                group.as_deref(),
                json,
            )?;
            for l in lines {
                println!("{l}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Place(args) => match gearshift_placement::cli::run_place(args).await {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("gearshift-broker place: {e}");
                Ok(ExitCode::from(e.exit_code().clamp(1, 255) as u8))
            }
        },
        Cmd::PushStats(args) => match gearshift_pushstats::run_push_stats(&args).await {
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
                Ok(ExitCode::SUCCESS)
            }
            Err(e) => {
                eprintln!("gearshift-broker push-stats: {e}");
                Ok(ExitCode::from(if e.is_usage() { 2 } else { 1 }))
            }
        },
        Cmd::CheckConfig { .. } | Cmd::Keygen { .. } => Ok(ExitCode::SUCCESS),
    }
}

/// Starts the pull-mode pusher when `[push_stats]` is enabled, fed with the
/// fleet figures of every status the agent publishes (per profile, and per
/// district from the groups).
fn start_push_stats(
    cfg: &BrokerConfig,
    mut status: tokio::sync::watch::Receiver<Arc<gearshift_broker::status::Status>>,
    token: &CancellationToken,
) -> anyhow::Result<
    Option<(
        gearshift_pushstats::Pusher,
        gearshift_pushstats::PushMetrics,
    )>,
> {
    let push_metrics = gearshift_pushstats::PushMetrics::new();
    let Some(pusher) = cfg
        .push_stats
        .start(None, push_metrics.clone(), token.clone())
        .context("push_stats")?
    else {
        return Ok(None);
    };
    let handle = pusher.handle();
    let ps = cfg.push_stats.clone();
    let token = token.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                _ = token.cancelled() => return,
            }
            let s = status.borrow_and_update().clone();
            if s.at.is_none() {
                continue;
            }
            let profiles = s
                .profiles
                .iter()
                .map(|p| (p.profile.clone(), p.stats.clone()))
                .collect();
            let districts = s
                .groups
                .iter()
                .map(|g| (g.district.clone(), g.stats.clone()))
                .collect();
            handle.update(ps.fleet_samples(&profiles, &districts));
        }
    });
    Ok(Some((pusher, push_metrics)))
}

async fn admin(op: &OpArgs, req: AdminRequest) -> anyhow::Result<ExitCode> {
    let (bus, keys) = operator(op).await?;
    let key = match &op.config {
        Some(p) => config::load(p)?.agent.admin_key,
        None => gearshift_proto::routing::ADMIN.to_string(),
    };
    let r = cli::admin_on(&bus, &keys, &op.from, &key, req, op.timeout).await?;
    if r.ok {
        println!("{}", r.message);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("refused: {}", r.message);
        Ok(ExitCode::from(1))
    }
}

async fn operator(op: &OpArgs) -> anyhow::Result<(SharedBus, OperatorKeys)> {
    let cfg = match &op.config {
        Some(p) => Some(config::load(p)?),
        None => None,
    };
    let url = op
        .bus
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.bus.url.clone()))
        .unwrap_or_else(|| config::BrokerConfig::defaults().bus.url);
    let key = op
        .key
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.keys.signing_key.clone()))
        .unwrap_or_else(|| PathBuf::from("/etc/gearshift/operator.key"));
    let mut keys = OperatorKeys::load(&key, op.broker_pub.as_deref())?;
    if let Some(c) = &cfg {
        // With the broker's configuration, trust what the broker trusts, so
        // that `watch` can verify node events and reports too.
        trust_dir(&mut keys.brokers, &c.keys.node_keys_dir, Role::Node)?;
        trust_dir(&mut keys.brokers, &c.keys.operator_keys_dir, Role::Operator)?;
        for t in &c.keys.trust {
            gearshift_service::keys::trust(&mut keys.brokers, &t.path, t.role)?;
        }
    }
    let opts = ConnectOptions {
        name: "gearshift-broker-cli".into(),
        tls: cfg.as_ref().map(tls).unwrap_or_default(),
        connect_timeout: op.timeout,
        ..Default::default()
    };
    let bus = gearshift_bus::connect(&url, opts)
        .await
        .with_context(|| format!("cannot connect to {}", redact(&url)))?;
    Ok((bus, keys))
}

fn tls(c: &BrokerConfig) -> TlsOptions {
    TlsOptions {
        ca_file: c.bus.ca_file.clone(),
        cert_file: c.bus.cert_file.clone(),
        key_file: c.bus.key_file.clone(),
        server_name: None,
    }
}

fn redact(url: &str) -> String {
    match url.split_once('@') {
        Some((head, tail)) => match head.rsplit_once(':') {
            Some((user, _)) if user.contains("://") => format!("{user}:***@{tail}"),
            _ => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// Every *.pub of `dir`, trusted for `role`; a missing directory trusts nobody.
fn trust_dir(ring: &mut Keyring, dir: &Path, role: Role) -> anyhow::Result<usize> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::warn!(dir = %dir.display(), %role, "no such key directory: no {role} key trusted from it");
            return Ok(0);
        }
        Err(e) => bail!("{}: {e}", dir.display()),
    };
    let mut n = 0;
    let mut paths: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    for p in paths {
        if p.extension().is_some_and(|x| x == "pub") {
            gearshift_service::keys::trust(ring, &p, role)?;
            n += 1;
        }
    }
    Ok(n)
}

fn keyring(cfg: &BrokerConfig, own: &gearshift_proto::KeyPair) -> anyhow::Result<Keyring> {
    let mut ring = Keyring::new();
    ring.add(own.public(), Role::Broker, "own key");
    let nodes = trust_dir(&mut ring, &cfg.keys.node_keys_dir, Role::Node)?;
    let ops = trust_dir(&mut ring, &cfg.keys.operator_keys_dir, Role::Operator)?;
    for t in &cfg.keys.trust {
        gearshift_service::keys::trust(&mut ring, &t.path, t.role)?;
    }
    tracing::info!(
        node_keys = nodes,
        operator_keys = ops,
        extra = cfg.keys.trust.len(),
        "keys trusted"
    );
    Ok(ring)
}

async fn run_agent(
    path: &Path,
    log_format: Option<gearshift_service::logging::LogFormat>,
) -> anyhow::Result<()> {
    // Validate before touching anything else.
    let cfg = config::load(path)?;
    gearshift_service::logging::init(log_format.unwrap_or(cfg.log.format), &cfg.log.level);
    let signer = gearshift_service::keys::load_keypair(&cfg.keys.signing_key)?;
    let ring = keyring(&cfg, &signer)?;
    let shutdown = Shutdown::new();
    shutdown
        .listen_for_signals()
        .context("cannot install signal handlers")?;
    let token = shutdown.token.clone();

    // Connect, retrying forever until the bus answers or we are told to stop.
    let opts = ConnectOptions {
        name: format!("gearshift-broker {}", cfg.agent.name),
        tls: tls(&cfg),
        heartbeat: cfg.bus.heartbeat,
        op_timeout: cfg.bus.op_timeout,
        ..Default::default()
    };
    let mut attempt = 0;
    let bus = loop {
        match gearshift_bus::connect(&cfg.bus.url, opts.clone()).await {
            Ok(b) => break b,
            Err(e) => {
                let wait = gearshift_bus::backoff(
                    attempt,
                    Duration::from_millis(200),
                    Duration::from_secs(10),
                );
                attempt += 1;
                tracing::warn!(url = %redact(&cfg.bus.url), error = %e, wait = ?wait, "bus not reachable; retrying");
                gearshift_service::notify::status(&format!("waiting for the bus: {e}"));
                tokio::select! {
                    _ = token.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    };

    let metrics = Metrics::new();
    let (reload_tx, reload_rx) = tokio::sync::watch::channel(Arc::new(cfg.clone()));
    let agent = Agent::builder(cfg.clone(), bus.clone())
        .signer(signer)
        .keyring(ring)
        .metrics(metrics.clone())
        .reloads(reload_rx)
        .build()?;
    let push_stats = start_push_stats(&cfg, agent.status(), &token)?;
    if let Some((_, pm)) = &push_stats {
        pm.register(&mut metrics.registry.lock().unwrap_or_else(|p| p.into_inner()));
    }
    if let Some(addr) = cfg.metrics.listen {
        // One listener: /metrics, /healthz and the dashboard.
        let dashboard = gearshift_broker::dashboard::Dashboard::spawn(
            &agent,
            cfg.agent.name.clone(),
            token.clone(),
        );
        let router = gearshift_service::http::metrics_router(metrics.registry.clone())
            .merge(dashboard.router());
        let (local, _) = gearshift_service::http::serve(addr, router, token.clone())
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        tracing::info!(%local, "metrics and dashboard listener (http://{local}/)");
    }
    // SIGHUP: reload and validate; a bad file keeps the running configuration.
    let mut hups = shutdown.reloads();
    let cfg_path = path.to_path_buf();
    tokio::spawn(async move {
        while hups.changed().await.is_ok() {
            match config::load(&cfg_path) {
                Ok(c) => {
                    let _ = reload_tx.send(Arc::new(c));
                }
                Err(e) => {
                    tracing::error!(error = %e, "reload refused: keeping the running configuration")
                }
            }
        }
    });
    let status = agent.status();
    gearshift_service::notify::spawn_watchdog(token.clone(), move || {
        status
            .borrow()
            .at
            .is_some_and(|t| chrono::Utc::now() - t < chrono::Duration::seconds(10))
    });
    gearshift_service::notify::ready("running");
    let run = shutdown.tracker.spawn(agent.run(token.clone()));
    let res = tokio::select! {
        r = run => r,
        _ = token.cancelled() => {
            gearshift_service::notify::stopping();
            // The agent's own drain is bounded by shutdown_grace.
            let grace = cfg.agent.shutdown_grace + Duration::from_secs(2);
            shutdown.tracker.close();
            if !shutdown.drain(grace).await {
                tracing::warn!("grace period over");
            }
            return Ok(());
        }
    };
    bus.close().await;
    res.context("agent task")?.map_err(Into::into)
}
