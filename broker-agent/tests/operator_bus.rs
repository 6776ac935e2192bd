//! The operator controls end to end on an in-process bus: signed requests
//! from the CLI's functions, through the agent's gate and journal, to its
//! status, its explanations, the commands it sends and its history.

use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::cli::{self, OperatorKeys};
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::history::{self, Event, Filter};
use gearshift_broker::status::Status;
use gearshift_broker::{Agent, Observed};
use gearshift_bus::{OutMessage, SharedBus};
use gearshift_proto::msg::{DistrictInfo, GearCounts, Message, NodeReport, Role};
use gearshift_proto::{Envelope, KeyPair, Keyring, routing};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

fn report(node: &str, seq: u64, active_gears: u32, active: bool) -> NodeReport {
    NodeReport {
        node: node.into(),
        seq,
        profile: "small".into(),
        district: Some(DistrictInfo {
            uuid: "d1".into(),
            active,
            first_uid: None,
            max_uid: None,
        }),
        max_active_gears: 100,
        gears: GearCounts {
            started: active_gears,
            ..Default::default()
        },
        active,
        region: None,
        zone: None,
        mem_free_mb: 1024,
        mem_total_mb: 2048,
        started_at: chrono::Utc::now(),
        booted_at: Some(chrono::Utc::now() - chrono::Duration::days(3)),
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 1,
        agent_version: "test".into(),
    }
}

async fn publish_report(bus: &SharedBus, key: &KeyPair, r: NodeReport) {
    let k = routing::report(r.district_uuid(), &r.node);
    let env = Envelope::new(r.node.clone(), r);
    bus.publish(OutMessage::new(k, key.seal(env)).transient())
        .await
        .unwrap();
}

