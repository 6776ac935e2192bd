//! A single-active-consumer queue: one consumer at a time receives, and
//! another takes over when the active one's connection closes (what the
//! broker agents' leader election stands on).

use gearshift_bus::{BusError, ConsumeOptions, OutMessage, QueueSpec, Subscription};

use super::cases::{assert_quiet, recv, text};
use super::harness::Harness;
use crate::rabbit::uniq;

/// Receives `n` messages on `sub`, acking each, and returns their texts.
async fn take(sub: &mut Subscription, n: usize) -> Vec<String> {
    let mut got = vec![];
    for _ in 0..n {
        let d = recv(sub).await;
        got.push(text(&d));
        d.ack().await.unwrap();
    }
    got
}

pub async fn single_active_consumer_hands_over(h: &dyn Harness) {
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.token")])
        .with_single_active_consumer();
    let a = h.bus("first").await;
    let b = h.bus("second").await;
    let opts = ConsumeOptions { prefetch: 4 };
    if !h.quirks().single_active_consumer {
        // Refused with a reason, never a queue where every consumer receives.
        match a.consume(&spec, opts).await {
            Err(BusError::Invalid(why)) => assert!(why.contains("single active"), "{why}"),
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
        }
        a.close().await;
        b.close().await;
        return;
    }
    let mut sa = a.consume(&spec, opts).await.unwrap();
    // The first consumer is active before the second subscribes.
    a.publish(OutMessage::new(format!("{t}.token"), "0"))
        .await
        .unwrap();
    assert_eq!(take(&mut sa, 1).await, ["0"]);
    let mut sb = b.consume(&spec, opts).await.unwrap();
    for i in 1..=6 {
        b.publish(OutMessage::new(format!("{t}.token"), i.to_string()))
            .await
            .unwrap();
    }
    assert_eq!(take(&mut sa, 6).await, ["1", "2", "3", "4", "5", "6"]);
    assert_quiet(&mut sb).await;
    // The active consumer's connection ends: the other one takes over.
    drop(sa);
    a.close().await;
    for i in 7..=9 {
        b.publish(OutMessage::new(format!("{t}.token"), i.to_string()))
            .await
            .unwrap();
    }
    assert_eq!(take(&mut sb, 3).await, ["7", "8", "9"]);
    drop(sb);
    b.close().await;
}
