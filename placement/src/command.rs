//! The `command` strategy: an operator's external program speaking JSON.
//!
//! The program gets the placement input as one JSON object on standard
//! input and prints its choice on standard output:
//!
//! | output | meaning |
//! | --- | --- |
//! | `node-3.example.com` (a bare name, one line) | this node |
//! | `"node-3.example.com"` | this node |
//! | `{"node": "node-3.example.com"}` | this node |
//! | `{"node": null}` or `null` | no preference: place with `default` |
//! | `{"refused": "why"}` | refuse, with this reason |
//!
//! A non-zero exit is a refusal that quotes the start of standard error. The
//! program runs in its own process group, which is killed when it outlives
//! `timeout` or prints more than `max_output_bytes`.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::config::CommandConfig;
use crate::error::CommandError;
use crate::script::{Verdict, truncate};

/// How much of standard error a refusal quotes.
const STDERR_EXCERPT: usize = 1024;

/// A configured external command.
#[derive(Debug, Clone)]
pub struct CommandStrategy {
    program: PathBuf,
    args: Vec<String>,
    timeout: Duration,
    max_output: usize,
}

enum Out {
    Done(Vec<u8>),
    TooLarge,
    Failed(String),
}

impl CommandStrategy {
    /// The command of `cfg`, or `None` when no program is configured.
    pub fn new(cfg: &CommandConfig) -> Option<CommandStrategy> {
        cfg.program.as_ref().map(|p| CommandStrategy {
            program: p.clone(),
            args: cfg.args.clone(),
            timeout: cfg.timeout,
            max_output: cfg.max_output_bytes,
        })
    }

    fn name(&self) -> String {
        self.program.display().to_string()
    }

    /// Runs the command on `input` and interprets its answer. Blocks the
    /// calling thread for at most `timeout` (plus the time to reap a killed
    /// process group).
    pub fn decide(&self, input: &serde_json::Value) -> Result<Verdict, CommandError> {
        let program = self.name();
        let io = |reason: String| CommandError::Io {
            program: program.clone(),
            reason,
        };
        let deadline = Instant::now() + self.timeout;
        let mut child = Command::new(&self.program)
            .args(&self.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| CommandError::Spawn {
                program: program.clone(),
                reason: e.to_string(),
            })?;
        let payload = serde_json::to_vec(input).map_err(|e| io(e.to_string()))?;
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            kill(&mut child);
            return Err(io("pipes were not opened".into()));
        };
        // A command that does not read its input must not block us: write
        // from a thread and ignore a closed pipe.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&payload);
        });
        let (out_tx, out_rx) = mpsc::channel();
        let limit = self.max_output;
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let r = stdout.take(limit as u64 + 1).read_to_end(&mut buf);
            let _ = out_tx.send(match r {
                Err(e) => Out::Failed(e.to_string()),
                Ok(_) if buf.len() > limit => Out::TooLarge,
                Ok(_) => Out::Done(buf),
            });
        });
        let (err_tx, err_rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let mut stderr = stderr;
            let _ = (&mut stderr)
                .take(STDERR_EXCERPT as u64 * 4)
                .read_to_end(&mut buf);
            // Keep draining so that a chatty command never blocks on stderr.
            let _ = std::io::copy(&mut stderr, &mut std::io::sink());
            let _ = err_tx.send(buf);
        });

        let remaining = deadline.saturating_duration_since(Instant::now());
        let out = match out_rx.recv_timeout(remaining) {
            Ok(Out::Done(b)) => b,
            Ok(Out::TooLarge) => {
                kill(&mut child);
                return Err(CommandError::OutputTooLarge {
                    program,
                    limit: self.max_output,
                });
            }
            Ok(Out::Failed(reason)) => {
                kill(&mut child);
                return Err(io(format!("reading standard output: {reason}")));
            }
            Err(_) => {
                kill(&mut child);
                return Err(CommandError::Timeout {
                    program,
                    after: self.timeout,
                });
            }
        };
        // Standard output is closed; the process should be exiting now.
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break s,
                Ok(None) if Instant::now() >= deadline => {
                    kill(&mut child);
                    return Err(CommandError::Timeout {
                        program,
                        after: self.timeout,
                    });
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) => {
                    kill(&mut child);
                    return Err(io(format!("waiting for the command: {e}")));
                }
            }
        };
        if !status.success() {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200));
            let err = err_rx.recv_timeout(wait).unwrap_or_default();
            let text = String::from_utf8_lossy(&err);
            let text = truncate(text.trim(), STDERR_EXCERPT);
            return Err(CommandError::Failed {
                program,
                status: status.to_string(),
                stderr: if text.is_empty() {
                    "(no standard error)".into()
                } else {
                    text
                },
            });
        }
        parse_answer(&out).map_err(|reason| CommandError::BadOutput { program, reason })
    }
}

