//! Cases about what a queue keeps and gives back, where brokers differ
//! ([`super::harness::Quirks`]).

use std::collections::BTreeSet;

use gearshift_bus::{ConsumeOptions, Delivery, OutMessage, QueueSpec};

use super::cases::{assert_quiet, cleanup, recv, text};
use super::harness::Harness;
use crate::rabbit::uniq;

/// Two deliveries held, one requeued: RabbitMQ (and the memory transport)
/// gives back that one; ActiveMQ gives back both (its NACK never requeues,
/// so the transport subscribes again), and the other's old handle refuses
/// to settle. Either way nothing is lost and nothing is settled twice.
pub async fn requeue_and_the_other_unsettled_deliveries(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let bus = h.bus("requeue").await;
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    for m in ["one", "two"] {
        bus.publish(OutMessage::new(format!("{t}.cmd"), m))
            .await
            .unwrap();
    }
    let first = recv(&mut sub).await;
    let second = recv(&mut sub).await;
    let (nacked, other) = if text(&first) == "one" {
        (first, second)
    } else {
        (second, first)
    };
    nacked.nack(true).await.unwrap();
    let mut again = vec![recv(&mut sub).await];
    if h.quirks().requeue_returns_every_unsettled {
        again.push(recv(&mut sub).await);
        assert!(
            other.ack().await.is_err(),
            "the old handle of a delivery that came back cannot settle it"
        );
        let names: BTreeSet<String> = again.iter().map(text).collect();
        assert_eq!(names, ["one", "two"].map(String::from).into());
    } else {
        assert_eq!(text(&again[0]), "one");
        other.ack().await.unwrap();
    }
    for d in again {
        assert!(d.redelivered, "{d:?}");
        d.ack().await.unwrap();
    }
    assert_quiet(&mut sub).await;
    drop(sub);
    bus.close().await;
}

/// `Delivery::ack_all` (one cumulative ack per consumer on AMQP) settles
/// exactly the deliveries it is given, in whatever order they are listed:
/// the later ones, unsettled when the consumer goes away, come again.
pub async fn ack_all_settles_its_batch_and_nothing_after_it(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.r")]);
    let bus = h.bus("ack-all").await;
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    for m in ["one", "two", "three", "four", "five"] {
        bus.publish(OutMessage::new(format!("{t}.r"), m))
            .await
            .unwrap();
    }
    let mut got = vec![];
    for _ in 0..5 {
        got.push(recv(&mut sub).await);
    }
    let mut rest = got.split_off(3);
    // The first batch listed latest first, the second of one delivery.
    got.reverse();
    Delivery::ack_all(got).await.unwrap();
    Delivery::ack_all(vec![rest.remove(0)]).await.unwrap();
    // "five" is held, unsettled, when the consumer goes away.
    drop(sub);
    drop(rest);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let again = recv(&mut sub).await;
    assert_eq!(text(&again), "five");
    assert!(again.redelivered, "{again:?}");
    Delivery::ack_all(vec![again]).await.unwrap();
    assert_quiet(&mut sub).await;
    drop(sub);
    cleanup(&*bus, &spec).await;
    bus.close().await;
}

/// The broker agent's event queue: declared while nobody consumes it, it
/// keeps what is published under every key it is bound to, and each
/// delivery carries the key it was published with (on ActiveMQ, from
/// `original-destination`: the consumer queue's own name holds the pattern).
pub async fn a_durable_queue_keeps_what_is_published_before_its_first_consumer(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(
        format!("gearshift.test.{t}.events"),
        vec![format!("{t}.event.#"), format!("{t}.admin.request")],
    );
    let publisher = h.bus("events-publisher").await;
    publisher.declare_queue(&spec).await.unwrap();
    let keys = [
        format!("{t}.event.n1%2Eexample%2Ecom"),
        format!("{t}.event.n2.deeper"),
        format!("{t}.admin.request"),
    ];
    for k in &keys {
        publisher
            .publish(OutMessage::new(k.clone(), k.clone()).transient())
            .await
            .unwrap();
    }
    // Not bound: never reaches the queue.
    publisher
        .publish(OutMessage::new(format!("{t}.report.d.n1"), "no"))
        .await
        .unwrap();
    publisher.close().await;

    let consumer = h.bus("events-consumer").await;
    let mut sub = consumer
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..keys.len() {
        let d = recv(&mut sub).await;
        assert_eq!(d.key, text(&d), "the delivery carries its routing key");
        got.insert(d.key.clone());
        d.ack().await.unwrap();
    }
    assert_eq!(got, keys.iter().cloned().collect());
    assert_quiet(&mut sub).await;
    drop(sub);
    cleanup(&*consumer, &spec).await;
    consumer.close().await;
}
