//! The tools' exit codes and output, read as origin-server prints them
//! (`openshift/origin-server` at 7fd1910, 2017-07-26; line numbers below
//! are of that commit). The only place that reads the tools' text: every
//! decision downstream is on the typed [`Outcome`].
//!
//! - [`ctl`]: `oo-admin-ctl-district` for one `-i` node.
//! - [`moves`]: `oo-admin-move` for one `--gear_uuid` (text or `--json`).
//!
//! Both start with [`common`]: what any tool (or `sudo` in front of it)
//! means the same way.

pub mod ctl;
pub mod moves;
#[cfg(test)]
mod tests;

use super::outcome::{Failure, Outcome};

/// How a tool ended, as the runner saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Exit {
    /// Exit code; none when killed by a signal.
    pub code: Option<i32>,
    /// The signal that ended it, if any.
    pub signal: Option<i32>,
    /// Standard output (bounded; see `paas::capture`).
    pub stdout: String,
    /// Standard error (bounded).
    pub stderr: String,
}

impl Exit {
    /// The same output with `\r\n` line ends as `\n`: under sudo's
    /// `use_pty` (the default from sudo 1.9.14) the tool writes to a
    /// terminal, which turns each `\n` into `\r\n`.
    pub fn without_cr(&self) -> Exit {
        Exit {
            stdout: self.stdout.replace("\r\n", "\n"),
            stderr: self.stderr.replace("\r\n", "\n"),
            ..self.clone()
        }
    }
}

/// Longest text quoted in a failure's detail, in bytes.
const DETAIL_MAX: usize = 600;

/// The last `DETAIL_MAX` bytes of what the tool printed (standard error
/// when it printed any, else standard output), trimmed.
pub fn detail(exit: &Exit) -> String {
    let text = if exit.stderr.trim().is_empty() {
        exit.stdout.trim()
    } else {
        exit.stderr.trim()
    };
    let mut start = text.len().saturating_sub(DETAIL_MAX);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_string()
}

/// What every tool's exit means whatever it printed, or `None`:
/// - a signal the agent did not send: [`Failure::Signaled`];
/// - exit 255: GetoptLong refused an option, or no `-c` / an unknown
///   command (`oo-admin-ctl-district:88-93`, `:100-103`, `:120-128`;
///   `oo-admin-move:50-55`): [`Failure::Usage`];
/// - sudo refusing to run the tool (`sudo: a password is required`,
///   `sudo: sorry, you must have a tty to run sudo`, `Sorry, user U is not
///   allowed to execute ...`): [`Failure::NotPermitted`]; sudo's `command
///   not found`, and exit 126/127 of `env` or a shell: [`Failure::NotExecutable`].
pub fn common(exit: &Exit) -> Option<Outcome> {
    if exit.code.is_none() {
        let sig = exit.signal.unwrap_or(0);
        return Some(Outcome::failed(
            Failure::Signaled,
            format!("killed by signal {sig}: {}", detail(exit)),
        ));
    }
    if exit.code == Some(0) {
        return None;
    }
    let sudo = exit
        .stderr
        .lines()
        .find(|l| l.starts_with("sudo: ") || l.starts_with("Sorry, user "));
    if let Some(line) = sudo {
        let failure = if line.ends_with(": command not found") {
            Failure::NotExecutable
        } else {
            Failure::NotPermitted
        };
        return Some(Outcome::failed(failure, line.trim()));
    }
    match exit.code {
        Some(255) => Some(Outcome::failed(Failure::Usage, detail(exit))),
        Some(126 | 127) => Some(Outcome::failed(Failure::NotExecutable, detail(exit))),
        _ => None,
    }
}
