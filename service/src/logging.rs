//! Logging: tracing to stderr in a human or JSON format.
//!
//! Under systemd, stderr goes to the journal; the human format then omits
//! its own timestamps (the journal has them) when `JOURNAL_STREAM` is set.

use serde::{Deserialize, Serialize};
use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One readable line per event.
    #[default]
    Human,
    /// One JSON object per line (for log shippers).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    /// `human` or `json` (what `--log-format` takes).
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "human" => Ok(LogFormat::Human),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("{other:?} is not a log format (human or json)")),
        }
    }
}

/// Installs the global subscriber. `level` is an `EnvFilter` directive such
/// as `info` or `gearshift_broker=debug,info`; `RUST_LOG` overrides it.
/// Calling it twice is harmless (the second call is ignored).
pub fn init(format: LogFormat, level: &str) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match (format, under_journal) {
        (LogFormat::Json, _) => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .try_init(),
        (LogFormat::Human, true) => builder.without_time().with_ansi(false).try_init(),
        (LogFormat::Human, false) => builder.try_init(),
    };
}
