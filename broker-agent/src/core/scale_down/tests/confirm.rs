//! Confirming the node empty: only reports the node sent at or after the
//! evacuation's `event.done` (its clock) judge the evacuation, whatever
//! order the broker agent takes them in.

use crate::core::testkit::*;

use super::machine::{World, done_msg, evacuating, event_at, report_at};
use crate::core::actions::{Effect, Out};
use crate::core::scale_down::{DownInput, Seen};

/// The node's clock: `s` seconds after `t0()`.
fn at(s: i64) -> DateTime<Utc> {
    t0() + Duration::seconds(s)
}

fn evacuated(cmd: Uuid, gears_left: u32) -> Message {
    done_msg(
        cmd,
        CommandResult::Evacuated {
            moved: 4 - gears_left,
            failed: gears_left,
            results: vec![],
            gears_left,
        },
    )
}

/// A drain of `c` whose evacuation the node answered (sent at `at(5)`),
/// taken by the broker agent at `at(6)`.
fn confirming(w: &mut World) -> ScaleDown {
    let (mut d, evac) = evacuating(w);
    let done = evacuated(evac, 0);
    let out = w.step(&mut d, event_at("c", &done, at(5)), at(6));
    assert!(out.effects.is_empty(), "{out:?}");
    assert_eq!(
        (d.step.clone(), d.done_at),
        (DownStep::ConfirmingEmpty, Some(at(5)))
    );
    d
}

#[test]
fn a_report_sent_before_the_done_never_fails_the_evacuation() {
    let mut w = World::new();
    let mut d = confirming(&mut w);
    // A report from before the evacuation began (every gear, idle), taken
    // after the done: the issue's "still reports 10 gears after its
    // evacuation". Ignored, whatever it says.
    for stale in [report_at(10, false, at(1)), report_at(0, false, at(4))] {
        assert_eq!(w.step(&mut d, stale, at(6)), Out::none());
        assert_eq!((d.step.clone(), d.round), (DownStep::ConfirmingEmpty, 1));
    }
    // One sent in the done's millisecond or later counts: empty, removed.
    let out = w.step(&mut d, report_at(0, false, at(5)), at(7));
    assert!(
        matches!(&out.effects[..], [Effect::Call(HandlerCall::Remove(r))] if r.node == "c"),
        "{out:?}"
    );
    assert_eq!(d.step, DownStep::Removing);
}

#[test]
fn a_report_sent_after_the_done_with_gears_left_starts_another_round() {
    let mut w = World::new();
    let mut d = confirming(&mut w);
    // Busy (another command running) waits even after the done.
    assert_eq!(
        w.step(&mut d, report_at(3, true, at(6)), at(7)),
        Out::none()
    );
    let out = w.step(&mut d, report_at(3, false, at(7)), at(8));
    let (_, msg) = super::machine::sent(&out);
    assert!(matches!(msg, Message::Inventory(_)), "{msg:?}");
    assert_eq!(d.step, DownStep::Inventorying);
    // The new command: the old done no longer orders anything.
    assert_eq!(d.done_at, None);
}

#[test]
fn a_report_taken_before_the_done_counts_when_the_node_sent_it_after() {
    let mut w = World::new();
    let (mut d, evac) = evacuating(&mut w);
    // Events and reports travel apart: the node's empty report (sent at
    // 5.5 s, after its done at 5 s) is taken first, while still evacuating.
    let empty = report_at(0, false, at(5) + Duration::milliseconds(500));
    assert_eq!(w.step(&mut d, empty, at(6)), Out::none());
    assert_eq!(d.step, DownStep::Evacuating);
    // The done follows: no need to wait for another report.
    let done = evacuated(evac, 0);
    let out = w.step(&mut d, event_at("c", &done, at(5)), at(6));
    assert!(
        matches!(&out.effects[..], [Effect::Call(HandlerCall::Remove(_))]),
        "{out:?}"
    );
}

#[test]
fn a_stale_report_taken_before_the_done_does_not_judge_it_when_it_arrives() {
    let mut w = World::new();
    let (mut d, evac) = evacuating(&mut w);
    // Sent at 1 s with every gear, idle (the evacuation not begun on the
    // node), taken while evacuating; then the done sent at 5 s.
    assert_eq!(
        w.step(&mut d, report_at(4, false, at(1)), at(6)),
        Out::none()
    );
    let done = evacuated(evac, 0);
    let out = w.step(&mut d, event_at("c", &done, at(5)), at(6));
    assert!(out.effects.is_empty(), "{out:?}");
    assert_eq!((d.step.clone(), d.round), (DownStep::ConfirmingEmpty, 1));
    // An older report arriving late does not replace the newest seen.
    w.step(&mut d, report_at(4, false, at(0)), at(7));
    assert_eq!(d.seen.map(|s| s.sent), Some(at(1)));
    // Waiting is bounded: no report after the done within
    // `confirm_empty_timeout` (default 2 min) is another round, as before.
    let timeout = w.cfg.saga.confirm_empty_timeout.as_secs() as i64;
    assert_eq!(
        w.step(&mut d, DownInput::Tick, at(6 + timeout - 1)),
        Out::none()
    );
    let out = w.step(&mut d, DownInput::Tick, at(6 + timeout));
    let (_, msg) = super::machine::sent(&out);
    assert!(matches!(msg, Message::Inventory(_)), "{msg:?}");
}

#[test]
fn the_order_survives_the_journal_and_older_records_read_without_it() {
    let mut w = World::new();
    let mut d = confirming(&mut w);
    w.step(&mut d, report_at(4, false, at(2)), at(7));
    let json = serde_json::to_value(&d).unwrap();
    let back: ScaleDown = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, d);
    assert_eq!(
        back.seen,
        Some(Seen {
            sent: at(2),
            total_gears: 4,
            busy: false
        })
    );
    // A record journaled before these fields existed: no order known, so
    // the next report is judged as before.
    let mut old = json;
    let o = old.as_object_mut().unwrap();
    o.remove("done_at");
    o.remove("seen");
    let back: ScaleDown = serde_json::from_value(old).unwrap();
    assert_eq!((back.done_at, back.seen), (None, None));
}
