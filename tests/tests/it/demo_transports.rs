//! The demo (`gearshift-sim demo`, the README's first command) on every
//! transport: in-process, RabbitMQ over AMQP and over STOMP. Each run must
//! scale up (the new node joins), complete a scale-down saga, and lose no
//! gear by the demo's independent inventory. The binary itself is checked
//! too: `--json` prints exactly one JSON object on stdout (the summary, or
//! an error object when the demo could not run), and unmet expectations give
//! a non-zero exit status. The same demo on ActiveMQ is in `activemq_agents`.

use std::process::{Command, Stdio};
use std::time::Duration;

use gearshift_sim::demo::display::Mode;
use gearshift_sim::demo::{DemoArgs, Summary};
use gearshift_tests::bins::sim_binary;
use gearshift_tests::{amqp_url, init_logging, stomp_url};
use tokio_util::sync::CancellationToken;

async fn run_demo(bus: Option<String>, seed: u64) -> Summary {
    init_logging();
    let args = DemoArgs {
        bus,
        seed: Some(seed),
        timeout: Duration::from_secs(300),
        ..DemoArgs::default()
    };
    gearshift_sim::demo::run(&args, Mode::Quiet, CancellationToken::new())
        .await
        .unwrap_or_else(|e| {
            panic!("the demo could not run: {e} (is RabbitMQ ready? scripts/setup-rabbitmq)")
        })
}

