//! The cases themselves, written once against `dyn Bus`.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use gearshift_bus::{BusError, ConsumeOptions, Delivery, OutMessage, QueueSpec, Subscription};

use super::harness::{Harness, wait_reconnected};
use crate::rabbit::uniq;

const WAIT: Duration = Duration::from_secs(10);
/// How long we listen to be sure something does NOT arrive.
const QUIET: Duration = Duration::from_millis(400);

pub(super) async fn recv(sub: &mut Subscription) -> Delivery {
    match sub.next_timeout(WAIT).await {
        Ok(Some(d)) => d,
        Ok(None) => panic!("subscription ended"),
        Err(e) => panic!("{e}"),
    }
}

pub(super) async fn assert_quiet(sub: &mut Subscription) {
    if let Ok(Some(d)) = sub.next_timeout(QUIET).await {
        panic!("unexpected delivery {d:?}");
    }
}

pub(super) fn text(d: &Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

/// A subscription may need a moment to be bound on a real broker after the
/// SUBSCRIBE/consume call returns; a confirmed publish to a probe key settles it.
async fn settle(bus: &dyn gearshift_bus::Bus, sub: &mut Subscription, probe_key: &str) {
    for _ in 0..50 {
        bus.publish(OutMessage::new(probe_key, "probe").transient())
            .await
            .expect("publish probe");
        if let Ok(Some(_)) = sub.next_timeout(Duration::from_millis(200)).await {
            // Drain any extra probes.
            while let Ok(Some(_)) = sub.next_timeout(Duration::from_millis(100)).await {}
            return;
        }
    }
    panic!("subscription never became live");
}

pub async fn pubsub_by_pattern(h: &dyn Harness) {
    let t = uniq();
    let bus = h.bus("pubsub").await;
    let mut all = bus.subscribe(&format!("{t}.report.#")).await.unwrap();
    let mut one = bus.subscribe(&format!("{t}.report.*.n1")).await.unwrap();
    settle(&*bus, &mut all, &format!("{t}.report.probe.x")).await;
    settle(&*bus, &mut one, &format!("{t}.report.probe.n1")).await;
    while let Ok(Some(_)) = all.next_timeout(Duration::from_millis(100)).await {}

    for k in [
        "report.d1.n1",
        "report.d2.n2",
        "event.n1",
        "report.d1.n1.extra",
    ] {
        bus.publish(OutMessage::new(format!("{t}.{k}"), k.to_string()))
            .await
            .unwrap();
    }
    let mut got = BTreeSet::new();
    for _ in 0..3 {
        got.insert(text(&recv(&mut all).await));
    }
    assert_eq!(
        got,
        ["report.d1.n1", "report.d2.n2", "report.d1.n1.extra"]
            .map(String::from)
            .into()
    );
    assert_quiet(&mut all).await;
    let d = recv(&mut one).await;
    assert_eq!(text(&d), "report.d1.n1");
    assert_eq!(d.key, format!("{t}.report.d1.n1"));
    assert_quiet(&mut one).await;
    bus.close().await;
}

pub async fn node_queue_keeps_commands_while_consumer_away(h: &dyn Harness) {
    let t = uniq();
    let node = format!("{t}-node.example.com");
    let spec = QueueSpec::node_commands(&node);
    let broker = h.bus("sender").await;
    broker.declare_queue(&spec).await.unwrap();
    for i in 0..3 {
        broker
            .publish(OutMessage::new(
                gearshift_proto::routing::command(&node),
                format!("cmd{i}"),
            ))
            .await
            .unwrap();
    }
    // The node connects only now.
    let nodebus = h.bus("node").await;
    let mut sub = nodebus
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    for i in 0..3 {
        let d = recv(&mut sub).await;
        assert_eq!(text(&d), format!("cmd{i}"));
        assert!(!d.redelivered);
        d.ack().await.unwrap();
    }
    assert_quiet(&mut sub).await;
    drop(sub);
    // Gone while away again: a command published now waits for the next consumer.
    broker
        .publish(OutMessage::new(
            gearshift_proto::routing::command(&node),
            "later",
        ))
        .await
        .unwrap();
    let mut sub = nodebus
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "later");
    d.ack().await.unwrap();
    drop(sub);
    cleanup(&*nodebus, &spec).await;
    nodebus.close().await;
    broker.close().await;
}