/// Waits until the published status satisfies `pred`.
async fn status_until(
    rx: &mut tokio::sync::watch::Receiver<Arc<Status>>,
    what: &str,
    pred: impl Fn(&Status) -> bool,
) -> Arc<Status> {
    let r = tokio::time::timeout(WAIT, rx.wait_for(|s| pred(s)))
        .await
        .map(|r| r.map(|s| s.clone()));
    match r {
        Ok(Ok(s)) => s,
        _ => panic!("no status where {what}: {:?}", rx.borrow()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_cordon_and_activate_through_the_bus_reach_status_commands_and_history() {
    let url = format!("memory://operators-{}", uuid::Uuid::new_v4().simple());
    let bus = gearshift_bus::connect(&url, Default::default())
        .await
        .unwrap();
    let (broker, node, operator) = (
        KeyPair::generate().unwrap(),
        KeyPair::generate().unwrap(),
        KeyPair::generate().unwrap(),
    );
    let mut ring = Keyring::new();
    ring.add(broker.public(), Role::Broker, "broker");
    ring.add(node.public(), Role::Node, "nodes");
    ring.add(operator.public(), Role::Operator, "operator");
    let mut cfg = BrokerConfig::defaults();
    cfg.bus.url = url;
    cfg.agent.name = "broker-ops".into();
    cfg.agent.admin_key = "admin.ops-test".into();
    cfg.agent.placement_service = false;
    cfg.policy.startup_grace = Duration::ZERO;
    cfg.policy.interval = Duration::from_millis(200);
    let dir = tempfile::tempdir().unwrap();
    let agent = Agent::builder(cfg.clone(), bus.clone())
        .signer(broker.clone())
        .keyring(ring)
        .state_dir(dir.path())
        .build()
        .unwrap();
    let mut status = agent.status();
    let mut observed = agent.observe();
    let token = CancellationToken::new();
    let run = tokio::spawn(agent.run(token.clone()));
    // Its first status comes from its loop, once it consumes its queues.
    status_until(&mut status, "the agent runs", |s| s.at.is_some()).await;
    let mut brokers = Keyring::new();
    brokers.add(broker.public(), Role::Broker, "broker");
    let keys = OperatorKeys {
        signer: operator,
        brokers,
    };
    let key = cfg.agent.admin_key.clone();
    let ask = |req| {
        let (bus, keys, key) = (bus.clone(), keys.clone(), key.clone());
        async move {
            cli::admin_on(&bus, &keys, "alice", &key, req, Duration::from_secs(10))
                .await
                .unwrap()
        }
    };
    let pause = cli::controls::pause(
        Some("d1/small"),
        "kernel upgrade",
        Some(Duration::from_secs(3600)),
        None,
        chrono::Utc::now(),
    )
    .unwrap();
    let r = ask(pause).await;
    assert!(
        r.ok && r.message.contains("paused by alice until"),
        "{}",
        r.message
    );
    // Paused before anything reports: n1, busy enough to want a node, and
    // n2, left inactive by an earlier drain.
    // n1 busy enough to want a node; n2 left inactive by an earlier drain.
    let mut cmds = bus.subscribe(&routing::command("n2")).await.unwrap();
    publish_report(&bus, &node, report("n1", 1, 95, true)).await;
    publish_report(&bus, &node, report("n2", 1, 0, false)).await;
    status_until(&mut status, "both nodes report", |s| s.nodes.len() == 2).await;

    let r = ask(cli::controls::cordon("n1", true, "disk swap")).await;
    assert!(r.ok, "{}", r.message);
    let s = status_until(&mut status, "d1/small paused and n1 cordoned", |s| {
        s.groups.iter().any(|g| g.paused.is_some()) && s.nodes.iter().any(|n| n.cordoned.is_some())
    })
    .await;
    assert!(s.render().contains("n1 cordoned by alice: disk swap"));
    // The paused group is still explained, naming the pause; nothing is decided.
    let explained = tokio::time::timeout(WAIT, async {
        loop {
            match observed.recv().await {
                Ok(Observed::Explanation(x)) if x.summary.starts_with("paused by alice") => {
                    return x;
                }
                Ok(Observed::Decision(d)) => panic!("a paused group decided {d:?}"),
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
        }
    })
    .await
    .expect("an explanation of the paused group");
    assert!(
        explained
            .reasons
            .iter()
            .any(|r| r.rule == "paused" && !r.ok)
    );
    // activate: a signed cmd.activate reaches n2.
    let r = ask(cli::controls::activate("n2")).await;
    assert!(
        r.ok && r.message.contains("cmd.activate sent to n2"),
        "{}",
        r.message
    );
    let d = tokio::time::timeout(WAIT, cmds.next())
        .await
        .unwrap()
        .unwrap();
    let e = Envelope::decode(&d.payload).unwrap().envelope;
    assert!(matches!(e.msg, Message::Activate(_)), "{e:?}");
    // Refusals come back as such.
    let r = ask(cli::controls::resume(None).unwrap()).await;
    assert_eq!(
        (r.ok, r.message.as_str()),
        (false, "the fleet is not paused")
    );
    // The status over the bus carries the controls too.
    let remote = cli::admin_on(
        &bus,
        &keys,
        "alice",
        &key,
        gearshift_proto::msg::AdminRequest::Status,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let remote: Status = serde_json::from_value(remote.data).unwrap();
    assert!(remote.groups.iter().any(|g| {
        g.paused
            .as_deref()
            .is_some_and(|p| p.contains("kernel upgrade"))
    }));

    token.cancel();
    run.await.unwrap().unwrap();
    // The history kept the requests and the paused group's explanation.
    let records = history::read(dir.path(), &Filter::default()).unwrap();
    let by_alice: Vec<bool> = records
        .iter()
        .filter_map(|r| match &r.event {
            Event::Operator(o) if o.by == "alice" => Some(o.ok),
            _ => None,
        })
        .collect();
    assert_eq!(by_alice, vec![true, true, true, false], "{records:?}");
    assert!(records.iter().any(
        |r| matches!(&r.event, Event::Explanation(x) if x.summary.starts_with("paused by alice"))
    ));
}
