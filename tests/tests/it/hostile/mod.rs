//! The hostile-client suite: what a client that read only
//! `docs/protocol.md` can do to a node, on real RabbitMQ against the real
//! `gearshift-node` binary. Every refusal reason of the protocol's verifying
//! steps (section 3) and the transport's size limit (section 5), a command
//! sent right after a node's first report (section 7.1), a flood of forged
//! commands that must not silence the node's reports (section 9, bounded
//! answers), and the `check-config` matrix of both binaries.
//!
//! - `refusals`: each reason, answered and counted; an oversized message,
//!   then a good command acted upon;
//! - `startup`: the command right after the first report;
//! - `flood`: `disruptive_hostile_flood`, 20,000 unsigned commands (serial
//!   pass: it competes for the CPU), with its figures printed;
//! - `config`: `check-config` on bad key files, and the operator commands
//!   on a non-default `agent.admin_key`;
//! - `fencing`: a deposed broker agent's commands (an older leader epoch),
//!   refused and not acted upon.

mod config;
mod fencing;
mod flood;
mod refusals;
mod startup;

use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

use gearshift_proto::KeyPair;
use gearshift_tests::node_harness::{Controller, Keys, temp_dir, unique};
use gearshift_tests::node_process::{NodeProcess, write_file};

/// Longest wait of a step.
const WAIT: Duration = Duration::from_secs(60);

/// A real node agent on RabbitMQ (AMQP), its keys, and a controller that
/// plays the broker agent and the hostile client.
struct HostileNode {
    _dir: tempfile::TempDir,
    name: String,
    node_key: KeyPair,
    ctl: Controller,
    proc: NodeProcess,
    port: u16,
}

impl HostileNode {
    /// Writes the node's keys and `node.toml` (sim runtime, reports every
    /// `interval`); declares its command queue first when `prepare`, as a
    /// broker agent does, else leaves that to the node. Not started.
    async fn new(interval: &str, prepare: bool) -> HostileNode {
        gearshift_tests::init_logging();
        let keys = Keys::new();
        let ctl = Controller::connect(&gearshift_tests::amqp_url(), keys.clone()).await;
        let dir = temp_dir();
        let d = dir.path();
        let (_, _, node_key) = gearshift_service::keys::write_keypair(d, "node", false).unwrap();
        write_file(d, "broker.pub", &keys.broker.public_pem());
        write_file(d, "client.pub", &keys.client.public_pem());
        let name = unique("hostile-");
        let port = free_port();
        let cfg = write_file(d, "node.toml", &node_toml(d, &name, port, interval));
        if prepare {
            ctl.prepare(&name).await;
        }
        let proc = NodeProcess::new(cfg, d.join("node.log"));
        HostileNode {
            _dir: dir,
            name,
            node_key,
            ctl,
            proc,
            port,
        }
    }

    /// The node's resident set, in KiB.
    fn rss_kib(&self) -> u64 {
        let pid = self.proc.pid().expect("the node runs");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }

    /// The value of the `/metrics` sample whose line starts with `prefix`
    /// (0 when absent).
    fn metric(&self, prefix: &str) -> f64 {
        metrics_text(self.port)
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// `refused_total` for `reason`.
    fn refused(&self, reason: &str) -> f64 {
        self.metric(&format!(
            "gearshift_node_refused_total{{reason=\"{reason}\"}}"
        ))
    }

    fn log_tail(&self) -> String {
        self.proc.log_tail()
    }
}

fn node_toml(d: &Path, name: &str, port: u16, interval: &str) -> String {
    format!(
        r#"
[node]
name = "{name}"
[bus]
url = "{url}"
reconnect_min = "50ms"
reconnect_max = "500ms"
[keys]
signing_key = "{d}/node.key"
broker_keys = ["{d}/broker.pub"]
client_keys = ["{d}/client.pub"]
[state]
dir = "{d}/state"
[report]
interval = "{interval}"
scan_interval = "500ms"
min_gap = "50ms"
[runtime]
kind = "sim"
[runtime.sim]
gears = 5
idle_percent = 40
[metrics]
listen = "127.0.0.1:{port}"
[service]
shutdown_grace = "2s"
"#,
        url = gearshift_tests::amqp_url(),
        d = d.display()
    )
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn metrics_text(port: u16) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(s, "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Polls `f` every 200 ms until it holds; panics after `within`.
async fn eventually(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + within;
    while !f() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
