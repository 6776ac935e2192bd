//! docs/protocol.md is enough for a third party: a small Python client
//! (examples/python/gearshift_watch.py, pika or stomp.py plus `cryptography`)
//! reads a node report and a decision off the real bus and verifies their
//! signatures, and tells a forged report apart: over AMQP, and over STOMP on
//! RabbitMQ and on ActiveMQ (given the agents' bus URL, `--bus`).

use std::process::Stdio;
use std::time::Duration;

use gearshift_bus::OutMessage;
use gearshift_proto::msg::{
    Decision, DecisionKind, DistrictInfo, GearCounts, GroupStats, NodeReport,
};
use gearshift_proto::{Envelope, KeyPair, routing};
use gearshift_tests::{activemq_url, amqp_url, connect, python, repo_root, stomp_url, unique};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

fn report(node: &str, district: &str) -> NodeReport {
    NodeReport {
        node: node.into(),
        seq: 1,
        profile: "small".into(),
        district: Some(DistrictInfo {
            uuid: district.into(),
            active: true,
            first_uid: Some(1000),
            max_uid: Some(6999),
        }),
        max_active_gears: 100,
        gears: GearCounts {
            started: 40,
            idle: 10,
            stopped: 5,
            deploying: 1,
            unknown: 0,
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 1024,
        mem_total_mb: 4096,
        started_at: chrono::Utc::now(),
        booted_at: None,
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 10,
        agent_version: "test".into(),
    }
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

async fn next(lines: &mut Lines) -> Value {
    match tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await {
        Ok(Ok(Some(l))) => serde_json::from_str::<Value>(&l).unwrap_or_else(|e| panic!("{e}: {l}")),
        other => panic!("no output from the Python client: {other:?}"),
    }
}

/// The Python client on `transport`, trusting `dir/node.pub` and
/// `dir/broker.pub`, bound to `district`'s reports and decisions; returns
/// the child, its output lines (after its `ready` line) and the bus URL.
async fn start_client(
    transport: &str,
    dir: &std::path::Path,
    district: &str,
) -> (tokio::process::Child, Lines, String) {
    let script = repo_root().join("examples/python/gearshift_watch.py");
    let mut cmd = tokio::process::Command::new(python());
    cmd.arg(&script);
    let url = match transport {
        "amqp" => {
            cmd.args(["--amqp", &amqp_url()]);
            amqp_url()
        }
        // The agents' own bus URL, as an operator would pass it.
        "stomp" => {
            cmd.args(["--bus", &stomp_url()]);
            stomp_url()
        }
        _ => {
            cmd.args(["--bus", &activemq_url()]);
            activemq_url()
        }
    };
    cmd.args(["--bind", &format!("report.{district}.#")])
        .args(["--bind", &format!("decision.*.{district}.*")])
        .args([
            "--trust",
            &format!("node:{}", dir.join("node.pub").display()),
        ])
        .args([
            "--trust",
            &format!("broker:{}", dir.join("broker.pub").display()),
        ])
        .args(["--want", "report", "--want", "decision", "--timeout", "30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    let mut child = cmd.spawn().expect("start the Python client");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = next(&mut lines).await;
    assert_eq!(ready["ready"], true, "{ready}");
    if transport != "amqp" {
        let flavor = if transport == "activemq" {
            "activemq"
        } else {
            "rabbitmq"
        };
        assert_eq!(ready["flavor"], flavor, "{ready}");
    }
    (child, lines, url)
}

/// A scale-up decision in `district`, signed by `broker_key`.
fn decision(broker_key: &KeyPair, district: &str) -> Vec<u8> {
    let decision = Decision {
        decision: DecisionKind::ScaleUp,
        district: district.to_string(),
        profile: "small".into(),
        op: Some("op-test".into()),
        node: None,
        reason: "profile small at 84.0 % >= PROFILE_THRESHOLD 80 %".into(),
        handler: Some("log".into()),
        stats: Some(GroupStats::default()),
        dry_run: false,
        // A leader's decision: the client verifies the epoch with the rest.
        epoch: 7,
    };
    broker_key.seal(Envelope::new("broker", decision).with_corr("op-test"))
}

async fn run(transport: &str) {
    let dir = tempfile::tempdir().unwrap();
    let node_key = KeyPair::generate().unwrap();
    let broker_key = KeyPair::generate().unwrap();
    let rogue = KeyPair::generate().unwrap();
    std::fs::write(dir.path().join("node.pub"), node_key.public_pem()).unwrap();
    std::fs::write(dir.path().join("broker.pub"), broker_key.public_pem()).unwrap();
    let district = unique("d");
    let node = format!("{}.example.com", unique("node-"));
    let (mut child, mut lines, url) = start_client(transport, dir.path(), &district).await;

    let bus = connect(&url, "python-client-test").await;
    // A forged report first: signed by a key the client does not trust.
    let key = routing::report(Some(&district), &node);
    let forged = rogue.seal(Envelope::new(node.clone(), report(&node, &district)));
    bus.publish(OutMessage::new(key.clone(), forged).transient())
        .await
        .unwrap();
    let real = node_key.seal(Envelope::new(node.clone(), report(&node, &district)));
    bus.publish(OutMessage::new(key, real).transient())
        .await
        .unwrap();
    let d = decision(&broker_key, &district);
    bus.publish(OutMessage::new(
        routing::decision(DecisionKind::ScaleUp, &district, "small"),
        d,
    ))
    .await
    .unwrap();

    let forged_line = next(&mut lines).await;
    assert_eq!(forged_line["kind"], "report");
    assert_eq!(forged_line["verified"], false);
    assert_eq!(forged_line["reason"], "unknown_key");

    let report_line = next(&mut lines).await;
    assert_eq!(report_line["kind"], "report");
    assert_eq!(report_line["verified"], true, "{report_line}");
    assert_eq!(
        report_line["routing_key"],
        routing::report(Some(&district), &node)
    );
    assert_eq!(report_line["body"]["node"], node.as_str());
    assert_eq!(report_line["body"]["gears"]["started"], 40);

    let decision_line = next(&mut lines).await;
    assert_eq!(decision_line["kind"], "decision");
    assert_eq!(decision_line["verified"], true, "{decision_line}");
    assert_eq!(decision_line["body"]["decision"], "scale_up");
    assert_eq!(decision_line["body"]["epoch"], 7);
    assert_eq!(decision_line["corr"], "op-test");

    let status = tokio::time::timeout(Duration::from_secs(15), child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(
        status.success(),
        "the client exits 0 once it saw both kinds"
    );
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pika_client_reads_a_report_and_a_decision() {
    run("amqp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stomp_client_reads_a_report_and_a_decision() {
    run("stomp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_stomp_client_on_activemq_reads_a_report_and_a_decision() {
    run("activemq").await;
}