/// Durable test queues are emptied so that a real broker keeps nothing; the
/// queue itself stays (bounded: one per test run).
pub(super) async fn cleanup(bus: &dyn gearshift_bus::Bus, spec: &QueueSpec) {
    if let Ok(mut sub) = bus.consume(spec, ConsumeOptions::default()).await {
        while let Ok(Some(d)) = sub.next_timeout(Duration::from_millis(200)).await {
            let _ = d.ack().await;
        }
    }
}

pub async fn nack_redelivers(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let bus = h.bus("nack").await;
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "work"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert!(!d.redelivered);
    d.nack(true).await.unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "work");
    assert!(
        d.redelivered,
        "a nacked message comes back marked redelivered"
    );
    // nack without requeue drops it.
    d.nack(false).await.unwrap();
    assert_quiet(&mut sub).await;
    drop(sub);
    bus.close().await;
}

pub async fn consumer_dying_before_ack_redelivers(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let a = h.bus("dies").await;
    let mut sub = a.consume(&spec, ConsumeOptions::default()).await.unwrap();
    a.publish(OutMessage::new(format!("{t}.cmd"), "important"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "important");
    // The consumer dies: its connection goes away without an ack.
    drop(d);
    drop(sub);
    a.close().await;

    let b = h.bus("survivor").await;
    let mut sub = b.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "important");
    assert!(d.redelivered);
    d.ack().await.unwrap();
    assert_quiet(&mut sub).await;
    drop(sub);
    b.close().await;
}

pub async fn confirmed_publishes_are_all_delivered(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.#")]);
    let bus = h.bus("confirms").await;
    bus.declare_queue(&spec).await.unwrap();
    let n = 200;
    let publishes = (0..n).map(|i| {
        let bus = bus.clone();
        let key = format!("{t}.m.{}", i % 7);
        async move { bus.publish(OutMessage::new(key, format!("{i}"))).await }
    });
    for r in futures::future::join_all(publishes).await {
        r.expect("every publish is confirmed");
    }
    let mut sub = bus
        .consume(&spec, ConsumeOptions { prefetch: 50 })
        .await
        .unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..n {
        let d = recv(&mut sub).await;
        got.insert(text(&d).parse::<u32>().unwrap());
        d.ack().await.unwrap();
    }
    assert_eq!(got, (0..n).collect());
    assert_quiet(&mut sub).await;
    drop(sub);
    bus.close().await;
}

