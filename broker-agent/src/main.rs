//! `gearshift-broker`: the broker agent and its operator commands.
//!
//! Exit codes (`gearshift_service::bootstrap`): 0 success, 1 failure at run
//! time, 2 bad configuration or usage.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use gearshift_broker::cli::{self, OperatorKeys};
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::{Agent, metrics::Metrics};
use gearshift_bus::{ConnectOptions, SharedBus};
use gearshift_proto::msg::{AdminRequest, Role};
use gearshift_proto::sign::Keyring;
use gearshift_service::bootstrap::{self, Failure, Service};
use gearshift_service::logging::LogFormat;
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
    /// Routing key of the broker agent's operator requests (default: the
    /// configuration's `agent.admin_key`, else `admin`).
    #[arg(long, env = "GEARSHIFT_ADMIN_KEY")]
    admin_key: Option<String>,
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
        log_format: Option<LogFormat>,
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
    /// Print a new enrollment token (offline): nodes booted with it in their
    /// user data enroll their own keys (docs/security.md).
    EnrollToken(cli::enroll::TokenArgs),
    /// Push metrics once, like heat-cfntools' cfn-push-stats (the F18
    /// template's notify-scale-up: --heartbeat --watch ALARM).
    PushStats(gearshift_pushstats::PushStatsArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        // check-config and keygen run without a runtime or network.
        Cmd::CheckConfig { file } => bootstrap::check_config::<BrokerConfig>(&file, |cfg| {
            load_keys(cfg)?;
            Ok(Vec::new())
        }),
        Cmd::Keygen { dir, name, force } => bootstrap::keygen(
            &dir,
            &name,
            force,
            "Give the public key to the node agents (their keys.broker_keys).",
        ),
        Cmd::Run { config, log_format } => bootstrap::block_on(None, run_agent(config, log_format)),
        Cmd::EnrollToken(args) => enroll_token(&args),
        cmd => bootstrap::block_on(None, operator_command(cmd)),
    };
    bootstrap::exit("gearshift-broker", r)
}

/// `enroll-token`: the key is `--key`, else the configuration's signing
/// key, else the operator key's usual place.
fn enroll_token(args: &cli::enroll::TokenArgs) -> Result<(), Failure> {
    let key = match (&args.key, &args.config) {
        (Some(k), _) => k.clone(),
        (None, Some(c)) => bootstrap::load::<BrokerConfig>(c)?.keys.signing_key,
        (None, None) => PathBuf::from("/etc/gearshift/operator.key"),
    };
    println!("{}", cli::enroll::mint(args, &key).map_err(cli_failure)?);
    Ok(())
}

/// A usage error of an operator subcommand is a bad invocation (exit 2);
/// anything else failed at run time (exit 1).
fn cli_failure(e: cli::CliError) -> Failure {
    match e {
        cli::CliError::Usage(_) => Failure::config(e),
        e => Failure::runtime(e),
    }
}

fn runtime(e: impl Into<anyhow::Error>) -> Failure {
    Failure::runtime(e.into())
}

/// The operator commands: requests on the bus, and the offline helpers.
async fn operator_command(cmd: Cmd) -> Result<(), Failure> {
    match cmd {
        Cmd::Status { op, json } => {
            let o = operator(&op).await?;
            let s = cli::status(&o.bus, &o.keys, &op.from, &o.admin_key, op.timeout)
                .await
                .map_err(runtime)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s).map_err(runtime)?);
            } else {
                print!("{}", s.render());
            }
            Ok(())
        }
        Cmd::Watch { op, no_explain } => {
            let Operator { bus, keys, .. } = operator(&op).await?;
            let stop = CancellationToken::new();
            let s = stop.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                s.cancel();
            });
            cli::watch(&bus, &keys.brokers, !no_explain, |l| println!("{l}"), stop)
                .await
                .map_err(runtime)
        }
        Cmd::Ping { op, window } => ping(&op, window).await,
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
                cli::controls::pause(group.as_deref(), &reason, for_, until, chrono::Utc::now())
                    .map_err(cli_failure)?;
            admin(&op, req).await
        }
        Cmd::Resume { op, group } => {
            admin(
                &op,
                cli::controls::resume(group.as_deref()).map_err(cli_failure)?,
            )
            .await
        }
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
            )
            .map_err(cli_failure)?;
            for l in lines {
                println!("{l}");
            }
            Ok(())
        }
        Cmd::Place(args) => gearshift_placement::cli::run_place(args)
            .await
            .map_err(|e| {
                let code = e.exit_code().clamp(1, 255) as u8;
                Failure::with_code(code, format!("place: {e}"))
            }),
        Cmd::PushStats(args) => push_stats_once(&args).await,
        Cmd::Run { .. } | Cmd::CheckConfig { .. } | Cmd::Keygen { .. } | Cmd::EnrollToken(_) => {
            Ok(())
        }
    }
}

