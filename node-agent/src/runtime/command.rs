//! Running operator commands: argument templates (no shell), timeouts,
//! bounded output, and cancellation.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::RuntimeError;

/// Most bytes of standard error kept for error messages.
const STDERR_TAIL: usize = 2048;

/// Replaces `{name}` placeholders in every argument.
pub(crate) fn substitute(template: &[String], vars: &[(&str, &str)]) -> Vec<String> {
    template
        .iter()
        .map(|arg| {
            let mut a = arg.clone();
            for (k, v) in vars {
                a = a.replace(&format!("{{{k}}}"), v);
            }
            a
        })
        .collect()
}

/// Runs `argv` with no standard input; returns its standard output (at most
/// `max_stdout` bytes) when it exits 0.
pub(crate) async fn run(
    argv: &[String],
    timeout: Duration,
    cancel: Option<&CancellationToken>,
    max_stdout: usize,
) -> Result<Vec<u8>, RuntimeError> {
    let program = argv.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(&argv[1.min(argv.len())..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| RuntimeError::Command {
            program: program.clone(),
            status: "could not start".into(),
            code: None,
            stderr: e.to_string(),
        })?;
    let read_out = read_stdout(child.stdout.take(), max_stdout);
    let read_err = read_stderr_tail(child.stderr.take());
    let work = async {
        let (out, err, status) = tokio::join!(read_out, read_err, child.wait());
        (out, err, status)
    };
    let never = CancellationToken::new();
    let cancel = cancel.unwrap_or(&never);
    let (out, err, status) = tokio::select! {
        r = tokio::time::timeout(timeout, work) => match r {
            Ok(v) => v,
            Err(_) => {
                return Err(RuntimeError::Timeout { what: program, after: timeout });
            }
        },
        _ = cancel.cancelled() => return Err(RuntimeError::Interrupted),
    };
    let status = status.map_err(|e| RuntimeError::Command {
        program: program.clone(),
        status: "wait failed".into(),
        code: None,
        stderr: e.to_string(),
    })?;
    if !status.success() {
        return Err(RuntimeError::Command {
            program,
            status: status.to_string(),
            code: status.code(),
            stderr: tail(&err),
        });
    }
    if out.len() > max_stdout {
        return Err(RuntimeError::Parse {
            what: format!("output of {program}"),
            reason: format!("more than {max_stdout} bytes"),
        });
    }
    Ok(out)
}

/// At most `max + 1` bytes of standard output (one more tells it was cut).
async fn read_stdout(stdout: Option<tokio::process::ChildStdout>, max: usize) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(out) = stdout {
        let mut limited = out.take(max as u64 + 1);
        let _ = limited.read_to_end(&mut buf).await;
    }
    buf
}

/// The end of standard error, read to the end so that the child never
/// blocks on a full pipe.
async fn read_stderr_tail(stderr: Option<tokio::process::ChildStderr>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(mut err) = stderr {
        let mut chunk = [0u8; 4096];
        loop {
            match err.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    buf.extend_from_slice(&chunk[..n]);
                    if buf.len() > STDERR_TAIL * 2 {
                        buf.drain(..buf.len() - STDERR_TAIL);
                    }
                }
            }
        }
    }
    buf
}

/// The last [`STDERR_TAIL`] bytes of `b` as text, cut at a character boundary.
fn tail(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    let s = s.trim();
    let mut start = s.len().saturating_sub(STDERR_TAIL);
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn substitution_is_per_argument() {
        let t = argv(&["mv", "--gear={gear}", "{target}", "{gear}{gear}"]);
        assert_eq!(
            substitute(&t, &[("gear", "g 1; rm -rf /"), ("target", "n2")]),
            argv(&[
                "mv",
                "--gear=g 1; rm -rf /",
                "n2",
                "g 1; rm -rf /g 1; rm -rf /"
            ])
        );
    }

    #[tokio::test]
    async fn runs_captures_and_fails_cleanly() {
        let out = run(
            &argv(&["sh", "-c", "echo hello"]),
            Duration::from_secs(5),
            None,
            100,
        )
        .await
        .unwrap();
        assert_eq!(out, b"hello\n");
        let e = run(
            &argv(&["sh", "-c", "echo oops >&2; exit 75"]),
            Duration::from_secs(5),
            None,
            100,
        )
        .await
        .unwrap_err();
        match &e {
            RuntimeError::Command { code, stderr, .. } => {
                assert_eq!(*code, Some(75));
                assert_eq!(stderr, "oops");
            }
            other => panic!("{other:?}"),
        }
        assert!(e.is_retryable());
        let e = run(
            &argv(&["sleep", "5"]),
            Duration::from_millis(100),
            None,
            100,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, RuntimeError::Timeout { .. }));
        let e = run(
            &argv(&["sh", "-c", "yes | head -c 1000"]),
            Duration::from_secs(5),
            None,
            10,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, RuntimeError::Parse { .. }));
        let e = run(
            &argv(&["/nonexistent/program"]),
            Duration::from_secs(5),
            None,
            10,
        )
        .await
        .unwrap_err();
        assert!(matches!(e, RuntimeError::Command { code: None, .. }));
    }

    #[tokio::test]
    async fn cancellation_interrupts() {
        let t = CancellationToken::new();
        let t2 = t.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            t2.cancel();
        });
        let e = run(
            &argv(&["sleep", "5"]),
            Duration::from_secs(10),
            Some(&t),
            10,
        )
        .await
        .unwrap_err();
        assert_eq!(e, RuntimeError::Interrupted);
    }
}
