//! `[trace]` of `conf/broker.toml`: recording the reports the agent
//! receives, for `gearshift-sim replay` (what-if runs of another
//! configuration against real traffic).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[trace]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TraceConfig {
    /// Record every verified report. Default `false`.
    pub record: bool,
    /// Where (appended to). Default `<state_dir>/trace.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// Recording stops (with one warning) once the file holds this many
    /// bytes: a day of 1,000 nodes reporting every minute is about 1 GiB.
    /// Default 1 GiB.
    pub max_bytes: u64,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            record: false,
            path: None,
            max_bytes: 1024 * 1024 * 1024,
        }
    }
}

impl TraceConfig {
    /// Checks the bound (room for some reports).
    pub fn validate(&self) -> Result<(), gearshift_service::config::Invalid> {
        use gearshift_service::config::Invalid;
        if self.max_bytes < 64 * 1024 {
            return Err(Invalid::new(
                "trace.max_bytes",
                "must be at least 65536 (64 KiB)",
            ));
        }
        if let Some(p) = &self.path {
            gearshift_service::check::names_a_path("trace.path", p, "file")?;
        }
        Ok(())
    }

    /// The file, under `state_dir` unless `path` is set.
    pub fn file(&self, state_dir: &std::path::Path) -> PathBuf {
        self.path
            .clone()
            .unwrap_or_else(|| state_dir.join("trace.jsonl"))
    }
}
