//! `cmd.*`: commands the broker agent (or an operator) sends to one node.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{MAX_MOVES, Validate, check_len, check_name, check_text};

/// `cmd.deactivate`: stop accepting new gears. Persisted by the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Deactivate {
    /// Why, for the node's log.
    #[serde(default)]
    pub reason: String,
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

/// `cmd.activate`: accept new gears again. Persisted by the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Activate {
    /// Why, for the node's log.
    #[serde(default)]
    pub reason: String,
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

/// One gear to move and where to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
pub struct Move {
    /// The gear's id (its UUID in OpenShift v2).
    pub gear: String,
    /// The target node's identity.
    pub target: String,
}

/// `cmd.evacuate`: move these gears off the node.
///
/// Idempotent on the envelope's `corr`: a node that receives the same
/// operation again resumes it and never moves a gear twice.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Evacuate {
    /// The moves, each gear at most once.
    pub moves: Vec<Move>,
    /// Moves in flight at once; the node's configured default (4) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallelism: Option<u32>,
    /// Give up on remaining gears after this instant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<DateTime<Utc>>,
    /// The moves are carried out elsewhere (the broker agent runs
    /// `oo-admin-move` on the PaaS broker host): the node moves nothing,
    /// watches each gear leave its own gear directory and reports progress
    /// as for its own moves. Absent (false): the node moves the gears.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub watch: bool,
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

impl Validate for Evacuate {
    fn validate(&self) -> Result<(), String> {
        check_len("moves", &self.moves, MAX_MOVES)?;
        let mut seen = std::collections::HashSet::with_capacity(self.moves.len());
        for m in &self.moves {
            check_name("moves[].gear", &m.gear)?;
            check_name("moves[].target", &m.target)?;
            if !seen.insert(m.gear.as_str()) {
                return Err(format!("gear {:?} appears twice in moves", m.gear));
            }
        }
        if let Some(p) = self.parallelism
            && !(1..=256).contains(&p)
        {
            return Err(format!("parallelism {p} outside 1..=256"));
        }
        Ok(())
    }
}

/// `cmd.remove`: the node is empty; run the configured removal action
/// (for example a Heat signal naming this host), report it, then stop.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Remove {
    /// Why, for the node's log.
    #[serde(default)]
    pub reason: String,
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

/// `cmd.ping`: answer with a `pong` on the reply queue (or on `event.<node>`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Ping {}

/// Which Heat action a node performs with its own credentials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeatAction {
    /// POST the scale-up policy's pre-signed `alarm_url`.
    ScaleUp,
    /// POST the scale-down policy's pre-signed `alarm_url`.
    ScaleDown,
    /// POST the configured `signal_url` with a Keystone token.
    Signal,
    /// Mark this node's group member unhealthy (so Heat removes exactly it).
    MarkUnhealthy,
}

impl HeatAction {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            HeatAction::ScaleUp => "scale_up",
            HeatAction::ScaleDown => "scale_down",
            HeatAction::Signal => "signal",
            HeatAction::MarkUnhealthy => "mark_unhealthy",
        }
    }
}

/// `cmd.heat_signal`: the PEP's path, where a node sends the Heat signal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeatSignal {
    /// What to do.
    pub action: HeatAction,
    /// Why; sent to Heat as the reason where the API takes one.
    #[serde(default)]
    pub reason: String,
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

impl Validate for HeatSignal {
    fn validate(&self) -> Result<(), String> {
        check_text("reason", &self.reason)
    }
}

/// `cmd.inventory`: answer with the node's gear list in `event.done`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct InventoryRequest {
    /// The sending broker agent's leader epoch ([`super::fence`]); absent: 0.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

impl Validate for Deactivate {
    fn validate(&self) -> Result<(), String> {
        check_text("reason", &self.reason)
    }
}
impl Validate for Activate {
    fn validate(&self) -> Result<(), String> {
        check_text("reason", &self.reason)
    }
}
impl Validate for Remove {
    fn validate(&self) -> Result<(), String> {
        check_text("reason", &self.reason)
    }
}
impl Validate for Ping {}
impl Validate for InventoryRequest {}
