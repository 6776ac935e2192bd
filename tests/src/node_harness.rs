//! Test harness for the node agent: a controller that signs commands as
//! the broker agent would, streams of the node's verified events and
//! reports, and in-process agents on any bus URL.
//!
//! Also compiled into `node-agent/tests` (by `#[path]`), so it only uses
//! crates both packages depend on.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{OutMessage, QueueSpec, SharedBus, Subscription};
use gearshift_node::agent::AgentConfig;
use gearshift_node::runtime::SharedRuntime;
use gearshift_node::{Agent, RunExit};
use gearshift_proto::msg::{Message, NodeReport, Role};
use gearshift_proto::{Envelope, Expect, Gate, KeyPair, Keyring, TimePolicy, routing};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How long any single wait in these tests may take.
pub const WAIT: Duration = Duration::from_secs(30);

/// The keys of a test fleet.
#[derive(Debug, Clone)]
pub struct Keys {
    /// The broker agent's key (role broker).
    pub broker: KeyPair,
    /// An operator's key.
    pub operator: KeyPair,
    /// A client's key (may only ping).
    pub client: KeyPair,
    /// A key nobody trusts.
    pub rogue: KeyPair,
}

impl Default for Keys {
    fn default() -> Self {
        Self::new()
    }
}

impl Keys {
    /// Fresh random keys.
    pub fn new() -> Keys {
        let k = || KeyPair::generate().expect("random key");
        Keys {
            broker: k(),
            operator: k(),
            client: k(),
            rogue: k(),
        }
    }

    /// What a node trusts: broker, operator and client keys.
    pub fn node_keyring(&self) -> Keyring {
        let mut r = Keyring::new();
        r.add(self.broker.public(), Role::Broker, "broker");
        r.add(self.operator.public(), Role::Operator, "operator");
        r.add(self.client.public(), Role::Client, "client");
        r
    }
}

/// A unique name for a node, queue or memory bus.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}{}", &Uuid::new_v4().simple().to_string()[..10])
}

/// Connects to a bus URL with test timeouts; a missing broker fails loudly.
pub async fn connect(url: &str, name: &str) -> SharedBus {
    let opts = gearshift_bus::ConnectOptions {
        name: format!("gearshift-test-{name}"),
        heartbeat: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        op_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(10),
        ..gearshift_bus::ConnectOptions::default()
    };
    match gearshift_bus::connect(url, opts).await {
        Ok(b) => b,
        Err(e) => panic!(
            "cannot reach the test broker at {} ({e}); run scripts/setup-rabbitmq",
            gearshift_bus::url::redact(url)
        ),
    }
}

/// Plays the broker agent: signs and sends commands, watches events and reports.
pub struct Controller {
    /// The controller's bus connection.
    pub bus: SharedBus,
    /// The fleet's keys.
    pub keys: Keys,
}

impl Controller {
    /// Connects a controller.
    pub async fn connect(url: &str, keys: Keys) -> Controller {
        Controller {
            bus: connect(url, "controller").await,
            keys,
        }
    }

    /// A command envelope from the broker agent (unsigned).
    pub fn command(&self, msg: impl Into<Message>, corr: Option<&str>) -> Envelope {
        let e = Envelope::new("broker-agent", msg);
        match corr {
            Some(c) => e.with_corr(c),
            None => e,
        }
    }

    /// Signs with the broker key.
    pub fn seal(&self, env: Envelope) -> Vec<u8> {
        self.keys.broker.seal(env)
    }

    /// Declares the node's command queue, so that commands sent before the
    /// agent consumes are kept.
    pub async fn prepare(&self, node: &str) {
        self.bus
            .declare_queue(&QueueSpec::node_commands(node))
            .await
            .expect("declare the node's queue");
    }

    /// Publishes raw bytes on `cmd.<node>`.
    pub async fn send_raw(&self, node: &str, bytes: Vec<u8>) {
        self.bus
            .publish(OutMessage::new(routing::command(node), bytes))
            .await
            .expect("publish a command");
    }

    /// Signs and sends a command; returns its envelope id.
    pub async fn send(&self, node: &str, msg: impl Into<Message>, corr: Option<&str>) -> Uuid {
        let env = self.command(msg, corr);
        let id = env.id;
        self.send_raw(node, self.seal(env)).await;
        id
    }

    /// The node's events, verified against `node_key`.
    pub async fn events(&self, node: &str, node_key: &KeyPair) -> Verified {
        Verified::new(
            self.bus
                .subscribe(&routing::event(node))
                .await
                .expect("subscribe to events"),
            node_key,
        )
    }

    /// The node's reports, verified against `node_key`.
    pub async fn reports(&self, node: &str, node_key: &KeyPair) -> Verified {
        Verified::new(
            self.bus
                .subscribe(&format!("report.*.{}", routing::segment(node)))
                .await
                .expect("subscribe to reports"),
            node_key,
        )
    }
}