/// Kills the command's whole process group and reaps the command.
fn kill(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Interprets a command's standard output.
pub fn parse_answer(out: &[u8]) -> Result<Verdict, String> {
    let text = std::str::from_utf8(out).map_err(|_| "output is not UTF-8".to_string())?;
    let text = text.trim();
    if text.is_empty() {
        return Err("printed nothing".into());
    }
    if text.starts_with(['{', '"', '[']) || text == "null" {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
        return match v {
            serde_json::Value::Null => Ok(Verdict::Delegate),
            serde_json::Value::String(s) => Ok(Verdict::Node(s)),
            serde_json::Value::Object(m) => match (m.get("refused"), m.get("node")) {
                (Some(serde_json::Value::String(r)), _) => {
                    Ok(Verdict::Refuse(truncate(r, STDERR_EXCERPT * 4)))
                }
                (Some(_), _) => Err("\"refused\" must be a string".into()),
                (None, Some(serde_json::Value::String(n))) => Ok(Verdict::Node(n.clone())),
                (None, Some(serde_json::Value::Null)) => Ok(Verdict::Delegate),
                (None, Some(_)) => Err("\"node\" must be a string or null".into()),
                (None, None) => Err("expected {\"node\": ...} or {\"refused\": ...}".into()),
            },
            _ => Err("expected a name, a JSON string or a JSON object".into()),
        };
    }
    if text.contains(char::is_whitespace) {
        return Err(format!(
            "expected one node name, got {:?}",
            truncate(text, 200)
        ));
    }
    Ok(Verdict::Node(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers() {
        assert_eq!(
            parse_answer(b"node-1\n"),
            Ok(Verdict::Node("node-1".into()))
        );
        assert_eq!(parse_answer(b"\"n 2\""), Ok(Verdict::Node("n 2".into())));
        assert_eq!(
            parse_answer(br#"{"node":"x"}"#),
            Ok(Verdict::Node("x".into()))
        );
        assert_eq!(parse_answer(br#"{"node":null}"#), Ok(Verdict::Delegate));
        assert_eq!(parse_answer(b"null"), Ok(Verdict::Delegate));
        assert_eq!(
            parse_answer(br#"{"refused":"no"}"#),
            Ok(Verdict::Refuse("no".into()))
        );
        assert!(parse_answer(b"").is_err());
        assert!(parse_answer(b"two words").is_err());
        assert!(parse_answer(b"{bad json").is_err());
        assert!(parse_answer(br#"{"node":3}"#).is_err());
        assert!(parse_answer(b"\xff").is_err());
    }

    fn sh(script: &str, timeout_ms: u64, max: usize) -> CommandStrategy {
        CommandStrategy {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout: Duration::from_millis(timeout_ms),
            max_output: max,
        }
    }

    #[test]
    fn reads_input_and_prints_choice() {
        // The command sees the input on stdin: echo back the second node's name.
        let c = sh(
            r#"python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][1]["name"])'"#,
            10_000,
            1024,
        );
        let input = serde_json::json!({"nodes": [{"name": "a"}, {"name": "b"}]});
        assert_eq!(c.decide(&input).unwrap(), Verdict::Node("b".into()));
    }

    #[test]
    fn failure_timeout_and_flood() {
        let input = serde_json::json!({});
        let e = sh("echo 'no capacity today' >&2; exit 3", 10_000, 1024)
            .decide(&input)
            .unwrap_err();
        match e {
            CommandError::Failed { stderr, status, .. } => {
                assert_eq!(stderr, "no capacity today");
                assert!(status.contains('3'), "{status}");
            }
            other => panic!("unexpected {other}"),
        }
        let t = Instant::now();
        let e = sh("sleep 30", 200, 1024).decide(&input).unwrap_err();
        assert!(matches!(e, CommandError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        // A grandchild holding stdout open is killed with the group.
        let t = Instant::now();
        let e = sh("sleep 30 & echo x; wait", 200, 1024)
            .decide(&input)
            .unwrap_err();
        assert!(matches!(e, CommandError::Timeout { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(10));
        let e = sh("yes", 10_000, 4096).decide(&input).unwrap_err();
        assert!(
            matches!(e, CommandError::OutputTooLarge { limit: 4096, .. }),
            "{e}"
        );
        let e = CommandStrategy {
            program: "/nonexistent/placer".into(),
            args: vec![],
            timeout: Duration::from_secs(1),
            max_output: 10,
        }
        .decide(&input)
        .unwrap_err();
        assert!(matches!(e, CommandError::Spawn { .. }), "{e}");
    }
}
