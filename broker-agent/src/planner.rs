//! The evacuation planner interface: where each gear of a draining node goes.
//!
//! The broker agent plans through `gearshift_placement` (see
//! [`PlacementPlanner`]); the interface lets the pure core stay free of the
//! placement engine's configuration and lets tests substitute a planner.

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{GearInfo, Move, NodeProperties};

/// What the planner is asked.
#[derive(Debug, Clone)]
pub struct PlanInput<'a> {
    /// The node being emptied.
    pub victim: &'a str,
    /// Its district (gears stay in it).
    pub district: Option<&'a str>,
    /// The victim's gears (from its inventory).
    pub gears: &'a [GearInfo],
    /// Active nodes of the same district with room.
    pub candidates: Vec<NodeProperties>,
    /// Now.
    pub now: DateTime<Utc>,
}

/// Plans the moves of an evacuation.
pub trait EvacuationPlanner: Send + Sync {
    /// One move per gear, or why no plan exists (for example: no room).
    fn plan(&self, input: &PlanInput<'_>) -> Result<Vec<Move>, String>;
}

/// The placement engine (`gearshift_placement`) as the evacuation planner.
#[derive(Clone)]
pub struct PlacementPlanner {
    engine: gearshift_placement::Engine,
}

impl PlacementPlanner {
    /// Wraps an engine.
    pub fn new(engine: gearshift_placement::Engine) -> Self {
        PlacementPlanner { engine }
    }
}

impl std::fmt::Debug for PlacementPlanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlacementPlanner").finish_non_exhaustive()
    }
}

impl EvacuationPlanner for PlacementPlanner {
    fn plan(&self, input: &PlanInput<'_>) -> Result<Vec<Move>, String> {
        let req = gearshift_placement::EvacuationRequest {
            victim: input.victim.to_string(),
            district: input.district.map(str::to_string),
            gears: input.gears.to_vec(),
            candidates: input.candidates.clone(),
            now: input.now,
        };
        self.engine.plan_evacuation(&req).map_err(|e| e.to_string())
    }
}
