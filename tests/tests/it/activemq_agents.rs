//! Both agents on Apache ActiveMQ Classic (the private broker of
//! `scripts/setup-activemq`, `GEARSHIFT_TEST_ACTIVEMQ_URL`): the demo's real
//! binary (scale-up, scale-down, no gear lost), the broker agent's sagas and
//! operator commands, events published while the broker agent is down and
//! consumed after its restart, every node scenario (restarts included), and
//! an oversized message on a node's queue followed by a good command that is
//! acted upon. A missing ActiveMQ fails these tests naming the script; they
//! are never skipped. (Bus-level ActiveMQ tests: `bus/tests/it/activemq.rs`.)

use std::time::Duration;

use gearshift_broker::Agent;
use gearshift_bus::stomp::StompBus;
use gearshift_bus::stomp::parse::Limits;
use gearshift_bus::{Bus, BusUrl, OutMessage};
use gearshift_node::metrics::ReasonLabels;
use gearshift_proto::msg::{CommandResult, Deactivate, DecisionKind, Message};
use gearshift_proto::routing;
use gearshift_tests::broker_harness::eventually;
use gearshift_tests::node_harness::{
    Controller, Keys, Running, agent_config, connect, state_dir, temp_dir, unique,
};
use gearshift_tests::node_scenarios::sim_world;
use gearshift_tests::{activemq_url, init_logging, test_options};
use tokio_util::sync::CancellationToken;

use crate::broker_sagas::{self as sagas, Ctx};

const WAIT: Duration = Duration::from_secs(60);

// ------------------------------------------------------------------ demo

