//! Least privilege on the bus, on the real RabbitMQ: `scripts/rabbitmq-node-user`
//! creates a user for one node (random name, deleted at the end); the node
//! agent works with it (reports, its command queue, events), and RabbitMQ
//! itself refuses what the user must not do: publish another node's report
//! or events, consume another node's command queue, bind to its commands.

use std::process::Command;

use gearshift_bus::{BusError, ConsumeOptions, OutMessage, QueueSpec, SharedBus};
use gearshift_proto::msg::{InventoryRequest, Message};
use gearshift_proto::routing;
use gearshift_tests::node_harness::{
    Controller, Keys, Running, WAIT, agent_config, state_dir, temp_dir, unique,
};
use gearshift_tests::node_scenarios::sim_world;
use gearshift_tests::{connect, init_logging, repo_root};

/// The node's RabbitMQ user, deleted when dropped (also when the test fails).
struct NodeUser {
    node: String,
    password: String,
}

impl NodeUser {
    fn add(node: &str) -> NodeUser {
        let password = unique("pw");
        script(&["add", node, &password]);
        NodeUser {
            node: node.into(),
            password,
        }
    }

    fn url(&self) -> String {
        format!(
            "amqp://gearshift-node-{}:{}@127.0.0.1:5672/%2f",
            routing::segment(&self.node),
            self.password
        )
    }
}

impl Drop for NodeUser {
    fn drop(&mut self) {
        script(&["delete", &self.node]);
    }
}

fn script(args: &[&str]) {
    let out = Command::new(repo_root().join("scripts/rabbitmq-node-user"))
        .args(args)
        .output()
        .expect("run scripts/rabbitmq-node-user (rabbitmqctl must be on this host)");
    assert!(
        out.status.success(),
        "rabbitmq-node-user {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The error of `r`, which RabbitMQ must have refused.
fn refused<T>(r: Result<T, BusError>, what: &str) -> String {
    let e = match r {
        Ok(_) => panic!("RabbitMQ let the node user {what}"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("ACCESS_REFUSED") || e.contains("403"),
        "{what}: {e}"
    );
    e
}

/// A fresh connection of the node user (a refusal closes its channel).
async fn as_node(user: &NodeUser, who: &str) -> SharedBus {
    connect(&user.url(), &format!("lp-{who}")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_bus_user_reaches_only_its_own_keys_and_queue() {
    init_logging();
    let node = unique("lp");
    let other = format!("{node}-other");
    let user = NodeUser::add(&node);
    let keys = Keys::new();
    let ctl = Controller::connect(&gearshift_tests::amqp_url(), keys.clone()).await;
    // Both command queues exist before anything is sent (a command to a
    // queue not yet declared would be dropped by the exchange).
    ctl.prepare(&other).await;
    ctl.prepare(&node).await;
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();

    // The node agent works with the restricted user: it declares and consumes
    // its command queue, reports, answers a command with its events.
    let mut reports = ctl.reports(&node, &node_key).await;
    let mut events = ctl.events(&node, &node_key).await;
    let (_world, rt, _) = sim_world(&node, 4);
    let cfg = agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node));
    let agent = Running::start(cfg, as_node(&user, "agent").await, rt);
    let r = reports.report(WAIT, "a report", |_| true).await;
    assert_eq!(r.node, node);
    let cmd = ctl.send(&node, InventoryRequest::default(), None).await;
    let done = events.outcome(cmd, WAIT).await;
    assert!(matches!(done.msg, Message::Done(_)), "{:?}", done.msg);

    // What RabbitMQ refuses to this user, whatever it signs.
    let forged = || OutMessage::new("x", b"{}".to_vec());
    let bus = as_node(&user, "report").await;
    let key = routing::report(Some("d1"), &other);
    refused(
        bus.publish(OutMessage { key, ..forged() }).await,
        "publish another node's report",
    );
    let bus = as_node(&user, "event").await;
    refused(
        bus.publish(OutMessage {
            key: routing::event(&other),
            ..forged()
        })
        .await,
        "publish another node's events",
    );
    let bus = as_node(&user, "decision").await;
    refused(
        bus.publish(OutMessage {
            key: "decision.scale_up.d1.small".into(),
            ..forged()
        })
        .await,
        "publish a decision",
    );
    let bus = as_node(&user, "consume").await;
    refused(
        bus.consume(
            &QueueSpec::node_commands(&other),
            ConsumeOptions { prefetch: 1 },
        )
        .await,
        "consume another node's command queue",
    );
    let bus = as_node(&user, "bind").await;
    refused(
        bus.subscribe(&routing::command(&other)).await,
        "bind to another node's commands",
    );
    refused(bus.subscribe("report.#").await, "watch every report");

    agent.stop().await;
    drop(user);
}
