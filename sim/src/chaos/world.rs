//! The campaign's world: the broker agent's process, the node agents'
//! processes and their gear directories, and the cloud played from the
//! `exec` handler's request log.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::perkey::PerKey;
use gearshift_broker::status::Status;
use gearshift_bus::Subscription;
use gearshift_proto::routing;

use super::ChaosArgs;
use crate::fleet::Keys;
use crate::harness::broker::{BrokerProc, process_config};
use crate::harness::process::{self, Proc};
use crate::harness::requests::{CloudRequest, RequestLog, write_recording_handler};
use crate::harness::{bus, metrics};

/// `max_active_gears` of every node.
pub(super) const MAX_ACTIVE: u32 = 10;

/// One node agent process and where its gears live.
pub(super) struct Node {
    pub(super) name: String,
    pub(super) proc: Proc,
    pub(super) root: PathBuf,
    pub(super) removed: bool,
}

/// What the campaign watches on the bus.
pub(super) struct Watch {
    /// Every decision.
    pub(super) decisions: Subscription,
    /// Every node report.
    pub(super) reports: Subscription,
}

/// The broker agent, the nodes, the cloud's log, the gears that must exist.
pub(super) struct World {
    dir: PathBuf,
    url: String,
    tag: String,
    district: String,
    node_bin: PathBuf,
    pub(super) keys: Keys,
    /// The broker agents (one, or the cluster of the HA campaign).
    pub(super) brokers: Vec<BrokerProc>,
    pub(super) nodes: Vec<Node>,
    pub(super) requests: RequestLog,
    pub(super) expected_gears: BTreeSet<String>,
    next_gear: usize,
}

/// The broker agent's configuration: the exec handler in `handler_dir`
/// records every request; scale-downs only when the campaign asks
/// (operator evacuations); scale-ups over 90 % of a district.
fn chaos_config(url: &str, dir: &Path, keys: &Keys, tag: &str) -> anyhow::Result<BrokerConfig> {
    let mut cfg = process_config(url, dir, keys, tag, metrics::free_port()?);
    cfg.log.level = "info".into();
    cfg.handlers.insert(
        "cloud".into(),
        serde_json::from_value(serde_json::json!({
            "type": "exec", "dir": dir.join("handler"), "timeout": "20s",
        }))?,
    );
    cfg.group_defaults.handler = "cloud".into();
    cfg.group_defaults.max_nodes = 50;
    let p = &mut cfg.policy;
    p.interval = Duration::from_millis(500);
    p.react_delay = Duration::from_millis(100);
    p.startup_grace = Duration::from_secs(3);
    p.compact_threshold = PerKey::off();
    p.profile_threshold = PerKey::off();
    p.district_threshold = PerKey::all(90);
    p.max_scale_ups_in_flight = 1;
    p.cooldown_after_scale_up = Duration::from_secs(2);
    p.provision_timeout = Duration::from_secs(60);
    let s = &mut cfg.saga;
    s.command_timeout = Duration::from_secs(5);
    s.command_attempts = 20;
    s.evacuation_timeout = Duration::from_secs(60);
    s.evacuation_attempts = 10;
    s.evacuation_parallelism = 2;
    s.confirm_empty_timeout = Duration::from_secs(10);
    s.remove_timeout = Duration::from_secs(60);
    s.presence_poll = Duration::from_millis(500);
    s.handler_timeout = Duration::from_secs(20);
    Ok(cfg)
}

impl World {
    /// Keys, the recording handler, the broker agent (started and
    /// answering), and the campaign's subscriptions, in `dir`.
    pub(super) async fn start(
        args: &ChaosArgs,
        dir: &Path,
        tag: &str,
    ) -> anyhow::Result<(World, Watch)> {
        let broker_bin = process::sibling_binary(args.broker_bin.as_deref(), "gearshift-broker")?;
        let node_bin = process::sibling_binary(args.node_bin.as_deref(), "gearshift-node")?;
        // One key shared by the nodes: new nodes join without a broker restart.
        let keys = Keys::generate(&dir.join("keys"))?;
        let requests = RequestLog::new(&dir.join("requests.log"));
        write_recording_handler(&dir.join("handler"), requests.path())?;
        let cfg = chaos_config(&args.bus, dir, &keys, tag)?;
        let control = bus::connect(&args.bus, "gearshift-sim chaos 0").await?;
        let watch = Watch {
            decisions: control.subscribe(routing::ALL_DECISIONS).await?,
            reports: control.subscribe(routing::ALL_REPORTS).await?,
        };
        let mut brokers = vec![];
        for i in 0..args.brokers.max(1) {
            let mut c = cfg.clone();
            let bdir = if args.brokers > 1 {
                c.agent.name = format!("{}-{i}", cfg.agent.name);
                let d = dir.join(format!("b{i}"));
                c.agent.state_dir = d.join("broker-state");
                c.metrics.listen = Some(std::net::SocketAddr::from((
                    [127, 0, 0, 1],
                    metrics::free_port()?,
                )));
                std::fs::create_dir_all(&d)?;
                d
            } else {
                dir.to_path_buf()
            };
            let mut b = BrokerProc::new(
                &broker_bin,
                c,
                &bdir,
                control.clone(),
                keys.operator_keys(),
                "gearshift-sim-chaos",
            )?
            .env("RUST_LOG", "info");
            b.proc.start()?;
            brokers.push(b);
        }
        brokers[0].wait_ready().await?;
        let w = World {
            dir: dir.to_path_buf(),
            url: args.bus.clone(),
            tag: tag.to_string(),
            district: format!("{tag}-d1"),
            node_bin,
            keys,
            brokers,
            nodes: vec![],
            requests,
            expected_gears: BTreeSet::new(),
            next_gear: 0,
        };
        Ok((w, watch))
    }

