//! The broker agent's binary in a scenario: its configuration for a run on
//! a shared bus, its process, and the operator's admin channel to it.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gearshift_broker::cli::OperatorKeys;
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::status::Status;
use gearshift_bus::SharedBus;
use gearshift_proto::msg::{AdminReply, AdminRequest};

use super::process::Proc;
use crate::fleet::Keys;

/// The broker agent's configuration for a benchmark or campaign run: queues
/// and admin key tagged `tag` (runs share one RabbitMQ), state under `dir`,
/// `keys`' files, metrics on 127.0.0.1:`port`, the `spool` handler into
/// `dir/spool`, and a
/// policy that decides at once (no debounce, no cooldowns).
pub fn process_config(url: &str, dir: &Path, keys: &Keys, tag: &str, port: u16) -> BrokerConfig {
    let mut c = BrokerConfig::defaults();
    c.agent.name = format!("broker-{tag}");
    c.agent.state_dir = dir.join("broker-state");
    c.agent.events_queue = format!("gearshift.bench.events.{tag}");
    c.agent.cluster = gearshift_broker::config::AgentSection::cluster_of(tag);
    c.agent.admin_queue = format!("gearshift.bench.admin.{tag}");
    c.agent.admin_key = format!("admin.bench.{tag}");
    c.agent.placement_service = false;
    c.agent.shutdown_grace = Duration::from_secs(2);
    c.bus.url = url.to_string();
    keys.configure_broker(&mut c);
    c.metrics.listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    c.log.level = "warn".into();
    let p = &mut c.policy;
    p.interval = Duration::from_secs(1);
    // Evaluate as soon as a report shows pressure: the benchmark times the
    // decision path itself, not the configurable debounce.
    p.react_delay = Duration::ZERO;
    p.startup_grace = Duration::from_secs(2);
    p.scale_down_stabilization = Duration::ZERO;
    p.cooldown_after_scale_up = Duration::ZERO;
    p.cooldown_after_scale_down = Duration::ZERO;
    p.provision_timeout = Duration::from_secs(3600);
    c.saga.command_timeout = Duration::from_secs(30);
    c.saga.confirm_empty_timeout = Duration::from_secs(30);
    c.group_defaults.max_nodes = 100_000;
    // A handler that acts (`log` is a dry run: no drain would run): the
    // requests land as files nobody picks up.
    c.handlers.insert(
        "spool".into(),
        gearshift_handlers::HandlerConfig::Spool(gearshift_handlers::config::SpoolConfig {
            dir: dir.join("spool"),
        }),
    );
    c.group_defaults.handler = "spool".into();
    c
}

/// Writes `cfg` to `path` as TOML and loads it back through the broker
/// agent's own checks.
pub fn write_config(cfg: &BrokerConfig, path: &Path) -> anyhow::Result<()> {
    let text = cfg
        .to_toml()
        .map_err(|e| anyhow::anyhow!("broker configuration: {e}"))?;
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    gearshift_broker::config::load(path)
        .map_err(|e| anyhow::anyhow!("generated broker configuration refused: {e}"))?;
    Ok(())
}

/// The `gearshift-broker` process of a run and an operator's admin channel
/// to it.
pub struct BrokerProc {
    /// The process.
    pub proc: Proc,
    /// Its configuration.
    pub cfg: BrokerConfig,
    control: SharedBus,
    op: OperatorKeys,
    client: String,
}

impl std::fmt::Debug for BrokerProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerProc")
            .field("proc", &self.proc)
            .field("client", &self.client)
            .finish_non_exhaustive()
    }
}

impl BrokerProc {
    /// Writes `cfg` to `dir/broker.toml` (checked), and describes
    /// `gearshift-broker run` with it, logging to `dir/broker.log`; admin
    /// requests go over `control`, signed by `op`, from `client`.
    pub fn new(
        bin: &Path,
        cfg: BrokerConfig,
        dir: &Path,
        control: SharedBus,
        op: OperatorKeys,
        client: &str,
    ) -> anyhow::Result<BrokerProc> {
        let path = dir.join("broker.toml");
        write_config(&cfg, &path)?;
        let proc = Proc::new(
            "gearshift-broker",
            bin,
            &["run", "--config", &path.to_string_lossy()],
            &dir.join("broker.log"),
        );
        Ok(BrokerProc {
            proc,
            cfg,
            control,
            op,
            client: client.to_string(),
        })
    }

    /// The admin channel's connection.
    pub fn control(&self) -> &SharedBus {
        &self.control
    }

    /// One admin request.
    pub async fn admin(&self, req: AdminRequest, timeout: Duration) -> anyhow::Result<AdminReply> {
        Ok(gearshift_broker::cli::admin_on(
            &self.control,
            &self.op,
            &self.client,
            &self.cfg.agent.admin_key,
            req,
            timeout,
        )
        .await?)
    }

    /// The agent's status, if it answers within 2 s.
    pub async fn status(&self) -> Option<Status> {
        self.admin(AdminRequest::Status, Duration::from_secs(2))
            .await
            .ok()
            .filter(|r| r.ok)
            .and_then(|r| serde_json::from_value(r.data).ok())
    }

    /// Adds an environment variable of the process.
    pub fn env(mut self, k: &str, v: &str) -> BrokerProc {
        self.proc = self.proc.env(k, v);
        self
    }

    /// Waits until the agent answers a status request (at most 120 s);
    /// fails at once if the process exits.
    pub async fn wait_ready(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if !self.proc.running() {
                bail!("gearshift-broker exited:\n{}", self.proc.log_tail(30));
            }
            let r = self
                .admin(AdminRequest::Status, Duration::from_secs(2))
                .await;
            if matches!(r, Ok(ref x) if x.ok) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the broker agent did not answer within 120 s: {r:?}\n{}",
                    self.proc.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Its durable queues (events and admin).
    pub fn queues(&self) -> Vec<String> {
        vec![
            self.cfg.agent.events_queue.clone(),
            self.cfg.agent.admin_queue.clone(),
            gearshift_proto::routing::leader_queue(&self.cfg.agent.cluster),
        ]
    }
}
