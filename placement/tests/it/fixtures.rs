//! Nodes and placement requests for the placement tests (also compiled into
//! the cross-crate test binary by `#[path]`, for `placement_bus`).

use chrono::Utc;
use gearshift_proto::msg::{
    ApplicationProperties, NodeProperties, PlacementRequest, UserProperties,
};

/// An active node of district `d1` (100 free UIDs), region `r1`, zone `z1`,
/// profile `small`, with 1000 MiB free; tests change the fields they need.
pub fn node(name: &str, consumed: f64) -> NodeProperties {
    NodeProperties {
        name: name.into(),
        node_consumed_capacity: consumed,
        district_id: Some("d1".into()),
        district_available_capacity: Some(100),
        region_id: Some("r1".into()),
        zone_id: Some("z1".into()),
        profile: Some("small".into()),
        active: true,
        mem_free_mb: Some(1000),
        gears_active: None,
        max_active_gears: None,
    }
}

/// Application `id` named `name` with web cartridge `cart`.
pub fn app(id: &str, name: &str, cart: &str) -> ApplicationProperties {
    ApplicationProperties {
        id: id.into(),
        name: name.into(),
        web_cartridge: Some(cart.into()),
        ..Default::default()
    }
}

/// A request to place a new gear of `app` among `nodes`, for user
/// `user_id` (`login`), made now, naming no profile, region or strategy.
pub fn request(
    nodes: Vec<NodeProperties>,
    app: ApplicationProperties,
    user_id: &str,
    login: &str,
) -> PlacementRequest {
    PlacementRequest {
        nodes,
        app,
        current_gears: vec![],
        components: vec![],
        user: UserProperties {
            id: user_id.into(),
            login: login.into(),
            ..Default::default()
        },
        request_time: Utc::now(),
        profile: None,
        region: None,
        moving: None,
        strategy: None,
    }
}
