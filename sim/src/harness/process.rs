//! The agents' binaries as child processes, and what `/proc` says of them
//! (resident memory, CPU time).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// The path of a sibling binary of the running one (`cargo build` puts
/// `gearshift-broker` and `gearshift-node` next to `gearshift-sim`), unless
/// `given`.
pub fn sibling_binary(given: Option<&Path>, name: &str) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let exe = std::env::current_exe().context("cannot find the running executable")?;
    let dir = exe.parent().context("the executable has no directory")?;
    // Under `cargo test` the executable is in deps/.
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!(
        "{name} not found next to {}: build it (cargo build --release -p {}) or pass its path",
        exe.display(),
        if name == "gearshift-broker" {
            "gearshift-broker"
        } else {
            "gearshift-node"
        }
    )
}

/// A child process that is killed when dropped.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    /// What it is (for messages).
    pub what: String,
    bin: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    env: Vec<(String, String)>,
    /// How many times it was started.
    pub starts: u32,
}

impl Proc {
    /// A process description; `start` runs it.
    pub fn new(what: &str, bin: &Path, args: &[&str], log: &Path) -> Proc {
        Proc {
            child: None,
            what: what.to_string(),
            bin: bin.to_path_buf(),
            args: args.iter().map(|s| s.to_string()).collect(),
            log: log.to_path_buf(),
            env: vec![],
            starts: 0,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, k: &str, v: &str) -> Proc {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Starts it (output appended to its log).
    pub fn start(&mut self) -> anyhow::Result<()> {
        if self.child.is_some() {
            bail!("{} is already running", self.what);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let child = Command::new(&self.bin)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", self.bin.display()))?;
        self.child = Some(child);
        self.starts += 1;
        Ok(())
    }

    /// The process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it is running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM; SIGKILL after `grace`. Returns whether it stopped by itself.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        if let Ok(pid) = i32::try_from(c.id()) {
            let _ = nix_kill(pid, "TERM");
        }
        let deadline = std::time::Instant::now() + grace;
        loop {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Resident memory in MiB, if running.
    pub fn rss_mb(&self) -> Option<f64> {
        self.pid().and_then(rss_mb)
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn nix_kill(pid: i32, sig: &str) -> std::io::Result<std::process::ExitStatus> {
    Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .stderr(Stdio::null())
        .status()
}

/// `VmRSS` of a process in MiB.
pub fn rss_mb(pid: u32) -> Option<f64> {
    proc_status_kb(pid, "VmRSS:").map(|kb| kb as f64 / 1024.0)
}

/// `RssAnon` (private, heap and stacks) of a process in MiB.
pub fn rss_anon_mb(pid: u32) -> Option<f64> {
    proc_status_kb(pid, "RssAnon:").map(|kb| kb as f64 / 1024.0)
}

/// CPU time (user + system) a process used so far, in seconds.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields count from after its ')'.
    let rest = text.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // USER_HZ is 100 on Linux.
    Some((utime + stime) / 100.0)
}

/// `VmHWM` (peak resident memory) of a process in MiB.
pub fn hwm_mb(pid: u32) -> Option<f64> {
    proc_status_kb(pid, "VmHWM:").map(|kb| kb as f64 / 1024.0)
}

fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}
