//! The seed's filters, in order. Each takes the nodes still in the running,
//! returns those it keeps and records the ones it removed with its name.
//!
//! 1. [`profile`]: the requested gear profile.
//! 2. [`region`]: the requested region.
//! 3. [`availability`]: inactive (`inactive`), full (`full`) and, when
//!    districts are in use, undistricted (`undistricted`) nodes.
//! 4. [`zone_required`]: nodes without a region or zone, when zones are required.
//! 5. [`ha_zone`]: zones already used by an HA application.
//! 6. [`scaled_app`]: nodes already used by a scaled application, unless
//!    none would be left (then exactly one is kept).
//! 7. [`moving`]: when a gear moves: not its source, same district, free UIDs
//!    in a new district, not excluded by the operator.

use std::collections::{HashMap, HashSet};

use gearshift_proto::msg::NodeProperties;

use crate::config::{DistrictMode, PlacementConfig};
use crate::engine::Inputs;

/// Filter names as they appear in `FilteredNode::filter` of a reply.
pub mod names {
    /// Filter 1.
    pub const PROFILE: &str = "profile";
    /// Filter 2.
    pub const REGION: &str = "region";
    /// Filter 3, deactivated nodes.
    pub const INACTIVE: &str = "inactive";
    /// Filter 3, nodes without room for an active gear or without free UIDs.
    pub const FULL: &str = "full";
    /// Filter 3, nodes without a district while districts are in use.
    pub const UNDISTRICTED: &str = "undistricted";
    /// Filter 4.
    pub const ZONE_REQUIRED: &str = "zone_required";
    /// Filter 5.
    pub const HA_ZONE: &str = "ha_zone";
    /// Filter 6.
    pub const SCALED_APP: &str = "scaled_app";
    /// Filter 7.
    pub const MOVE: &str = "move";
}

/// The nodes a filter keeps.
pub type Kept<'a> = Vec<&'a NodeProperties>;

/// The nodes the filters removed, each with the name of the filter (in
/// [`names`]). Recorded by reference: the reply's `filtered` list is built
/// from it only when a reply is made.
pub type Removed<'a> = Vec<(&'a NodeProperties, &'static str)>;

fn drop<'a>(removed: &mut Removed<'a>, n: &'a NodeProperties, filter: &'static str) {
    removed.push((n, filter));
}

fn retain<'a>(
    nodes: Kept<'a>,
    removed: &mut Removed<'a>,
    filter: &'static str,
    mut keep: impl FnMut(&NodeProperties) -> bool,
) -> Kept<'a> {
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        if keep(n) {
            out.push(n);
        } else {
            drop(removed, n, filter);
        }
    }
    out
}

/// Runs the seven filters in order.
pub fn apply<'a>(inp: &Inputs<'a>, cfg: &PlacementConfig, removed: &mut Removed<'a>) -> Kept<'a> {
    let nodes: Kept<'a> = inp.nodes.iter().collect();
    let nodes = profile(inp, nodes, removed);
    let nodes = region(inp, nodes, removed);
    let nodes = availability(inp, cfg, nodes, removed);
    let nodes = zone_required(cfg, nodes, removed);
    let nodes = ha_zone(inp, cfg, nodes, removed);
    let nodes = scaled_app(inp, nodes, removed);
    moving(inp, nodes, removed)
}

/// Filter 1: when the request names a profile, only nodes of that profile.
pub fn profile<'a>(inp: &Inputs<'_>, nodes: Kept<'a>, removed: &mut Removed<'a>) -> Kept<'a> {
    match inp.profile {
        None => nodes,
        Some(p) => retain(nodes, removed, names::PROFILE, |n| {
            n.profile.as_deref() == Some(p)
        }),
    }
}

/// Filter 2: when the request names a region, only nodes of that region.
pub fn region<'a>(inp: &Inputs<'_>, nodes: Kept<'a>, removed: &mut Removed<'a>) -> Kept<'a> {
    match inp.region {
        None => nodes,
        Some(r) => retain(nodes, removed, names::REGION, |n| {
            n.region_id.as_deref() == Some(r)
        }),
    }
}