pub async fn request_reply(h: &dyn Harness) {
    let t = uniq();
    let server = h.bus("server").await;
    let client = h.bus("client").await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.svc")]);
    let mut sub = server
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let srv = server.clone();
    let task = tokio::spawn(async move {
        while let Some(d) = sub.next().await {
            let to = d.reply_to.clone().expect("request carries reply_to");
            let mut reply = OutMessage::new(to.clone(), format!("pong:{}", text(&d))).transient();
            reply.correlation_id = d.correlation_id.clone();
            srv.send_to_queue(&to, reply).await.unwrap();
            d.ack().await.unwrap();
        }
    });
    for i in 0..5 {
        let r = client
            .request(
                OutMessage::new(format!("{t}.svc"), format!("ping{i}")),
                WAIT,
            )
            .await
            .unwrap();
        assert_eq!(text(&r), format!("pong:ping{i}"));
    }
    // Nobody answers on another key: a clear timeout.
    let e = client
        .request(
            OutMessage::new(format!("{t}.nobody"), "hello"),
            Duration::from_millis(300),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    task.abort();
    client.close().await;
    server.close().await;
}

pub async fn request_all_gathers_every_responder(h: &dyn Harness) {
    let t = uniq();
    let client = h.bus("client").await;
    let mut tasks = vec![];
    for name in ["a", "b", "c"] {
        let bus = h.bus(name).await;
        let mut sub = bus.subscribe(&format!("{t}.ping")).await.unwrap();
        settle(&*bus, &mut sub, &format!("{t}.ping")).await;
        tasks.push(tokio::spawn(async move {
            while let Some(d) = sub.next().await {
                if text(&d) == "probe" {
                    continue;
                }
                let to = d.reply_to.clone().unwrap();
                let mut reply = OutMessage::new(to.clone(), name).transient();
                reply.correlation_id = d.correlation_id.clone();
                bus.send_to_queue(&to, reply).await.unwrap();
            }
        }));
    }
    let replies = client
        .request_all(
            OutMessage::new(format!("{t}.ping"), "who is there"),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    let names: BTreeSet<String> = replies.iter().map(text).collect();
    assert_eq!(names, ["a", "b", "c"].map(String::from).into());
    for t in tasks {
        t.abort();
    }
    client.close().await;
}

pub async fn prefetch_bounds_unacked_deliveries(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.w")]);
    let bus = h.bus("prefetch").await;
    bus.declare_queue(&spec).await.unwrap();
    for i in 0..10 {
        bus.publish(OutMessage::new(format!("{t}.w"), format!("{i}")))
            .await
            .unwrap();
    }
    let mut sub = bus
        .consume(&spec, ConsumeOptions { prefetch: 3 })
        .await
        .unwrap();
    let mut held = vec![];
    for _ in 0..3 {
        held.push(recv(&mut sub).await);
    }
    // With three unacknowledged deliveries, the fourth must wait.
    assert_quiet(&mut sub).await;
    held.remove(0).ack().await.unwrap();
    held.push(recv(&mut sub).await);
    for d in held {
        d.ack().await.unwrap();
    }
    for _ in 4..10 {
        recv(&mut sub).await.ack().await.unwrap();
    }
    assert_quiet(&mut sub).await;
    drop(sub);
    bus.close().await;
}

pub async fn a_bounded_queue_keeps_the_newest(h: &dyn Harness) {
    let t = uniq();
    // One binding: on STOMP every further binding is one more consumer of
    // the queue, each with its own prefetch. On ActiveMQ the queue is a topic
    // subscription whose pending limit the broker applies (the policy that
    // `scripts/setup-activemq` writes; a broker started without it keeps
    // every message and this case fails).
    let spec = QueueSpec::transient(format!("gearshift.test.{t}"), vec![format!("{t}.w")])
        .with_max_length(3);
    let bus = h.bus("bounded").await;
    let mut sub = bus
        .consume(&spec, ConsumeOptions { prefetch: 1 })
        .await
        .unwrap();
    // Wait until the bindings are live, acknowledging every probe.
    let mut live = false;
    for _ in 0..50 {
        bus.publish(OutMessage::new(format!("{t}.w"), "probe"))
            .await
            .unwrap();
        if let Ok(Some(d)) = sub.next_timeout(Duration::from_millis(200)).await {
            d.ack().await.unwrap();
            live = true;
            break;
        }
    }
    assert!(live, "the bounded queue never became live");
    while let Ok(Some(d)) = sub.next_timeout(Duration::from_millis(200)).await {
        assert_eq!(text(&d), "probe");
        d.ack().await.unwrap();
    }
    // The consumer holds "0" (prefetch 1) while 1..=9 arrive: only the
    // newest three wait in the queue, the others were dropped from its head.
    for i in 0..10 {
        bus.publish(OutMessage::new(format!("{t}.w"), format!("{i}")))
            .await
            .unwrap();
    }
    let first = recv(&mut sub).await;
    assert_eq!(text(&first), "0");
    first.ack().await.unwrap();
    let mut rest = vec![];
    for _ in 0..3 {
        let d = recv(&mut sub).await;
        rest.push(text(&d));
        d.ack().await.unwrap();
    }
    assert_eq!(rest, ["7", "8", "9"]);
    assert_quiet(&mut sub).await;
    drop(sub);
    bus.close().await;
}

pub async fn oversized_and_invalid_inputs_are_refused(h: &dyn Harness) {
    let bus = h.bus("limits").await;
    let huge = Bytes::from(vec![b'x'; 64 * 1024 * 1024]);
    let e = bus
        .publish(OutMessage::new(format!("{}.big", uniq()), huge))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::TooLarge { .. }), "{e}");
    let e = bus
        .declare_queue(&QueueSpec::durable("", vec![]))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Invalid(_)), "{e}");
    // The connection is still usable afterwards.
    let t = uniq();
    let mut sub = bus.subscribe(&format!("{t}.ok")).await.unwrap();
    settle(&*bus, &mut sub, &format!("{t}.ok")).await;
    bus.close().await;
}

