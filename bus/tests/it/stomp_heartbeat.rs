//! Heart-beats both ways, with an in-process broker and paused time: a
//! broker that falls silent is declared dead after three of its intervals and the
//! bus reconnects; a healthy one is never dropped; we keep sending EOLs.

use crate::stomp_support;

use std::time::Duration;

use gearshift_bus::{BusEvent, ConnectOptions, OutMessage};
use stomp_support::FakeBroker;
use tokio::time::{Instant, timeout};

fn options() -> ConnectOptions {
    ConnectOptions {
        name: "heartbeat-test".into(),
        heartbeat: Duration::from_secs(1),
        reconnect_min: Duration::from_millis(100),
        reconnect_max: Duration::from_millis(200),
        op_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

#[tokio::test(start_paused = true)]
async fn silent_broker_is_detected_by_the_heart_beat_timer() {
    let broker = FakeBroker::start("1000,1000", None).await;
    let bus = gearshift_bus::connect(&broker.url("stomp"), options())
        .await
        .expect("connect to the fake broker");
    let mut events = bus.events();

    // Healthy: ten seconds of heart-beats both ways, no disconnection.
    let quiet = timeout(Duration::from_secs(10), events.recv()).await;
    assert!(quiet.is_err(), "unexpected event {quiet:?}");
    let sent = broker.heartbeats_in();
    assert!(
        (10..=25).contains(&sent),
        "we promised an EOL at least every second: {sent} in 10 s"
    );

    // The broker stops writing anything on this connection.
    broker.silence(1);
    let silent_since = Instant::now();
    // A publish made now gets no receipt on the dead connection; it must be
    // sent again on the next one and only then return.
    let publisher = {
        let bus = bus.clone();
        tokio::spawn(async move { bus.publish(OutMessage::new("during.silence", "x")).await })
    };
    let ev = timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("the silent broker must be noticed")
        .unwrap();
    let noticed_after = silent_since.elapsed();
    match ev {
        BusEvent::Disconnected { reason } => assert!(reason.contains("heart-beat"), "{reason}"),
        other => panic!("expected Disconnected, got {other:?}"),
    }
    // Three times the broker's 1 s interval, counted from the last byte it
    // sent (at most half an interval before the silence began).
    assert!(
        noticed_after >= Duration::from_millis(2400)
            && noticed_after <= Duration::from_millis(3100),
        "declared dead after {noticed_after:?}"
    );
    // We kept sending while the broker was silent.
    assert!(
        broker.heartbeats_in() > sent,
        "no heart-beat sent to the silent broker"
    );

    // A new connection (not silent) is made and reported.
    match timeout(Duration::from_secs(10), events.recv()).await {
        Ok(Ok(BusEvent::Connected { reconnects })) => assert_eq!(reconnects, 1),
        other => panic!("expected Connected, got {other:?}"),
    }
    assert_eq!(broker.connections(), 2);
    publisher
        .await
        .unwrap()
        .expect("the publish is confirmed on the new connection");
    let sends: Vec<usize> = broker
        .state
        .frames
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, f)| f.get("destination") == Some("/exchange/gearshift/during.silence"))
        .map(|(conn, _)| *conn)
        .collect();
    assert_eq!(
        sends,
        vec![1, 2],
        "sent on the silent connection, then again"
    );
    // And it works.
    bus.publish(OutMessage::new("after.reconnect", "x"))
        .await
        .expect("publish after reconnect");
    bus.close().await;
}

#[tokio::test(start_paused = true)]
async fn no_heart_beats_when_the_broker_declines_them() {
    let broker = FakeBroker::start("0,0", None).await;
    let bus = gearshift_bus::connect(&broker.url("stomp"), options())
        .await
        .unwrap();
    let mut events = bus.events();
    // A minute of silence from both sides is fine when nobody asked for heart-beats.
    let quiet = timeout(Duration::from_secs(60), events.recv()).await;
    assert!(quiet.is_err(), "unexpected event {quiet:?}");
    assert_eq!(broker.heartbeats_in(), 0);
    bus.close().await;
}
