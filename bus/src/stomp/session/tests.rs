//! The session machine with a made-up clock and no socket: what it writes,
//! whom it answers, what it hands out, and when its timers fire.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use super::*;
use crate::api::BusEvent;
use crate::backoff::Backoff;

/// A caller that can give up.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub(super) id: u32,
    pub(super) gone: Rc<Cell<bool>>,
}

impl Caller for Call {
    fn gave_up(&self) -> bool {
        self.gone.get()
    }
}

pub(super) fn call(id: u32) -> Call {
    Call {
        id,
        gone: Rc::new(Cell::new(false)),
    }
}

pub(super) const S: fn(u64) -> Duration = Duration::from_secs;
pub(super) const MS: fn(u64) -> Duration = Duration::from_millis;

/// What came out of one step, sorted by kind.
#[derive(Default)]
pub(super) struct Outs {
    pub(super) frames: Vec<Frame>,
    pub(super) beats: usize,
    pub(super) finished: Vec<(u32, Result<(), BusError>)>,
    pub(super) delivered: Vec<Message>,
    pub(super) ended: Vec<u64>,
    pub(super) events: Vec<BusEvent>,
}

impl Outs {
    pub(super) fn ok(&self) -> Vec<u32> {
        self.finished
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(id, _)| *id)
            .collect()
    }

    pub(super) fn failed(&self) -> Vec<(u32, &BusError)> {
        self.finished
            .iter()
            .filter_map(|(id, r)| r.as_ref().err().map(|e| (*id, e)))
            .collect()
    }

    pub(super) fn commands(&self) -> Vec<Command> {
        self.frames.iter().map(|f| f.command).collect()
    }
}

pub(super) struct T {
    pub(super) s: StompSession<Call>,
    pub(super) now: Instant,
}

impl T {
    /// Connected, without heart-beats.
    pub(super) fn new() -> T {
        Self::with(HeartBeats::default())
    }

    pub(super) fn with(hb: HeartBeats) -> T {
        Self::flavored(hb, StompFlavor::RabbitMq)
    }

    pub(super) fn flavored(hb: HeartBeats, flavor: StompFlavor) -> T {
        let mut t = T {
            s: StompSession::new("broker:61613", flavor, Backoff::new(MS(100), S(1))),
            now: Instant::now(),
        };
        t.s.connected(hb, t.now);
        assert!(t.outs().frames.is_empty());
        t
    }

    pub(super) fn outs(&mut self) -> Outs {
        let mut o = Outs::default();
        while let Some(out) = self.s.poll_output() {
            match out {
                Output::Write(Item::Frame(f)) => o.frames.push(f),
                Output::Write(Item::HeartBeat) => o.beats += 1,
                Output::Write(Item::TooLarge { .. }) => panic!("the session wrote a skipped frame"),
                Output::Finish(c, r) => o.finished.push((c.id, r)),
                Output::Deliver(m) => o.delivered.push(m),
                Output::Ended(k) => o.ended.push(k),
                Output::Event(e) => o.events.push(e),
            }
        }
        o
    }

    pub(super) fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    pub(super) fn request(&mut self, r: Request<Call>) -> Outs {
        self.s.request(r, self.now);
        self.outs()
    }

    pub(super) fn publish(&mut self, c: Call) -> Outs {
        let send = Frame::new(Command::Send).header("destination", "/exchange/gearshift/k");
        self.request(Request::Batch(Batch::new(vec![send], c)))
    }

    pub(super) fn subscribe(&mut self, key: u64, manual: bool, c: Call) -> Outs {
        self.subscribe_to(key, manual, c, "/queue/q")
    }

    pub(super) fn subscribe_to(&mut self, key: u64, manual: bool, c: Call, dest: &str) -> Outs {
        let frames = vec![
            Frame::new(Command::Subscribe)
                .header("id", format!("s{key}.0"))
                .header("destination", dest),
        ];
        let mut batch = Batch::new(frames.clone(), c);
        batch.sub = Some(key);
        let sub = SubSpec { frames, manual };
        self.request(Request::Subscribe { key, sub, batch })
    }

    pub(super) fn frame(&mut self, f: Frame) -> (Result<(), Lost>, Outs) {
        let r = self.s.received(Item::Frame(f), self.now);
        (r, self.outs())
    }

    pub(super) fn receipt(&mut self, id: &str) -> (Result<(), Lost>, Outs) {
        self.frame(Frame::new(Command::Receipt).header("receipt-id", id))
    }

