//! Properties over random fleets: a reply names exactly one node that the
//! filters kept (or refuses), every node is either a candidate or filtered
//! once, and an evacuation plan never overfills a target or leaves the
//! district.

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use gearshift_placement::{Engine, EvacuationRequest, PlacementConfig, PlanError, StrategyName};
use gearshift_proto::msg::{
    ApplicationProperties, GearInfo, GearProperties, GearState, MoveConstraints, NodeProperties,
    PlacementRequest, UserProperties,
};
use proptest::prelude::*;

fn arb_node(i: usize) -> impl Strategy<Value = NodeProperties> {
    (
        prop::option::of(0u8..3),
        prop::option::of(0u8..2),
        prop::option::of(0u8..3),
        prop::option::of(0u8..2),
        any::<bool>(),
        prop::option::of(0u32..3),
        0u32..12,
        prop::option::of(1u32..12),
        prop::option::of(0u64..9000),
    )
        .prop_map(
            move |(district, region, zone, profile, inactive, uids, active, max, mem)| {
                NodeProperties {
                    name: format!("n{i}"),
                    node_consumed_capacity: match max {
                        Some(m) => f64::from(active) * 100.0 / f64::from(m),
                        None => f64::from(active * 9),
                    },
                    district_id: district.map(|d| format!("d{d}")),
                    district_available_capacity: uids,
                    region_id: region.map(|r| format!("r{r}")),
                    zone_id: zone.map(|z| format!("z{z}")),
                    profile: profile.map(|p| ["small", "large"][p as usize].to_string()),
                    active: !inactive,
                    mem_free_mb: mem,
                    gears_active: max.map(|_| active),
                    max_active_gears: max,
                }
            },
        )
}

fn arb_fleet() -> impl Strategy<Value = Vec<NodeProperties>> {
    (0usize..25).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>())
}

fn arb_strategy() -> impl Strategy<Value = StrategyName> {
    prop::sample::select(vec![
        StrategyName::Default,
        StrategyName::LeastConsumed,
        StrategyName::MostFreeMemory,
        StrategyName::First,
        StrategyName::PhpHosts,
        StrategyName::PinnedUser,
        StrategyName::VendorBlacklist,
    ])
}

fn engine(strategy: StrategyName, zones_required: bool, seed: u64) -> Engine {
    Engine::new(&PlacementConfig {
        strategy,
        seed: Some(seed),
        zones_required,
        php_hosts: vec!["n1".into(), "n3".into()],
        pinned_user: Some("pinned".into()),
        slow_hosts: vec!["n2".into()],
        blacklisted_vendor: Some("shady".into()),
        ..Default::default()
    })
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn a_reply_is_one_kept_candidate_or_a_refusal(
        nodes in arb_fleet(),
        strategy in arb_strategy(),
        zones_required in any::<bool>(),
        seed in any::<u64>(),
        scalable in any::<bool>(),
        ha in any::<bool>(),
        on in prop::collection::vec(0usize..25, 0..4),
        profile in prop::option::of(prop::sample::select(vec!["small", "large"])),
        moving in any::<bool>(),
        login in prop::sample::select(vec!["pinned", "other"]),
        cart in prop::sample::select(vec!["php-5.4", "ruby-1.9"]),
    ) {
        let e = engine(strategy, zones_required, seed);
        let req = PlacementRequest {
            current_gears: on
                .iter()
                .map(|i| GearProperties {
                    id: format!("g{i}"),
                    server: format!("n{i}"),
                    ..Default::default()
                })
                .collect(),
            nodes: nodes.clone(),
            app: ApplicationProperties {
                id: "a".into(),
                name: "a".into(),
                web_cartridge: Some(cart.into()),
                scalable,
                ha,
            },
            components: vec![],
            user: UserProperties { id: "u".into(), login: login.into(), ..Default::default() },
            request_time: Utc::now(),
            profile: profile.map(str::to_string),
            region: None,
            moving: moving.then(|| MoveConstraints {
                source: "n0".into(),
                district: Some("d1".into()),
                exclude: vec!["n4".into()],
            }),
            strategy: None,
        };
        let r = e.place(&req);
        prop_assert!(r.node.is_some() != r.refused.is_some(), "{r:?}");
        // Every node is either a candidate or filtered exactly once.
        let filtered: HashSet<&str> = r.filtered.iter().map(|f| f.node.as_str()).collect();
        prop_assert_eq!(filtered.len(), r.filtered.len());
        prop_assert_eq!(r.filtered.len() + r.candidates as usize, nodes.len());
        if let Some(n) = &r.node {
            prop_assert!(!filtered.contains(n.as_str()));
            let chosen = nodes.iter().find(|x| &x.name == n).unwrap();
            prop_assert!(chosen.active);
            if let Some(p) = &req.profile {
                prop_assert_eq!(chosen.profile.as_ref(), Some(p));
            }
            if let Some(m) = &req.moving {
                prop_assert_ne!(&chosen.name, &m.source);
                prop_assert_eq!(chosen.district_id.as_deref(), Some("d1"));
            }
            if zones_required {
                prop_assert!(chosen.zone_id.is_some() && chosen.region_id.is_some());
            }
        }
    }

    #[test]
    fn a_plan_never_overfills_or_leaves_the_district(
        nodes in arb_fleet(),
        strategy in arb_strategy(),
        seed in any::<u64>(),
        gears in 0usize..30,
        apps in 1usize..5,
    ) {
        let e = engine(strategy, false, seed);
        let req = EvacuationRequest {
            victim: "n0".into(),
            district: Some("d1".into()),
            gears: (0..gears)
                .map(|i| GearInfo {
                    id: format!("g{i}"),
                    app: Some(format!("app{}", i % apps)),
                    state: GearState::Started,
                    uid: None,
                    bytes: None,
                    do_not_disrupt: false,
                })
                .collect(),
            candidates: nodes.clone(),
            now: Utc::now(),
        };
        let by_name: HashMap<&str, &NodeProperties> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        match e.plan_evacuation(&req) {
            Ok(moves) => {
                prop_assert_eq!(moves.len(), gears);
                let mut added: HashMap<&str, u32> = HashMap::new();
                for m in &moves {
                    let t = by_name[m.target.as_str()];
                    prop_assert_ne!(t.name.as_str(), "n0");
                    prop_assert!(t.active);
                    prop_assert_eq!(t.district_id.as_deref(), Some("d1"));
                    *added.entry(t.name.as_str()).or_default() += 1;
                }
                for (name, k) in added {
                    let t = by_name[name];
                    prop_assert!(t.gears_active.unwrap() + k <= t.max_active_gears.unwrap());
                }
            }
            Err(PlanError::NoTarget { gear, .. }) => {
                // Only when the district's room is really smaller than the gears
                // or the strategy refused (pinned/php hosts never refuse here).
                let room: u32 = nodes
                    .iter()
                    .filter(|n| n.name != "n0" && n.active && n.district_id.as_deref() == Some("d1"))
                    .filter_map(|n| Some(n.max_active_gears?.saturating_sub(n.gears_active?)))
                    .sum();
                prop_assert!((room as usize) < gears, "gear {} refused with room {}", gear, room);
            }
            Err(other) => prop_assert!(false, "unexpected {}", other),
        }
    }
}
