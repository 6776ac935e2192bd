//! `[history]` of `conf/broker.toml`: the durable, rotating history of
//! decisions, saga steps, changed explanations and operator requests.

use serde::{Deserialize, Serialize};

/// `[history]`
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// Keep the history (`<state_dir>/history.jsonl`). Default `true`.
    pub enabled: bool,
    /// Bytes a history file may reach before it is rotated
    /// (`history.jsonl` -> `history.jsonl.1` -> ...). Default 8 MiB.
    pub max_file_bytes: u64,
    /// Rotated files kept besides the current one; the oldest is deleted.
    /// Default `6` (with 8 MiB files, at most 56 MiB on disk).
    pub rotated_files: u32,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        HistoryConfig {
            enabled: true,
            max_file_bytes: 8 * 1024 * 1024,
            rotated_files: 6,
        }
    }
}

impl HistoryConfig {
    /// Checks the bounds (a file holds at least a few records).
    pub fn validate(&self) -> Result<(), gearshift_service::config::Invalid> {
        use gearshift_service::config::Invalid;
        if self.max_file_bytes < 64 * 1024 {
            return Err(Invalid::new(
                "history.max_file_bytes",
                "must be at least 65536 (64 KiB)",
            ));
        }
        if self.rotated_files > 1000 {
            return Err(Invalid::new("history.rotated_files", "must be 0..=1000"));
        }
        Ok(())
    }
}