    /// Answers every receipt of `frames`.
    pub(super) fn confirm(&mut self, frames: &[Frame]) -> Outs {
        let mut all = Outs::default();
        for f in frames {
            let (r, o) = self.receipt(f.get("receipt").expect("a receipt"));
            assert!(r.is_ok());
            all.finished.extend(o.finished);
            all.frames.extend(o.frames);
            all.events.extend(o.events);
        }
        all
    }

    pub(super) fn message(&mut self, key: u64, ack: &str) -> (Result<(), Lost>, Outs) {
        self.frame(
            Frame::new(Command::Message)
                .header("subscription", format!("s{key}.0"))
                .header("destination", "/queue/q")
                .header("message-id", ack)
                .header("ack", ack)
                .body(&b"payload"[..]),
        )
    }

    pub(super) fn settle(&mut self, m: &Message, verdict: Verdict, c: Option<Call>) -> Outs {
        let (AckBy::App(id) | AckBy::Forwarder(id)) = &m.ack else {
            panic!("no ack id");
        };
        self.request(Request::Settle {
            generation: m.generation,
            sub: m.sub,
            ack_id: id.clone(),
            verdict,
            caller: c,
        })
    }

    pub(super) fn lose(&mut self, why: &str) -> Outs {
        self.s.connection_lost(&Lost::new(why));
        self.outs()
    }

    pub(super) fn reconnect(&mut self) -> Outs {
        self.s.connected(HeartBeats::default(), self.now);
        self.outs()
    }
}

#[test]
fn a_publish_is_done_when_its_receipt_comes() {
    let mut t = T::new();
    let o = t.publish(call(1));
    assert_eq!(o.commands(), vec![Command::Send]);
    let receipt = o.frames[0].get("receipt").unwrap().to_string();
    assert!(o.finished.is_empty());
    // A receipt nobody waits for changes nothing.
    let (r, o2) = t.receipt("r999");
    assert!(r.is_ok() && o2.finished.is_empty());
    let (r, o2) = t.receipt(&receipt);
    assert!(r.is_ok());
    assert_eq!(o2.ok(), vec![1]);
    // The same receipt twice: nothing more.
    assert!(t.receipt(&receipt).1.finished.is_empty());
}

#[test]
fn a_batch_is_done_when_every_receipt_came_and_empty_batches_at_once() {
    let mut t = T::new();
    let frames = vec![
        Frame::new(Command::Subscribe).header("id", "d1"),
        Frame::new(Command::Unsubscribe).header("id", "d1"),
    ];
    let o = t.request(Request::Batch(Batch::new(frames, call(1))));
    assert_eq!(o.commands(), vec![Command::Subscribe, Command::Unsubscribe]);
    let receipts: Vec<&str> = o.frames.iter().map(|f| f.get("receipt").unwrap()).collect();
    assert_ne!(receipts[0], receipts[1]);
    assert!(t.receipt(receipts[1]).1.finished.is_empty());
    assert_eq!(t.receipt(receipts[0]).1.ok(), vec![1]);
    let o = t.request(Request::Batch(Batch::new(vec![], call(2))));
    assert!(o.frames.is_empty());
    assert_eq!(o.ok(), vec![2]);
}

#[test]
fn an_error_naming_a_receipt_fails_that_call_only() {
    let mut t = T::new();
    let o = t.subscribe(7, true, call(1));
    let receipt = o.frames[0].get("receipt").unwrap().to_string();
    let other = t.publish(call(2));
    let (r, o) = t.frame(
        Frame::new(Command::Error)
            .header("receipt-id", receipt)
            .header("message", "not_found")
            .body(&b"no queue 'q'"[..]),
    );
    assert!(r.is_ok(), "the session goes on");
    let failed = o.failed();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].0, 1);
    assert!(matches!(failed[0].1, BusError::Server(t) if t == "not_found: no queue 'q'"));
    assert_eq!(o.ended, vec![7], "the refused subscription ends");
    // Its messages are no longer delivered; the other call completes.
    assert!(t.message(7, "m1").1.delivered.is_empty());
    let receipt = other.frames[0].get("receipt").unwrap().to_string();
    assert_eq!(t.receipt(&receipt).1.ok(), vec![2]);
}

