//! `report`: what a node agent tells the fleet about itself.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{MAX_LIST, Validate, check_name, check_opt_name};

/// State of one gear, as in an OpenShift v2 gear's state file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum GearState {
    /// Running and serving.
    Started,
    /// Idled by the platform (counts as inactive).
    Idle,
    /// Stopped by its owner (counts as inactive).
    Stopped,
    /// Being built or deployed.
    Deploying,
    /// Any state the runtime could not classify; counts as active, to be safe.
    Unknown,
}

impl GearState {
    /// Parses the content of a gear state file; anything unrecognised is `Unknown`.
    pub fn parse_lenient(s: &str) -> GearState {
        match s.trim().to_ascii_lowercase().as_str() {
            "started" | "running" => GearState::Started,
            "idle" => GearState::Idle,
            "stopped" => GearState::Stopped,
            "deploying" | "building" | "new" => GearState::Deploying,
            _ => GearState::Unknown,
        }
    }
}

/// Gear counts per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GearCounts {
    /// Gears in state `started`.
    #[serde(default)]
    pub started: u32,
    /// Gears in state `idle`.
    #[serde(default)]
    pub idle: u32,
    /// Gears in state `stopped`.
    #[serde(default)]
    pub stopped: u32,
    /// Gears in state `deploying`.
    #[serde(default)]
    pub deploying: u32,
    /// Gears in state `unknown`.
    #[serde(default)]
    pub unknown: u32,
}

impl GearCounts {
    /// Adds one gear in `state`.
    pub fn add(&mut self, state: GearState) {
        let slot = match state {
            GearState::Started => &mut self.started,
            GearState::Idle => &mut self.idle,
            GearState::Stopped => &mut self.stopped,
            GearState::Deploying => &mut self.deploying,
            GearState::Unknown => &mut self.unknown,
        };
        *slot = slot.saturating_add(1);
    }

    /// All gears on the node.
    pub fn total(&self) -> u32 {
        self.started
            .saturating_add(self.idle)
            .saturating_add(self.stopped)
            .saturating_add(self.deploying)
            .saturating_add(self.unknown)
    }

    /// Active gears, as `oo-stats` counts them: total - idle - stopped.
    pub fn active(&self) -> u32 {
        self.total() - self.idle - self.stopped
    }
}

/// The district a node belongs to, from its district info file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DistrictInfo {
    /// District UUID (32 hex digits in OpenShift v2).
    pub uuid: String,
    /// Whether the node is active in its district (placement allowed).
    pub active: bool,
    /// First UID of the district's range, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_uid: Option<u32>,
    /// Last UID of the district's range, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uid: Option<u32>,
}

impl DistrictInfo {
    /// UID capacity of the district: `max_uid - first_uid + 1`, or 6000 (OpenShift's default).
    pub fn capacity(&self) -> u32 {
        match (self.first_uid, self.max_uid) {
            (Some(first), Some(max)) if max >= first => max - first + 1,
            _ => DEFAULT_DISTRICT_CAPACITY,
        }
    }
}

/// UIDs per district when the district info file does not say (OpenShift's default).
pub const DEFAULT_DISTRICT_CAPACITY: u32 = 6000;

/// What a node is doing right now on behalf of a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperationStatus {
    /// The operation id (`corr`) of the command.
    pub corr: String,
    /// The command kind, for example `cmd.evacuate`.
    pub command: String,
    /// Gears moved so far.
    pub moved: u32,
    /// Gears that failed for good.
    pub failed: u32,
    /// Gears still to move.
    pub remaining: u32,
    /// Gears in the command.
    pub total: u32,
}

/// `report`: a node's capacity and state, sent periodically and on every change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    /// The node's identity: its host name, for example `node-3.example.com`.
    pub node: String,
    /// Strictly increasing per node, across restarts (microseconds since the
    /// epoch at send time, bumped when the clock did not move): a receiver drops
    /// any report whose `seq` is not greater than the last one it accepted.
    pub seq: u64,
    /// The node profile (size class), `node_profile` in `resource_limits.conf`.
    pub profile: String,
    /// The district, if the node is districted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district: Option<DistrictInfo>,
    /// `max_active_gears` from `resource_limits.conf`.
    pub max_active_gears: u32,
    /// Gear counts per state.
    pub gears: GearCounts,
    /// False once the node was deactivated (no new gears); persisted across restarts.
    pub active: bool,
    /// Region, when regions are in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zone, when zones are in use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Free memory in MiB (MemAvailable).
    #[serde(default)]
    pub mem_free_mb: u64,
    /// Total memory in MiB.
    #[serde(default)]
    pub mem_total_mb: u64,
    /// When this agent process started.
    pub started_at: DateTime<Utc>,
    /// When the host booted (Linux: `btime` of `/proc/stat`), or was
    /// created: what the `oldest`/`newest` victim strategies order by, so
    /// that an agent restart or upgrade does not make a node "new". Absent
    /// from older nodes (the broker agent then uses `started_at`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_at: Option<DateTime<Utc>>,
    /// The scale-up operation id that created this node (from its user data), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub booted_for: Option<String>,
    /// The operator marked this node do-not-disrupt: never chosen for scale-down.
    #[serde(default)]
    pub do_not_disrupt: bool,
    /// Gears on the node that opted out of scale-down (the node is then never a victim).
    #[serde(default)]
    pub pinned_gears: u32,
    /// The command in progress, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operation: Option<OperationStatus>,
    /// Seconds between periodic reports; the broker agent treats a node as
    /// missing after a few intervals without a report.
    pub interval_secs: u32,
    /// The agent's version.
    #[serde(default)]
    pub agent_version: String,
}

impl NodeReport {
    /// The district UUID, if districted.
    pub fn district_uuid(&self) -> Option<&str> {
        self.district.as_ref().map(|d| d.uuid.as_str())
    }
}

impl Validate for NodeReport {
    fn validate(&self) -> Result<(), String> {
        check_name("node", &self.node)?;
        check_name("profile", &self.profile)?;
        if let Some(d) = &self.district {
            check_name("district.uuid", &d.uuid)?;
        }
        check_opt_name("region", &self.region)?;
        check_opt_name("zone", &self.zone)?;
        if self.gears.total() as usize > MAX_LIST {
            return Err(format!(
                "gear count {} exceeds {MAX_LIST}",
                self.gears.total()
            ));
        }
        if self.interval_secs == 0 {
            return Err("interval_secs is 0".into());
        }
        if let Some(op) = &self.operation {
            check_name("operation.corr", &op.corr)?;
        }
        Ok(())
    }
}
