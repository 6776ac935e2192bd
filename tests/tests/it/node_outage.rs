//! The bus goes away in the middle of an evacuation (a proxy between the
//! agent and RabbitMQ is cut): the evacuation keeps moving gears, its events
//! wait in the outbox, and once the bus is back every progress event and
//! the final result arrive. On AMQP and STOMP; other clients of the broker
//! are not disturbed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use gearshift_node::runtime::sim::SimWorld;
use gearshift_proto::msg::{CommandResult, Done, Evacuate, Message, Move};
use gearshift_tests::node_harness::{
    Controller, Keys, Running, Verified, WAIT, agent_config, connect, state_dir, temp_dir, unique,
};
use gearshift_tests::node_proxy::Proxy;
use gearshift_tests::node_scenarios::sim_world;
use gearshift_tests::{amqp_url, init_logging, stomp_url};
use uuid::Uuid;

async fn outage(direct_url: &str, upstream: SocketAddr, proxied_url: impl Fn(u16) -> String) {
    init_logging();
    let proxy = Proxy::start(upstream).await;
    let keys = Keys::new();
    let ctl = Controller::connect(direct_url, keys.clone()).await;
    let node = unique("n-outage-");
    let node_key = gearshift_proto::KeyPair::generate().unwrap();
    let dir = temp_dir();
    let (world, rt, targets) = sim_world(&node, 10);
    world.set_move_time(Duration::from_millis(250));
    ctl.prepare(&node).await;
    let mut events = ctl.events(&node, &node_key).await;
    let running = Running::start(
        agent_config(&node, &node_key, &keys, &state_dir(dir.path(), &node)),
        connect(&proxied_url(proxy.port()), &node).await,
        rt,
    );
    let moves: Vec<Move> = world
        .gears_of(&node)
        .iter()
        .map(|g| Move {
            gear: g.id.clone(),
            target: targets[0].clone(),
        })
        .collect();
    let all: BTreeSet<String> = moves.iter().map(|m| m.gear.clone()).collect();
    let id = ctl
        .send(
            &node,
            Evacuate {
                moves,
                parallelism: Some(1),
                deadline: None,
                watch: false,
                epoch: 0,
            },
            Some("outage-1"),
        )
        .await;
    let (reported, done) = through_the_outage(&proxy, &world, &mut events, id).await;
    assert_eq!(
        reported, all,
        "every gear's progress event arrived after the outage"
    );
    match done.result {
        CommandResult::Evacuated { moved, failed, .. } => assert_eq!((moved, failed), (10, 0)),
        other => panic!("{other:?}"),
    }
    for g in &all {
        assert_eq!(world.locate(g), vec![targets[0].clone()]);
    }
    assert!(
        running.agent.metrics().bus_reconnects.get() >= 1,
        "the reconnection is counted"
    );
    running.stop().await;
}

/// Cuts the bus after the first progress event of command `id` for 1.5 s
/// (local moves go on), then collects every gear's progress and the result.
async fn through_the_outage(
    proxy: &Proxy,
    world: &SimWorld,
    events: &mut Verified,
    id: Uuid,
) -> (BTreeSet<String>, Done) {
    let mut reported = BTreeSet::new();
    let first = events
        .until(WAIT, "the first progress event", |e| {
            matches!(&e.msg, Message::Progress(_))
        })
        .await;
    if let Message::Progress(p) = &first.msg {
        reported.extend(p.results.iter().map(|r| r.gear.clone()));
    }
    proxy.cut();
    let moved_at_cut = world.moves();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let moved_during = world.moves() - moved_at_cut;
    assert!(
        moved_during >= 3,
        "local work continues without the bus ({moved_during} moves)"
    );
    proxy.restore();
    loop {
        let e = events.next(WAIT).await;
        match &e.msg {
            Message::Progress(p) => reported.extend(p.results.iter().map(|r| r.gear.clone())),
            Message::Done(d) if d.cmd == id => return (reported, d.clone()),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_outage_during_evacuation() {
    outage(&amqp_url(), "127.0.0.1:5672".parse().unwrap(), |port| {
        format!("amqp://guest:guest@127.0.0.1:{port}/%2f")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stomp_outage_during_evacuation() {
    outage(&stomp_url(), "127.0.0.1:61613".parse().unwrap(), |port| {
        format!("stomp://guest:guest@127.0.0.1:{port}")
    })
    .await;
}
