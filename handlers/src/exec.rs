//! The `exec` handler: the seeds' event-handler contract.
//!
//! - create: `<dir>/<program> create-node --profile=P --district=D`
//! - remove: `<dir>/<program> remove-node --host=H --district=D`
//!
//! The program runs in `dir`, in its own process group, with stdin closed
//! and these variables added to the agent's environment:
//! `GEARSHIFT_EVENT` (`create-node`/`remove-node`), `GEARSHIFT_OP` (the
//! operation id; a new node reports it as `booted_for`), `GEARSHIFT_DISTRICT`,
//! `GEARSHIFT_PROFILE`, `GEARSHIFT_ATTEMPT`, `GEARSHIFT_AGENT`, for create
//! `GEARSHIFT_SHAPE` (the node group's shape as JSON), `GEARSHIFT_FLAVOR`,
//! `GEARSHIFT_IMAGE`, `GEARSHIFT_AVAILABILITY_ZONE` (when set), and for remove
//! `GEARSHIFT_NODE` and `GEARSHIFT_CLOUD_ID` (when known).
//!
//! Exit status mapping:
//! | exit | meaning | [`HandlerError`] |
//! |---|---|---|
//! | 0 | done | success |
//! | `quota_exit_code` (3) | the cloud is out of quota | `Quota` |
//! | `busy_exit_code` (4) | busy, try later | `Busy` |
//! | `retry_exit_codes` (75) | temporary failure | `Transient` |
//! | killed by a signal, or timed out | | `Transient` |
//! | 126, 127, cannot start | not executable / not found | `Permanent` |
//! | anything else | failed | `Permanent` |
//!
//! stdout and stderr are captured (at most `max_output` bytes each) and
//! logged. If the last line of stdout is a JSON object, its `node` and
//! `cloud_id` strings are taken as the new node's host name and cloud id.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::config::ExecConfig;
use crate::{
    CreateOutcome, CreateRequest, Handler, HandlerContext, HandlerError, RemoveOutcome,
    RemoveRequest,
};

/// Runs the operator's `event` program.
#[derive(Debug, Clone)]
pub struct ExecHandler {
    cfg: ExecConfig,
    agent: String,
}

/// What one run produced.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
}

impl ExecHandler {
    /// A handler (the program is looked for when it runs).
    pub fn new(cfg: ExecConfig, ctx: &HandlerContext) -> Self {
        ExecHandler {
            cfg,
            agent: ctx.agent.clone(),
        }
    }