#[test]
fn an_error_without_receipt_loses_the_connection_and_calls_are_resent_up_to_three_times() {
    let mut t = T::new();
    t.publish(call(1));
    let error = Frame::new(Command::Error).header("message", "boom");
    let (r, _) = t.frame(error.clone());
    let lost = r.unwrap_err();
    assert!(lost.reason.contains("boom"), "{}", lost.reason);
    assert!(matches!(&lost.error, Some(BusError::Server(_))));
    for attempt in 1..MAX_ATTEMPTS {
        t.s.connection_lost(&lost);
        assert!(t.outs().finished.is_empty(), "attempt {attempt} is re-sent");
        let o = t.reconnect();
        assert_eq!(o.commands(), vec![Command::Send], "sent again");
        assert_eq!(o.events.len(), 1, "reconnected");
    }
    t.s.connection_lost(&lost);
    let o = t.outs();
    let failed = o.failed();
    assert_eq!(failed.len(), 1);
    assert!(matches!(failed[0].1, BusError::Server(m) if m == "boom"));
}

#[test]
fn acks_and_nacks_are_kept_per_subscription() {
    let mut t = T::new();
    let o = t.subscribe(3, true, call(1));
    assert_eq!(t.confirm(&o.frames).ok(), vec![1]);
    let (_, o) = t.message(3, "m1");
    let m1 = o.delivered.into_iter().next().unwrap();
    assert_eq!((m1.sub, m1.ack.clone()), (3, AckBy::App("m1".into())));
    let (_, o) = t.message(3, "m2");
    let m2 = o.delivered.into_iter().next().unwrap();

    let o = t.settle(&m1, Verdict::Ack, Some(call(2)));
    assert_eq!(o.commands(), vec![Command::Ack]);
    assert_eq!(o.frames[0].get("id"), Some("m1"));
    assert_eq!(t.confirm(&o.frames).ok(), vec![2]);
    // A second settle of the same delivery is refused without a frame.
    let o = t.settle(&m1, Verdict::Ack, Some(call(3)));
    assert!(o.frames.is_empty());
    assert_eq!(o.failed().len(), 1);

    let o = t.settle(&m2, Verdict::Nack { requeue: false }, Some(call(4)));
    assert_eq!(o.commands(), vec![Command::Nack]);
    assert_eq!(o.frames[0].get("requeue"), Some("false"));
}

#[test]
fn subscribe_deliveries_are_acked_by_the_forwarder_without_a_receipt() {
    let mut t = T::new();
    let o = t.subscribe(4, false, call(1));
    t.confirm(&o.frames);
    let (_, o) = t.message(4, "m1");
    let m = o.delivered.into_iter().next().unwrap();
    assert_eq!(m.ack, AckBy::Forwarder("m1".into()));
    let o = t.settle(&m, Verdict::Ack, None);
    assert_eq!(o.commands(), vec![Command::Ack]);
    assert_eq!(o.frames[0].get("receipt"), None);
}

#[test]
fn deliveries_of_a_lost_connection_cannot_be_settled() {
    let mut t = T::new();
    let o = t.subscribe(3, true, call(1));
    t.confirm(&o.frames);
    let m = t.message(3, "m1").1.delivered.remove(0);
    t.lose("gone");
    // Offline.
    let o = t.settle(&m, Verdict::Ack, Some(call(2)));
    assert!(o.frames.is_empty());
    assert!(matches!(o.failed()[0].1, BusError::Connect { .. }));
    // Online again, but another connection.
    t.reconnect();
    let o = t.settle(&m, Verdict::Ack, Some(call(3)));
    assert!(o.frames.is_empty());
    assert_eq!(o.failed().len(), 1);
}

