//! Logging: tracing to stderr in a human or JSON format.
//!
//! Under systemd, stderr goes to the journal; the human format then omits
//! its own timestamps (the journal has them) when `JOURNAL_STREAM` is set.

use serde::{Deserialize, Serialize};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

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

/// Checks a log filter: `info`, `warn`, `gearshift_node=debug,info`, ...
/// (per-target levels, as `RUST_LOG` takes them without span filters).
pub fn check_level(level: &str) -> Result<(), String> {
    parse_filter(level).map(|_| ())
}

fn parse_filter(level: &str) -> Result<Targets, String> {
    if level.trim().is_empty() {
        return Err("empty filter".into());
    }
    level.trim().parse::<Targets>().map_err(|e| {
        format!("{level:?} is not a log filter like \"info\" or \"gearshift_node=debug,info\": {e}")
    })
}

/// Installs the global subscriber. `level` is a filter such as `info` or
/// `gearshift_broker=debug,info`; `RUST_LOG` overrides it. A filter that
/// does not parse is reported and `info` is used. Calling it twice is
/// harmless (the second call is ignored).
pub fn init(format: LogFormat, level: &str) {
    let from_env = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty());
    let (filter, problem) = match parse_filter(from_env.as_deref().unwrap_or(level)) {
        Ok(f) => (f, None),
        Err(e) => (Targets::new().with_default(tracing::Level::INFO), Some(e)),
    };
    let under_journal = std::env::var_os("JOURNAL_STREAM").is_some();
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    let installed = match (format, under_journal) {
        (LogFormat::Json, _) => registry
            .with(fmt.json().flatten_event(true).with_current_span(false))
            .try_init(),
        (LogFormat::Human, true) => registry
            .with(fmt.without_time().with_ansi(false))
            .try_init(),
        (LogFormat::Human, false) => registry.with(fmt).try_init(),
    };
    if let (Ok(()), Some(e)) = (installed, problem) {
        tracing::warn!("logging at info: {e}");
    }
}