fn check(s: &Summary, transport: &str) {
    assert!(s.ok, "the demo failed on {transport}: {:#?}", s.failures);
    assert_eq!(s.transport, transport);
    assert_eq!(s.phase, "done");
    assert!(s.scale_ups >= 1, "no scale-up: {s:#?}");
    assert!(s.scale_ups_joined >= 1, "no node joined: {s:#?}");
    assert!(s.scale_downs >= 1, "no completed scale-down: {s:#?}");
    assert_eq!(s.gears_lost, 0, "{s:#?}");
    assert_eq!(s.gears_duplicated, 0, "{s:#?}");
    assert_eq!(s.gears_unexpected, 0, "{s:#?}");
    // The figures agree with each other.
    assert_eq!(
        s.gears_before + s.gears_created - s.gears_deleted,
        s.gears_expected as u64,
        "{s:#?}"
    );
    assert_eq!(s.gears_after, s.gears_expected, "{s:#?}");
    let on_nodes: usize = s.per_node.values().map(|g| g.gears).sum();
    assert_eq!(on_nodes, s.gears_after, "{s:#?}");
    assert_eq!(s.nodes_final, s.per_node.len());
    assert_eq!(
        s.nodes_final as u32, s.nodes_initial,
        "back to the initial size"
    );
    assert!(s.gears_moved >= 1, "the removed node was evacuated: {s:#?}");
    assert!(s.peak_usage_pct >= 80.0, "{s:#?}");
    let kinds = &s.decisions_by_kind;
    for k in ["scale_up", "joined", "scale_down", "removed"] {
        assert!(
            kinds.get(k).copied().unwrap_or(0) >= 1,
            "no {k} decision: {kinds:?}"
        );
    }
    assert_eq!(s.decisions, kinds.values().sum::<u32>());
    assert_eq!(s.nodes_removed.len() as u32, s.scale_downs);
    assert!(s.placement_requests >= s.gears_created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_the_memory_bus() {
    let s = run_demo(None, 11).await;
    check(&s, "memory");
    assert_eq!(
        s.queues_deleted, 0,
        "nothing to clean on the in-process bus"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_over_rabbitmq_amqp() {
    let s = run_demo(Some(amqp_url()), 12).await;
    check(&s, "amqp");
    // One command queue per node ever started, plus the broker agent's two.
    let nodes = s.nodes_initial as usize + s.nodes_booted.len();
    assert_eq!(s.queues_deleted, nodes + 2, "{s:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_over_rabbitmq_stomp() {
    let s = run_demo(Some(stomp_url()), 13).await;
    check(&s, "stomp");
    let nodes = s.nodes_initial as usize + s.nodes_booted.len();
    assert_eq!(s.queues_deleted, nodes + 2, "{s:#?}");
}

/// Runs `gearshift-sim demo --json <extra>` and returns (exit code, stdout, stderr).
fn demo_binary(extra: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = Command::new(sim_binary());
    cmd.arg("demo").arg("--json").args(extra);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .expect("run gearshift-sim demo");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exactly one JSON object on stdout, nothing else.
fn one_object(stdout: &str) -> serde_json::Value {
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(
        lines.len(),
        1,
        "stdout must hold one JSON object and nothing else:\n{stdout}"
    );
    let v: serde_json::Value = serde_json::from_str(lines[0]).expect("stdout is JSON");
    assert!(v.is_object(), "{v}");
    v
}

#[test]
fn demo_binary_json_is_one_object_and_the_exit_status_follows_it() {
    let (code, out, err) = demo_binary(&["--speed", "2", "--seed", "5", "--timeout", "5m"], &[]);
    let v = one_object(&out);
    assert_eq!(code, Some(0), "stderr:\n{err}\nsummary: {v:#}");
    assert_eq!(v["ok"], true, "{v:#}");
    for k in [
        "scale_ups",
        "scale_downs",
        "gears_before",
        "gears_after",
        "gears_lost",
        "nodes_final",
        "decisions",
        "duration_s",
        "per_node",
        "transport",
    ] {
        assert!(v.get(k).is_some(), "{k} missing from {v:#}");
    }
    assert_eq!(v["gears_lost"], 0);
    assert_eq!(v["seed"], 5);
    assert!(v["scale_ups"].as_u64().unwrap() >= 1);
    assert!(v["scale_downs"].as_u64().unwrap() >= 1);
}

#[test]
fn demo_binary_fails_when_the_fleet_cannot_scale_up() {
    // A profile threshold the workload never reaches (through the same
    // environment overrides as the shipped broker.toml): no scale-up, so the
    // demo must give up and say why, with exit status 1.
    let (code, out, err) = demo_binary(
        &["--speed", "2", "--timeout", "12s"],
        &[("GEARSHIFT_BROKER_POLICY__PROFILE_THRESHOLD", "99")],
    );
    let v = one_object(&out);
    assert_eq!(code, Some(1), "stderr:\n{err}\nsummary: {v:#}");
    assert_eq!(v["ok"], false);
    let failures: Vec<String> = v["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert!(
        failures
            .iter()
            .any(|f| f.contains("no scale-up was decided")),
        "{failures:?}"
    );
    assert!(
        failures.iter().any(|f| f.contains("timed out")),
        "{failures:?}"
    );
    assert_eq!(v["scale_ups"], 0);
    assert_eq!(
        v["gears_lost"], 0,
        "nothing is lost even when the demo fails"
    );
}

#[test]
fn demo_binary_refuses_bad_options() {
    // With --json, every non-zero exit prints one JSON error object on stdout.
    let (code, out, err) = demo_binary(&["--speed", "9"], &[]);
    assert_eq!(code, Some(2), "clap's usage error");
    let v = one_object(&out);
    assert_eq!(v["ok"], false, "{v:#}");
    assert_eq!(v["exit_code"], 2, "{v:#}");
    assert_eq!(v["error"]["kind"], "usage", "{v:#}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--speed"),
        "{v:#}"
    );
    assert!(err.contains("--speed"), "{err}");
    let (code, out, err) = demo_binary(&["--bus", "carrier-pigeon://x"], &[]);
    assert_eq!(code, Some(2));
    let v = one_object(&out);
    assert_eq!(v["ok"], false, "{v:#}");
    assert_eq!(v["error"]["kind"], "config", "{v:#}");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("--bus"),
        "{v:#}"
    );
    assert!(
        v.get("scale_ups").is_none(),
        "no summary when it could not run"
    );
    assert!(err.contains("--bus"), "{err}");
    // A broker that is not there: a connection error, as an object too.
    let (code, out, _) = demo_binary(&["--bus", "stomp://u:p@127.0.0.1:1"], &[]);
    assert_eq!(code, Some(2));
    let v = one_object(&out);
    assert_eq!(v["error"]["kind"], "connect", "{v:#}");
    assert!(
        !v["error"]["message"].as_str().unwrap().contains(":p@"),
        "the password is not printed: {v:#}"
    );
}
