//! Outages: waiting through them, close, dropped subscriptions, publishing
//! across a reconnect, silent brokers, deleted queues.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_wait_for_the_reconnect_and_consumers_resume() {
    let t = uniq();
    let proxy = Proxy::start(broker_addr(), None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("outage")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let mut topic = bus.subscribe(&format!("{t}.topic.#")).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "before"))
        .await
        .unwrap();
    recv(&mut sub).await.ack().await.unwrap();

    proxy.cut();
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    assert!(matches!(ev, BusEvent::Disconnected { .. }));

    // Issued while the broker is unreachable: waits instead of failing.
    let b = bus.clone();
    let key = format!("{t}.cmd");
    let pending = tokio::spawn(async move { b.publish(OutMessage::new(key, "during")).await });
    let b = bus.clone();
    let key = format!("{t}.topic.x");
    let pending_topic =
        tokio::spawn(async move { b.publish(OutMessage::new(key, "topic").transient()).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !pending.is_finished(),
        "publish must wait for the reconnect"
    );
    proxy.restore();

    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    assert_eq!(ev, BusEvent::Connected { reconnects: 1 });
    tokio::time::timeout(WAIT, pending)
        .await
        .expect("publish finishes after the reconnect")
        .unwrap()
        .expect("publish confirmed after the reconnect");
    tokio::time::timeout(WAIT, pending_topic)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut d = recv(&mut sub).await;
    if text(&d) == "before" {
        // Its ack was written just before the cut and may never have reached
        // the broker: then it comes again, marked redelivered.
        assert!(d.redelivered);
        d.ack().await.unwrap();
        d = recv(&mut sub).await;
    }
    assert_eq!(text(&d), "during");
    d.ack().await.unwrap();
    let d = recv(&mut topic).await;
    assert_eq!(text(&d), "topic");
    drop(sub);
    drop(topic);
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_fail_after_op_timeout_while_the_broker_stays_away() {
    let proxy = Proxy::start(broker_addr(), None).await;
    let opts = ConnectOptions {
        op_timeout: Duration::from_millis(600),
        ..options("away")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let mut events = bus.events();
    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    let started = std::time::Instant::now();
    let e = bus
        .publish(OutMessage::new(format!("{}.x", uniq()), "lost"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(5));
    let e = bus
        .declare_queue(&QueueSpec::durable(
            format!("gearshift.test.{}", uniq()),
            vec![],
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    let e = bus.subscribe("whatever.#").await.unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_fails_pending_operations_ends_subscriptions_and_never_reconnects() {
    let t = uniq();
    let proxy = Proxy::start(broker_addr(), None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("close")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let mut topic = bus.subscribe(&format!("{t}.#")).await.unwrap();

    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    let b = bus.clone();
    let key = format!("{t}.cmd");
    let pending = tokio::spawn(async move { b.publish(OutMessage::new(key, "never")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    bus.close().await;
    let r = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert!(matches!(r, Err(BusError::Closed)), "{r:?}");
    assert!(matches!(sub.next_timeout(WAIT).await, Ok(None)));
    assert!(matches!(topic.next_timeout(WAIT).await, Ok(None)));
    let e = bus
        .publish(OutMessage::new(format!("{t}.cmd"), "after"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Closed), "{e}");
    assert!(!e.is_retryable());
    let e = bus.subscribe(&format!("{t}.#")).await.unwrap_err();
    assert!(matches!(e, BusError::Closed), "{e}");

    // The broker comes back: a closed bus stays closed.
    let before = proxy.accepted();
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.accepted(), before, "a closed bus must not reconnect");

    // Clean up the durable test queue.
    let direct = connect(&broker_url(), options("close-cleanup")).await;
    drain(&*direct, &spec).await;
    direct.close().await;
}

async fn drain(bus: &dyn gearshift_bus::Bus, spec: &QueueSpec) -> Vec<String> {
    let mut out = vec![];
    if let Ok(mut sub) = bus.consume(spec, ConsumeOptions { prefetch: 500 }).await {
        while let Ok(Some(d)) = sub.next_timeout(Duration::from_millis(500)).await {
            out.push(text(&d));
            let _ = d.ack().await;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_subscriptions_are_not_restored_after_a_reconnect() {
    let t = uniq();
    let proxy = Proxy::start(broker_addr(), None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("dropped")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let transient = QueueSpec {
        name: format!("gearshift.test.{t}.transient"),
        bindings: vec![format!("{t}.watch")],
        durability: Durability::Transient,
        max_length: None,
        single_active_consumer: false,
    };
    let durable_sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let transient_sub = bus
        .consume(&transient, ConsumeOptions::default())
        .await
        .unwrap();
    assert!(queue_names().await.contains(&transient.name));
    drop(durable_sub);
    drop(transient_sub);
    // Let the cancellation reach the broker.
    tokio::time::sleep(Duration::from_millis(300)).await;

    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    proxy.restore();
    wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;

    // Had the dropped consumer come back, it would take about half of these
    // and hold them unacknowledged: another consumer must get every one.
    for i in 0..6 {
        bus.publish(OutMessage::new(format!("{t}.cmd"), format!("{i}")))
            .await
            .unwrap();
    }
    let other = connect(&broker_url(), options("dropped-other")).await;
    let mut sub = other
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..6 {
        let d = recv(&mut sub).await;
        assert!(!d.redelivered, "nobody else held {}", text(&d));
        got.insert(text(&d));
        d.ack().await.unwrap();
    }
    assert_eq!(got.len(), 6);
    // The transient queue went with its consumer and was not declared again.
    assert!(!queue_names().await.contains(&transient.name));
    drop(sub);
    other.close().await;
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_while_publishing_loses_no_confirmed_message() {
    let t = uniq();
    let proxy = Proxy::start(broker_addr(), None).await;
    let opts = ConnectOptions {
        op_timeout: Duration::from_secs(10),
        ..options("publisher")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let direct = connect(&broker_url(), options("publisher-check")).await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.#")]);
    direct.declare_queue(&spec).await.unwrap();

    let tasks = 8;
    let per_task = 150;
    let not_confirmed = Arc::new(AtomicUsize::new(0));
    let mut handles = vec![];
    for w in 0..tasks {
        let bus = bus.clone();
        let t = t.clone();
        let nc = not_confirmed.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let id = format!("{w}-{i}");
                let mut tries = 0;
                loop {
                    match bus
                        .publish(OutMessage::new(format!("{t}.m.{w}"), id.clone()))
                        .await
                    {
                        Ok(()) => break,
                        Err(e) if e.is_retryable() && tries < 20 => {
                            tries += 1;
                            nc.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("publish {id}: {e}"),
                    }
                }
            }
        }));
    }
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.restore();
    }
    for h in handles {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("publishers finish")
            .unwrap();
    }
    let got: BTreeSet<String> = drain(&*direct, &spec).await.into_iter().collect();
    let want: BTreeSet<String> = (0..tasks)
        .flat_map(|w| (0..per_task).map(move |i| format!("{w}-{i}")))
        .collect();
    let missing: Vec<_> = want.difference(&got).take(10).collect();
    assert!(
        missing.is_empty(),
        "confirmed but never delivered: {missing:?}"
    );
    println!(
        "{} confirmed publishes across 2 outages; {} attempts needed a retry",
        want.len(),
        not_confirmed.load(Ordering::SeqCst)
    );
    bus.close().await;
    direct.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptive_subscriptions_survive_repeated_connection_drops() {
    let t = uniq();
    let bus = connect(&broker_url(), options("repeated")).await;
    let server = connect(&broker_url(), options("repeated-server")).await;
    let mut events = bus.events();
    let mut server_events = server.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    // A responder on a topic subscription; requests use the bus's reply queue.
    let mut requests = server.subscribe(&format!("{t}.svc")).await.unwrap();
    let srv = server.clone();
    let responder = tokio::spawn(async move {
        while let Some(d) = requests.next().await {
            let Some(to) = d.reply_to.clone() else {
                continue;
            };
            let mut reply = OutMessage::new(to.clone(), format!("re:{}", text(&d))).transient();
            reply.correlation_id = d.correlation_id.clone();
            let _ = srv.send_to_queue(&to, reply).await;
        }
    });
    let r = bus
        .request(OutMessage::new(format!("{t}.svc"), "r0"), WAIT)
        .await
        .unwrap();
    assert_eq!(text(&r), "re:r0");
    for round in 1..=3u64 {
        rabbitmqctl(&["close_all_connections", "gearshift amqp test"]).await;
        let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
        assert_eq!(ev, BusEvent::Connected { reconnects: round });
        wait_event(&mut server_events, |e| {
            matches!(e, BusEvent::Connected { .. })
        })
        .await;
        bus.publish(OutMessage::new(format!("{t}.cmd"), format!("r{round}")))
            .await
            .unwrap();
        let d = recv(&mut sub).await;
        assert_eq!(text(&d), format!("r{round}"));
        d.ack().await.unwrap();
        // The reply queue (same name, exclusive) and the responder's
        // subscription were restored.
        let r = bus
            .request(
                OutMessage::new(format!("{t}.svc"), format!("r{round}")),
                WAIT,
            )
            .await
            .unwrap();
        assert_eq!(text(&r), format!("re:r{round}"));
    }
    responder.abort();
    drop(sub);
    bus.close().await;
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_is_detected_by_heartbeats() {
    let t = uniq();
    let proxy = Proxy::start(broker_addr(), None).await;
    let opts = ConnectOptions {
        heartbeat: Duration::from_secs(1),
        ..options("heartbeat")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let mut events = bus.events();
    let mut topic = bus.subscribe(&format!("{t}.#")).await.unwrap();
    proxy.freeze();
    let frozen = std::time::Instant::now();
    // lapin gives up after two heart-beat intervals without a frame.
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    println!(
        "silent broker detected after {:?}: {ev:?}",
        frozen.elapsed()
    );
    proxy.restore();
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    assert_eq!(ev, BusEvent::Connected { reconnects: 1 });
    bus.publish(OutMessage::new(format!("{t}.after"), "after").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut topic).await), "after");
    drop(topic);
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_come_back_when_an_operator_deletes_their_queue() {
    let t = uniq();
    let bus = connect(&broker_url(), options("deleted")).await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "first"))
        .await
        .unwrap();
    recv(&mut sub).await.ack().await.unwrap();

    // The broker cancels our consumer when its queue goes.
    rabbitmqctl(&["delete_queue", &spec.name]).await;
    // The queue and its binding are declared again and the consumer restarted.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if queue_names().await.contains(&spec.name) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted queue was not declared again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bus.publish(OutMessage::new(format!("{t}.cmd"), "second"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "second");
    d.ack().await.unwrap();
    drop(sub);
    bus.close().await;
}
