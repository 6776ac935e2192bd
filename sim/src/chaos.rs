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

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use gearshift_broker::cli::OperatorKeys;
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::perkey::PerKey;
use gearshift_bus::SharedBus;
use gearshift_proto::msg::{AdminRequest, DecisionKind, Message, Role};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use rand::Rng;
use serde::Serialize;

use crate::bench::{self, RunDir};
use crate::bench_proc::{self, Proc};

/// Options of `gearshift-sim chaos`.
#[derive(Debug, Clone, clap::Args)]
pub struct ChaosArgs {
    /// AMQP URL of the bus (RabbitMQ on this machine: the campaign runs rabbitmqctl).
    #[arg(long, env = "GEARSHIFT_BUS", default_value = bench::DEFAULT_BUS)]
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
}

impl ChaosReport {
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
        s
    }
}

/// `rabbitmqctl stop_app` undone by `start_app` when dropped (also on panic).
struct AppGuard {
    ctl: String,
    stopped: bool,
}

impl AppGuard {
    fn stop(ctl: &str) -> anyhow::Result<AppGuard> {
        let mut g = AppGuard {
            ctl: ctl.to_string(),
            stopped: true,
        };
        if let Err(e) = rabbitmqctl(ctl, &["stop_app"]) {
            g.stopped = false;
            let _ = rabbitmqctl(ctl, &["start_app"]);
            return Err(e);
        }
        Ok(g)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        rabbitmqctl(&self.ctl, &["start_app"])?;
        self.stopped = false;
        rabbitmqctl(&self.ctl, &["await_startup"])?;
        Ok(())
    }
}

impl Drop for AppGuard {
    fn drop(&mut self) {
        if self.stopped {
            let _ = rabbitmqctl(&self.ctl, &["start_app"]);
        }
    }
}

