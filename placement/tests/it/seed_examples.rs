//! Seed 003's example algorithms, each reproducing its documented behaviour,
//! plus the engine's handling of strategies named by requests.

use std::collections::HashSet;

use gearshift_placement::strategy::{PHP_HOSTS_NO_MATCH, SLOW_HOSTS_NO_MATCH};
use gearshift_placement::{Engine, PlacementConfig, StrategyName};
use gearshift_proto::msg::{ComponentProperties, NodeProperties, PlacementReply, PlacementRequest};

use crate::fixtures;

fn node(name: &str, consumed: f64) -> NodeProperties {
    NodeProperties {
        district_available_capacity: Some(5000),
        region_id: None,
        zone_id: None,
        mem_free_mb: Some(2048),
        ..fixtures::node(name, consumed)
    }
}

fn request(nodes: Vec<NodeProperties>) -> PlacementRequest {
    PlacementRequest {
        components: vec![ComponentProperties {
            cartridge_name: "ruby-1.9".into(),
            component_name: "ruby-1.9".into(),
            version: "1.9".into(),
            cartridge_vendor: "redhat".into(),
        }],
        ..fixtures::request(
            nodes,
            fixtures::app("app-1", "blog", "ruby-1.9"),
            "u1",
            "alice",
        )
    }
}

fn engine(cfg: PlacementConfig) -> Engine {
    Engine::new(&PlacementConfig {
        seed: Some(42),
        ..cfg
    })
    .unwrap()
}

fn chosen(r: &PlacementReply) -> &str {
    assert!(r.refused.is_none(), "refused: {r:?}");
    r.node.as_deref().unwrap()
}

/// Names chosen over many placements of the same request.
fn draws(e: &Engine, req: &PlacementRequest, n: usize) -> HashSet<String> {
    (0..n).map(|_| chosen(&e.place(req)).to_string()).collect()
}

fn set(v: &[&str]) -> HashSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

#[test]
fn first_returns_the_first_candidate_after_the_filters() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::First,
        ..Default::default()
    });
    let mut inactive = node("n0", 0.0);
    inactive.active = false;
    let req = request(vec![inactive, node("n1", 90.0), node("n2", 5.0)]);
    let r = e.place(&req);
    assert_eq!(chosen(&r), "n1");
    assert_eq!(r.strategy, "first");
    assert_eq!(r.candidates, 2);
    assert_eq!(r.filtered.len(), 1);
    assert_eq!(
        (r.filtered[0].node.as_str(), r.filtered[0].filter.as_str()),
        ("n0", "inactive")
    );
}

#[test]
fn php_hosts_pins_php_apps_and_places_others_normally() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::PhpHosts,
        php_hosts: vec!["n2".into(), "n4".into(), "gone".into()],
        ..Default::default()
    });
    let nodes: Vec<NodeProperties> = (1..=5).map(|i| node(&format!("n{i}"), 10.0)).collect();
    let mut php = request(nodes.clone());
    for cart in ["php-5.3", "php-5.4"] {
        php.app.web_cartridge = Some(cart.into());
        // "chooses randomly from the matched hosts": both, and only them.
        assert_eq!(draws(&e, &php, 200), set(&["n2", "n4"]));
    }
    // Not a PHP app: "selecting a node normally", any node may be chosen.
    let ruby = request(nodes.clone());
    assert_eq!(draws(&e, &ruby, 400), set(&["n1", "n2", "n3", "n4", "n5"]));
    // PHP app but none of PHP_HOSTS is a candidate: the seed's error.
    let mut php = request(vec![node("n1", 0.0), node("n3", 0.0)]);
    php.app.web_cartridge = Some("php-5.4".into());
    let r = e.place(&php);
    assert_eq!(r.node, None);
    assert_eq!(r.refused.as_deref(), Some(PHP_HOSTS_NO_MATCH));
    assert_eq!(r.strategy, "php-hosts");
}

#[test]
fn pinned_user_goes_to_the_first_slow_host_and_others_normally() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::PinnedUser,
        pinned_user: Some("slowpoke".into()),
        slow_hosts: vec!["slow-2".into(), "slow-1".into()],
        ..Default::default()
    });
    let nodes = vec![
        node("fast-1", 0.0),
        node("slow-1", 80.0),
        node("fast-2", 0.0),
        node("slow-2", 10.0),
    ];
    let mut req = request(nodes.clone());
    req.user.login = "slowpoke".into();
    // "return matched_server_infos.first": candidates' order, not the setting's.
    for _ in 0..20 {
        assert_eq!(chosen(&e.place(&req)), "slow-1");
    }
    // Another user: chosen normally (the default drops above-average nodes).
    let other = request(nodes);
    assert_eq!(draws(&e, &other, 200), set(&["fast-1", "fast-2", "slow-2"]));
    // Slow hosts all filtered out: the seed's error.
    let mut req = request(vec![node("fast-1", 0.0)]);
    req.user.login = "slowpoke".into();
    assert_eq!(e.place(&req).refused.as_deref(), Some(SLOW_HOSTS_NO_MATCH));
}

