//! `placement.request` / `placement.reply`: where should a new gear go (seed 003).
//!
//! The fields mirror the OpenShift gear-placement plugin's inputs
//! (`server_infos`, `app_props`, `current_gears`, `comp_list`, `user_props`,
//! `request_time`), plus facts gearshift learns from node reports.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{MAX_LIST, Validate, check_len, check_name};

/// A candidate node (`NodeProperties`, extended with reported facts).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeProperties {
    /// The node's identity.
    pub name: String,
    /// Consumed capacity in percent (active gears / max active gears * 100).
    #[serde(default)]
    pub node_consumed_capacity: f64,
    /// District UUID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district_id: Option<String>,
    /// Free UIDs of the node's district.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district_available_capacity: Option<u32>,
    /// Region id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_id: Option<String>,
    /// Zone id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone_id: Option<String>,
    /// Node profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// False when deactivated.
    #[serde(default = "yes")]
    pub active: bool,
    /// Free memory in MiB, from reports (the seed's `memoryfree` fact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_free_mb: Option<u64>,
    /// Active gears, from reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gears_active: Option<u32>,
    /// `max_active_gears`, from reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_gears: Option<u32>,
}

fn yes() -> bool {
    true
}

/// The application the gear belongs to (`ApplicationProperties`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplicationProperties {
    /// Application id.
    pub id: String,
    /// Application name.
    pub name: String,
    /// The web cartridge, for example `php-5.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub web_cartridge: Option<String>,
    /// The application is scaled (gears spread over nodes).
    #[serde(default)]
    pub scalable: bool,
    /// The application is highly available (gears spread over zones).
    #[serde(default)]
    pub ha: bool,
}

/// An existing gear of the application (`GearProperties`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GearProperties {
    /// Gear id.
    pub id: String,
    /// Gear name.
    #[serde(default)]
    pub name: String,
    /// The node the gear is on.
    pub server: String,
    /// The gear's district.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district: Option<String>,
    /// Cartridges on the gear.
    #[serde(default)]
    pub cartridges: Vec<String>,
    /// Region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
}

/// A component of the new gear (`ComponentProperties`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ComponentProperties {
    /// Cartridge name, for example `php-5.4`.
    pub cartridge_name: String,
    /// Component name.
    #[serde(default)]
    pub component_name: String,
    /// Version.
    #[serde(default)]
    pub version: String,
    /// Cartridge vendor, for example `redhat`.
    #[serde(default)]
    pub cartridge_vendor: String,
}

/// The user who owns the application (`UserProperties`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UserProperties {
    /// User id.
    pub id: String,
    /// Login.
    pub login: String,
    /// Gears the user consumes.
    #[serde(default)]
    pub consumed_gears: u32,
    /// Capabilities (free-form, as the broker has them).
    #[serde(default)]
    pub capabilities: serde_json::Value,
    /// Plan id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// Plan state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_state: Option<String>,
}

/// Constraints when the gear is being moved rather than created (filter 7).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveConstraints {
    /// The node the gear moves from (never a candidate).
    pub source: String,
    /// The district the gear must stay in (its UID is kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub district: Option<String>,
    /// Nodes the operator excluded.
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// `placement.request`: the placement plugin's inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlacementRequest {
    /// Candidate nodes (`server_infos`).
    pub nodes: Vec<NodeProperties>,
    /// The application (`app_props`).
    pub app: ApplicationProperties,
    /// The application's existing gears (`current_gears`).
    #[serde(default)]
    pub current_gears: Vec<GearProperties>,
    /// Components of the new gear (`comp_list`).
    #[serde(default)]
    pub components: Vec<ComponentProperties>,
    /// The user (`user_props`).
    pub user: UserProperties,
    /// When the request was made (`request_time`).
    pub request_time: DateTime<Utc>,
    /// Required gear profile, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// Required region, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Set when a gear is moved rather than created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<MoveConstraints>,
    /// Strategy to use instead of the configured one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
}

/// `placement.reply`: exactly one of the candidates, or a refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementReply {
    /// The chosen node; absent when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Why no node was chosen; absent when a node was chosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    /// The strategy that decided.
    pub strategy: String,
    /// Candidates left after the filters.
    pub candidates: u32,
    /// Which filter removed which node, in filter order.
    #[serde(default)]
    pub filtered: Vec<FilteredNode>,
}

/// A candidate a filter removed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilteredNode {
    /// The node.
    pub node: String,
    /// The filter (`profile`, `region`, `full`, `inactive`, `undistricted`, `zone_required`, `ha_zone`, `scaled_app`, `move`).
    pub filter: String,
}

impl Validate for PlacementRequest {
    fn validate(&self) -> Result<(), String> {
        check_len("nodes", &self.nodes, MAX_LIST)?;
        for n in &self.nodes {
            check_name("nodes[].name", &n.name)?;
        }
        check_len("current_gears", &self.current_gears, MAX_LIST)?;
        check_len("components", &self.components, 1000)?;
        Ok(())
    }
}

impl Validate for PlacementReply {
    fn validate(&self) -> Result<(), String> {
        match (&self.node, &self.refused) {
            (Some(_), None) | (None, Some(_)) => Ok(()),
            _ => Err("exactly one of node and refused must be present".into()),
        }
    }
}