async fn ping(op: &OpArgs, window: Duration) -> Result<(), Failure> {
    let Operator { bus, keys, .. } = operator(op).await?;
    let answers = cli::ping(&bus, &keys.signer, &op.from, window, None)
        .await
        .map_err(runtime)?;
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
    if n == 0 {
        println!("no replies");
        return Err(Failure::runtime("no agent answered the ping"));
    }
    let ms: Vec<f64> = answers
        .iter()
        .map(|a| a.rtt.as_secs_f64() * 1000.0)
        .collect();
    let min = ms.iter().copied().fold(f64::MAX, f64::min);
    let max = ms.iter().copied().fold(0.0, f64::max);
    let avg = ms.iter().sum::<f64>() / n as f64;
    println!("{n} replies, min/avg/max = {min:.1}/{avg:.1}/{max:.1} ms");
    Ok(())
}

/// `push-stats`: one push, like cfn-push-stats.
async fn push_stats_once(args: &gearshift_pushstats::PushStatsArgs) -> Result<(), Failure> {
    match gearshift_pushstats::run_push_stats(args).await {
        Ok(report) => {
            report.lines().iter().for_each(|l| println!("{l}"));
            Ok(())
        }
        Err(e) if e.is_usage() => Err(Failure::config(format!("push-stats: {e}"))),
        Err(e) => Err(Failure::runtime(format!("push-stats: {e}"))),
    }
}

async fn admin(op: &OpArgs, req: AdminRequest) -> Result<(), Failure> {
    let o = operator(op).await?;
    let r = cli::admin_on(&o.bus, &o.keys, &op.from, &o.admin_key, req, op.timeout)
        .await
        .map_err(runtime)?;
    if !r.ok {
        return Err(Failure::runtime(format!("refused: {}", r.message)));
    }
    println!("{}", r.message);
    Ok(())
}

/// What every operator subcommand on the bus works with, from its options
/// and the broker's configuration.
struct Operator {
    bus: SharedBus,
    keys: OperatorKeys,
    /// Where the broker agent takes operator requests (`agent.admin_key`).
    admin_key: String,
}

async fn operator(op: &OpArgs) -> Result<Operator, Failure> {
    let cfg = match &op.config {
        Some(p) => Some(bootstrap::load::<BrokerConfig>(p)?),
        None => None,
    };
    let url = op
        .bus
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.bus.url.clone()))
        .unwrap_or_else(|| BrokerConfig::defaults().bus.url);
    let key = op
        .key
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.keys.signing_key.clone()))
        .unwrap_or_else(|| PathBuf::from("/etc/gearshift/operator.key"));
    let admin_key = op
        .admin_key
        .clone()
        .or_else(|| cfg.as_ref().map(|c| c.agent.admin_key.clone()))
        .unwrap_or_else(|| gearshift_proto::routing::ADMIN.to_string());
    let mut keys = OperatorKeys::load(&key, op.broker_pub.as_deref()).map_err(Failure::config)?;
    if let Some(c) = &cfg {
        // With the broker's configuration, trust what the broker trusts, so
        // that `watch` can verify node events and reports too.
        c.keys
            .trust_into(&mut keys.brokers)
            .map_err(Failure::config)?;
    }
    let opts = ConnectOptions {
        name: "gearshift-broker-cli".into(),
        tls: cfg.as_ref().map(|c| c.bus.tls()).unwrap_or_default(),
        connect_timeout: op.timeout,
        ..Default::default()
    };
    let bus = gearshift_bus::connect(&url, opts).await.map_err(|e| {
        Failure::runtime(format!(
            "cannot connect to {}: {e}",
            gearshift_bus::url::redact(&url)
        ))
    })?;
    Ok(Operator {
        bus,
        keys,
        admin_key,
    })
}

/// Loads and parses every key file `cfg` names, as `run` does (and
/// `check-config`): the signing key, and the keyring it makes.
fn load_keys(cfg: &BrokerConfig) -> Result<(gearshift_proto::KeyPair, Keyring), Failure> {
    let signer =
        gearshift_service::keys::load_keypair(&cfg.keys.signing_key).map_err(Failure::config)?;
    let ring = keyring(cfg, &signer.public()).map_err(Failure::config)?;
    Ok((signer, ring))
}

/// The broker agent's keyring: its own key, then what `[keys]` trusts (at
/// start, and again on every reload).
fn keyring(
    cfg: &BrokerConfig,
    own: &gearshift_proto::sign::VerifyingKey,
) -> Result<Keyring, gearshift_service::keys::KeyFileError> {
    let mut ring = Keyring::new();
    ring.add(*own, Role::Broker, "own key");
    let (nodes, operators) = cfg.keys.trust_into(&mut ring)?;
    tracing::info!(
        node_keys = nodes,
        operator_keys = operators,
        extra = cfg.keys.trust.len(),
        "keys trusted"
    );
    Ok(ring)
}

