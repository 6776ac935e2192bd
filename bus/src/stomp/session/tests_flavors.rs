//! The session's refusal backoff, oversized messages, and what differs on
//! ActiveMQ, with a made-up clock (the helpers are in `tests`).

use super::tests::{MS, S, T, call};
use super::*;
use crate::api::BusEvent;

fn error_for(receipt: &str, text: &str) -> Frame {
    Frame::new(Command::Error)
        .header("receipt-id", receipt)
        .header("message", text)
}

fn receipt_of(f: &Frame) -> String {
    f.get("receipt").expect("a receipt").to_string()
}

#[test]
fn a_refused_destination_holds_further_attempts_for_its_backoff() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.subscribe(1, true, call(1));
    let (r, o) = t.frame(error_for(&receipt_of(&o.frames[0]), "not authorized"));
    assert!(r.is_ok(), "ActiveMQ keeps the connection");
    assert_eq!(o.failed().len(), 1);
    assert_eq!(o.ended, vec![1]);
    let h = t.s.health();
    assert_eq!(h.refused_total, 1);
    assert_eq!(h.refusing[0].destination, "/queue/q");
    assert!(h.is_degraded());
    // A caller that tries again at once reaches the broker only after the backoff.
    let o = t.subscribe(2, true, call(2));
    assert!(o.frames.is_empty(), "held: {:?}", o.commands());
    let due = t.s.next_deadline().expect("a timer for the held batch");
    assert!(due >= t.now + MS(100) && due <= t.now + MS(120), "{due:?}");
    // Other destinations are not held.
    assert_eq!(t.publish(call(3)).commands(), vec![Command::Send]);
    t.advance(MS(120));
    t.s.timer(t.now).unwrap();
    let o = t.outs();
    assert_eq!(o.commands(), vec![Command::Subscribe]);
    // Refused again: the next wait is longer.
    let (_, o2) = t.frame(error_for(&receipt_of(&o.frames[0]), "not authorized"));
    assert_eq!(o2.failed().len(), 1);
    let o = t.subscribe(3, true, call(4));
    assert!(o.frames.is_empty());
    let due = t.s.next_deadline().unwrap();
    assert!(due >= t.now + MS(200), "{due:?}");
    // A caller that gave up meanwhile is not sent at all.
    let gone = call(5);
    t.subscribe(4, true, gone.clone());
    gone.gone.set(true);
    t.advance(MS(300));
    t.s.timer(t.now).unwrap();
    let o = t.outs();
    assert_eq!(
        o.commands(),
        vec![Command::Subscribe],
        "only the live caller"
    );
    // Accepted at last: the refusal is forgotten.
    assert_eq!(t.confirm(&o.frames).ok(), vec![4]);
    assert!(t.s.health().refusing.is_empty());
    assert_eq!(t.s.health().refused_total, 2);
}

#[test]
fn a_subscription_refused_while_restoring_is_retried_without_holding_the_rest() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.subscribe_to(1, true, call(1), "/queue/a");
    t.confirm(&o.frames);
    let o = t.subscribe_to(2, false, call(2), "/queue/b");
    t.confirm(&o.frames);
    t.lose("broker restart");
    t.publish(call(3));
    let o = t.reconnect();
    assert_eq!(o.frames.len(), 2, "both restored");
    // The broker now refuses the first one (its rights were taken away).
    let (r, o1) = t.frame(error_for(&receipt_of(&o.frames[0]), "not authorized"));
    assert!(r.is_ok());
    assert!(o1.ended.is_empty(), "the subscription stays");
    let o2 = t.confirm(&o.frames[1..]);
    assert_eq!(o2.events, vec![BusEvent::Connected { reconnects: 1 }]);
    assert_eq!(
        o2.commands(),
        vec![Command::Send],
        "the queued call goes out"
    );
    assert!(t.s.health().connected);
    assert_eq!(t.s.health().refusing.len(), 1);
    // After the backoff the SUBSCRIBE is sent again, under the same id.
    t.advance(MS(130));
    t.s.timer(t.now).unwrap();
    let o = t.outs();
    assert_eq!(o.commands(), vec![Command::Subscribe]);
    assert_eq!(o.frames[0].get("id"), Some("s1.0"));
    let (_, o3) = t.frame(error_for(&receipt_of(&o.frames[0]), "not authorized"));
    assert!(o3.ended.is_empty());
    t.advance(MS(250));
    t.s.timer(t.now).unwrap();
    let o = t.outs();
    assert_eq!(o.commands(), vec![Command::Subscribe]);
    t.confirm(&o.frames);
    assert!(t.s.health().refusing.is_empty());
    assert_eq!(t.message(1, "m1").1.delivered.len(), 1);
}

#[test]
fn on_rabbitmq_an_error_without_receipt_ends_the_connection_and_is_counted() {
    let mut t = T::new();
    let (r, _) = t.frame(Frame::new(Command::Error).header("message", "not_found"));
    assert!(r.is_err());
    assert_eq!(t.s.health().refused_total, 1);
}

#[test]
fn on_activemq_an_error_without_receipt_keeps_the_connection() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.publish(call(1));
    let (r, o2) = t.frame(
        Frame::new(Command::Error)
            .header("message", "Unexpected ACK received for message-id [null]"),
    );
    assert!(r.is_ok());
    assert!(o2.finished.is_empty());
    assert_eq!(t.confirm(&o.frames).ok(), vec![1]);
    assert_eq!(t.s.health().refused_total, 1);
}

