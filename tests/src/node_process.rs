//! The real `gearshift-node` binary as a child process: built (or found up
//! to date) with cargo, configured through a generated `node.toml`, started,
//! killed with SIGKILL, stopped with SIGTERM.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use crate::bins::node_binary;

/// Writes `text` to `dir/name` and returns the path.
pub fn write_file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write test file");
    p
}

/// One running (or stopped) `gearshift-node run` process.
pub struct NodeProcess {
    config: PathBuf,
    log: PathBuf,
    env: Vec<(String, String)>,
    child: Option<Child>,
    /// How many times it was started.
    pub starts: u32,
}

impl NodeProcess {
    /// A process for `config`, logging to `log`.
    pub fn new(config: PathBuf, log: PathBuf) -> Self {
        NodeProcess {
            config,
            log,
            env: Vec::new(),
            child: None,
            starts: 0,
        }
    }

    /// Extra environment for the child (for example `OS_*` credentials).
    pub fn with_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env = env;
        self
    }

    /// Starts the agent.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "already running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open the node's log");
        let child = Command::new(node_binary())
            .args(["run", "--config"])
            .arg(&self.config)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LOG", "gearshift_node=debug,info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log fd"))
            .stderr(log)
            .spawn()
            .expect("start gearshift-node");
        self.child = Some(child);
        self.starts += 1;
    }

    /// SIGKILL, and reap it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; waits up to `within` and returns the exit code.
    pub fn terminate(&mut self, within: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(status)) = c.try_wait() {
                return status.code();
            }
            if Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!(
                    "gearshift-node did not stop within {within:?} after SIGTERM\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process has exited (and its code).
    pub fn exited(&mut self) -> Option<Option<i32>> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(s)) => Some(s.code()),
            _ => None,
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The last lines of its log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