/// Whether a node has no room for one more active gear: its reported active
/// gears reached `max_active_gears`, or (without gear counts) its consumed
/// capacity reached 100 %.
pub fn is_full(n: &NodeProperties) -> bool {
    match (n.gears_active, n.max_active_gears) {
        (Some(a), Some(m)) => a >= m,
        _ => n.node_consumed_capacity >= 100.0,
    }
}

/// Filter 3: deactivated nodes, full nodes (a new gear also needs a free UID
/// in the node's district; a moved gear keeps its UID, see [`moving`]) and,
/// when districts are in use, nodes without a district.
pub fn availability<'a>(
    inp: &Inputs<'_>,
    cfg: &PlacementConfig,
    nodes: Kept<'a>,
    removed: &mut Removed<'a>,
) -> Kept<'a> {
    let drop_undistricted = match cfg.districts {
        DistrictMode::Off => false,
        DistrictMode::Required => true,
        DistrictMode::Auto => nodes.iter().any(|n| n.district_id.is_some()),
    };
    let creating = inp.moving.is_none();
    let mut out = Vec::with_capacity(nodes.len());
    for n in nodes {
        if !n.active {
            drop(removed, n, names::INACTIVE);
        } else if is_full(n) || (creating && n.district_available_capacity == Some(0)) {
            drop(removed, n, names::FULL);
        } else if drop_undistricted && n.district_id.is_none() {
            drop(removed, n, names::UNDISTRICTED);
        } else {
            out.push(n);
        }
    }
    out
}

/// Filter 4: when zones are required, nodes without a region or a zone.
pub fn zone_required<'a>(
    cfg: &PlacementConfig,
    nodes: Kept<'a>,
    removed: &mut Removed<'a>,
) -> Kept<'a> {
    if !cfg.zones_required {
        return nodes;
    }
    retain(nodes, removed, names::ZONE_REQUIRED, |n| {
        n.region_id.is_some() && n.zone_id.is_some()
    })
}

/// Filter 5: for an HA application (with `ha_zone_spreading`), nodes in
/// zones that already hold one of its gears. When every remaining node is in
/// such a zone, the nodes of the zones holding the fewest of its gears are
/// kept, so that the gear still lands as spread out as possible.
pub fn ha_zone<'a>(
    inp: &Inputs<'_>,
    cfg: &PlacementConfig,
    nodes: Kept<'a>,
    removed: &mut Removed<'a>,
) -> Kept<'a> {
    if !inp.app.ha || !cfg.ha_zone_spreading || inp.current_gears.is_empty() {
        return nodes;
    }
    // Gears that do not carry their zone are located by their server.
    let by_name: Option<HashMap<&str, &NodeProperties>> = inp
        .current_gears
        .iter()
        .any(|g| g.zone.is_none())
        .then(|| inp.nodes.iter().map(|n| (n.name.as_str(), n)).collect());
    let mut used: HashMap<&str, usize> = HashMap::new();
    for g in inp.current_gears {
        let zone = g.zone.as_deref().or_else(|| {
            by_name
                .as_ref()
                .and_then(|m| m.get(g.server.as_str()))
                .and_then(|n| n.zone_id.as_deref())
        });
        if let Some(z) = zone {
            *used.entry(z).or_default() += 1;
        }
    }
    if used.is_empty() {
        return nodes;
    }
    let in_used = |n: &NodeProperties| n.zone_id.as_deref().is_some_and(|z| used.contains_key(z));
    if nodes.iter().any(|n| !in_used(n)) {
        return retain(nodes, removed, names::HA_ZONE, |n| !in_used(n));
    }
    let fewest = nodes
        .iter()
        .filter_map(|n| n.zone_id.as_deref().and_then(|z| used.get(z)))
        .min()
        .copied()
        .unwrap_or(0);
    retain(nodes, removed, names::HA_ZONE, |n| {
        n.zone_id.as_deref().and_then(|z| used.get(z)).copied() == Some(fewest)
    })
}