fn rabbitmqctl(ctl: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new(ctl)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {ctl}"))?;
    if !out.status.success() {
        bail!(
            "{ctl} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// One node agent process and where its gears live.
struct Node {
    name: String,
    proc: Proc,
    root: PathBuf,
    removed: bool,
}

/// The campaign's world: the broker agent, the nodes, the cloud's log.
struct World {
    dir: PathBuf,
    url: String,
    tag: String,
    district: String,
    node_bin: PathBuf,
    node_key: PathBuf,
    broker_pub: PathBuf,
    broker: Proc,
    cfg: BrokerConfig,
    nodes: Vec<Node>,
    requests: PathBuf,
    seen_lines: usize,
    creates: BTreeMap<String, usize>,
    removes: BTreeMap<String, usize>,
    expected_gears: BTreeSet<String>,
    next_gear: usize,
    op: OperatorKeys,
    control: SharedBus,
    brokers: Keyring,
}

const MAX_ACTIVE: u32 = 10;

impl World {
    fn nodes_root(&self) -> PathBuf {
        self.dir.join("nodes")
    }

    /// Starts a node agent with `gears` new gears (and `booted_for`).
    fn boot(&mut self, gears: usize, booted_for: Option<String>) -> anyhow::Result<String> {
        use gearshift_node::config::{NodeConfig, RuntimeKind};
        let name = format!("{}-n{}", self.tag, self.nodes.len() + 1);
        let base = self.dir.join("state").join(&name);
        let root = self.nodes_root().join(&name).join("gears");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&base)?;
        for _ in 0..gears {
            self.add_gear(&root)?;
        }
        let mut c = NodeConfig::default();
        c.node.name = Some(name.clone());
        c.node.booted_for = booted_for;
        c.bus.url = self.url.clone();
        c.bus.reconnect_max = Duration::from_secs(1);
        c.bus.heartbeat = Duration::from_secs(5);
        c.keys.signing_key = self.node_key.clone();
        c.keys.broker_keys = vec![self.broker_pub.clone()];
        c.state.dir = base.join("state");
        c.report.interval = Duration::from_secs(1);
        c.report.scan_interval = Duration::from_millis(500);
        c.runtime.kind = RuntimeKind::Dir;
        c.runtime.facts.profile = "small".into();
        c.runtime.facts.max_active_gears = MAX_ACTIVE;
        c.runtime.facts.district_uuid = Some(self.district.clone());
        c.runtime.dir.root = root.clone();
        c.runtime.dir.target_root = format!("{}/{{target}}/gears", self.nodes_root().display());
        c.runtime.dir.max_bytes_per_sec = 64 * 1024;
        c.evacuation.backoff_min = Duration::from_millis(200);
        c.evacuation.backoff_max = Duration::from_secs(2);
        c.log.level = "info".into();
        let path = base.join("node.toml");
        std::fs::write(&path, toml::to_string(&c)?)?;
        let mut proc = Proc::new(
            &name,
            &self.node_bin,
            &["run", "--config", &path.to_string_lossy()],
            &base.join("node.log"),
        );
        proc.start()?;
        self.nodes.push(Node {
            name: name.clone(),
            proc,
            root,
            removed: false,
        });
        Ok(name)
    }

    fn add_gear(&mut self, root: &Path) -> anyhow::Result<String> {
        self.next_gear += 1;
        let g = format!("gear{:04}", self.next_gear);
        let d = root.join(&g);
        std::fs::create_dir_all(&d)?;
        // 32 KiB per gear, copied at 64 KiB/s: a move takes half a second, so
        // that faults land in the middle of evacuations.
        std::fs::write(d.join("data"), format!("{g}\n").repeat(32 * 1024 / 9))?;
        self.expected_gears.insert(g.clone());
        Ok(g)
    }

    fn node(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }

    fn live(&self) -> Vec<&Node> {
        self.nodes.iter().filter(|n| !n.removed).collect()
    }

    /// Gears of a node's directory (not the copies in progress).
    fn gears_in(root: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(root)
            .map(|rd| {
                rd.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().to_string())
                    .filter(|n| !n.starts_with('.'))
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    /// Acts on the handler's new requests, like a cloud would.
    fn poll_cloud(&mut self) -> anyhow::Result<()> {
        let text = std::fs::read_to_string(&self.requests).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        for line in lines.iter().skip(self.seen_lines) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["create-node", op, ..] => {
                    let n = self.creates.entry(op.to_string()).or_default();
                    *n += 1;
                    if *n == 1 {
                        self.boot(0, Some(op.to_string()))?;
                    }
                }
                ["remove-node", op, node, ..] => {
                    *self.removes.entry(op.to_string()).or_default() += 1;
                    if let Some(n) = self.node(node) {
                        n.proc.terminate(Duration::from_secs(10));
                        n.removed = true;
                    }
                }
                _ => bail!("unexpected handler line {line:?}"),
            }
        }
        self.seen_lines = lines.len();
        Ok(())
    }

    async fn status(&self) -> Option<gearshift_broker::status::Status> {
        gearshift_broker::cli::admin_on(
            &self.control,
            &self.op,
            "gearshift-sim-chaos",
            &self.cfg.agent.admin_key,
            AdminRequest::Status,
            Duration::from_secs(2),
        )
        .await
        .ok()
        .filter(|r| r.ok)
        .and_then(|r| serde_json::from_value(r.data).ok())
    }

    /// Runs the cloud and restarts a dead broker agent until `f` holds or
    /// `within` passes; true when it held.
    async fn until<F>(&mut self, within: Duration, mut f: F) -> anyhow::Result<bool>
    where
        F: FnMut(&gearshift_broker::status::Status) -> bool,
    {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.poll_cloud()?;
            if !self.broker.running() {
                bail!("the broker agent died:\n{}", self.broker.log_tail(40));
            }
            if let Some(s) = self.status().await
                && f(&s)
            {
                return Ok(true);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(false)
    }
}

/// Runs the campaign.
pub async fn run(args: ChaosArgs) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let seed = args.seed.unwrap_or_else(rand::random);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let broker_bin = bench_proc::sibling_binary(args.broker_bin.as_deref(), "gearshift-broker")?;
    let node_bin = bench_proc::sibling_binary(args.node_bin.as_deref(), "gearshift-node")?;
    let tmp: RunDir = bench::tempfile_dir()?;
    let dir = tmp.path.clone();
    let tag = format!("c{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    eprintln!("chaos: run directory {}, seed {seed}", dir.display());

    // Keys: the broker's, one shared by the nodes (new nodes join without a
    // broker restart), an operator's.
    let keys = dir.join("keys");
    std::fs::create_dir_all(keys.join("nodes.d"))?;
    std::fs::create_dir_all(keys.join("operators.d"))?;
    let broker_key = KeyPair::generate()?;
    let node_key = KeyPair::generate()?;
    let operator = KeyPair::generate()?;
    write_key(&keys.join("broker.key"), &broker_key.to_pem())?;
    std::fs::write(keys.join("broker.pub"), broker_key.public_pem())?;
    write_key(&keys.join("node.key"), &node_key.to_pem())?;
    std::fs::write(keys.join("nodes.d/nodes.pub"), node_key.public_pem())?;
    std::fs::write(keys.join("operators.d/op.pub"), operator.public_pem())?;
    let mut brokers = Keyring::new();
    brokers.add(broker_key.public(), Role::Broker, "broker");
    let op = OperatorKeys {
        signer: operator,
        brokers: brokers.clone(),
    };

    // The broker agent: the exec handler records every request.
    let requests = dir.join("requests.log");
    let handler_dir = dir.join("handler");
    write_recording_handler(&handler_dir, &requests)?;
    let port = bench_proc::free_port()?;
    let mut cfg = bench::broker_config(&args.bus, &dir, &keys, &tag, port);
    cfg.log.level = "info".into();
    cfg.handlers.insert(
        "cloud".into(),
        serde_json::from_value(serde_json::json!({
            "type": "exec", "dir": handler_dir, "timeout": "20s",
        }))?,
    );
    cfg.group_defaults.handler = "cloud".into();
    cfg.group_defaults.max_nodes = 50;
    cfg.policy.interval = Duration::from_millis(500);
    cfg.policy.react_delay = Duration::from_millis(100);
    cfg.policy.startup_grace = Duration::from_secs(3);
    // Scale-downs only when the campaign asks (operator evacuations).
    cfg.policy.compact_threshold = PerKey::off();
    cfg.policy.profile_threshold = PerKey::off();
    cfg.policy.district_threshold = PerKey::all(90);
    cfg.policy.max_scale_ups_in_flight = 1;
    cfg.policy.cooldown_after_scale_up = Duration::from_secs(2);
    cfg.policy.provision_timeout = Duration::from_secs(60);
    cfg.saga.command_timeout = Duration::from_secs(5);
    cfg.saga.command_attempts = 20;
    cfg.saga.evacuation_timeout = Duration::from_secs(60);
    cfg.saga.evacuation_attempts = 10;
    cfg.saga.evacuation_parallelism = 2;
    cfg.saga.confirm_empty_timeout = Duration::from_secs(10);
    cfg.saga.remove_timeout = Duration::from_secs(60);
    cfg.saga.presence_poll = Duration::from_millis(500);
    cfg.saga.handler_timeout = Duration::from_secs(20);
    let cfg_path = dir.join("broker.toml");
    std::fs::write(
        &cfg_path,
        cfg.to_toml().map_err(|e| anyhow::anyhow!("{e}"))?,
    )?;
    gearshift_broker::config::load(&cfg_path)
        .map_err(|e| anyhow::anyhow!("generated configuration refused: {e}"))?;
    let control = bench::connect_many(&args.bus, 1, "gearshift-sim chaos")
        .await?
        .remove(0);
    let mut decisions = control.subscribe(routing::ALL_DECISIONS).await?;
    let mut reports = control.subscribe(routing::ALL_REPORTS).await?;

    let mut broker = Proc::new(
        "gearshift-broker",
        &broker_bin,
        &["run", "--config", &cfg_path.to_string_lossy()],
        &dir.join("broker.log"),
    )
    .env("RUST_LOG", "info");
    broker.start()?;
    let mut w = World {
        dir: dir.clone(),
        url: args.bus.clone(),
        tag: tag.clone(),
        district: format!("{tag}-d1"),
        node_bin,
        node_key: keys.join("node.key"),
        broker_pub: keys.join("broker.pub"),
        broker,
        cfg: cfg.clone(),
        nodes: vec![],
        requests,
        seen_lines: 0,
        creates: BTreeMap::new(),
        removes: BTreeMap::new(),
        expected_gears: BTreeSet::new(),
        next_gear: 0,
        op,
        control: control.clone(),
        brokers,
    };
    bench::wait_ready(&control, &w.op, &cfg.agent.admin_key, &mut w.broker).await?;
    for _ in 0..3 {
        w.boot(4, None)?;
    }
    let want = w.live().len();
    if !w
        .until(Duration::from_secs(30), |s| {
            s.nodes.iter().filter(|n| n.fresh).count() >= want
        })
        .await?
    {
        bail!("the node agents did not report within 30 s");
    }

    let mut report = ChaosReport {
        seed,
        ..Default::default()
    };
    let result = campaign(
        &args,
        &mut w,
        &mut rng,
        &mut report,
        &mut decisions,
        &mut reports,
    )
    .await;
    // Stop everything, then judge.
    for n in &mut w.nodes {
        n.proc.terminate(Duration::from_secs(10));
    }
    w.broker.terminate(Duration::from_secs(10));
    let mut extra: Vec<String> = w
        .nodes
        .iter()
        .map(|n| routing::node_queue(&n.name))
        .collect();
    extra.sort();
    bench::cleanup_queues(&args.bus, &cfg, &extra).await;
    if args.keep || result.is_err() || !report.ok() {
        eprintln!("chaos: run directory kept: {}", dir.display());
        tmp.keep();
    }
    result?;
    report.elapsed_s = (started.elapsed().as_secs_f64() * 10.0).round() / 10.0;
    Ok(report)
}

fn write_key(path: &Path, pem: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)?;
    std::io::Write::write_all(&mut f, pem.as_bytes())?;
    Ok(())
}

fn write_recording_handler(dir: &Path, log: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let script = dir.join("event");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$GEARSHIFT_EVENT $GEARSHIFT_OP ${{GEARSHIFT_NODE:--}} $GEARSHIFT_DISTRICT\" >> '{}'\n",
            log.display()
        ),
    )?;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

fn check(report: &mut ChaosReport, round: usize, name: &str, ok: bool, detail: String) {
    if !ok {
        eprintln!("chaos: round {round}: {name} FAILED: {detail}");
    }
    report.checks += 1;
    report.checks_held += usize::from(ok);
    report.details.push(Check {
        round,
        name: name.into(),
        ok,
        detail,
    });
}

async fn campaign(
    args: &ChaosArgs,
    w: &mut World,
    rng: &mut rand::rngs::StdRng,
    report: &mut ChaosReport,
    decisions: &mut gearshift_bus::Subscription,
    reports: &mut gearshift_bus::Subscription,
) -> anyhow::Result<()> {
    for round in 1..=args.rounds {
        let fault = FAULTS[(round - 1) % FAULTS.len()];
        report.rounds = round;
        eprintln!("chaos: round {round}: {fault:?}");
        let ops_before: BTreeSet<String> = w
            .status()
            .await
            .map(|s| s.ops.iter().map(|o| o.id.clone()).collect())
            .unwrap_or_default();
        let t0 = Utc::now();
        let deadline_for = match fault {
            Fault::Outage => args.outage + Duration::from_secs(120),
            _ => Duration::from_secs(120),
        };
        // Start the saga.
        let victim = match fault {
            Fault::KillBrokerScaleUp => {
                // Fill every live node to 9 of 10 active gears: over 90 %.
                let roots: Vec<(PathBuf, usize)> = w
                    .live()
                    .iter()
                    .map(|n| (n.root.clone(), World::gears_in(&n.root).len()))
                    .collect();
                for (root, have) in roots {
                    for _ in have..(MAX_ACTIVE as usize - 1) {
                        w.add_gear(&root)?;
                    }
                }
                None
            }
            _ => {
                // The live node with the fewest gears that others can absorb.
                let mut cands: Vec<(usize, String)> = w
                    .live()
                    .iter()
                    .map(|n| (World::gears_in(&n.root).len(), n.name.clone()))
                    .collect();
                // Prefer a node with gears: the fault then hits the moves.
                cands.sort_by_key(|(g, n)| (*g == 0, *g, n.clone()));
                let room: usize = cands
                    .iter()
                    .skip(1)
                    .map(|(g, _)| (MAX_ACTIVE as usize).saturating_sub(*g))
                    .sum();
                let Some((gears, v)) = cands.first().cloned() else {
                    bail!("no live node left");
                };
                if w.live().len() < 3 || room < gears {
                    // Make room first: a new, empty node.
                    w.boot(0, None)?;
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                // The broker agent may see less room than the directories
                // say (a node not fresh yet): then one more empty node, once.
                let mut attempt = 0;
                loop {
                    let r = gearshift_broker::cli::admin_on(
                        &w.control,
                        &w.op,
                        "gearshift-sim-chaos",
                        &w.cfg.agent.admin_key,
                        AdminRequest::Evacuate { node: v.clone() },
                        Duration::from_secs(10),
                    )
                    .await?;
                    if r.ok {
                        break;
                    }
                    attempt += 1;
                    if attempt > 1 {
                        bail!("evacuation of {v} refused: {}", r.message);
                    }
                    eprintln!(
                        "chaos: evacuation of {v} refused ({}); adding a node",
                        r.message
                    );
                    let new = w.boot(0, None)?;
                    let _ = w
                        .until(Duration::from_secs(15), |s| {
                            s.nodes.iter().any(|n| n.node == new && n.fresh)
                        })
                        .await?;
                }
                Some(v)
            }
        };
        // The fault, at a random point.
        let delay = Duration::from_millis(rng.random_range(100..2500));
        let until = Instant::now() + delay;
        while Instant::now() < until {
            w.poll_cloud()?;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        *report.faults.entry(format!("{fault:?}")).or_default() += 1;
        report.faults_injected += 1;
        match fault {
            Fault::KillBrokerDrain | Fault::KillBrokerScaleUp => {
                w.broker.kill();
                w.broker.start()?;
            }
            Fault::KillNode => {
                let v = victim.clone().unwrap_or_default();
                // A node the cloud already removed stays removed.
                if let Some(n) = w.node(&v)
                    && !n.removed
                {
                    n.proc.kill();
                    tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
                    n.proc.start()?;
                }
            }
            Fault::CloseConnections => {
                rabbitmqctl(
                    &args.rabbitmqctl,
                    &["close_all_connections", "gearshift chaos"],
                )?;
            }
            Fault::Outage => {
                outage_round(args, w, round, t0, report, decisions, reports).await?;
            }
        }
        // The saga ends before its deadline.
        let ended = w
            .until(deadline_for, |s| {
                let new: Vec<_> = s
                    .ops
                    .iter()
                    .filter(|o| !ops_before.contains(&o.id))
                    .collect();
                !new.is_empty() && new.iter().all(|o| o.done)
            })
            .await?;
        let (ops_desc, states) = match w.status().await {
            Some(s) => {
                let new: Vec<String> = s
                    .ops
                    .iter()
                    .filter(|o| !ops_before.contains(&o.id))
                    .map(|o| {
                        format!(
                            "{} {} {}",
                            o.kind,
                            o.state,
                            o.node.clone().unwrap_or_default()
                        )
                    })
                    .collect();
                (new.join(", "), new.len())
            }
            None => ("no status".into(), 0),
        };
        check(
            report,
            round,
            "saga_ended_before_deadline",
            ended,
            format!(
                "{states} new operation(s) within {}: {ops_desc}",
                humantime::format_duration(deadline_for)
            ),
        );
        // Quiet: nothing in flight, every node fresh.
        let _ = w
            .until(Duration::from_secs(30), |s| {
                s.ops.iter().all(|o| o.done) && s.nodes.iter().all(|n| n.fresh || !n.active)
            })
            .await?;
        w.poll_cloud()?;
        inventory_checks(w, round, report);
    }
    Ok(())
}

fn inventory_checks(w: &World, round: usize, report: &mut ChaosReport) {
    let mut at: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut lost_on_removed = vec![];
    for n in &w.nodes {
        for g in World::gears_in(&n.root) {
            if n.removed {
                lost_on_removed.push(format!("{g}@{}", n.name));
            } else {
                at.entry(g).or_default().push(n.name.clone());
            }
        }
    }
    let found: BTreeSet<String> = at.keys().cloned().collect();
    let missing: Vec<&String> = w.expected_gears.difference(&found).collect();
    let unexpected: Vec<&String> = found.difference(&w.expected_gears).collect();
    let dup: Vec<String> = at
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(g, v)| format!("{g}@{}", v.join("+")))
        .collect();
    check(
        report,
        round,
        "no_gear_lost",
        missing.is_empty() && lost_on_removed.is_empty() && unexpected.is_empty(),
        format!(
            "{} gears expected, {} on live nodes; missing {missing:?}, on removed nodes {lost_on_removed:?}, unknown {unexpected:?}",
            w.expected_gears.len(),
            found.len()
        ),
    );
    check(
        report,
        round,
        "no_gear_duplicated",
        dup.is_empty(),
        format!("duplicated: {dup:?}"),
    );
    let twice: Vec<String> = w
        .creates
        .iter()
        .chain(w.removes.iter())
        .filter(|(_, n)| **n > 1)
        .map(|(op, n)| format!("{op} x{n}"))
        .collect();
    check(
        report,
        round,
        "no_duplicate_node_request",
        twice.is_empty(),
        format!(
            "{} create-node and {} remove-node requests; repeated: {twice:?}",
            w.creates.values().sum::<usize>(),
            w.removes.values().sum::<usize>()
        ),
    );
}

/// The outage: stop RabbitMQ's app, wait, start it; then the reconnection
/// and stale-decision checks.
async fn outage_round(
    args: &ChaosArgs,
    w: &mut World,
    round: usize,
    _t0: DateTime<Utc>,
    report: &mut ChaosReport,
    decisions: &mut gearshift_bus::Subscription,
    reports: &mut gearshift_bus::Subscription,
) -> anyhow::Result<()> {
    // Reports received before the outage say nothing about reconnection.
    while let Ok(Some(_)) = reports.next_timeout(Duration::from_millis(10)).await {}
    let down_at = Utc::now();
    let mut guard = AppGuard::stop(&args.rabbitmqctl)?;
    let t = Instant::now();
    while t.elapsed() < args.outage {
        // The cloud keeps working from the handler's file.
        w.poll_cloud()?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    guard.start()?;
    let back = Instant::now();
    let back_at = Utc::now();
    drop(guard);
    eprintln!("chaos: bus back after {:.1} s", t.elapsed().as_secs_f64());
    // Reconnection: the broker agent answers, every live node reports.
    let mut broker_back = None;
    let mut nodes_back: BTreeMap<String, f64> = BTreeMap::new();
    let live: BTreeSet<String> = w.live().iter().map(|n| n.name.clone()).collect();
    let limit = Duration::from_secs(15);
    while back.elapsed() < limit && (broker_back.is_none() || nodes_back.len() < live.len()) {
        if broker_back.is_none() && w.status().await.is_some() {
            broker_back = Some(back.elapsed().as_secs_f64());
        }
        while let Ok(Some(d)) = reports.next_timeout(Duration::from_millis(50)).await {
            if let Ok(x) = Envelope::decode(&d.payload)
                && live.contains(&x.envelope.from)
            {
                nodes_back
                    .entry(x.envelope.from.clone())
                    .or_insert_with(|| back.elapsed().as_secs_f64());
            }
        }
    }
    let slow: Vec<String> = live
        .iter()
        .filter(|n| nodes_back.get(*n).is_none_or(|s| *s > 5.0))
        .map(|n| format!("{n} {:?}", nodes_back.get(n)))
        .collect();
    check(
        report,
        round,
        "broker_reconnected_within_5s",
        broker_back.is_some_and(|s| s <= 5.0),
        format!("answered {broker_back:?} s after the bus returned"),
    );
    check(
        report,
        round,
        "nodes_reconnected_within_5s",
        slow.is_empty(),
        format!("first reports after the bus returned (s): {nodes_back:?}"),
    );
    // No scaling decision taken on the outage's stale figures: none dated
    // within the outage, none with missing nodes in its figures.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut bad = vec![];
    let mut seen = 0;
    while let Ok(Some(d)) = decisions.next_timeout(Duration::from_millis(50)).await {
        let Ok(x) = Envelope::decode(&d.payload) else {
            continue;
        };
        let Message::Decision(dec) = &x.envelope.msg else {
            continue;
        };
        if x.envelope.ts < down_at {
            continue;
        }
        seen += 1;
        let scaling = matches!(
            dec.decision,
            DecisionKind::ScaleUp | DecisionKind::ScaleDown
        );
        let during = x.envelope.ts <= back_at;
        let missing = dec.stats.as_ref().is_some_and(|s| s.nodes_missing > 0);
        if scaling && (during || missing) {
            bad.push(format!(
                "{} at {} ({} missing)",
                dec.decision.as_str(),
                x.envelope.ts,
                dec.stats.as_ref().map_or(0, |s| s.nodes_missing)
            ));
        }
    }
    check(
        report,
        round,
        "no_decision_on_stale_data",
        bad.is_empty(),
        format!("{seen} decisions since the outage began; on stale data: {bad:?}"),
    );
    let _ = &w.brokers;
    Ok(())
}

/// `gearshift-sim chaos`: runs the campaign and prints its outcome.
pub fn main(args: ChaosArgs) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("gearshift-sim chaos: cannot start the runtime: {e}");
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
            if r.ok() {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("gearshift-sim chaos: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
