//! Placement decisions per second on a 10,000-node fleet, for each built-in
//! strategy, an operator script and command, and the evacuation planner.
//!
//! ```text
//! cargo run --release -p gearshift-placement --example placement_bench
//! cargo run --release -p gearshift-placement --example placement_bench -- --nodes 2000 --secs 0.5
//! ```
//!
//! Prints figures only; nothing is asserted.

use std::time::{Duration, Instant};

use chrono::Utc;
use gearshift_placement::{
    CommandConfig, Engine, EvacuationRequest, PlacementConfig, ScriptConfig, StrategyName,
};
use gearshift_proto::msg::{
    ApplicationProperties, ComponentProperties, GearInfo, GearState, NodeProperties,
    PlacementRequest, UserProperties,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DISTRICT_SIZE: usize = 50;

fn fleet(n: usize, rng: &mut StdRng) -> Vec<NodeProperties> {
    (0..n)
        .map(|i| {
            let district = i / DISTRICT_SIZE;
            let max = 100u32;
            let active = if i % 33 == 0 {
                max // about 3 % full
            } else {
                rng.random_range(0..90)
            };
            NodeProperties {
                name: format!("node-{i:05}.example.com"),
                node_consumed_capacity: f64::from(active) * 100.0 / f64::from(max),
                district_id: Some(format!("district-{district:03}")),
                district_available_capacity: Some(rng.random_range(0..6000)),
                region_id: Some(format!("region-{}", district % 2)),
                zone_id: Some(format!("zone-{}", i % 3)),
                profile: Some(if district % 2 == 0 { "small" } else { "medium" }.into()),
                active: i % 50 != 7, // 2 % deactivated
                mem_free_mb: Some(rng.random_range(256..16384)),
                gears_active: Some(active),
                max_active_gears: Some(max),
            }
        })
        .collect()
}

fn request(nodes: Vec<NodeProperties>) -> PlacementRequest {
    PlacementRequest {
        nodes,
        app: ApplicationProperties {
            id: "app-1".into(),
            name: "shop".into(),
            web_cartridge: Some("php-5.4".into()),
            scalable: true,
            ha: false,
        },
        current_gears: vec![],
        components: vec![ComponentProperties {
            cartridge_name: "php-5.4".into(),
            component_name: "php-5.4".into(),
            version: "5.4".into(),
            cartridge_vendor: "redhat".into(),
        }],
        user: UserProperties {
            id: "u1".into(),
            login: "slowpoke".into(),
            ..Default::default()
        },
        request_time: Utc::now(),
        profile: Some("small".into()),
        region: None,
        moving: None,
        strategy: None,
    }
}

/// Runs `f` for about `secs` (at least `min` times); returns calls per second.
fn rate(secs: f64, min: usize, mut f: impl FnMut()) -> (f64, usize) {
    let budget = Duration::from_secs_f64(secs);
    let t = Instant::now();
    let mut n = 0;
    while n < min || t.elapsed() < budget {
        f();
        n += 1;
    }
    (n as f64 / t.elapsed().as_secs_f64(), n)
}

fn arg<T: std::str::FromStr>(name: &str, default: T) -> T {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let n_nodes: usize = arg("--nodes", 10_000);
    let secs: f64 = arg("--secs", 2.0);
    let evac_gears: usize = arg("--gears", 200);
    let mut rng = StdRng::seed_from_u64(2026);
    let nodes = fleet(n_nodes, &mut rng);
    let req = request(nodes.clone());
    let hosts: Vec<String> = nodes.iter().step_by(97).map(|n| n.name.clone()).collect();

    let base = PlacementConfig {
        seed: Some(1),
        php_hosts: hosts.clone(),
        pinned_user: Some("slowpoke".into()),
        slow_hosts: hosts,
        blacklisted_vendor: Some("shadyvendor".into()),
        ..Default::default()
    };
    println!(
        "placement_bench: {n_nodes} nodes ({} districts of {DISTRICT_SIZE}, 2 profiles, 3 zones), \
         request for profile \"small\"; {} cores",
        n_nodes.div_ceil(DISTRICT_SIZE),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    println!(
        "{:<20} {:>14} {:>14} {:>11}  chosen",
        "strategy", "decisions/s", "us/decision", "candidates"
    );
    let mut rows: Vec<(String, Engine, f64, usize)> = StrategyName::ALL
        .iter()
        .filter(|s| !matches!(s, StrategyName::Script | StrategyName::Command))
        .map(|&s| {
            (
                s.to_string(),
                Engine::new(&PlacementConfig {
                    strategy: s,
                    ..base.clone()
                })
                .expect("config"),
                secs,
                20,
            )
        })
        .collect();
    let script = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            inline: Some(
                r#"fn place(input) {
                    let best = ();
                    for n in input.nodes {
                        if best == () || n.node_consumed_capacity < best.node_consumed_capacity { best = n; }
                    }
                    best.name
                }"#
                .into(),
            ),
            max_operations: 100_000_000,
            timeout: Duration::from_secs(60),
            ..Default::default()
        },
        ..base.clone()
    })
    .expect("script config");
    rows.push(("script (rhai)".into(), script, secs, 3));
    let command = Engine::new(&PlacementConfig {
        strategy: StrategyName::Command,
        command: CommandConfig {
            program: Some("/bin/sh".into()),
            args: vec![
                "-c".into(),
                "cat >/dev/null; echo node-00001.example.com".into(),
            ],
            timeout: Duration::from_secs(60),
            max_output_bytes: 4096,
            ..Default::default()
        },
        ..base.clone()
    })
    .expect("command config");
    rows.push(("command (sh)".into(), command, secs, 3));

    for (name, engine, secs, min) in rows {
        let mut last = None;
        let (per_sec, _) = rate(secs, min, || {
            last = Some(engine.place(&req));
        });
        let last = last.expect("ran once");
        println!(
            "{:<20} {:>14.0} {:>14.1} {:>11}  {}",
            name,
            per_sec,
            1e6 / per_sec,
            last.candidates,
            last.node
                .as_deref()
                .or(last.refused.as_deref())
                .unwrap_or("-")
        );
    }

    // Evacuation: empty one node of district 0 into the rest of its district,
    // the whole fleet given as candidates.
    let victim = nodes[1].name.clone();
    let mut candidates = nodes.clone();
    for n in candidates.iter_mut().take(DISTRICT_SIZE) {
        // Make room: the district can absorb the victim's gears.
        n.gears_active = Some(20);
        n.node_consumed_capacity = 20.0;
        n.active = true;
    }
    let gears: Vec<GearInfo> = (0..evac_gears)
        .map(|i| GearInfo {
            id: format!("gear-{i:05}"),
            app: Some(format!("app-{}", i / 4)),
            state: if i % 5 == 0 {
                GearState::Idle
            } else {
                GearState::Started
            },
            uid: Some(1000 + i as u32),
            bytes: None,
            do_not_disrupt: false,
        })
        .collect();
    let evac = EvacuationRequest {
        victim,
        district: nodes[1].district_id.clone(),
        gears,
        candidates,
        now: Utc::now(),
    };
    println!();
    println!(
        "{:<20} {:>14} {:>14} {:>11}",
        "evacuation planner", "plans/s", "gears/s", "gears/plan"
    );
    for s in [
        StrategyName::Default,
        StrategyName::LeastConsumed,
        StrategyName::First,
    ] {
        let engine = Engine::new(&PlacementConfig {
            strategy: s,
            ..base.clone()
        })
        .expect("config");
        let (per_sec, _) = rate(secs, 3, || {
            let plan = engine
                .plan_evacuation(&evac)
                .expect("the district has room");
            assert_eq!(plan.len(), evac.gears.len());
        });
        println!(
            "{:<20} {:>14.1} {:>14.0} {:>11}",
            s.to_string(),
            per_sec,
            per_sec * evac.gears.len() as f64,
            evac.gears.len()
        );
    }
}
