//! `event.*` and `pong`: what a node says about the commands it received.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::{GearState, HeatAction, MAX_LIST, Validate, check_len, check_name, check_text};

/// One gear on a node, as listed by `cmd.inventory` and `cmd.deactivate`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GearInfo {
    /// The gear's id.
    pub id: String,
    /// The application the gear belongs to, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    /// The gear's state.
    pub state: GearState,
    /// The gear's UID in the district, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Size on disk in bytes, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// The gear opted out of scale-down.
    #[serde(default)]
    pub do_not_disrupt: bool,
}

/// `event.ack`: the node accepted a command and is applying it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The command's envelope id.
    pub cmd: Uuid,
    /// The command's kind.
    pub command: String,
}

/// How one gear's move ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GearOutcome {
    /// Copied, verified and deleted from the source.
    Moved,
    /// Already at the target (found there on resume): not moved again.
    AlreadyMoved,
    /// Not on this node and not at the target: nothing to do.
    Missing,
    /// Failed after all retries; the gear is still on the source.
    Failed,
}

/// The result of one gear's move.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GearResult {
    /// The gear's id.
    pub gear: String,
    /// Where it was to go.
    pub target: String,
    /// How it ended.
    pub outcome: GearOutcome,
    /// Attempts made.
    pub attempts: u32,
    /// The last error, for failed gears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `event.progress`: sent after every gear of an evacuation finishes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// The command's envelope id.
    pub cmd: Uuid,
    /// Gears moved (including `already_moved` and `missing`).
    pub moved: u32,
    /// Gears failed for good.
    pub failed: u32,
    /// Gears not finished yet.
    pub remaining: u32,
    /// Gears in the evacuation.
    pub total: u32,
    /// The gears that finished since the previous progress event.
    pub results: Vec<GearResult>,
}

/// What a successful command produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CommandResult {
    /// The node is inactive; here are its gears.
    Deactivated {
        /// Every gear on the node.
        gears: Vec<GearInfo>,
    },
    /// The node is active.
    Activated,
    /// The evacuation ended; `failed` > 0 means some gears are still here.
    Evacuated {
        /// Gears moved.
        moved: u32,
        /// Gears failed for good.
        failed: u32,
        /// Every gear's result.
        results: Vec<GearResult>,
        /// Gears left on the node after the evacuation.
        gears_left: u32,
    },
    /// The removal action ran; the agent is stopping.
    Removed {
        /// The action that ran (`heat:mark_unhealthy`, `none`, ...).
        action: String,
        /// What the action answered.
        detail: String,
    },
    /// The Heat signal was sent and accepted.
    HeatSignalled {
        /// The action.
        action: HeatAction,
        /// The HTTP status Heat answered.
        status: u16,
        /// Response body or summary.
        detail: String,
    },
    /// The node's gears.
    Inventory {
        /// Every gear on the node.
        gears: Vec<GearInfo>,
    },
}

/// `event.done`: a command finished successfully.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Done {
    /// The command's envelope id.
    pub cmd: Uuid,
    /// The command's kind.
    pub command: String,
    /// What it produced.
    pub result: CommandResult,
}

/// `event.failed`: a command could not be carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Failed {
    /// The command's envelope id.
    pub cmd: Uuid,
    /// The command's kind.
    pub command: String,
    /// What went wrong.
    pub error: String,
    /// Whether sending the command again may succeed.
    pub retryable: bool,
    /// HTTP status of the failing upstream call (Heat, Keystone), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
}

/// `event.refused`: a command was refused before anything happened
/// (bad signature, expired, replayed, malformed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    /// The refused message's id, if it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Uuid>,
    /// Stable reason label (`bad_signature`, `expired`, `replayed`, ...).
    pub reason: String,
    /// Human-readable detail.
    pub detail: String,
    /// With reason `stale_epoch`: the newest leader epoch the node has
    /// seen, which the refused command's epoch is below. Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

/// `pong`: answer to `cmd.ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// The answering agent's identity.
    pub agent: String,
    /// `node` or `broker`.
    pub role: String,
    /// The agent's version.
    pub version: String,
    /// When the agent started.
    pub started_at: DateTime<Utc>,
    /// When the ping arrived at the agent.
    pub received_at: DateTime<Utc>,
    /// The ping's envelope id.
    pub ping: Uuid,
    /// For nodes: whether the node is active.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
}

impl Validate for Ack {}
impl Validate for Progress {
    fn validate(&self) -> Result<(), String> {
        check_len("results", &self.results, MAX_LIST)
    }
}
impl Validate for Done {
    fn validate(&self) -> Result<(), String> {
        match &self.result {
            CommandResult::Deactivated { gears } | CommandResult::Inventory { gears } => {
                check_len("gears", gears, MAX_LIST)?;
                for g in gears {
                    check_name("gears[].id", &g.id)?;
                }
                Ok(())
            }
            CommandResult::Evacuated { results, .. } => check_len("results", results, MAX_LIST),
            CommandResult::Removed { detail, .. } | CommandResult::HeatSignalled { detail, .. } => {
                check_text("detail", detail)
            }
            CommandResult::Activated => Ok(()),
        }
    }
}
impl Validate for Failed {
    fn validate(&self) -> Result<(), String> {
        check_text("error", &self.error)
    }
}
impl Validate for Refused {
    fn validate(&self) -> Result<(), String> {
        check_text("detail", &self.detail)
    }
}
impl Validate for Pong {
    fn validate(&self) -> Result<(), String> {
        check_name("agent", &self.agent)
    }
}