#[test]
fn demo_binary_on_activemq_scales_up_and_down_without_losing_a_gear() {
    let url = activemq_url();
    let out = std::process::Command::new(gearshift_tests::bins::sim_binary())
        .args(["demo", "--json", "--bus", &url])
        .args(["--seed", "21", "--speed", "2", "--timeout", "5m"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run gearshift-sim demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON object on stdout ({e}):\n{stdout}\n{stderr}"));
    assert_eq!(out.status.code(), Some(0), "{v:#}\nstderr:\n{stderr}");
    assert_eq!(v["ok"], true, "{v:#}");
    assert_eq!(v["transport"], "stomp", "{v:#}");
    // The URL is shown redacted: its password never.
    let password = url
        .split_once("://")
        .and_then(|(_, rest)| rest.split_once('@'))
        .and_then(|(auth, _)| auth.split_once(':'))
        .map(|(_, p)| p.to_string())
        .expect("the ActiveMQ URL carries a password");
    let shown = v["bus"].as_str().unwrap();
    assert!(
        !shown.contains(&password) && shown.contains("***"),
        "password shown: {v}"
    );
    assert!(v["scale_ups_joined"].as_u64().unwrap() >= 1, "{v:#}");
    assert!(v["scale_downs"].as_u64().unwrap() >= 1, "{v:#}");
    for k in ["gears_lost", "gears_duplicated", "gears_unexpected"] {
        assert_eq!(v[k], 0, "{k}: {v:#}");
    }
    assert_eq!(v["gears_after"], v["gears_expected"], "{v:#}");
    assert_eq!(v["nodes_final"], v["nodes_initial"], "{v:#}");
    assert!(v["gears_moved"].as_u64().unwrap() >= 1, "{v:#}");
    for k in ["scale_up", "joined", "scale_down", "removed"] {
        let n = v["decisions_by_kind"][k].as_u64().unwrap_or(0);
        assert!(n >= 1, "no {k} decision: {v:#}");
    }
}

// ---------------------------------------------------------- broker agent

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_scale_up_lands_in_the_right_district_activemq() {
    sagas::scale_up_lands_in_the_right_district("activemq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_full_scale_down_saga_activemq() {
    sagas::full_scale_down_saga("activemq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_abort_reactivates_the_node_activemq() {
    sagas::abort_reactivates_the_node("activemq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_drain_cancel_activemq() {
    sagas::drain_cancel("activemq").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_operator_commands_activemq() {
    sagas::operator_commands("activemq").await;
}

type Status = tokio::sync::watch::Receiver<std::sync::Arc<gearshift_broker::status::Status>>;

/// The broker agent of `c`, started, and its status snapshots.
fn start_broker(c: &Ctx) -> (Status, CancellationToken, tokio::task::JoinHandle<()>) {
    let agent = Agent::builder(c.cfg.clone(), c.broker_bus.clone())
        .signer(c.keys.broker.clone())
        .keyring(c.keys.broker_keyring().expect("broker keyring"))
        .handler("sim", c.cloud.clone())
        .build()
        .expect("broker agent");
    let status = agent.status();
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move { agent.run(t).await.expect("broker agent run") });
    (status, token, task)
}

async fn stop_broker(token: CancellationToken, task: tokio::task::JoinHandle<()>) {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(15), task)
        .await
        .expect("broker agent stops within its grace")
        .expect("broker task");
}

/// The broker agent stops in the middle of a scale-down saga; while it is
/// down, the node answers its commands and 5 undecodable events are
/// published on `event.<node>`. The restarted agent consumes them from its
/// durable events queue (a virtual-topic consumer queue on ActiveMQ): it
/// counts the 5 refusals, and the scale-down ends with the node removed
/// and no gear lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_restart_consumes_the_events_published_while_it_was_down_activemq() {
    let mut c = sagas::setup("activemq").await;
    c.cfg.group_defaults.min_nodes = 2;
    let d = format!("{}d1", c.tag);
    let [n1, n2, n3] = c.nodes(&d, [("n1", 30), ("n2", 20), ("n3", 5)]);
    let (_, token, task) = start_broker(&c);
    let down = c
        .watch
        .until("scale_down decision", |x| {
            x.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(down.node.as_deref(), Some(n3.as_str()), "{down:?}");
    stop_broker(token, task).await;

    // While it is down: the node goes on answering, and these wait.
    let publisher = c.bed.connect("publisher").await;
    let key = routing::event(&n3);
    for i in 0..5 {
        let junk = format!("not an envelope {i} {}", c.tag);
        publisher
            .publish(OutMessage::new(key.clone(), junk))
            .await
            .expect("publish while the broker agent is down");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (status, token, task) = start_broker(&c);
    eventually(
        "the 5 events published while it was down are consumed",
        || {
            status
                .borrow()
                .refused
                .get("malformed")
                .copied()
                .unwrap_or(0)
                >= 5
        },
    )
    .await;
    let removed = c
        .watch
        .until("removed decision", |x| x.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.node.as_deref(), Some(n3.as_str()));
    assert_eq!(c.cloud.remove_requests(), vec![n3.clone()]);
    assert!(c.cloud.lost().is_empty(), "lost: {:?}", c.cloud.lost());
    let after = c.fleet.gear_locations();
    assert_eq!(after.len(), 55, "no gear lost");
    for (g, at) in &after {
        assert!(
            at.len() == 1 && (at[0] == n1 || at[0] == n2),
            "{g} on {at:?}"
        );
    }
    stop_broker(token, task).await;
    publisher.close().await;
    c.fleet.stop_all().await;
}

// ------------------------------------------------------------ node agent

mod node {
    use gearshift_tests::node_scenarios as s;
    use gearshift_tests::{activemq_url, init_logging};

    macro_rules! on_activemq {
        ($($name:ident),+ $(,)?) => {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    init_logging();
                    s::$name(&activemq_url()).await;
                }
            )+
        };
    }

    on_activemq!(
        refusals,
        deactivate_survives_restart,
        evacuation_with_progress,
        evacuation_resumes_after_restart,
        pings,
        inventory_heat_and_remove,
    );
}

/// A message over the node agent's frame limit (16 MiB) on its queue,
/// then a good command: the big one is dropped unread and counted as
/// `refused_total{reason="too_large"}`, the session goes on, and the
/// command is acted upon.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_drops_an_oversized_message_and_acts_on_the_next_command_activemq() {
    init_logging();
    let url = activemq_url();
    let keys = Keys::new();
    let ctl = Controller::connect(&url, keys.clone()).await;
    let node = unique("n-big-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (world, rt, _) = sim_world(&node, 3);
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let cfg = agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node));
    let running = Running::start(cfg, connect(&url, &node).await, rt);

    // A sender allowed more than the node's 16 MiB.
    let limits = Limits {
        max_body: 20 << 20,
        max_frame: 21 << 20,
        ..Limits::default()
    };
    let big = StompBus::connect_with(BusUrl::parse(&url).unwrap(), test_options("big"), limits)
        .await
        .expect("connect the sender of the oversized message");
    let size = (16 << 20) + 4096;
    let mut junk = vec![b' '; size];
    junk[0] = b'{';
    junk[size - 1] = b'}';
    big.publish(OutMessage::new(routing::command(&node), junk))
        .await
        .expect("ActiveMQ takes a 16 MiB message");
    big.close().await;

    let reason = "after the big one".to_string();
    let id = ctl
        .send(&node, Deactivate { reason, epoch: 0 }, Some("sd-big"))
        .await;
    let out = events.outcome(id, WAIT).await;
    match &out.msg {
        Message::Done(d) => assert!(
            matches!(d.result, CommandResult::Deactivated { .. }),
            "{out:?}"
        ),
        other => panic!("expected event.done, got {other:?}"),
    }
    assert_eq!(world.is_active(&node), Some(false), "acted upon");
    let too_large = ReasonLabels {
        reason: "too_large".into(),
    };
    let refused = running
        .agent
        .metrics()
        .refused
        .get_or_create(&too_large)
        .get();
    assert_eq!(refused, 1, "the oversized message is counted once");
    assert_eq!(running.stop().await, gearshift_node::RunExit::Stopped);
    ctl.bus.close().await;
}