#[test]
fn confirmed_subscriptions_and_transient_declarations_are_restored_before_new_calls() {
    let mut t = T::new();
    let o = t.subscribe(1, true, call(1));
    t.confirm(&o.frames);
    // Not yet confirmed when the connection goes: re-sent as a call, not restored.
    t.subscribe(2, false, call(2));
    let declare = vec![Frame::new(Command::Subscribe).header("id", "d9")];
    let mut batch = Batch::new(declare, call(3));
    batch.redeclare = true;
    let o = t.request(Request::Batch(batch));
    t.confirm(&o.frames);

    t.lose("broker restart");
    // Calls made while offline wait.
    assert!(t.publish(call(4)).frames.is_empty());
    let o = t.reconnect();
    let ids: Vec<&str> = o.frames.iter().filter_map(|f| f.get("id")).collect();
    assert_eq!(ids, vec!["d9", "s1.0"], "the restoration comes alone");
    assert!(o.events.is_empty(), "Connected only once restored");
    // A call made during the restoration waits for it too.
    assert!(t.publish(call(5)).frames.is_empty());
    let o = t.confirm(&o.frames);
    assert_eq!(o.events, vec![BusEvent::Connected { reconnects: 1 }]);
    // Then the queue: the unconfirmed subscription first, then the rest in order.
    assert_eq!(
        o.commands(),
        vec![Command::Subscribe, Command::Send, Command::Send]
    );
    assert_eq!(o.frames[0].get("id"), Some("s2.0"));
    let o = t.confirm(&o.frames);
    assert_eq!(o.ok(), vec![2, 4, 5]);
    // Deliveries on the new connection reach both subscriptions.
    assert_eq!(t.message(1, "a").1.delivered.len(), 1);
    assert_eq!(t.message(2, "b").1.delivered.len(), 1);
}

#[test]
fn callers_that_gave_up_are_not_sent_again() {
    let mut t = T::new();
    let publish = call(1);
    t.publish(publish.clone());
    let sub = call(2);
    t.subscribe(8, true, sub.clone());
    t.lose("gone");
    publish.gone.set(true);
    sub.gone.set(true);
    let queued = call(3);
    t.publish(queued.clone());
    queued.gone.set(true);
    let o = t.reconnect();
    assert!(o.frames.is_empty(), "{:?}", o.commands());
    assert_eq!(o.ended, vec![8], "the abandoned subscription is forgotten");
    assert!(o.finished.is_empty(), "nobody waits for them");
    assert!(t.message(8, "x").1.delivered.is_empty());
    // In flight when its caller gives up: failed at the loss, not re-sent.
    let late = call(4);
    t.publish(late.clone());
    late.gone.set(true);
    assert_eq!(t.lose("again").failed().len(), 1);
    assert!(t.reconnect().frames.is_empty());
}

#[test]
fn unsubscribe_recycles_the_connection_for_stranded_deliveries() {
    let mut t = T::new();
    let o = t.subscribe(5, true, call(1));
    t.confirm(&o.frames);
    assert!(t.message(5, "m1").0.is_ok());
    let o = t.request(Request::Unsubscribe { key: 5 });
    assert_eq!(o.ended, vec![5]);
    assert_eq!(o.commands(), vec![Command::Unsubscribe]);
    assert_eq!(o.frames[0].get("id"), Some("s5.0"));
    // A delivery in flight before the broker processed the cancellation.
    assert!(t.message(5, "m2").1.delivered.is_empty());
    let receipt = o.frames[0].get("receipt").unwrap().to_string();
    let (r, _) = t.receipt(&receipt);
    let lost = r.unwrap_err();
    assert!(
        lost.reason.contains("give back 2 deliveries"),
        "{}",
        lost.reason
    );
    assert!(lost.recycle, "on purpose: no reason to back off");
}

#[test]
fn unsubscribe_without_unsettled_deliveries_keeps_the_connection() {
    let mut t = T::new();
    let o = t.subscribe(5, true, call(1));
    t.confirm(&o.frames);
    let m = t.message(5, "m1").1.delivered.remove(0);
    t.settle(&m, Verdict::Ack, None);
    let o = t.request(Request::Unsubscribe { key: 5 });
    let receipt = o.frames[0].get("receipt").unwrap().to_string();
    assert!(t.receipt(&receipt).0.is_ok());
    // Offline, a cancellation writes nothing.
    let o = t.subscribe(6, true, call(2));
    t.confirm(&o.frames);
    t.lose("gone");
    let o = t.request(Request::Unsubscribe { key: 6 });
    assert_eq!(o.ended, vec![6]);
    assert!(o.frames.is_empty());
}

#[test]
fn a_forwarder_delivery_that_finds_no_subscriber_is_stranded() {
    let mut t = T::new();
    let o = t.subscribe(2, false, call(1));
    t.confirm(&o.frames);
    assert!(t.message(2, "m1").0.is_ok());
    t.s.undelivered();
    let o = t.request(Request::Unsubscribe { key: 2 });
    let receipt = o.frames[0].get("receipt").unwrap().to_string();
    assert!(t.receipt(&receipt).0.is_err());
}