pub async fn recovery_after_broker_drops_every_connection(h: &dyn Harness) {
    let t = uniq();
    let bus = h.bus("recovery").await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut queue = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let mut topic = bus.subscribe(&format!("{t}.topic.#")).await.unwrap();
    settle(&*bus, &mut topic, &format!("{t}.topic.probe")).await;

    bus.publish(OutMessage::new(format!("{t}.cmd"), "in-flight"))
        .await
        .unwrap();
    let unacked = recv(&mut queue).await;
    assert_eq!(text(&unacked), "in-flight");

    h.drop_all_connections().await;
    wait_reconnected(&mut events, Duration::from_secs(15)).await;

    // Acking a delivery of the lost connection fails or is ignored; the
    // message itself comes back, marked redelivered.
    let _ = unacked.ack().await;
    let d = recv(&mut queue).await;
    assert_eq!(text(&d), "in-flight");
    assert!(d.redelivered);
    d.ack().await.unwrap();

    // Publishing, the durable consumer and the topic subscription all work again.
    bus.publish(OutMessage::new(format!("{t}.cmd"), "after"))
        .await
        .unwrap();
    let d = recv(&mut queue).await;
    assert_eq!(text(&d), "after");
    d.ack().await.unwrap();
    settle(&*bus, &mut topic, &format!("{t}.topic.again")).await;
    drop(queue);
    drop(topic);
    bus.close().await;
}

pub async fn settling_after_the_subscription_is_gone(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let bus = h.bus("late-ack").await;
    let mut events = bus.events();
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "late"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    drop(sub);
    // The application settles after it dropped the subscription. Either the
    // transport still settles it (the message is gone) or it refuses (the
    // message comes back); never both, never a broken connection.
    let acked = d.ack().await.is_ok();
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    match sub.next_timeout(Duration::from_secs(5)).await {
        Ok(Some(again)) => {
            assert!(!acked, "an acknowledged message was delivered again");
            assert_eq!(text(&again), "late");
            assert!(again.redelivered);
            again.ack().await.unwrap();
        }
        _ => assert!(acked, "a refused acknowledgement lost the message"),
    }
    // The broker never refused anything: no connection ended on an ERROR (a
    // transport may recycle its connection on purpose to get deliveries back),
    // and the bus still works.
    while let Ok(ev) = events.try_recv() {
        if let gearshift_bus::BusEvent::Disconnected { reason } = &ev {
            assert!(
                !reason.contains("ERROR"),
                "a late acknowledgement made the broker close the connection: {reason}"
            );
        }
    }
    bus.publish(OutMessage::new(format!("{t}.cmd"), "after"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "after");
    d.ack().await.unwrap();
    drop(sub);
    bus.close().await;
}