#[test]
fn on_activemq_a_requeue_renews_the_subscription() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.subscribe(3, true, call(1));
    t.confirm(&o.frames);
    let m1 = t.message(3, "m1").1.delivered.remove(0);
    let m2 = t.message(3, "m2").1.delivered.remove(0);
    let o = t.settle(&m1, Verdict::Nack { requeue: true }, Some(call(2)));
    assert_eq!(
        o.commands(),
        vec![Command::Unsubscribe, Command::Subscribe],
        "no NACK: ActiveMQ would dead-letter it"
    );
    assert_eq!(o.frames[0].get("id"), Some("s3.0"));
    let new_id = o.frames[1].get("id").unwrap().to_string();
    assert_ne!(new_id, "s3.0");
    assert_eq!(o.frames[1].get("destination"), Some("/queue/q"));
    assert_eq!(t.confirm(&o.frames).ok(), vec![2]);
    // The other delivery comes back too: its old handle is refused locally.
    let o = t.settle(&m2, Verdict::Ack, Some(call(3)));
    assert!(o.frames.is_empty());
    assert_eq!(o.failed().len(), 1);
    // Late MESSAGEs of the old subscription are ignored; the new one delivers.
    assert!(t.message(3, "late").1.delivered.is_empty());
    let (_, o) = t.frame(
        Frame::new(Command::Message)
            .header("subscription", new_id.clone())
            .header("destination", "/queue/q")
            .header("ack", "m1-again")
            .header("redelivered", "true"),
    );
    assert_eq!(o.delivered.len(), 1);
    assert_eq!(o.delivered[0].sub, 3);
    // Restored under the new id after a reconnect; a second requeue renews again.
    t.lose("gone");
    let o = t.reconnect();
    assert_eq!(o.frames[0].get("id"), Some(new_id.as_str()));
    t.confirm(&o.frames);
    // Unsettled deliveries of a cancelled subscription need no recycling.
    let o = t.request(Request::Unsubscribe { key: 3 });
    assert!(t.receipt(&receipt_of(&o.frames[0])).0.is_ok());
}

#[test]
fn on_activemq_nack_without_requeue_is_a_nack() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.subscribe(3, true, call(1));
    t.confirm(&o.frames);
    let m = t.message(3, "m1").1.delivered.remove(0);
    let o = t.settle(&m, Verdict::Nack { requeue: false }, Some(call(2)));
    assert_eq!(o.commands(), vec![Command::Nack]);
}

#[test]
fn an_oversized_message_is_acknowledged_and_handed_on_without_its_body() {
    for manual in [true, false] {
        let mut t = T::new();
        let o = t.subscribe(5, manual, call(1));
        t.confirm(&o.frames);
        let head = Frame::new(Command::Message)
            .header("subscription", "s5.0")
            .header("destination", "/queue/q")
            .header("ack", "big-1")
            .header("reply-to", "gearshift.reply.x");
        let r = t.s.received(
            Item::TooLarge {
                frame: head,
                size: 20_000_000,
            },
            t.now,
        );
        assert!(r.is_ok());
        let o = t.outs();
        assert_eq!(o.commands(), vec![Command::Ack]);
        assert_eq!(o.frames[0].get("id"), Some("big-1"));
        assert_eq!(o.frames[0].get("receipt"), None);
        assert_eq!(o.delivered.len(), 1);
        assert_eq!(o.delivered[0].too_large, Some(20_000_000));
        assert_eq!(o.delivered[0].ack, AckBy::Nobody);
        assert_eq!(t.s.health().too_large_total, 1);
        // The session goes on: the next message is an ordinary delivery.
        let (r, o) = t.message(5, "m2");
        assert!(r.is_ok());
        assert_eq!(o.delivered[0].too_large, None);
        // Nothing of the big one is pending: dropping the subscription
        // leaves nothing to give back but the ordinary delivery.
        if manual {
            let o = t.settle(&o.delivered[0], Verdict::Ack, None);
            assert_eq!(o.commands(), vec![Command::Ack]);
            let o = t.request(Request::Unsubscribe { key: 5 });
            assert!(
                t.receipt(&receipt_of(&o.frames[0])).0.is_ok(),
                "nothing stranded"
            );
        }
    }
}

#[test]
fn the_timer_covers_held_batches_only_while_connected() {
    let mut t = T::flavored(HeartBeats::default(), StompFlavor::ActiveMq);
    let o = t.subscribe(1, true, call(1));
    assert!(
        t.frame(error_for(&receipt_of(&o.frames[0]), "no"))
            .0
            .is_ok()
    );
    t.subscribe(2, true, call(2));
    assert!(t.s.next_deadline().is_some());
    t.lose("gone");
    assert_eq!(t.s.next_deadline(), None);
    // Held across the loss; sent once its backoff is over on the new connection.
    let o = t.reconnect();
    assert!(o.frames.is_empty());
    t.advance(S(1));
    t.s.timer(t.now).unwrap();
    assert_eq!(t.outs().commands(), vec![Command::Subscribe]);
    // Closing fails what is still held.
    let o = t.subscribe(3, true, call(3));
    assert!(
        t.frame(error_for(&receipt_of(&o.frames[0]), "no"))
            .0
            .is_ok()
    );
    t.subscribe(4, true, call(4));
    t.s.close();
    let o = t.outs();
    assert!(
        o.failed()
            .iter()
            .any(|(id, e)| *id == 4 && matches!(e, BusError::Closed))
    );
}