    async fn run(&self, args: &[String], env: &[(String, String)]) -> Result<Run, HandlerError> {
        let program = self.cfg.dir.join(&self.cfg.program);
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(args)
            .current_dir(&self.cfg.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        for (k, v) in &self.cfg.env {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().map_err(|e| {
            HandlerError::Permanent(format!("cannot run {}: {e}", program.display()))
        })?;
        let pid = child.id();
        let out = child.stdout.take().expect("piped stdout");
        let err = child.stderr.take().expect("piped stderr");
        let max = self.cfg.max_output;
        let out_task = tokio::spawn(read_bounded(out, max));
        let err_task = tokio::spawn(read_bounded(err, max));
        let status = match tokio::time::timeout(self.cfg.timeout, child.wait()).await {
            Ok(s) => s.map_err(|e| {
                HandlerError::Transient(format!("waiting for {}: {e}", program.display()))
            })?,
            Err(_) => {
                if let Some(pid) = pid {
                    // The whole group: the script's children too.
                    let _ = nix::sys::signal::killpg(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                let _ = child.wait().await;
                return Err(HandlerError::Transient(format!(
                    "{} {} timed out after {:?} and was killed",
                    program.display(),
                    args.join(" "),
                    self.cfg.timeout
                )));
            }
        };
        // Output readers end when the pipes close; a grandchild that keeps
        // them open must not hold us forever.
        let grace = Duration::from_secs(5);
        let stdout = tokio::time::timeout(grace, out_task)
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default();
        let stderr = tokio::time::timeout(grace, err_task)
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or_default();
        use std::os::unix::process::ExitStatusExt;
        Ok(Run {
            code: status.code(),
            signal: status.signal(),
            stdout,
            stderr,
        })
    }

    fn classify(&self, what: &str, run: &Run) -> Result<(), HandlerError> {
        let tail = |s: &str| {
            let t = s.trim();
            let start = t.len().saturating_sub(500);
            let mut i = start;
            while !t.is_char_boundary(i) {
                i += 1;
            }
            t[i..].to_string()
        };
        let detail = || {
            let e = tail(&run.stderr);
            if e.is_empty() { tail(&run.stdout) } else { e }
        };
        match (run.code, run.signal) {
            (Some(0), _) => Ok(()),
            (Some(c), _) if c == self.cfg.quota_exit_code => Err(HandlerError::Quota(format!(
                "{what} exited {c} (quota): {}",
                detail()
            ))),
            (Some(c), _) if c == self.cfg.busy_exit_code => Err(HandlerError::Busy(format!(
                "{what} exited {c} (busy): {}",
                detail()
            ))),
            (Some(c), _) if self.cfg.retry_exit_codes.contains(&c) => Err(HandlerError::Transient(
                format!("{what} exited {c} (temporary): {}", detail()),
            )),
            (Some(c @ (126 | 127)), _) => Err(HandlerError::Permanent(format!(
                "{what} exited {c} (not executable or not found): {}",
                detail()
            ))),
            (Some(c), _) => Err(HandlerError::Permanent(format!(
                "{what} exited {c}: {}",
                detail()
            ))),
            (None, sig) => Err(HandlerError::Transient(format!(
                "{what} was killed by signal {}: {}",
                sig.unwrap_or(0),
                detail()
            ))),
        }
    }

    fn log_run(&self, event: &str, op: &str, run: &Run) {
        tracing::info!(
            event,
            op,
            exit = ?run.code,
            signal = ?run.signal,
            stdout = %run.stdout.trim(),
            stderr = %run.stderr.trim(),
            "event handler finished"
        );
    }

    fn base_env(
        &self,
        event: &str,
        op: &str,
        district: &str,
        profile: &str,
        attempt: u32,
    ) -> Vec<(String, String)> {
        vec![
            ("GEARSHIFT_EVENT".into(), event.into()),
            ("GEARSHIFT_OP".into(), op.into()),
            ("GEARSHIFT_DISTRICT".into(), district.into()),
            ("GEARSHIFT_PROFILE".into(), profile.into()),
            ("GEARSHIFT_ATTEMPT".into(), attempt.to_string()),
            ("GEARSHIFT_AGENT".into(), self.agent.clone()),
        ]
    }
}

async fn read_bounded<R: AsyncRead + Unpin>(mut r: R, max: usize) -> String {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    let mut dropped = 0usize;
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = max.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                dropped += n.saturating_sub(room);
            }
        }
    }
    let mut s = String::from_utf8_lossy(&kept).into_owned();
    if dropped > 0 {
        s.push_str(&format!("\n[... {dropped} more bytes not kept]"));
    }
    s
}

/// The `node` / `cloud_id` of a JSON object on stdout's last line.
fn parse_result(stdout: &str) -> (Option<String>, Option<String>) {
    let Some(last) = stdout.lines().rev().find(|l| !l.trim().is_empty()) else {
        return (None, None);
    };
    let Ok(serde_json::Value::Object(m)) = serde_json::from_str::<serde_json::Value>(last.trim())
    else {
        return (None, None);
    };
    let get = |k: &str| {
        m.get(k)
            .and_then(|v| v.as_str())
            .filter(|s| !s.is_empty() && s.len() <= 255)
            .map(str::to_string)
    };
    (get("node"), get("cloud_id"))
}

#[async_trait]
impl Handler for ExecHandler {
    fn kind(&self) -> &'static str {
        "exec"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let args = vec![
            "create-node".to_string(),
            format!("--profile={}", req.group.profile),
            format!("--district={}", req.group.district),
        ];
        let mut env = self.base_env(
            "create-node",
            &req.op,
            &req.group.district,
            &req.group.profile,
            req.attempt,
        );
        env.push((
            "GEARSHIFT_SHAPE".into(),
            serde_json::to_string(&req.shape).unwrap_or_default(),
        ));
        for (k, v) in [
            ("GEARSHIFT_FLAVOR", &req.shape.flavor),
            ("GEARSHIFT_IMAGE", &req.shape.image),
            ("GEARSHIFT_AVAILABILITY_ZONE", &req.shape.availability_zone),
        ] {
            if let Some(v) = v {
                env.push((k.into(), v.clone()));
            }
        }
        let run = self.run(&args, &env).await?;
        self.log_run("create-node", &req.op, &run);
        self.classify(&format!("event {}", args.join(" ")), &run)?;
        let (node, cloud_id) = parse_result(&run.stdout);
        Ok(CreateOutcome {
            node,
            cloud_id,
            detail: format!("ran event {}", args.join(" ")),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let args = vec![
            "remove-node".to_string(),
            format!("--host={}", req.node),
            format!("--district={}", req.group.district),
        ];
        let mut env = self.base_env(
            "remove-node",
            &req.op,
            &req.group.district,
            &req.group.profile,
            req.attempt,
        );
        env.push(("GEARSHIFT_NODE".into(), req.node.clone()));
        if let Some(id) = &req.cloud_id {
            env.push(("GEARSHIFT_CLOUD_ID".into(), id.clone()));
        }
        let run = self.run(&args, &env).await?;
        self.log_run("remove-node", &req.op, &run);
        self.classify(&format!("event {}", args.join(" ")), &run)?;
        Ok(RemoveOutcome {
            detail: format!("ran event {}", args.join(" ")),
            gone: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_line() {
        assert_eq!(
            parse_result("booting\n{\"node\": \"n-1.example.com\", \"cloud_id\": \"abc\"}\n"),
            (Some("n-1.example.com".into()), Some("abc".into()))
        );
        assert_eq!(parse_result("done\n"), (None, None));
        assert_eq!(parse_result(""), (None, None));
    }
}