#[test]
fn heart_beats_are_sent_after_half_an_interval_of_our_silence() {
    let hb = HeartBeats {
        send_every: Some(S(1)),
        expect_every: None,
    };
    let mut t = T::with(hb);
    let start = t.now;
    assert_eq!(t.s.next_deadline(), Some(start + MS(500)));
    t.advance(MS(499));
    assert!(t.s.timer(t.now).is_ok());
    assert_eq!(t.outs().beats, 0);
    t.advance(MS(1));
    assert!(t.s.timer(t.now).is_ok());
    assert_eq!(t.outs().beats, 1);
    assert_eq!(t.s.next_deadline(), Some(t.now + MS(500)));
    // Any frame we write counts.
    t.advance(MS(200));
    t.publish(call(1));
    assert_eq!(t.s.next_deadline(), Some(t.now + MS(500)));
    // Reading does not.
    t.s.received(Item::HeartBeat, t.now + MS(100)).unwrap();
    assert_eq!(t.s.next_deadline(), Some(t.now + MS(500)));
}

#[test]
fn a_silent_broker_is_dead_after_three_of_its_intervals() {
    let hb = HeartBeats {
        send_every: None,
        expect_every: Some(S(1)),
    };
    let mut t = T::with(hb);
    let start = t.now;
    assert_eq!(t.s.next_deadline(), Some(start + S(3)));
    // ActiveMQ's timing (measured): the first beat two intervals after
    // CONNECTED, a little late, then one every interval.
    t.advance(MS(2050));
    assert!(
        t.s.timer(t.now).is_ok(),
        "the first beat may come after 2 P"
    );
    t.s.received(Item::HeartBeat, t.now).unwrap();
    for _ in 0..5 {
        t.advance(MS(1020));
        assert!(t.s.timer(t.now).is_ok());
        t.s.received(Item::HeartBeat, t.now).unwrap();
    }
    assert_eq!(t.s.next_deadline(), Some(t.now + S(3)));
    t.advance(MS(2999));
    assert!(t.s.timer(t.now).is_ok());
    t.advance(MS(1));
    let lost = t.s.timer(t.now).unwrap_err();
    assert!(lost.reason.contains("no heart-beat"), "{}", lost.reason);
    assert!(lost.error.is_none());
    // Disconnected: no timers.
    t.s.connection_lost(&lost);
    assert_eq!(t.s.next_deadline(), None);
    assert!(t.s.timer(t.now + S(60)).is_ok());
}

#[test]
fn deadlines_follow_the_servers_heart_beat_header() {
    // We offer 1 s both ways; the server can send every 1 s and wants ours every 10 s.
    let hb = negotiate(S(1), Some("1000,10000")).unwrap();
    let mut t = T::with(hb);
    assert_eq!(t.s.next_deadline(), Some(t.now + S(3)), "dead first");
    let start = t.now;
    t.advance(MS(1900));
    t.s.received(Item::HeartBeat, t.now).unwrap();
    assert_eq!(t.s.next_deadline(), Some(t.now + S(3)));
    t.advance(MS(1600));
    t.s.received(Item::HeartBeat, t.now).unwrap();
    assert_eq!(
        t.s.next_deadline(),
        Some(start + S(5)),
        "our EOL is due first"
    );
    // A server that declines: no timers at all.
    let none = negotiate(S(1), Some("0,0")).unwrap();
    assert_eq!(T::with(none).s.next_deadline(), None);
    let absent = negotiate(S(1), None).unwrap();
    assert_eq!(T::with(absent).s.next_deadline(), None);
}

#[test]
fn close_fails_every_call_and_ends_every_subscription() {
    let mut t = T::new();
    let o = t.subscribe(1, true, call(1));
    t.confirm(&o.frames);
    t.subscribe(2, true, call(2));
    t.publish(call(3));
    t.lose("gone");
    t.publish(call(4));
    t.s.close();
    let o = t.outs();
    let mut failed: Vec<u32> = o.failed().iter().map(|(id, _)| *id).collect();
    failed.sort_unstable();
    assert_eq!(failed, vec![2, 3, 4]);
    assert!(
        o.failed()
            .iter()
            .all(|(_, e)| matches!(e, BusError::Closed))
    );
    assert_eq!(o.ended, vec![1, 2]);
    assert!(!t.s.is_connected());
}

#[test]
fn the_disconnect_frame_asks_for_its_receipt() {
    let f = disconnect_frame();
    assert_eq!(f.command, Command::Disconnect);
    assert_eq!(f.get("receipt"), Some(DISCONNECT_RECEIPT));
}
