//! What every `gearshift-sim` subcommand does around its scenario: a
//! runtime, the outcome printed as text or JSON, an exit status.

use std::process::ExitCode;

use serde::Serialize;

/// A multi-threaded runtime for subcommand `name`, or the exit status
/// `code` after saying why there is none.
pub fn runtime(name: &str, code: u8) -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("gearshift-sim {name}: cannot start the runtime: {e}");
            ExitCode::from(code)
        })
}

/// Prints `outcome`: one JSON object on stdout with `json`, else `text`.
/// False when it could not be serialized (said on stderr).
pub fn emit<T: Serialize>(
    name: &str,
    json: bool,
    outcome: &T,
    text: impl FnOnce() -> String,
) -> bool {
    if !json {
        print!("{}", text());
        return true;
    }
    match serde_json::to_string(outcome) {
        Ok(j) => {
            println!("{j}");
            true
        }
        Err(e) => {
            fail(
                name,
                true,
                "output",
                &format!("cannot write the outcome as JSON: {e}"),
                2,
            );
            false
        }
    }
}

/// Ends subcommand `name` with exit status `code` after an error that kept
/// it from running (`kind`: `usage`, `connect`, `config`, ...): the message
/// on stderr, and with `json` also [`json_error`] on stdout.
pub fn fail(name: &str, json: bool, kind: &str, message: &str, code: u8) -> ExitCode {
    eprintln!("gearshift-sim {name}: {message}");
    if json {
        json_error(name, kind, message, code);
    }
    ExitCode::from(code)
}

/// Prints one JSON error object on stdout,
/// `{"ok":false,"command":…,"error":{"kind":…,"message":…},"exit_code":…}`,
/// so that a caller parsing stdout gets an object whatever went wrong.
pub fn json_error(name: &str, kind: &str, message: &str, code: u8) {
    let v = serde_json::json!({
        "ok": false,
        "command": name,
        "error": { "kind": kind, "message": message },
        "exit_code": code,
    });
    println!("{v}");
}

/// Rounds to one decimal, as the reports print their figures.
pub fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// A directory for one run under the system's temporary directory
/// (`gearshift-sim-<random>`), removed when dropped unless kept with
/// [`tempfile::TempDir::keep`].
pub fn run_dir() -> std::io::Result<tempfile::TempDir> {
    tempfile::Builder::new().prefix("gearshift-sim-").tempdir()
}
