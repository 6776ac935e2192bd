//! The evacuation planner of the scale-down saga: a target for every gear of
//! the victim, chosen by the same filters and strategy as [`Engine::place`].
//!
//! Each gear is placed as a move (filter 7): never onto the victim, only
//! within the victim's district, onto an active node with room. Room is
//! `max_active_gears - gears_active` as reported, minus the gears this plan
//! already sent there; every gear counts, idle and stopped ones included,
//! because an idle gear wakes up on its next request. Candidates whose report
//! lacks gear counts have unknown room and are not used. Gears of one
//! application are spread like a scaled application's (filter 6).

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{
    ApplicationProperties, GearInfo, GearProperties, MAX_LIST, MAX_MOVES, MAX_NAME, Move,
    MoveConstraints, NodeProperties, UserProperties,
};
use serde::{Deserialize, Serialize};

use crate::engine::{Engine, Inputs};
use crate::error::PlanError;

/// What the planner needs to empty one node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvacuationRequest {
    /// The node being emptied.
    pub victim: String,
    /// The victim's district; every gear stays in it. `None` for an
    /// undistricted victim (targets in a district then need free UIDs).
    pub district: Option<String>,
    /// The victim's gears, each moved exactly once.
    pub gears: Vec<GearInfo>,
    /// The fleet's nodes as the broker agent knows them (the victim may be
    /// among them; it is never a target).
    pub candidates: Vec<NodeProperties>,
    /// The planning time (handed to scripts and commands as `request_time`).
    pub now: DateTime<Utc>,
}

fn check(req: &EvacuationRequest) -> Result<(), PlanError> {
    let name_ok =
        |s: &str| !s.is_empty() && s.len() <= MAX_NAME && !s.chars().any(char::is_control);
    if !name_ok(&req.victim) {
        return Err(PlanError::Invalid(format!(
            "victim must be 1..={MAX_NAME} bytes without control characters"
        )));
    }
    if req.gears.len() > MAX_MOVES {
        return Err(PlanError::Invalid(format!(
            "{} gears (limit {MAX_MOVES})",
            req.gears.len()
        )));
    }
    if req.candidates.len() > MAX_LIST {
        return Err(PlanError::Invalid(format!(
            "{} candidates (limit {MAX_LIST})",
            req.candidates.len()
        )));
    }
    let mut seen = HashSet::with_capacity(req.gears.len());
    for g in &req.gears {
        if !name_ok(&g.id) {
            return Err(PlanError::Invalid(format!(
                "gear id must be 1..={MAX_NAME} bytes without control characters"
            )));
        }
        if !seen.insert(g.id.as_str()) {
            return Err(PlanError::DuplicateGear { gear: g.id.clone() });
        }
        if g.do_not_disrupt {
            return Err(PlanError::OptedOut { gear: g.id.clone() });
        }
    }
    Ok(())
}

impl Engine {
    /// Plans a target for every gear of `req.victim`, or fails naming the
    /// first gear that does not fit (the saga then aborts). The plan is all
    /// or nothing: on error no move is returned.
    pub fn plan_evacuation(&self, req: &EvacuationRequest) -> Result<Vec<Move>, PlanError> {
        check(req)?;
        let district_name = req
            .district
            .clone()
            .unwrap_or_else(|| "(no district)".to_string());
        // Working copies whose gear counts grow as the plan assigns gears.
        // The victim is never a target: it leaves the working set up front.
        // Filter 6 runs before filter 7 (the seed's order), so a victim kept
        // as a scaled application's only unused node would otherwise be
        // dropped by the move filter afterwards and refuse a gear that fits
        // elsewhere.
        let target = |n: &&NodeProperties| {
            n.name != req.victim && (req.district.is_none() || n.district_id == req.district)
        };
        let unknown_room = req
            .candidates
            .iter()
            .filter(target)
            .filter(|n| n.gears_active.is_none() || n.max_active_gears.is_none())
            .count();
        // Nodes of other districts would all fall to the move filter: leave
        // them out of the working set up front, which keeps a plan over a
        // large fleet proportional to the district, not the fleet.
        let mut nodes: Vec<NodeProperties> = req
            .candidates
            .iter()
            .filter(target)
            .filter(|n| n.gears_active.is_some() && n.max_active_gears.is_some())
            .cloned()
            .collect();
        let mut per_app: HashMap<&str, usize> = HashMap::new();
        for g in &req.gears {
            *per_app
                .entry(g.app.as_deref().unwrap_or(&g.id))
                .or_default() += 1;
        }
        // Where this plan already sent each application's gears.
        let mut placed: HashMap<&str, Vec<GearProperties>> = HashMap::new();
        let moving = MoveConstraints {
            source: req.victim.clone(),
            district: req.district.clone(),
            exclude: vec![],
        };
        let user = UserProperties::default();
        let strategy = self.cfg().strategy;
        let mut moves = Vec::with_capacity(req.gears.len());
        for g in &req.gears {
            let app_id = g.app.as_deref().unwrap_or(&g.id);
            let app = ApplicationProperties {
                id: app_id.to_string(),
                name: app_id.to_string(),
                web_cartridge: None,
                scalable: per_app.get(app_id).copied().unwrap_or(0) > 1,
                ha: false,
            };
            let current = placed.get(app_id).map(Vec::as_slice).unwrap_or(&[]);
            let inp = Inputs {
                nodes: &nodes,
                app: &app,
                current_gears: current,
                components: &[],
                user: &user,
                request_time: req.now,
                profile: None,
                region: None,
                moving: Some(&moving),
            };
            let d = self.decide(&inp, strategy);
            let i = match d.chosen {
                Ok(i) => i,
                Err(reason) => {
                    let reason = if unknown_room > 0 && d.candidates == 0 {
                        format!(
                            "{reason}; {unknown_room} candidates without reported gear counts were not considered"
                        )
                    } else {
                        reason
                    };
                    return Err(PlanError::NoTarget {
                        gear: g.id.clone(),
                        district: district_name,
                        reason,
                    });
                }
            };
            let target = &mut nodes[i];
            let active = target.gears_active.unwrap_or(0).saturating_add(1);
            target.gears_active = Some(active);
            if let Some(max) = target.max_active_gears.filter(|&m| m > 0) {
                target.node_consumed_capacity = f64::from(active) * 100.0 / f64::from(max);
            }
            placed.entry(app_id).or_default().push(GearProperties {
                id: g.id.clone(),
                name: g.id.clone(),
                server: target.name.clone(),
                district: target.district_id.clone(),
                cartridges: vec![],
                region: target.region_id.clone(),
                zone: target.zone_id.clone(),
            });
            moves.push(Move {
                gear: g.id.clone(),
                target: target.name.clone(),
            });
        }
        Ok(moves)
    }
}
