//! The steps of a scale-down and how it ends.

use serde::{Deserialize, Serialize};

/// Steps of a scale-down.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum DownStep {
    /// `deactivate-node` asked of OpenShift (`openshift` only).
    DistrictDeactivating,
    /// `cmd.deactivate` sent; waiting for `Deactivated{gears}`.
    Deactivating,
    /// `cmd.inventory` sent; waiting for `Inventory{gears}`.
    Inventorying,
    /// `cmd.evacuate` sent; following progress until `Evacuated`.
    Evacuating,
    /// Waiting for a report that shows the node empty.
    ConfirmingEmpty,
    /// The handler is asked to remove exactly this node. Journaled before the call.
    Removing,
    /// Waiting until the handler says gone or the reports stop.
    ConfirmingGone,
    /// `cmd.activate` sent (abort or drain cancel).
    Reactivating {
        /// A drain cancel (pressure returned) rather than an abort.
        cancel: bool,
    },
    /// `activate-node` asked of OpenShift after an abort or cancel (`openshift` only).
    DistrictActivating {
        /// A drain cancel (pressure returned) rather than an abort.
        cancel: bool,
    },
    /// `remove-node` asked of OpenShift: the node is confirmed empty, the
    /// cloud removal comes next (`openshift` only).
    DistrictRemoving,
    /// Finished; see `end`.
    Done,
}

impl DownStep {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            DownStep::DistrictDeactivating => "deactivating_in_district",
            DownStep::Deactivating => "deactivating",
            DownStep::Inventorying => "inventorying",
            DownStep::Evacuating => "evacuating",
            DownStep::ConfirmingEmpty => "confirming_empty",
            DownStep::Removing => "removing",
            DownStep::ConfirmingGone => "confirming_gone",
            DownStep::Reactivating { cancel: true } => "cancelling",
            DownStep::Reactivating { cancel: false } => "aborting",
            DownStep::DistrictActivating { cancel: true } => "cancelling_in_district",
            DownStep::DistrictActivating { cancel: false } => "aborting_in_district",
            DownStep::DistrictRemoving => "removing_from_district",
            DownStep::Done => "done",
        }
    }

    /// Whether a drain cancel can still bring the node back (nothing was removed).
    pub fn cancellable(&self) -> bool {
        matches!(
            self,
            DownStep::DistrictDeactivating
                | DownStep::Deactivating
                | DownStep::Inventorying
                | DownStep::Evacuating
                | DownStep::ConfirmingEmpty
        )
    }
}

/// How a scale-down ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "snake_case")]
pub enum DownEnd {
    /// Empty and gone.
    Removed,
    /// Aborted; the node is active again.
    Aborted {
        /// Why.
        reason: String,
    },
    /// Pressure returned; the node is active again.
    Cancelled,
    /// A maintenance drain emptied the node; it stays, inactive.
    Kept,
    /// Could not finish nor re-activate: needs an operator.
    Failed {
        /// Why.
        reason: String,
    },
}

impl DownEnd {
    /// Short name.
    pub fn name(&self) -> &'static str {
        match self {
            DownEnd::Removed => "removed",
            DownEnd::Aborted { .. } => "aborted",
            DownEnd::Cancelled => "cancelled",
            DownEnd::Kept => "kept",
            DownEnd::Failed { .. } => "failed",
        }
    }
}