/// `payload` through the signed-message gate with the keys of `ring`
/// (any kind, any age: the test checks those itself), or `None`.
pub fn verified(payload: &[u8], ring: &Keyring) -> Option<Envelope> {
    Gate::new(ring, TimePolicy::default())
        .admit(payload, Expect::any().any_age(), Utc::now())
        .ok()
        .map(|a| a.envelope)
}

/// [`verified`], or a panic that says why not.
fn must_verify(payload: &[u8], ring: &Keyring) -> Envelope {
    match Gate::new(ring, TimePolicy::default()).admit(payload, Expect::any().any_age(), Utc::now())
    {
        Ok(a) => a.envelope,
        Err(r) => panic!("node messages decode and are signed by the node's key: {r}"),
    }
}

/// A subscription whose messages must be signed by the node.
pub struct Verified {
    sub: Subscription,
    ring: Keyring,
}

impl Verified {
    fn new(sub: Subscription, node_key: &KeyPair) -> Self {
        let mut ring = Keyring::new();
        ring.add(node_key.public(), Role::Node, "node");
        Verified { sub, ring }
    }

    /// The next message, decoded and verified; panics after `within`.
    pub async fn next(&mut self, within: Duration) -> Envelope {
        let d = self
            .sub
            .next_timeout(within)
            .await
            .unwrap_or_else(|_| panic!("no message within {within:?}"))
            .expect("subscription open");
        must_verify(&d.payload, &self.ring)
    }

    /// Skips messages until `pred` holds; panics after `within`.
    pub async fn until(
        &mut self,
        within: Duration,
        what: &str,
        mut pred: impl FnMut(&Envelope) -> bool,
    ) -> Envelope {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                panic!("timed out after {within:?} waiting for {what}");
            }
            let d = match self.sub.next_timeout(left).await {
                Ok(Some(d)) => d,
                Ok(None) => panic!("subscription closed while waiting for {what}"),
                Err(_) => panic!("timed out after {within:?} waiting for {what}"),
            };
            let e = must_verify(&d.payload, &self.ring);
            if pred(&e) {
                return e;
            }
        }
    }

    /// The next report satisfying `pred`.
    pub async fn report(
        &mut self,
        within: Duration,
        what: &str,
        mut pred: impl FnMut(&NodeReport) -> bool,
    ) -> NodeReport {
        let e = self
            .until(
                within,
                what,
                |e| matches!(&e.msg, Message::Report(r) if pred(r)),
            )
            .await;
        match e.msg {
            Message::Report(r) => r,
            _ => unreachable!("filtered above"),
        }
    }

    /// The terminal event (done, failed or refused) about command `cmd`.
    pub async fn outcome(&mut self, cmd: Uuid, within: Duration) -> Envelope {
        self.until(
            within,
            &format!("the outcome of command {cmd}"),
            |e| match &e.msg {
                Message::Done(d) => d.cmd == cmd,
                Message::Failed(f) => f.cmd == cmd,
                Message::Refused(r) => r.cmd == Some(cmd),
                _ => false,
            },
        )
        .await
    }
}

/// Agent settings for tests: fast reports, short backoffs.
pub fn agent_config(name: &str, node_key: &KeyPair, keys: &Keys, state_dir: &Path) -> AgentConfig {
    let mut c = AgentConfig::new(name, node_key.clone(), keys.node_keyring(), state_dir);
    c.report.interval = Duration::from_millis(500);
    c.report.scan_interval = Duration::from_millis(50);
    c.report.min_gap = Duration::from_millis(20);
    c.evacuation.backoff_min = Duration::from_millis(10);
    c.evacuation.backoff_max = Duration::from_millis(50);
    c.shutdown_grace = Duration::from_secs(5);
    c.retry_min = Duration::from_millis(50);
    c.retry_max = Duration::from_millis(500);
    c
}

/// An agent running in this process.
pub struct Running {
    /// The agent.
    pub agent: Agent,
    /// Cancels it.
    pub token: CancellationToken,
    handle: tokio::task::JoinHandle<RunExit>,
}

impl Running {
    /// Starts an agent.
    pub fn start(cfg: AgentConfig, bus: SharedBus, rt: SharedRuntime) -> Running {
        let agent = Agent::new(cfg, bus, rt).expect("agent starts");
        let token = CancellationToken::new();
        let a = agent.clone();
        let t = token.clone();
        let handle = tokio::spawn(async move { a.run(t).await });
        Running {
            agent,
            token,
            handle,
        }
    }

    /// Stops it (as SIGTERM would) and returns how it ended.
    pub async fn stop(self) -> RunExit {
        self.token.cancel();
        self.join().await
    }

    /// Waits for it to end by itself.
    pub async fn join(self) -> RunExit {
        tokio::time::timeout(WAIT, self.handle)
            .await
            .expect("agent stops in time")
            .expect("agent task")
    }
}

/// Polls `f` until it holds; panics after `within`.
pub async fn wait_until(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !f() {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fresh temporary directory (kept until the value is dropped).
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// The state directory of node `name` under `base`.
pub fn state_dir(base: &Path, name: &str) -> PathBuf {
    base.join(format!("state-{name}"))
}
