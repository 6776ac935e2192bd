//! The operator strategies shipped in `examples/strategies/` load and do what
//! their comments say, and `gearshift-broker place` (run_place) asks a
//! placement service over the bus with key files.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gearshift_placement::cli::{PlaceArgs, PlaceError, run_place};
use gearshift_placement::service::{ServeOptions, serve_with};
use gearshift_placement::{CommandConfig, Engine, PlacementConfig, ScriptConfig, StrategyName};
use gearshift_proto::msg::{ComponentProperties, NodeProperties, PlacementRequest, Role};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::fixtures;

fn shipped(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("examples/strategies")
        .join(name)
}

fn node(name: &str, consumed: f64, zone: Option<&str>) -> NodeProperties {
    NodeProperties {
        zone_id: zone.map(str::to_string),
        mem_free_mb: None,
        ..fixtures::node(name, consumed)
    }
}

fn request(cart: &str, login: &str, nodes: Vec<NodeProperties>) -> PlacementRequest {
    fixtures::request(nodes, fixtures::app("app-7", "site", cart), login, login)
}

fn settings(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    v.as_object().unwrap().clone()
}

#[test]
fn php_hosts_script() {
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        seed: Some(4),
        script: ScriptConfig {
            path: Some(shipped("php_hosts.rhai")),
            settings: settings(json!({"php_hosts": ["n2", "n3", "elsewhere"]})),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let nodes = vec![
        node("n1", 0.0, None),
        node("n2", 50.0, None),
        node("n3", 50.0, None),
    ];
    for _ in 0..10 {
        let r = e.place(&request("php-5.4", "u", nodes.clone()));
        assert!(matches!(r.node.as_deref(), Some("n2" | "n3")), "{r:?}");
    }
    // Not PHP: placed normally, so the default takes the least loaded (below average).
    let r = e.place(&request("ruby-1.9", "u", nodes));
    assert_eq!(r.node.as_deref(), Some("n1"));
    let r = e.place(&request("php-5.3", "u", vec![node("n1", 0.0, None)]));
    assert_eq!(
        r.refused.as_deref(),
        Some("The gear-placement PHP_HOSTS setting doesn't match any of the NodeProfile names")
    );
}

#[test]
fn least_loaded_zone_script() {
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            path: Some(shipped("least_loaded_zone.rhai")),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let nodes = vec![
        node("a1", 10.0, Some("za")), // za average 50
        node("a2", 90.0, Some("za")),
        node("b1", 30.0, Some("zb")), // zb average 25
        node("b2", 20.0, Some("zb")),
        node("x", 60.0, None),
    ];
    let r = e.place(&request("php-5.4", "u", nodes));
    assert_eq!(r.node.as_deref(), Some("b2"), "{r:?}");
}

#[test]
fn placer_command() {
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Command,
        seed: Some(2),
        command: CommandConfig {
            program: Some(shipped("placer.py")),
            timeout: Duration::from_secs(20),
            settings: settings(json!({
                "pinned_user": "slowpoke",
                "slow_hosts": ["slow-2", "slow-1"],
                "blacklisted_vendor": "shadyvendor"
            })),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let nodes = vec![
        node("fast", 0.0, None),
        node("slow-1", 50.0, None),
        node("slow-2", 10.0, None),
    ];
    let r = e.place(&request("php-5.4", "slowpoke", nodes.clone()));
    assert_eq!(r.node.as_deref(), Some("slow-1"));
    let r = e.place(&request("php-5.4", "alice", nodes.clone()));
    assert!(
        matches!(r.node.as_deref(), Some("fast" | "slow-2")),
        "{r:?}"
    );
    let mut shady = request("php-5.4", "alice", nodes);
    shady.components.push(ComponentProperties {
        cartridge_name: "x".into(),
        cartridge_vendor: "shadyvendor".into(),
        ..Default::default()
    });
    assert_eq!(
        e.place(&shady).refused.as_deref(),
        Some("Applications containing cartridges from shadyvendor are blacklisted")
    );
}

/// `place --bus URL --key KEY --broker-pub PUB --timeout 5s` and `extra`,
/// parsed as the command line parses them.
fn place_args(url: &str, key: &Path, broker_pub: &Path, extra: &[&str]) -> PlaceArgs {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        place: PlaceArgs,
    }
    let mut v = vec![
        "place".to_string(),
        "--bus".into(),
        url.to_string(),
        "--key".into(),
        key.display().to_string(),
        "--broker-pub".into(),
        broker_pub.display().to_string(),
        "--timeout".into(),
        "5s".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    Cli::try_parse_from(v).unwrap().place
}

#[tokio::test]
async fn run_place_asks_the_service_with_key_files() {
    let dir = tempfile::tempdir().unwrap();
    let (_, broker_pub, broker) =
        gearshift_service::keys::write_keypair(dir.path(), "broker", false).unwrap();
    let (op_key, op_pub, _) =
        gearshift_service::keys::write_keypair(dir.path(), "operator", false).unwrap();
    let ring = gearshift_service::keys::load_keyring([(Role::Operator, op_pub.as_path())]).unwrap();
    let url = format!("memory://place-cli-{}", uuid::Uuid::new_v4().simple());
    let bus = gearshift_bus::connect(&url, Default::default())
        .await
        .unwrap();
    let token = CancellationToken::new();
    let fleet = vec![node("fleet-1", 70.0, None), node("fleet-2", 5.0, None)];
    let ready = Arc::new(tokio::sync::Notify::new());
    let service = tokio::spawn(serve_with(
        bus.clone(),
        Engine::new(&PlacementConfig {
            strategy: StrategyName::LeastConsumed,
            ..Default::default()
        })
        .unwrap(),
        Arc::new(broker),
        Arc::new(ring),
        "broker",
        token.clone(),
        ServeOptions {
            fleet: Some(Arc::new(move || fleet.clone())),
            ready: Some(ready.clone()),
            ..Default::default()
        },
    ));
    let args = |extra: &[&str]| place_args(&url, &op_key, &broker_pub, extra);
    tokio::time::timeout(Duration::from_secs(10), ready.notified())
        .await
        .expect("service ready");
    run_place(args(&[
        "--app", "blog", "--node", "n1=20", "--node", "n2=10",
    ]))
    .await
    .unwrap();
    // Without --node the broker agent's fleet is used.
    run_place(args(&["--app", "blog", "--json"])).await.unwrap();
    // A refusal is an error with exit code 2.
    let e = run_place(args(&["--app", "blog", "--strategy", "teleport"]))
        .await
        .unwrap_err();
    assert!(
        matches!(e, PlaceError::Refused(ref r) if r.contains("unknown strategy")),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    // A reply signed by a key we do not trust as the broker is rejected.
    let mut wrong = args(&["--app", "blog", "--node", "n1"]);
    wrong.broker_pub = op_pub.clone();
    let e = run_place(wrong).await.unwrap_err();
    assert!(
        matches!(e, PlaceError::BadReply(ref r) if r.contains("not authenticated")),
        "{e}"
    );
    // Missing key file: a clear error naming the file.
    let mut missing = args(&["--app", "blog"]);
    missing.key = dir.path().join("nope.key");
    let e = run_place(missing).await.unwrap_err();
    assert!(e.to_string().contains("nope.key"), "{e}");
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), service)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}
