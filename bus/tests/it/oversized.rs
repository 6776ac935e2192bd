//! An oversized message on a queue, followed by a good one, on every real
//! transport: the big one is settled and handed on as a `TooLarge` delivery
//! (size, key, headers, no body), the good one is delivered, and the
//! session is never lost.

use std::time::Duration;

use gearshift_bus::stomp::StompBus;
use gearshift_bus::stomp::parse::Limits;
use gearshift_bus::{Bus, BusEvent, BusUrl, ConsumeOptions, Delivery, OutMessage, QueueSpec};

use crate::conformance::harness::test_options;
use crate::rabbit::uniq;

const WAIT: Duration = Duration::from_secs(20);

async fn next(sub: &mut gearshift_bus::Subscription) -> Delivery {
    sub.next_timeout(WAIT)
        .await
        .expect("a delivery in time")
        .expect("the subscription goes on")
}

/// A consumer whose frame limit is 1 KiB, so that a 4 KiB message is over it.
async fn small_stomp_consumer(url: &str) -> StompBus {
    let limits = Limits {
        max_body: 1024,
        ..Limits::default()
    };
    match StompBus::connect_with(BusUrl::parse(url).unwrap(), test_options("small"), limits).await {
        Ok(b) => b,
        Err(e) => panic!(
            "cannot reach {} ({e}): run scripts/setup-rabbitmq and scripts/setup-activemq",
            gearshift_bus::url::redact(url)
        ),
    }
}

async fn stomp_case(url: &str) {
    let t = uniq();
    let node = format!("{t}.example.com");
    let spec = QueueSpec::node_commands(&node);
    let key = gearshift_proto::routing::command(&node);
    let consumer = small_stomp_consumer(url).await;
    let mut events = consumer.events();
    let mut sub = consumer
        .consume(&spec, ConsumeOptions { prefetch: 4 })
        .await
        .unwrap();
    let sender = gearshift_bus::connect(url, test_options("sender"))
        .await
        .unwrap();
    let mut big = OutMessage::new(key.clone(), vec![b'x'; 4096]);
    big.reply_to = Some("gearshift.reply.someone".into());
    big.correlation_id = Some("c-big".into());
    sender.publish(big).await.unwrap();
    sender
        .publish(OutMessage::new(key.clone(), "good"))
        .await
        .unwrap();

    let d = next(&mut sub).await;
    let tl = d.too_large.clone().expect("a too-large delivery");
    assert_eq!(tl.size, 4096);
    assert_eq!(tl.limit, 1024);
    assert!(d.payload.is_empty());
    assert_eq!(d.key, key);
    assert_eq!(d.correlation_id.as_deref(), Some("c-big"));
    assert!(d.reply_to.is_some(), "the sender's reply address is kept");
    assert!(tl.headers.iter().any(|(k, _)| k == "message-id"), "{tl:?}");
    d.ack().await.expect("settling it again is harmless");
    let d = next(&mut sub).await;
    assert_eq!(&d.payload[..], b"good");
    assert!(d.too_large.is_none());
    d.ack().await.unwrap();
    assert_eq!(consumer.health().too_large_total, 1);
    // Acknowledged: it does not come back, and the session was never lost.
    assert!(sub.next_timeout(Duration::from_millis(500)).await.is_err());
    while let Ok(ev) = events.try_recv() {
        assert!(!matches!(ev, BusEvent::Disconnected { .. }), "{ev:?}");
    }
    drop(sub);
    sender.close().await;
    consumer.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_rabbitmq_an_oversized_message_does_not_wedge_the_queue() {
    stomp_case(&crate::rabbit::stomp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stomp_activemq_an_oversized_message_does_not_wedge_the_queue() {
    stomp_case(&crate::activemq::url()).await;
}

/// Over AMQP the limit is [`gearshift_bus::amqp::MAX_PAYLOAD`] (16 MiB):
/// the big message is published with lapin directly, since the bus refuses
/// to send it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_an_oversized_message_does_not_wedge_the_queue() {
    use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
    let url = crate::rabbit::amqp_url();
    let t = uniq();
    let node = format!("{t}.example.com");
    let spec = QueueSpec::node_commands(&node);
    let key = gearshift_proto::routing::command(&node);
    let consumer = gearshift_bus::connect(&url, test_options("amqp-small"))
        .await
        .unwrap_or_else(|e| panic!("cannot reach RabbitMQ ({e}): run scripts/setup-rabbitmq"));
    let mut sub = consumer
        .consume(&spec, ConsumeOptions { prefetch: 2 })
        .await
        .unwrap();
    let conn = lapin::Connection::connect(&url, lapin::ConnectionProperties::default())
        .await
        .unwrap();
    let ch = conn.create_channel().await.unwrap();
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .unwrap();
    let size = gearshift_bus::amqp::MAX_PAYLOAD + 1;
    let props = lapin::BasicProperties::default().with_message_id("m-big".into());
    for body in [vec![b'x'; size], b"good".to_vec()] {
        ch.basic_publish(
            "gearshift".into(),
            key.as_str().into(),
            BasicPublishOptions::default(),
            &body,
            props.clone(),
        )
        .await
        .unwrap()
        .await
        .unwrap();
    }
    let d = next(&mut sub).await;
    let tl = d.too_large.clone().expect("a too-large delivery");
    assert_eq!(tl.size, size as u64);
    assert_eq!(d.key, key);
    assert!(
        tl.headers.contains(&("message-id".into(), "m-big".into())),
        "{tl:?}"
    );
    let d = next(&mut sub).await;
    assert_eq!(&d.payload[..], b"good");
    d.ack().await.unwrap();
    assert_eq!(consumer.health().too_large_total, 1);
    assert!(sub.next_timeout(Duration::from_millis(500)).await.is_err());
    drop(sub);
    let _ = conn.close(200, "done".into()).await;
    consumer.close().await;
    let _ = crate::rabbit::rabbitmqctl(&["-q", "delete_queue", &spec.name]).await;
}
