//! The real `gearshift-broker` binary as a child process (its `exec`
//! handler's request log, read like a cloud, is
//! [`gearshift_sim::harness::requests`]).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use gearshift_broker::config::BrokerConfig;

pub use crate::bins::broker_binary;

/// Writes `cfg` as a TOML file and checks it with `gearshift-broker check-config`.
pub fn write_config(cfg: &BrokerConfig, path: &Path) {
    let text = cfg.to_toml().expect("config serializes to TOML");
    std::fs::write(path, text).unwrap();
    let out = Command::new(broker_binary())
        .arg("check-config")
        .arg(path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "generated config refused: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running broker agent process.
pub struct BrokerProcess {
    child: Child,
}

impl BrokerProcess {
    /// Starts `gearshift-broker run --config <path>`, logging to `log`.
    pub fn start(config: &Path, log: &Path) -> BrokerProcess {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(broker_binary())
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .expect("start gearshift-broker");
        BrokerProcess { child }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGHUP: reload the configuration (and the trusted keys).
    pub fn reload(&self) {
        let st = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -HUP failed");
    }

    /// SIGKILL, and reap.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and wait for the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        self.child.wait().unwrap()
    }
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