/// Filter 6: for a scaled application, nodes that already hold one of its
/// gears. When that would leave no node, exactly one is kept: the node with
/// the fewest of the application's gears, then the least consumed, then the
/// first.
pub fn scaled_app<'a>(inp: &Inputs<'_>, nodes: Kept<'a>, removed: &mut Removed<'a>) -> Kept<'a> {
    if !inp.app.scalable || inp.current_gears.is_empty() || nodes.is_empty() {
        return nodes;
    }
    let mut count: HashMap<&str, usize> = HashMap::new();
    for g in inp.current_gears {
        *count.entry(g.server.as_str()).or_default() += 1;
    }
    if nodes.iter().any(|n| !count.contains_key(n.name.as_str())) {
        return retain(nodes, removed, names::SCALED_APP, |n| {
            !count.contains_key(n.name.as_str())
        });
    }
    let mut best = 0;
    for (i, n) in nodes.iter().enumerate() {
        let b = nodes[best];
        let key = |x: &NodeProperties| count.get(x.name.as_str()).copied().unwrap_or(0);
        if (key(n), n.node_consumed_capacity) < (key(b), b.node_consumed_capacity) {
            best = i;
        }
    }
    let mut out = Vec::with_capacity(1);
    for (i, n) in nodes.into_iter().enumerate() {
        if i == best {
            out.push(n);
        } else {
            drop(removed, n, names::SCALED_APP);
        }
    }
    out
}

