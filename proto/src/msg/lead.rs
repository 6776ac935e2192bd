//! Leader election among broker agents and the leader's replicated journal
//! (`docs/ha.md`): candidate tokens, the leader's announcement, and the
//! journal snapshot standbys take over from.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Validate, check_name};

/// Longest instance id (bytes).
pub const MAX_INSTANCE: usize = 64;

/// `lead.token`: a broker agent's candidacy, published every period on
/// `broker.candidate.<cluster>` and queued for the one active consumer of the
/// leader queue. An agent that receives its own token leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeadToken {
    /// The candidate's name (`[agent] name`).
    pub agent: String,
    /// This run of the candidate (a random id per process start), so that two
    /// processes under one name never take each other's tokens for their own.
    pub instance: String,
    /// Counts the instance's tokens from 0.
    pub seq: u64,
}

/// `leader`: the leader's announcement, every period on
/// `broker.leader.<cluster>`, for standbys, dashboards and tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderAnnouncement {
    /// The leader's name.
    pub agent: String,
    /// Its run (see [`LeadToken::instance`]).
    pub instance: String,
    /// Its epoch: strictly greater than every earlier leader's.
    pub epoch: u64,
    /// When it took over.
    pub since: DateTime<Utc>,
}

/// `journal.snapshot`: the leader's whole journal after a commit (and every
/// few seconds), on `broker.journal.<cluster>`. Standbys keep the newest and
/// load it when they take over.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalSnapshot {
    /// The leader that wrote it.
    pub agent: String,
    /// The leader's epoch.
    pub epoch: u64,
    /// Counts the leader's snapshots within its epoch: with `epoch`, orders them.
    pub seq: u64,
    /// The journal's records, in the broker agent's own format (a JSON
    /// object: `ops`, `groups`, `marks`, `cordons`, `meta`); opaque to third
    /// parties.
    pub journal: Value,
}

fn check_instance(s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > MAX_INSTANCE || !s.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(format!(
            "instance must be 1..={MAX_INSTANCE} ASCII letters and digits"
        ));
    }
    Ok(())
}

impl Validate for LeadToken {
    fn validate(&self) -> Result<(), String> {
        check_name("agent", &self.agent)?;
        check_instance(&self.instance)
    }
}

impl Validate for LeaderAnnouncement {
    fn validate(&self) -> Result<(), String> {
        check_name("agent", &self.agent)?;
        check_instance(&self.instance)
    }
}

impl Validate for JournalSnapshot {
    fn validate(&self) -> Result<(), String> {
        check_name("agent", &self.agent)?;
        if !self.journal.is_object() {
            return Err("journal is not a JSON object".into());
        }
        Ok(())
    }
}