#[test]
fn vendor_blacklist_refuses_the_vendor_and_places_others() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::VendorBlacklist,
        blacklisted_vendor: Some("shadyvendor".into()),
        ..Default::default()
    });
    let mut req = request(vec![node("n1", 0.0), node("n2", 0.0)]);
    let r = e.place(&req);
    assert!(["n1", "n2"].contains(&chosen(&r)));
    req.components.push(ComponentProperties {
        cartridge_name: "shady-db".into(),
        component_name: "shady-db".into(),
        version: "1".into(),
        cartridge_vendor: "shadyvendor".into(),
    });
    let r = e.place(&req);
    assert_eq!(r.node, None);
    assert_eq!(
        r.refused.as_deref(),
        Some("Applications containing cartridges from shadyvendor are blacklisted")
    );
}

#[test]
fn most_free_memory_takes_the_largest_memoryfree() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::MostFreeMemory,
        ..Default::default()
    });
    let mut nodes = vec![
        node("a", 10.0),
        node("b", 90.0),
        node("c", 50.0),
        node("d", 0.0),
    ];
    nodes[0].mem_free_mb = Some(512);
    nodes[1].mem_free_mb = Some(8192);
    nodes[2].mem_free_mb = Some(4096);
    nodes[3].mem_free_mb = None; // unknown counts as 0, as Hash.new(0) does
    assert_eq!(chosen(&e.place(&request(nodes.clone()))), "b");
    // The richest node filtered out (inactive): the next one.
    nodes[1].active = false;
    assert_eq!(chosen(&e.place(&request(nodes))), "c");
}

#[test]
fn least_consumed_sorts_by_node_consumed_capacity() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::LeastConsumed,
        ..Default::default()
    });
    let nodes = vec![
        node("a", 55.5),
        node("b", 12.25),
        node("c", 12.5),
        node("d", 99.0),
    ];
    assert_eq!(chosen(&e.place(&request(nodes.clone()))), "b");
    // Filling evenly: placing and updating the consumed capacity rotates.
    let mut nodes = vec![node("a", 10.0), node("b", 10.0), node("c", 10.0)];
    let mut order = vec![];
    for _ in 0..6 {
        let name = chosen(&e.place(&request(nodes.clone()))).to_string();
        let n = nodes.iter_mut().find(|n| n.name == name).unwrap();
        n.node_consumed_capacity += 1.0;
        order.push(name);
    }
    assert_eq!(order, ["a", "b", "c", "a", "b", "c"]);
}

#[test]
fn default_is_seedable_and_never_takes_a_node_above_average() {
    let nodes = vec![
        node("busy", 95.0),
        node("a", 20.0),
        node("b", 30.0),
        node("c", 40.0),
    ];
    let req = request(nodes);
    let seq = |seed| {
        let e = Engine::new(&PlacementConfig {
            seed: Some(seed),
            ..Default::default()
        })
        .unwrap();
        (0..30)
            .map(|_| chosen(&e.place(&req)).to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(seq(7), seq(7));
    assert!(!seq(7).contains(&"busy".to_string()));
}

#[test]
fn empty_candidates_and_everything_filtered_are_refusals() {
    let e = engine(PlacementConfig::default());
    let r = e.place(&request(vec![]));
    assert_eq!(
        r.refused.as_deref(),
        Some("no candidate nodes in the request")
    );
    let mut a = node("a", 100.0);
    a.gears_active = Some(50);
    a.max_active_gears = Some(50);
    let mut b = node("b", 0.0);
    b.active = false;
    let r = e.place(&request(vec![a, b]));
    assert_eq!(r.node, None);
    let why = r.refused.unwrap();
    assert!(
        why.contains("1 full") && why.contains("1 inactive"),
        "{why}"
    );
    assert_eq!(r.filtered.len(), 2);
}

#[test]
fn requests_may_name_a_configured_strategy_only() {
    let e = engine(PlacementConfig {
        strategy: StrategyName::LeastConsumed,
        ..Default::default()
    });
    let mut req = request(vec![node("a", 50.0), node("b", 10.0)]);
    req.strategy = Some("first".into());
    let r = e.place(&req);
    assert_eq!((chosen(&r), r.strategy.as_str()), ("a", "first"));
    req.strategy = Some("teleport".into());
    assert!(e.place(&req).refused.unwrap().contains("unknown strategy"));
    req.strategy = Some("script".into());
    assert!(e.place(&req).refused.unwrap().contains("not configured"));
    req.strategy = Some("php-hosts".into());
    assert!(e.place(&req).refused.unwrap().contains("php_hosts"));

    let strict = engine(PlacementConfig {
        strategy: StrategyName::LeastConsumed,
        allow_request_strategy: false,
        ..Default::default()
    });
    req.strategy = Some("first".into());
    assert!(
        strict
            .place(&req)
            .refused
            .unwrap()
            .contains("allow_request_strategy")
    );
    req.strategy = Some("least-consumed".into());
    assert_eq!(chosen(&strict.place(&req)), "b");
}
