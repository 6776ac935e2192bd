//! The real `gearshift-broker` binary as a child process, with an `exec`
//! handler whose script appends every request to a file (so a test can count
//! node requests across restarts and act as the cloud).

use std::path::Path;
use std::process::{Child, Command, Stdio};

use gearshift_broker::config::BrokerConfig;

pub use crate::bins::broker_binary;

/// Writes the `event` script of an exec handler in `dir` that appends
/// `<event> <op> <node> <district>` to `log` and succeeds.
pub fn write_recording_handler(dir: &Path, log: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let script = dir.join("event");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$GEARSHIFT_EVENT $GEARSHIFT_OP ${{GEARSHIFT_NODE:--}} $GEARSHIFT_DISTRICT\" >> '{}'\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

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
