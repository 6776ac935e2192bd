//! Typed errors of the placement engine and the evacuation planner.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

/// Why an [`Engine`](crate::Engine) could not be built.
#[derive(Debug, Error)]
pub enum PlacementError {
    /// A configuration value is unusable.
    #[error("key `{key}`: {reason}")]
    Config {
        /// Dotted key, for example `placement.php_hosts`.
        key: String,
        /// Why.
        reason: String,
    },
    /// The operator's script could not be loaded or compiled.
    #[error(transparent)]
    Script(#[from] ScriptError),
}

impl From<gearshift_service::config::Invalid> for PlacementError {
    fn from(i: gearshift_service::config::Invalid) -> Self {
        PlacementError::Config {
            key: i.key,
            reason: i.reason,
        }
    }
}

/// A problem with the operator's Rhai script, at load time or while deciding.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ScriptError {
    /// The script file could not be read.
    #[error("script {path}: cannot read: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The script does not compile.
    #[error("script does not compile: {reason}")]
    Compile {
        /// Parser's message with line and column.
        reason: String,
    },
    /// The script has no `fn place(input)`.
    #[error("script defines no `fn place(input)` (one parameter)")]
    NoPlaceFunction,
    /// The script failed while running (not a deliberate `throw`).
    #[error("script failed: {reason}")]
    Runtime {
        /// Rhai's message with position.
        reason: String,
    },
    /// The script ran longer than `script.timeout`.
    #[error("script ran longer than {after:?} and was stopped")]
    Timeout {
        /// The limit.
        after: Duration,
    },
    /// The script exceeded `script.max_operations`.
    #[error("script exceeded {limit} operations and was stopped")]
    TooManyOperations {
        /// The limit.
        limit: u64,
    },
    /// The script returned something other than a node name or `()`.
    #[error("script returned {got}, expected a node name (string) or ()")]
    BadReturn {
        /// Type of what it returned.
        got: String,
    },
}

impl ScriptError {
    /// The configuration key a load-time error is about.
    pub fn config_key(&self) -> &'static str {
        match self {
            ScriptError::Read { .. } => "script.path",
            _ => "script",
        }
    }
}

/// A problem running the operator's external command.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CommandError {
    /// The command could not be started.
    #[error("command {program}: cannot start: {reason}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        reason: String,
    },
    /// The command ran longer than `command.timeout` and was killed.
    #[error("command {program} ran longer than {after:?} and was killed")]
    Timeout {
        /// The program.
        program: String,
        /// The limit.
        after: Duration,
    },
    /// The command printed more than `command.max_output_bytes`.
    #[error("command {program} printed more than {limit} bytes and was killed")]
    OutputTooLarge {
        /// The program.
        program: String,
        /// The limit.
        limit: usize,
    },
    /// The command exited with a failure status.
    #[error("command {program} exited with {status}: {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// Exit status as text.
        status: String,
        /// The start of its standard error.
        stderr: String,
    },
    /// The command's output is neither a name nor one of the accepted JSON forms.
    #[error("command {program} printed an unusable answer: {reason}")]
    BadOutput {
        /// The program.
        program: String,
        /// Why.
        reason: String,
    },
    /// Reading or writing the command's pipes failed.
    #[error("command {program}: {reason}")]
    Io {
        /// The program.
        program: String,
        /// Why.
        reason: String,
    },
}

/// Why the evacuation planner could not move every gear; the scale-down
/// saga aborts on any of these.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PlanError {
    /// No candidate can take this gear.
    #[error("gear {gear} does not fit anywhere in {district}: {reason}")]
    NoTarget {
        /// The gear that does not fit.
        gear: String,
        /// The victim's district (`(no district)` when it has none).
        district: String,
        /// What the filters and the strategy said.
        reason: String,
    },
    /// The gear opted out of scale-down (`do_not_disrupt`).
    #[error("gear {gear} opted out of scale-down (do_not_disrupt)")]
    OptedOut {
        /// The gear.
        gear: String,
    },
    /// The same gear id appears twice in the request.
    #[error("gear {gear} is listed twice")]
    DuplicateGear {
        /// The gear.
        gear: String,
    },
    /// The request is out of bounds (too many gears or candidates, empty names).
    #[error("invalid evacuation request: {0}")]
    Invalid(String),
}
