//! `decision` and `explain`: what the broker agent decided, and why.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{MAX_LIST, Validate, check_len, check_name, check_text};

/// Capacity figures of a node group (or district, or profile), as `oo-stats` computes them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupStats {
    /// Nodes reporting and active.
    pub nodes_active: u32,
    /// Nodes reporting and inactive (deactivated).
    pub nodes_inactive: u32,
    /// Nodes whose reports stopped (stale or missing).
    pub nodes_missing: u32,
    /// Active gears (total - idle - stopped) on reporting nodes.
    pub gears_active: u32,
    /// All gears on reporting nodes.
    pub gears_total: u32,
    /// Sum over active nodes of max(0, max_active_gears - active gears).
    pub available_active_gears: u32,
    /// min(available_active_gears, free UIDs of the district).
    pub effective_available_gears: u32,
    /// 100 * active / (available_active + active); 0 when both are 0.
    pub usage_pct: f64,
    /// Free UIDs of the district (capacity - total gears), when it is one district.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district_free_uids: Option<u32>,
}

/// What kind of decision a `decision` message announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionKind {
    /// Ask the cloud for a new node in the group.
    ScaleUp,
    /// The node booted for a scale-up sent its first report.
    Joined,
    /// A requested node never joined within the provision timeout.
    ProvisionTimeout,
    /// The cloud refused or failed a request.
    HandlerFailed,
    /// Empty and remove a node.
    ScaleDown,
    /// A scale-down saga reached its end: the node is gone.
    Removed,
    /// A maintenance drain (`drain --keep`) reached its end: the node is
    /// empty, inactive and cordoned, and was not removed.
    Drained,
    /// A scale-down saga was aborted; the node is active again.
    Aborted,
    /// Scale-up pressure returned during a drain: the drain stops, the node is re-activated.
    DrainCancelled,
    /// The cloud has no capacity left for this group (quota).
    Exhausted,
    /// The group has capacity again.
    ExhaustionLifted,
    /// Too many nodes are stale: all scaling stopped.
    BreakerOpen,
    /// Enough nodes report again: scaling resumes.
    BreakerClosed,
}

impl DecisionKind {
    /// The wire name, also used in the routing key `decision.<kind>.<district>.<profile>`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::ScaleUp => "scale_up",
            DecisionKind::Joined => "joined",
            DecisionKind::ProvisionTimeout => "provision_timeout",
            DecisionKind::HandlerFailed => "handler_failed",
            DecisionKind::ScaleDown => "scale_down",
            DecisionKind::Removed => "removed",
            DecisionKind::Drained => "drained",
            DecisionKind::Aborted => "aborted",
            DecisionKind::DrainCancelled => "drain_cancelled",
            DecisionKind::Exhausted => "exhausted",
            DecisionKind::ExhaustionLifted => "exhaustion_lifted",
            DecisionKind::BreakerOpen => "breaker_open",
            DecisionKind::BreakerClosed => "breaker_closed",
        }
    }
}

/// `decision`: one decision of the broker agent, published on
/// `decision.<kind>.<district>.<profile>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// What was decided.
    pub decision: DecisionKind,
    /// The node group's district (`_none` for undistricted nodes, `_all` for fleet-wide).
    pub district: String,
    /// The node group's profile (`_all` for fleet-wide).
    pub profile: String,
    /// The operation id this decision belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op: Option<String>,
    /// The node concerned, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Why, in one sentence an operator can read.
    pub reason: String,
    /// The handler that acts on it (`log`, `exec`, `nova`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handler: Option<String>,
    /// The group's figures when the decision was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<GroupStats>,
    /// A dry run (the group's handler is `log`): nothing was done, no
    /// command reached a node; `reason` says what would have happened.
    /// Absent (false) on decisions that act.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dry_run: bool,
    /// The deciding broker agent's leader epoch ([`super::fence`]); absent: 0
    /// (a single agent without high availability). A watcher that sees
    /// decisions of two epochs keeps those of the higher one: the lower
    /// comes from a deposed leader that has not noticed yet.
    #[serde(default, skip_serializing_if = "super::fence::is_zero")]
    pub epoch: u64,
}

/// What one evaluation concluded for a node group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A scale-up was decided.
    ScaleUp,
    /// A scale-down was decided.
    ScaleDown,
    /// A drain was cancelled to meet returning pressure.
    DrainCancelled,
    /// Nothing to do: the group is within its thresholds.
    None,
    /// Something should be done, but a rule holds it back (cooldown, budget, breaker, ...).
    Held,
}

/// One rule's verdict within an explanation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    /// The rule, for example `profile_threshold`, `cooldown_after_scale_up`, `max_nodes`.
    pub rule: String,
    /// Whether the rule allowed the action (`true`) or held it back (`false`).
    pub ok: bool,
    /// What the rule saw, with figures.
    pub detail: String,
}

/// `explain`: one evaluation of one node group, published on `explain.<district>.<profile>`
/// whether or not anything was done.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    /// The group's district.
    pub district: String,
    /// The group's profile.
    pub profile: String,
    /// When the evaluation ran.
    pub evaluated_at: DateTime<Utc>,
    /// What it concluded.
    pub outcome: Outcome,
    /// A one-line summary.
    pub summary: String,
    /// Every rule consulted, in order.
    pub reasons: Vec<Reason>,
    /// The group's figures.
    pub stats: GroupStats,
    /// Operations in flight in the group.
    #[serde(default)]
    pub ops_in_flight: Vec<String>,
}

impl Validate for Decision {
    fn validate(&self) -> Result<(), String> {
        check_name("district", &self.district)?;
        check_name("profile", &self.profile)?;
        check_text("reason", &self.reason)
    }
}

impl Validate for Explanation {
    fn validate(&self) -> Result<(), String> {
        check_name("district", &self.district)?;
        check_name("profile", &self.profile)?;
        check_len("reasons", &self.reasons, 1000)?;
        check_len("ops_in_flight", &self.ops_in_flight, MAX_LIST)?;
        check_text("summary", &self.summary)
    }
}