    /// Three nodes of four gears each, reporting.
    pub(super) async fn boot_initial(&mut self) -> anyhow::Result<()> {
        for _ in 0..3 {
            self.boot(4, None)?;
        }
        let want = self.live().len();
        let fresh = |s: &Status| s.nodes.iter().filter(|n| n.fresh).count() >= want;
        if !self.until(Duration::from_secs(30), fresh).await? {
            bail!("the node agents did not report within 30 s");
        }
        Ok(())
    }

    /// Stops every process and deletes the run's durable queues.
    pub(super) async fn stop(&mut self) {
        for n in &mut self.nodes {
            n.proc.terminate(Duration::from_secs(10));
        }
        for b in &mut self.brokers {
            b.proc.terminate(Duration::from_secs(10));
        }
        let mut queues: Vec<String> = self
            .nodes
            .iter()
            .map(|n| routing::node_queue(&n.name))
            .collect();
        queues.sort();
        queues.extend(self.broker().queues());
        bus::cleanup_queues(&self.url, &queues).await;
    }

    fn nodes_root(&self) -> PathBuf {
        self.dir.join("nodes")
    }

    /// The `node.toml` of node `name`: the `dir` runtime on `root`, fast
    /// reports and reconnects.
    fn node_config(
        &self,
        name: &str,
        base: &Path,
        root: &Path,
        booted_for: Option<String>,
    ) -> gearshift_node::NodeConfig {
        use gearshift_node::config::{NodeConfig, RuntimeKind};
        let mut c = NodeConfig::default();
        c.node.name = Some(name.to_string());
        c.node.booted_for = booted_for;
        c.bus.url = self.url.clone();
        c.bus.reconnect_max = Duration::from_secs(1);
        c.bus.heartbeat = Duration::from_secs(5);
        c.keys.signing_key = self.keys.path("node.key");
        c.keys.broker_keys = vec![self.keys.path("broker.pub")];
        c.state.dir = base.join("state");
        c.report.interval = Duration::from_secs(1);
        c.report.scan_interval = Duration::from_millis(500);
        c.runtime.kind = RuntimeKind::Dir;
        c.runtime.facts.profile = "small".into();
        c.runtime.facts.max_active_gears = MAX_ACTIVE;
        c.runtime.facts.district_uuid = Some(self.district.clone());
        c.runtime.dir.root = root.to_path_buf();
        c.runtime.dir.target_root = format!("{}/{{target}}/gears", self.nodes_root().display());
        c.runtime.dir.max_bytes_per_sec = 64 * 1024;
        c.evacuation.backoff_min = Duration::from_millis(200);
        c.evacuation.backoff_max = Duration::from_secs(2);
        c.log.level = "info".into();
        c
    }

    /// Starts a node agent with `gears` new gears (and `booted_for`).
    pub(super) fn boot(
        &mut self,
        gears: usize,
        booted_for: Option<String>,
    ) -> anyhow::Result<String> {
        let name = format!("{}-n{}", self.tag, self.nodes.len() + 1);
        let base = self.dir.join("state").join(&name);
        let root = self.nodes_root().join(&name).join("gears");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&base)?;
        for _ in 0..gears {
            self.add_gear(&root)?;
        }
        let c = self.node_config(&name, &base, &root, booted_for);
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

    /// A new gear directory in `root`, expected to exist from now on.
    pub(super) fn add_gear(&mut self, root: &Path) -> anyhow::Result<String> {
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

    pub(super) fn node(&mut self, name: &str) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.name == name)
    }

    pub(super) fn live(&self) -> Vec<&Node> {
        self.nodes.iter().filter(|n| !n.removed).collect()
    }

    /// Gears of a node's directory (not the copies in progress).
    pub(super) fn gears_in(root: &Path) -> Vec<String> {
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

    /// Acts on the handler's new requests, like a cloud would: boots a node
    /// for an operation's first create request, stops a removed node.
    pub(super) fn poll_cloud(&mut self) -> anyhow::Result<()> {
        for r in self.requests.poll()? {
            match r {
                CloudRequest::Create {
                    op, first: true, ..
                } => {
                    self.boot(0, Some(op))?;
                }
                CloudRequest::Create { .. } => {}
                CloudRequest::Remove { node, .. } => {
                    if let Some(n) = self.node(&node) {
                        n.proc.terminate(Duration::from_secs(10));
                        n.removed = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// The first broker agent: admin requests through it reach whichever
    /// agent leads (they share the admin queue).
    pub(super) fn broker(&self) -> &BrokerProc {
        &self.brokers[0]
    }

    pub(super) async fn status(&self) -> Option<Status> {
        self.broker().status().await
    }

    /// Runs the cloud until `f` holds or `within` passes; true when it
    /// held. Fails if the broker agent died.
    pub(super) async fn until<F>(&mut self, within: Duration, mut f: F) -> anyhow::Result<bool>
    where
        F: FnMut(&Status) -> bool,
    {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.poll_cloud()?;
            if !self.brokers.iter_mut().any(|b| b.proc.running()) {
                bail!(
                    "the broker agent died:\n{}",
                    self.brokers[0].proc.log_tail(40)
                );
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

    /// Runs the cloud for `d`.
    pub(super) async fn run_cloud_for(
        &mut self,
        d: Duration,
        every: Duration,
    ) -> anyhow::Result<()> {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.poll_cloud()?;
            tokio::time::sleep(every).await;
        }
        Ok(())
    }
}