/// Starts the pull-mode pusher when `[push_stats]` is enabled, fed with the
/// fleet figures of every status the agent publishes (per profile, and per
/// district from the groups).
fn start_push_stats(
    service: &Service<BrokerConfig>,
    cfg: &BrokerConfig,
    mut status: tokio::sync::watch::Receiver<Arc<gearshift_broker::status::Status>>,
    metrics: &Metrics,
) -> Result<(), Failure> {
    let push_metrics = gearshift_pushstats::PushMetrics::new();
    let token = service.token().clone();
    let pusher = cfg
        .push_stats
        .start_in(None, push_metrics.clone(), token.clone(), service.tracker())
        .map_err(|e| Failure::runtime(format!("push_stats: {e}")))?;
    let Some(pusher) = pusher else {
        return Ok(());
    };
    push_metrics.register(&mut metrics.registry.lock().unwrap_or_else(|p| p.into_inner()));
    let handle = pusher.handle();
    let ps = cfg.push_stats.clone();
    service.spawn(async move {
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
    Ok(())
}

/// One listener for `/metrics`, `/healthz` and the dashboard, on
/// `metrics.listen` (if any), handed to the agent so that reloads move it.
async fn serve_metrics(
    service: &Service<BrokerConfig>,
    cfg: &BrokerConfig,
    agent: &mut Agent,
    metrics: &Metrics,
) -> Result<(), Failure> {
    // The dashboard's task runs on the agent's tracker (the service's).
    let dashboard = gearshift_broker::dashboard::Dashboard::spawn(
        agent,
        cfg.agent.name.clone(),
        service.token().clone(),
    );
    let router =
        gearshift_service::http::metrics_router(metrics.registry.clone()).merge(dashboard.router());
    let mut listener = gearshift_service::http::Listener::new(
        service.tracker().clone(),
        router,
        service.token().clone(),
    );
    let local = listener
        .rebind(cfg.metrics.listen)
        .await
        .map_err(|e| Failure::runtime(format!("metrics.listen {:?}: {e}", cfg.metrics.listen)))?;
    if let Some(local) = local {
        tracing::info!(%local, "metrics and dashboard listener (http://{local}/)");
    }
    agent.set_listener(listener);
    Ok(())
}

async fn run_agent(path: PathBuf, log_format: Option<LogFormat>) -> Result<(), Failure> {
    // Validate before touching anything else.
    let (service, cfg) = Service::<BrokerConfig>::start(&path, log_format)?;
    let (signer, ring) = load_keys(&cfg)?;
    let own = signer.public();
    let key_source: gearshift_broker::agent::KeySource =
        Arc::new(move |c: &BrokerConfig| keyring(c, &own).map_err(|e| e.to_string()));
    // Connect, retrying until the bus answers or we are told to stop.
    let opts = cfg
        .bus
        .connect_options(format!("gearshift-broker {}", cfg.agent.name));
    let Some(bus) = service.connect_bus(&cfg.bus.url, &opts).await else {
        return Ok(());
    };
    let metrics = Metrics::new();
    let mut agent = Agent::builder(cfg.clone(), bus.clone())
        .tracker(service.tracker().clone())
        .signer(signer)
        .keyring(ring)
        .keys_from(key_source)
        .metrics(metrics.clone())
        .build()
        .map_err(runtime)?;
    start_push_stats(&service, &cfg, agent.status(), &metrics)?;
    serve_metrics(&service, &cfg, &mut agent, &metrics).await?;
    // SIGHUP: the agent rebuilds what the new file names, or keeps running
    // the old one (a bad file, a key that only applies at start).
    let reloader = agent.reloader();
    service.on_reload_async(move |c| {
        let r = reloader.clone();
        async move { r.reload(c).await }
    });
    let status = agent.status();
    service.ready("running", move || {
        status
            .borrow()
            .at
            .is_some_and(|t| chrono::Utc::now() - t < chrono::Duration::seconds(10))
    });
    let token = service.token().clone();
    let run = service.spawn(agent.run(token.clone()));
    let ended = tokio::select! {
        r = run => Some(r),
        _ = token.cancelled() => None,
    };
    // The agent's own drain is bounded by shutdown_grace.
    service
        .stop(cfg.agent.shutdown_grace + Duration::from_secs(2))
        .await;
    close(&bus).await;
    match ended {
        None => Ok(()),
        Some(r) => r.map_err(runtime)?.map_err(runtime),
    }
}

/// Closes the bus connection, without waiting long for a bus that is gone.
async fn close(bus: &SharedBus) {
    if tokio::time::timeout(Duration::from_secs(5), bus.close())
        .await
        .is_err()
    {
        tracing::warn!("the bus did not close within 5s");
    }
}
