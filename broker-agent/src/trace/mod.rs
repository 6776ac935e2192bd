//! Report traces: what `[trace]` records of the node reports the agent
//! receives, and what `gearshift-sim replay` reads back to run the real
//! policy and sagas against them in virtual time.
//!
//! ## Format
//! JSON lines (UTF-8, one object a line, `\n`-terminated), in receive order:
//!
//! ```json
//! {"at":"2026-11-27T14:00:00.120Z","report":{"node":"node-1.example.com","seq":42,...}}
//! ```
//!
//! - `at`: when the broker agent received the report (RFC 3339, UTC);
//! - `report`: the body of the `report` envelope after the signed-message
//!   gate verified it (signature, node role, identity), exactly the
//!   `NodeReport` of `docs/protocol.md`.
//!
//! A line is at most [`MAX_LINE`] bytes; a reader refuses a longer one, a
//! line that is not such an object, or a file of more than its bound of
//! lines, naming the line.
//!
//! Layout: this file the format and the reader, `recorder.rs` the bounded
//! writer the agent runs, `config.rs` the `[trace]` section.

mod config;
mod recorder;

use std::io::BufRead;
use std::path::Path;

use chrono::{DateTime, Utc};
use gearshift_proto::msg::NodeReport;
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use config::TraceConfig;
pub use recorder::Recorder;

/// Longest line a trace may hold (a report is well under 4 KiB).
pub const MAX_LINE: usize = 64 * 1024;

/// One received report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TraceLine {
    /// When the agent received it.
    pub at: DateTime<Utc>,
    /// The verified report.
    pub report: NodeReport,
}

/// Why a trace could not be read.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a trace line.
    #[error("line {line}: {reason}")]
    Line {
        /// 1-based line number.
        line: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// The trace has more lines than the reader takes.
    #[error("more than {0} lines: split the trace or raise the bound")]
    TooLong(u64),
}

/// Opens the trace at `path` for reading (at most `max_lines` lines).
pub fn open(
    path: &Path,
    max_lines: u64,
) -> Result<Reader<std::io::BufReader<std::fs::File>>, TraceError> {
    let f = std::fs::File::open(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Reader::new(std::io::BufReader::new(f), max_lines))
}

/// Reads the whole trace at `path` (at most `max_lines` lines).
pub fn read_file(path: &Path, max_lines: u64) -> Result<Vec<TraceLine>, TraceError> {
    open(path, max_lines)?.collect()
}

/// Reads a whole trace (see [`Reader`]).
pub fn read(r: impl BufRead, max_lines: u64) -> Result<Vec<TraceLine>, TraceError> {
    Reader::new(r, max_lines).collect()
}

/// The lines of a trace, one at a time (a day of a large fleet need not
/// fit in memory): every line checked (length, JSON, fields), blank lines
/// skipped; the first bad line ends the reading with its number.
#[derive(Debug)]
pub struct Reader<R> {
    r: R,
    line: u64,
    max_lines: u64,
    buf: Vec<u8>,
    failed: bool,
}

impl<R: BufRead> Reader<R> {
    /// Reads `r`, refusing more than `max_lines` lines.
    pub fn new(r: R, max_lines: u64) -> Self {
        Reader {
            r,
            line: 0,
            max_lines,
            buf: Vec::new(),
            failed: false,
        }
    }

    fn next_line(&mut self) -> Result<Option<TraceLine>, TraceError> {
        loop {
            self.buf.clear();
            // One byte past the bound tells an overlong line from a full one.
            let n = <&mut R as std::io::Read>::take(&mut self.r, MAX_LINE as u64 + 2)
                .read_until(b'\n', &mut self.buf)
                .map_err(|source| TraceError::Io {
                    path: String::new(),
                    source,
                })?;
            if n == 0 {
                return Ok(None);
            }
            self.line += 1;
            let line = self.line;
            if line > self.max_lines {
                return Err(TraceError::TooLong(self.max_lines));
            }
            let text = self.buf.strip_suffix(b"\n").unwrap_or(&self.buf);
            if text.len() > MAX_LINE {
                return Err(TraceError::Line {
                    line,
                    reason: format!("longer than {MAX_LINE} bytes"),
                });
            }
            if text.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let t = serde_json::from_slice(text).map_err(|e| TraceError::Line {
                line,
                reason: e.to_string(),
            })?;
            return Ok(Some(t));
        }
    }
}

impl<R: BufRead> Iterator for Reader<R> {
    type Item = Result<TraceLine, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let r = self.next_line();
        self.failed = r.is_err();
        r.transpose()
    }
}

#[cfg(test)]
mod tests;