/// Filter 7: when a gear moves, never to its source; only within the
/// required district (a moved gear keeps its UID there); into another
/// district only with free UIDs; never to a node the operator excluded.
pub fn moving<'a>(inp: &Inputs<'_>, nodes: Kept<'a>, removed: &mut Removed<'a>) -> Kept<'a> {
    let Some(m) = inp.moving else {
        return nodes;
    };
    let exclude: HashSet<&str> = m.exclude.iter().map(String::as_str).collect();
    retain(nodes, removed, names::MOVE, |n| {
        if n.name == m.source || exclude.contains(n.name.as_str()) {
            return false;
        }
        match (&m.district, &n.district_id) {
            (Some(want), Some(have)) => want == have,
            (Some(_), None) => false,
            // A gear from no district needs a free UID in the target's district.
            (None, Some(_)) => n.district_available_capacity != Some(0),
            (None, None) => true,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Inputs;
    use gearshift_proto::msg::{
        ApplicationProperties, GearProperties, MoveConstraints, PlacementRequest, UserProperties,
    };

    pub(crate) fn node(name: &str) -> NodeProperties {
        NodeProperties {
            name: name.into(),
            node_consumed_capacity: 10.0,
            district_id: Some("d1".into()),
            district_available_capacity: Some(100),
            region_id: Some("r1".into()),
            zone_id: Some("z1".into()),
            profile: Some("small".into()),
            active: true,
            mem_free_mb: Some(1024),
            gears_active: Some(10),
            max_active_gears: Some(100),
        }
    }

    fn req(nodes: Vec<NodeProperties>) -> PlacementRequest {
        PlacementRequest {
            nodes,
            app: ApplicationProperties {
                id: "a1".into(),
                name: "app".into(),
                ..Default::default()
            },
            current_gears: vec![],
            components: vec![],
            user: UserProperties::default(),
            request_time: chrono::Utc::now(),
            profile: None,
            region: None,
            moving: None,
            strategy: None,
        }
    }

    fn gear(server: &str, zone: Option<&str>) -> GearProperties {
        GearProperties {
            id: format!("g-{server}"),
            server: server.into(),
            zone: zone.map(str::to_string),
            ..Default::default()
        }
    }

    fn run(
        r: &PlacementRequest,
        f: impl for<'a> Fn(&Inputs<'a>, Kept<'a>, &mut Removed<'a>) -> Kept<'a>,
    ) -> (Vec<String>, Vec<(String, String)>) {
        let inp = Inputs::from_request(r);
        let mut removed = vec![];
        let kept = f(&inp, inp.nodes.iter().collect(), &mut removed);
        (
            kept.iter().map(|n| n.name.clone()).collect(),
            removed
                .into_iter()
                .map(|(n, f)| (n.name.clone(), f.to_string()))
                .collect(),
        )
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn profile_filter() {
        let mut b = node("b");
        b.profile = Some("large".into());
        let mut c = node("c");
        c.profile = None;
        let mut r = req(vec![node("a"), b, c]);
        assert_eq!(run(&r, profile).0, s(&["a", "b", "c"]));
        r.profile = Some("small".into());
        let (kept, removed) = run(&r, profile);
        assert_eq!(kept, s(&["a"]));
        assert_eq!(
            removed,
            vec![
                ("b".into(), "profile".into()),
                ("c".into(), "profile".into())
            ]
        );
    }

    #[test]
    fn region_filter() {
        let mut b = node("b");
        b.region_id = Some("r2".into());
        let mut r = req(vec![node("a"), b]);
        assert_eq!(run(&r, region).0, s(&["a", "b"]));
        r.region = Some("r2".into());
        let (kept, removed) = run(&r, region);
        assert_eq!(kept, s(&["b"]));
        assert_eq!(removed, vec![("a".into(), "region".into())]);
    }

    #[test]
    fn availability_filter() {
        let cfg = PlacementConfig::default();
        let mut inactive = node("inactive");
        inactive.active = false;
        let mut full = node("full");
        full.gears_active = Some(100);
        let mut full_pct = node("full-pct");
        full_pct.gears_active = None;
        full_pct.node_consumed_capacity = 100.0;
        let mut no_uids = node("no-uids");
        no_uids.district_available_capacity = Some(0);
        let mut undistricted = node("undistricted");
        undistricted.district_id = None;
        let nodes = vec![
            node("ok"),
            inactive,
            full,
            full_pct,
            no_uids,
            undistricted.clone(),
        ];
        let r = req(nodes.clone());
        let (kept, removed) = run(&r, |i, n, rm| availability(i, &cfg, n, rm));
        assert_eq!(kept, s(&["ok"]));
        assert_eq!(
            removed,
            vec![
                ("inactive".into(), "inactive".into()),
                ("full".into(), "full".into()),
                ("full-pct".into(), "full".into()),
                ("no-uids".into(), "full".into()),
                ("undistricted".into(), "undistricted".into()),
            ]
        );
        // Districts not in use at all: undistricted nodes stay (auto).
        let mut lone = undistricted.clone();
        lone.name = "lone".into();
        let r = req(vec![undistricted.clone(), lone]);
        assert_eq!(
            run(&r, |i, n, rm| availability(i, &cfg, n, rm)).0,
            s(&["undistricted", "lone"])
        );
        let required = PlacementConfig {
            districts: DistrictMode::Required,
            ..Default::default()
        };
        assert!(
            run(&r, |i, n, rm| availability(i, &required, n, rm))
                .0
                .is_empty()
        );
        let off = PlacementConfig {
            districts: DistrictMode::Off,
            ..Default::default()
        };
        let r = req(nodes);
        assert_eq!(
            run(&r, |i, n, rm| availability(i, &off, n, rm)).0,
            s(&["ok", "undistricted"])
        );
        // A moved gear keeps its UID: a district without free UIDs is fine.
        let mut no_uids = node("no-uids");
        no_uids.district_available_capacity = Some(0);
        let mut r = req(vec![no_uids]);
        r.moving = Some(MoveConstraints {
            source: "src".into(),
            district: Some("d1".into()),
            exclude: vec![],
        });
        assert_eq!(
            run(&r, |i, n, rm| availability(i, &cfg, n, rm)).0,
            s(&["no-uids"])
        );
    }

    #[test]
    fn zone_required_filter() {
        let mut no_zone = node("no-zone");
        no_zone.zone_id = None;
        let mut no_region = node("no-region");
        no_region.region_id = None;
        let r = req(vec![node("a"), no_zone, no_region]);
        let off = PlacementConfig::default();
        assert_eq!(run(&r, |_, n, rm| zone_required(&off, n, rm)).0.len(), 3);
        let on = PlacementConfig {
            zones_required: true,
            ..Default::default()
        };
        let (kept, removed) = run(&r, |_, n, rm| zone_required(&on, n, rm));
        assert_eq!(kept, s(&["a"]));
        assert_eq!(
            removed,
            vec![
                ("no-zone".into(), "zone_required".into()),
                ("no-region".into(), "zone_required".into())
            ]
        );
    }

    #[test]
    fn ha_zone_filter() {
        let cfg = PlacementConfig::default();
        let mut nodes = vec![];
        for (name, zone) in [("a1", "za"), ("a2", "za"), ("b1", "zb"), ("c1", "zc")] {
            let mut n = node(name);
            n.zone_id = Some(zone.into());
            nodes.push(n);
        }
        let mut r = req(nodes);
        r.app.ha = true;
        // One gear in zone za (explicit), one on b1 whose zone comes from the node.
        r.current_gears = vec![gear("elsewhere", Some("za")), gear("b1", None)];
        let (kept, removed) = run(&r, |i, n, rm| ha_zone(i, &cfg, n, rm));
        assert_eq!(kept, s(&["c1"]));
        assert_eq!(removed.len(), 3);
        assert!(removed.iter().all(|(_, f)| f == "ha_zone"));
        // Not HA, or spreading off: nothing removed.
        let off = PlacementConfig {
            ha_zone_spreading: false,
            ..Default::default()
        };
        assert_eq!(run(&r, |i, n, rm| ha_zone(i, &off, n, rm)).0.len(), 4);
        r.app.ha = false;
        assert_eq!(run(&r, |i, n, rm| ha_zone(i, &cfg, n, rm)).0.len(), 4);
        // Every zone used: the least used zone is kept.
        r.app.ha = true;
        r.current_gears = vec![
            gear("x", Some("za")),
            gear("y", Some("za")),
            gear("z", Some("zb")),
            gear("w", Some("zc")),
            gear("v", Some("zc")),
        ];
        assert_eq!(run(&r, |i, n, rm| ha_zone(i, &cfg, n, rm)).0, s(&["b1"]));
    }

    #[test]
    fn scaled_app_filter() {
        let mut r = req(vec![node("a"), node("b"), node("c")]);
        r.current_gears = vec![gear("a", None), gear("b", None)];
        // Not scaled: nothing removed.
        assert_eq!(run(&r, scaled_app).0.len(), 3);
        r.app.scalable = true;
        let (kept, removed) = run(&r, scaled_app);
        assert_eq!(kept, s(&["c"]));
        assert_eq!(
            removed,
            vec![
                ("a".into(), "scaled_app".into()),
                ("b".into(), "scaled_app".into())
            ]
        );
        // Every node used: exactly one is returned, the one with the fewest
        // of the app's gears, then the least consumed.
        r.current_gears = vec![
            gear("a", None),
            gear("a", None),
            gear("b", None),
            gear("c", None),
        ];
        r.nodes[1].node_consumed_capacity = 50.0;
        let (kept, removed) = run(&r, scaled_app);
        assert_eq!(kept, s(&["c"]));
        assert_eq!(removed.len(), 2);
    }

    #[test]
    fn move_filter() {
        let mut other = node("other-district");
        other.district_id = Some("d2".into());
        let mut none = node("undistricted");
        none.district_id = None;
        let mut r = req(vec![node("src"), node("a"), node("excluded"), other, none]);
        assert_eq!(run(&r, moving).0.len(), 5);
        r.moving = Some(MoveConstraints {
            source: "src".into(),
            district: Some("d1".into()),
            exclude: vec!["excluded".into()],
        });
        let (kept, removed) = run(&r, moving);
        assert_eq!(kept, s(&["a"]));
        assert_eq!(removed.len(), 4);
        assert!(removed.iter().all(|(_, f)| f == "move"));
        // A gear from no district may go to a district with free UIDs only.
        r.nodes[1].district_available_capacity = Some(0);
        r.moving = Some(MoveConstraints {
            source: "src".into(),
            district: None,
            exclude: vec![],
        });
        assert_eq!(
            run(&r, moving).0,
            s(&["excluded", "other-district", "undistricted"])
        );
    }
}
