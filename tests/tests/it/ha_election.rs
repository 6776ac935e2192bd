//! Three broker agents on one bus (in-process, each with its own
//! connection, state directory and name, one cluster): exactly one leads,
//! the standbys publish no decision, and when the leader's connection dies
//! in the middle of a drain a standby takes over within seconds and
//! finishes that saga from the replicated journal (the node removed once,
//! no gear lost, no node requested), over the in-process bus and RabbitMQ.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gearshift_broker::Agent;
use gearshift_broker::status::Status;
use gearshift_bus::SharedBus;
use gearshift_proto::msg::DecisionKind;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::broker_sagas::{Ctx, setup};

struct Member {
    name: String,
    bus: SharedBus,
    status: watch::Receiver<Arc<Status>>,
    token: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

fn leads(m: &Member) -> bool {
    m.status
        .borrow()
        .ha
        .as_ref()
        .is_some_and(|h| h.role == "leader")
}

async fn start_member(c: &Ctx, i: usize) -> Member {
    let mut cfg = c.cfg.clone();
    cfg.agent.name = format!("{}-{i}", c.cfg.agent.name);
    cfg.agent.state_dir = c.bed.path(&format!("broker{i}"));
    let bus = c.bed.connect(&format!("broker{i}")).await;
    let agent = Agent::builder(cfg.clone(), bus.clone())
        .signer(c.keys.broker.clone())
        .keyring(c.keys.broker_keyring().expect("broker keyring"))
        .handler("sim", c.cloud.clone())
        .build()
        .expect("broker agent");
    let status = agent.status();
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move {
        let _ = agent.run(t).await;
    });
    Member {
        name: cfg.agent.name,
        bus,
        status,
        token,
        task,
    }
}

/// The one leader among `members`, once exactly one leads (within 15 s).
async fn one_leader(members: &[Member]) -> usize {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let l: Vec<usize> = (0..members.len()).filter(|&i| leads(&members[i])).collect();
        if l.len() == 1 {
            return l[0];
        }
        assert!(
            Instant::now() < deadline,
            "leaders: {:?}",
            l.iter().map(|&i| &members[i].name).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn standby_takes_over_a_drain(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.group_defaults.min_nodes = 2;
    let d = format!("{}d1", c.tag);
    let [n1, n2, n3] = c.nodes(&d, [("n1", 30), ("n2", 20), ("n3", 12)]);
    // Slow moves: the drain is still running when the leader dies.
    c.fleet.world().set_move_time(Duration::from_millis(300));
    let before = c.fleet.gear_locations();
    let mut members = vec![];
    for i in 0..3 {
        members.push(start_member(&c, i).await);
    }
    let first = one_leader(&members).await;
    let down = c
        .watch
        .until("scale_down decision", |x| {
            x.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(down.node.as_deref(), Some(n3.as_str()));
    // Once the first gear has moved, the leader's connection dies.
    let started = Instant::now() + Duration::from_secs(30);
    while c.fleet.world().gears_of(&n3).len() >= 12 {
        assert!(Instant::now() < started, "the drain started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !c.fleet.world().gears_of(&n3).is_empty(),
        "the drain is still running"
    );
    let dead = members.remove(first);
    let t0 = Instant::now();
    dead.bus.close().await;
    dead.token.cancel();
    let next = one_leader(&members).await;
    let failover = t0.elapsed();
    assert!(failover < Duration::from_secs(10), "{failover:?}");
    eprintln!("{} -> {} in {failover:?}", dead.name, members[next].name);
    let removed = c
        .watch
        .until("removed decision", |x| x.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.node.as_deref(), Some(n3.as_str()));
    assert_eq!(removed.op, down.op, "the same saga, continued");
    assert_eq!(c.cloud.remove_requests(), vec![n3.clone()]);
    assert_eq!(c.cloud.create_requests(), 0);
    assert!(
        c.cloud.lost().is_empty(),
        "gears lost: {:?}",
        c.cloud.lost()
    );
    let after = c.fleet.gear_locations();
    assert_eq!(after.len(), before.len(), "no gear lost");
    for (g, at) in &after {
        assert_eq!(at.len(), 1, "{g} is on {at:?}");
        assert!(at[0] == n1 || at[0] == n2, "{g} on {at:?}");
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), dead.task).await;
    for m in members {
        m.token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), m.task).await;
    }
    c.fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_standby_takes_over_a_drain_memory() {
    standby_takes_over_a_drain("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ha_standby_takes_over_a_drain_amqp() {
    standby_takes_over_a_drain("amqp").await;
}
