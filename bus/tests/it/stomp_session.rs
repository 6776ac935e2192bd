//! Session behaviour against the in-process broker: ERROR frames, close,
//! publishes that outlive their connection, the reconnect backoff when a
//! restored subscription is refused every time, and the ActiveMQ destinations
//! (named by `?flavor=`: the in-process broker sends no `server` header).

use crate::stomp_support;

use std::time::Duration;

use gearshift_bus::stomp::frame::{Command, Frame};
use gearshift_bus::{BusError, BusEvent, ConnectOptions, ConsumeOptions, OutMessage, QueueSpec};
use stomp_support::FakeBroker;

fn options() -> ConnectOptions {
    ConnectOptions {
        name: "session-test".into(),
        heartbeat: Duration::from_secs(1),
        reconnect_min: Duration::from_millis(20),
        reconnect_max: Duration::from_millis(50),
        op_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

fn frames(broker: &FakeBroker, command: Command) -> Vec<Frame> {
    let all = broker.state.frames.lock().unwrap();
    all.iter()
        .filter(|(_, f)| f.command == command)
        .map(|(_, f)| f.clone())
        .collect()
}

#[tokio::test]
async fn an_error_frame_fails_the_call_and_the_bus_recovers() {
    let broker = FakeBroker::start("1000,1000", None).await;
    let bus = gearshift_bus::connect(&broker.url("stomp"), options())
        .await
        .unwrap();
    let mut events = bus.events();
    let e = bus
        .publish(OutMessage::new("x.fail", "boom"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Server(_)), "{e}");
    assert!(e.to_string().contains("not_found"), "{e}");
    // It was tried on more than one connection before giving up.
    assert!(
        broker.connections() >= 3,
        "{} connections",
        broker.connections()
    );
    assert!(matches!(
        events.recv().await.unwrap(),
        BusEvent::Disconnected { .. }
    ));
    // The bus is usable afterwards.
    bus.publish(OutMessage::new("x.ok", "fine")).await.unwrap();
    bus.close().await;
}

#[tokio::test]
async fn close_disconnects_with_a_receipt_and_later_calls_fail() {
    let broker = FakeBroker::start("0,0", None).await;
    let bus = gearshift_bus::connect(&broker.url("stomp"), options())
        .await
        .unwrap();
    let mut sub = bus.subscribe("a.b").await.unwrap();
    bus.close().await;
    let disconnects = frames(&broker, Command::Disconnect);
    assert_eq!(disconnects.len(), 1);
    assert!(disconnects[0].get("receipt").is_some());
    let e = bus
        .publish(OutMessage::new("a.b", "late"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Closed), "{e}");
    // Subscriptions end.
    assert!(
        sub.next_timeout(Duration::from_secs(5))
            .await
            .unwrap()
            .is_none()
    );
}

#[tokio::test]
async fn every_send_carries_a_receipt_and_the_message_headers() {
    let broker = FakeBroker::start("0,0", None).await;
    let bus = gearshift_bus::connect(&broker.url("stomp"), options())
        .await
        .unwrap();
    let mut msg = OutMessage::new("report.d1.n1", "{}");
    msg.reply_to = Some("gearshift.reply.r1".into());
    msg.correlation_id = Some("c-1".into());
    bus.publish(msg).await.unwrap();
    bus.publish(OutMessage::new("report.d1.n1", "t").transient())
        .await
        .unwrap();
    let sends = frames(&broker, Command::Send);
    assert_eq!(sends.len(), 2);
    assert_eq!(
        sends[0].get("destination"),
        Some("/exchange/gearshift/report.d1.n1")
    );
    assert!(sends.iter().all(|f| f.get("receipt").is_some()));
    assert_eq!(sends[0].get("persistent"), Some("true"));
    assert_eq!(sends[0].get("reply-to"), Some("gearshift.reply.r1"));
    assert_eq!(sends[0].get("correlation-id"), Some("c-1"));
    assert_eq!(sends[1].get("persistent"), None, "transient");
    bus.close().await;
}

#[tokio::test]
async fn activemq_flavor_uses_topics_and_node_queues() {
    let broker = FakeBroker::start("0,0", None).await;
    let url = format!("{}?flavor=activemq", broker.url("stomp"));
    let bus = gearshift_bus::connect(&url, options()).await.unwrap();
    // No exchange probe on ActiveMQ: the first frame after CONNECT is ours.
    assert!(frames(&broker, Command::Subscribe).is_empty());
    let node = "n1.example.com";
    let spec = QueueSpec::node_commands(node);
    let mut cmds = bus
        .consume(&spec, ConsumeOptions { prefetch: 7 })
        .await
        .unwrap();
    let mut reports = bus.subscribe("report.#").await.unwrap();
    bus.publish(OutMessage::new(
        gearshift_proto::routing::command(node),
        "cmd",
    ))
    .await
    .unwrap();
    let d = cmds
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(d.key, gearshift_proto::routing::command(node));
    d.ack().await.unwrap();
    let subs = frames(&broker, Command::Subscribe);
    assert_eq!(
        subs[0].get("destination"),
        Some("/queue/gearshift.node.n1%2Eexample%2Ecom")
    );
    assert_eq!(subs[0].get("ack"), Some("client-individual"));
    assert_eq!(subs[0].get("activemq.prefetchSize"), Some("7"));
    assert_eq!(
        subs[1].get("destination"),
        Some("/topic/VirtualTopic.gearshift.report.>")
    );
    // One SEND reaches the node's queue and the topic watchers see.
    let sends = frames(&broker, Command::Send);
    assert_eq!(
        sends[0].get("destination"),
        Some(
            "/queue/gearshift.node.n1%2Eexample%2Ecom,\
             /topic/VirtualTopic.gearshift.cmd.n1%2Eexample%2Ecom"
        )
    );
    let connect = frames(&broker, Command::Connect);
    assert_eq!(connect[0].get("host"), Some("127.0.0.1"));
    assert_eq!(frames(&broker, Command::Ack).len(), 1);
    assert!(
        reports
            .next_timeout(Duration::from_millis(200))
            .await
            .is_err()
    );
    bus.close().await;
}

/// RabbitMQ answers a forbidden SUBSCRIBE with an ERROR and a close. A
/// subscription it refuses after a reconnect must not make the bus reconnect
/// at its shortest delay forever: the delays keep growing, since no
/// connection lasts.
#[tokio::test(start_paused = true)]
async fn a_subscription_refused_after_every_connect_backs_off() {
    let broker = FakeBroker::start("0,0", None).await;
    let opts = ConnectOptions {
        reconnect_min: Duration::from_millis(10),
        reconnect_max: Duration::from_secs(1),
        ..options()
    };
    let bus = gearshift_bus::connect(&broker.url("stomp"), opts)
        .await
        .unwrap();
    let _sub = bus.subscribe("a.b").await.unwrap();
    broker
        .state
        .refuse_subscribes
        .store(true, std::sync::atomic::Ordering::SeqCst);
    // The connection goes (a SEND the broker refuses); every new one is
    // refused as soon as the subscription is restored.
    let _ = bus.publish(OutMessage::new("x.fail", "boom")).await;
    let start = broker.connections();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let made = broker.connections() - start;
    // 10, 20, 40, … 640 ms, then 1 s: about 16 in 10 s (at 10 ms each: 1000).
    assert!((5..=25).contains(&made), "{made} connections in 10 s");
    let h = bus.health();
    assert!(h.refused_total >= 5, "{h:?}");
    assert!(!h.connected || h.refused_total > 0);
    bus.close().await;
}
