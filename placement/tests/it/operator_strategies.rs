//! Operator-defined strategies through the engine: a Rhai script and an
//! external command, their answers, refusals and failures.

use std::path::PathBuf;
use std::time::Duration;

use gearshift_placement::{
    CommandConfig, Engine, PlacementConfig, PlacementError, ScriptConfig, ScriptError, StrategyName,
};
use gearshift_proto::msg::PlacementRequest;

use crate::fixtures::{self, node};

fn request(login: &str) -> PlacementRequest {
    let mut inactive = node("off", 0.0);
    inactive.active = false;
    let nodes = vec![node("a", 70.0), node("b", 20.0), inactive, node("c", 40.0)];
    fixtures::request(nodes, fixtures::app("1", "shop", "php-5.4"), "u", login)
}

fn script_engine(text: &str) -> Result<Engine, PlacementError> {
    let mut settings = serde_json::Map::new();
    settings.insert("vip".into(), serde_json::json!("carol"));
    Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        seed: Some(1),
        script: ScriptConfig {
            inline: Some(text.into()),
            settings,
            ..Default::default()
        },
        ..Default::default()
    })
}

const SCRIPT: &str = r#"
// Refuse the banned user, send the VIP (from settings) to the emptiest
// node, let "dave" pick a node that is not a candidate, and place everyone
// else normally.
fn place(input) {
    let login = input.user.login;
    if login == "mallory" { throw "mallory may not create gears"; }
    if login == "dave" { return "off"; }
    if login == input.settings.vip {
        let best = ();
        for n in input.nodes {
            if best == () || n.node_consumed_capacity < best.node_consumed_capacity { best = n; }
        }
        return best.name;
    }
    if login == "eve" { return 42; }
    if login == "loop" { loop {} }
    ()
}
"#;

#[test]
fn script_chooses_refuses_delegates_and_is_checked() {
    let e = script_engine(SCRIPT).unwrap();
    let r = e.place(&request("carol"));
    assert_eq!(r.node.as_deref(), Some("b"));
    assert_eq!(r.strategy, "script");
    assert_eq!(r.candidates, 3);

    let r = e.place(&request("mallory"));
    assert_eq!(r.refused.as_deref(), Some("mallory may not create gears"));

    // "off" was filtered (inactive): a choice outside the candidates is refused.
    let r = e.place(&request("dave"));
    let why = r.refused.unwrap();
    assert!(
        why.contains("\"off\"") && why.contains("not one of the 3 candidates"),
        "{why}"
    );

    let r = e.place(&request("eve"));
    assert!(r.refused.unwrap().contains("expected a node name"));

    // () = place normally: the default never takes "a" (above average).
    for _ in 0..50 {
        let r = e.place(&request("alice"));
        assert!(matches!(r.node.as_deref(), Some("b" | "c")), "{r:?}");
    }
}

#[test]
fn script_runaways_are_refusals_not_hangs() {
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            inline: Some(SCRIPT.into()),
            max_operations: u64::MAX / 2,
            timeout: Duration::from_millis(100),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    let t = std::time::Instant::now();
    let r = e.place(&request("loop"));
    assert!(r.refused.unwrap().contains("ran longer than"));
    assert!(t.elapsed() < Duration::from_secs(10));

    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            inline: Some(SCRIPT.into()),
            max_operations: 5000,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    assert!(
        e.place(&request("loop"))
            .refused
            .unwrap()
            .contains("5000 operations")
    );
}

#[test]
fn script_load_errors_are_clear() {
    let e = script_engine("fn place(input) { input.nodes[0].name ").unwrap_err();
    assert!(
        matches!(e, PlacementError::Config { ref key, .. } if key == "placement.script"),
        "{e}"
    );
    assert!(e.to_string().contains("does not compile"), "{e}");
    let e = script_engine("fn choose(input) { () }").unwrap_err();
    assert!(e.to_string().contains("fn place(input)"), "{e}");
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            path: Some(PathBuf::from("/nonexistent/placement.rhai")),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(e, PlacementError::Config { ref key, .. } if key == "placement.script.path"),
        "{e}"
    );
    // The error type itself names the failure.
    let direct = gearshift_placement::script::ScriptStrategy::compile(
        "fn place(x) {",
        &ScriptConfig::default(),
    )
    .unwrap_err();
    assert!(matches!(direct, ScriptError::Compile { .. }));
}

#[test]
fn script_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("place.rhai");
    std::fs::write(
        &p,
        r#"fn place(input) { input.nodes[input.nodes.len() - 1].name }"#,
    )
    .unwrap();
    let e = Engine::new(&PlacementConfig {
        strategy: StrategyName::Script,
        script: ScriptConfig {
            path: Some(p),
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap();
    assert_eq!(e.place(&request("x")).node.as_deref(), Some("c"));
}

fn command_engine(script: &str, timeout: Duration) -> Engine {
    Engine::new(&PlacementConfig {
        strategy: StrategyName::Command,
        seed: Some(3),
        command: CommandConfig {
            program: Some("/bin/sh".into()),
            args: vec!["-c".into(), script.into()],
            timeout,
            ..Default::default()
        },
        ..Default::default()
    })
    .unwrap()
}

const PY_PLACER: &str = r#"exec python3 -c '
import json, sys
inp = json.load(sys.stdin)
login = inp["user"]["login"]
if login == "mallory":
    print(json.dumps({"refused": "no gears for mallory"}))
elif login == "broken":
    sys.stderr.write("placer: database unreachable\n"); sys.exit(4)
elif login == "alice":
    print(min(inp["nodes"], key=lambda n: n["node_consumed_capacity"])["name"])
elif login == "bob":
    print(json.dumps({"node": max(inp["nodes"], key=lambda n: n["node_consumed_capacity"])["name"]}))
elif login == "dave":
    print("off")
else:
    print(json.dumps({"node": None}))
'"#;

#[test]
fn command_chooses_refuses_and_fails_clearly() {
    let e = command_engine(PY_PLACER, Duration::from_secs(20));
    assert_eq!(e.place(&request("alice")).node.as_deref(), Some("b"));
    assert_eq!(e.place(&request("bob")).node.as_deref(), Some("a"));
    let r = e.place(&request("mallory"));
    assert_eq!(r.refused.as_deref(), Some("no gears for mallory"));
    assert_eq!(r.strategy, "command");
    let why = e.place(&request("broken")).refused.unwrap();
    assert!(
        why.contains("exited with") && why.contains("placer: database unreachable"),
        "{why}"
    );
    let why = e.place(&request("dave")).refused.unwrap();
    assert!(why.contains("not one of the 3 candidates"), "{why}");
    let r = e.place(&request("zed"));
    assert!(matches!(r.node.as_deref(), Some("b" | "c")), "{r:?}");

    let slow = command_engine("sleep 20", Duration::from_millis(200));
    let t = std::time::Instant::now();
    let why = slow.place(&request("alice")).refused.unwrap();
    assert!(why.contains("ran longer than"), "{why}");
    assert!(t.elapsed() < Duration::from_secs(10));
}
