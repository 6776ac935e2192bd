//! Runs one tool: no shell, its own process group, stdin closed, output
//! captured within bounds, and a deadline after which the group gets
//! SIGTERM, then SIGKILL after `kill_grace`.
//!
//! SIGTERM comes first for the `sudo -n` templates: the agent may not
//! signal the root process sudo runs, but sudo relays a SIGTERM to it; a
//! SIGKILL would end sudo and leave the tool running.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};

use super::capture::Capture;
use super::error::PaasError;
use super::parse::Exit;

/// How long the output pipes may stay open after the tool exits (a child
/// it left behind holds them) before its process group is killed.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// How the tools run: their environment and bounds.
#[derive(Debug, Clone)]
pub struct Runner {
    /// `PATH` of the tools; none: the agent's own.
    pub path: Option<String>,
    /// Variables added to the agent's environment.
    pub env: Vec<(String, String)>,
    /// Bytes kept of each of stdout and stderr.
    pub max_output: usize,
    /// Between SIGTERM and SIGKILL on a timeout.
    pub kill_grace: Duration,
}

/// One finished (or stopped) run.
#[derive(Debug, Clone)]
pub struct Ran {
    /// The deadline passed and the process group was stopped.
    pub timed_out: bool,
    /// Exit status and output (what was printed before the stop, on a timeout).
    pub exit: Exit,
    /// From spawn to reaping.
    pub elapsed: Duration,
}

/// Kills the process group when dropped while armed: a caller that gives
/// up on the future (a cancelled saga step) leaves no tool behind.
struct Group(Option<Pid>);

impl Group {
    fn signal(&self, sig: Signal) {
        if let Some(pgid) = self.0 {
            // ESRCH (nobody left) and EPERM (a member we may not signal)
            // are expected here.
            let _ = killpg(pgid, sig);
        }
    }

    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, into: Arc<Mutex<Capture>>) {
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        into.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(&buf[..n]);
    }
}

fn text(c: &Arc<Mutex<Capture>>) -> String {
    c.lock().unwrap_or_else(PoisonError::into_inner).text()
}

impl Runner {
    fn spawn_error(&self, program: &str, source: io::Error) -> PaasError {
        let reason = match source.kind() {
            io::ErrorKind::NotFound if !program.contains('/') => {
                let path = self
                    .path
                    .clone()
                    .or_else(|| std::env::var("PATH").ok())
                    .unwrap_or_default();
                format!("not found in PATH ({path})")
            }
            io::ErrorKind::NotFound => "no such file".into(),
            io::ErrorKind::PermissionDenied => "not executable (permission denied)".into(),
            _ => source.to_string(),
        };
        PaasError::Spawn {
            program: program.to_string(),
            reason,
            source,
        }
    }

    fn command(&self, argv: &[String]) -> Command {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(p) = &self.path {
            cmd.env("PATH", p);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// SIGTERM to the group, then SIGKILL after `kill_grace`; reaps the tool.
    async fn stop(&self, child: &mut Child, group: &Group) -> io::Result<std::process::ExitStatus> {
        group.signal(Signal::SIGTERM);
        if let Ok(status) = tokio::time::timeout(self.kill_grace, child.wait()).await {
            return status;
        }
        group.signal(Signal::SIGKILL);
        let _ = child.start_kill();
        child.wait().await
    }

    /// Runs `argv` (`argv[0]` looked up in `PATH` unless it holds a `/`)
    /// for at most `timeout`.
    pub async fn run(&self, argv: &[String], timeout: Duration) -> Result<Ran, PaasError> {
        let program = argv.first().map(String::as_str).unwrap_or_default();
        let start = Instant::now();
        let mut child = self
            .command(argv)
            .spawn()
            .map_err(|e| self.spawn_error(program, e))?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .map(Pid::from_raw);
        let mut group = Group(pgid);
        let out = Arc::new(Mutex::new(Capture::new(self.max_output)));
        let err = Arc::new(Mutex::new(Capture::new(self.max_output)));
        let mut readers = Vec::new();
        if let Some(s) = child.stdout.take() {
            readers.push(tokio::spawn(pump(s, out.clone())));
        }
        if let Some(s) = child.stderr.take() {
            readers.push(tokio::spawn(pump(s, err.clone())));
        }
        let (status, timed_out) = match tokio::time::timeout(timeout, child.wait()).await {
            Ok(status) => (status, false),
            Err(_) => (self.stop(&mut child, &group).await, true),
        };
        let status = status.map_err(|source| PaasError::Wait {
            program: program.to_string(),
            source,
        })?;
        let all_read = futures::future::join_all(readers.iter_mut());
        if tokio::time::timeout(PIPE_GRACE, all_read).await.is_err() {
            // Something the tool started still holds its output open.
            group.signal(Signal::SIGKILL);
            readers.iter().for_each(|r| r.abort());
        }
        group.disarm();
        Ok(Ran {
            timed_out,
            exit: Exit {
                code: status.code(),
                signal: status.signal(),
                stdout: text(&out),
                stderr: text(&err),
            },
            elapsed: start.elapsed(),
        })
    }
}
