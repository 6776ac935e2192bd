//! The bounded trace writer: appends one line per verified report, stops at
//! `max_bytes` (one warning), never fails the agent (a write error is
//! logged once and recording stops).

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use gearshift_proto::msg::NodeReport;

use super::{MAX_LINE, TraceConfig, TraceLine};

/// Appends reports to a trace file.
#[derive(Debug)]
pub struct Recorder {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    written: u64,
    max: u64,
}

impl Recorder {
    /// Opens (appends to) the trace `cfg` names, when recording is on.
    pub fn open(cfg: &TraceConfig, state_dir: &Path) -> Option<Recorder> {
        if !cfg.record {
            return None;
        }
        let path = cfg.file(state_dir);
        let opened = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|f| Ok((f.metadata()?.len(), f)));
        match opened {
            Ok((written, f)) => {
                tracing::info!(path = %path.display(), "recording node reports");
                Some(Recorder {
                    path,
                    out: Some(BufWriter::new(f)),
                    written,
                    max: cfg.max_bytes,
                })
            }
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "trace not recorded");
                None
            }
        }
    }

    /// Records `report`, received `at`.
    pub fn record(&mut self, at: DateTime<Utc>, report: &NodeReport) {
        let Some(out) = self.out.as_mut() else {
            return;
        };
        let line = TraceLine {
            at,
            report: report.clone(),
        };
        let Ok(mut text) = serde_json::to_vec(&line) else {
            return;
        };
        if text.len() > MAX_LINE {
            return;
        }
        text.push(b'\n');
        if self.written + text.len() as u64 > self.max {
            tracing::warn!(path = %self.path.display(), max_bytes = self.max,
                "trace full: recording stops");
            self.stop();
            return;
        }
        match out.write_all(&text) {
            Ok(()) => self.written += text.len() as u64,
            Err(e) => {
                tracing::error!(path = %self.path.display(), error = %e,
                    "trace write failed: recording stops");
                self.stop();
            }
        }
    }

    /// Writes what is buffered (on every tick, and at the end).
    pub fn flush(&mut self) {
        if let Some(out) = self.out.as_mut()
            && let Err(e) = out.flush()
        {
            tracing::error!(path = %self.path.display(), error = %e,
                "trace write failed: recording stops");
            self.out = None;
        }
    }

    /// Bytes in the file.
    pub fn written(&self) -> u64 {
        self.written
    }

    fn stop(&mut self) {
        if let Some(mut out) = self.out.take() {
            let _ = out.flush();
        }
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop();
    }
}
