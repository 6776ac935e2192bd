//! Evacuations: progress after every gear, retries, a final result, and
//! resumption after a restart.

use std::time::Duration;

use gearshift_proto::Envelope;
use gearshift_proto::msg::{CommandResult, Evacuate, GearOutcome, Message, Move, Progress};
use uuid::Uuid;

use super::{Bed, done};
use crate::node_harness::*;

/// Moves of every gear of the node to the two targets in turn.
fn moves_to_targets(b: &Bed) -> Vec<Move> {
    b.world
        .gears_of(&b.node)
        .iter()
        .enumerate()
        .map(|(i, g)| Move {
            gear: g.id.clone(),
            target: b.targets[i % 2].clone(),
        })
        .collect()
}

/// An evacuation: ack, a progress event after every gear, retries, a final
/// result; every gear ends exactly once at its target.
pub async fn evacuation_with_progress(url: &str) {
    let b = Bed::new(url, "n-evac-", 10).await;
    b.world.set_move_time(Duration::from_millis(5));
    let gears: Vec<String> = b
        .world
        .gears_of(&b.node)
        .iter()
        .map(|g| g.id.clone())
        .collect();
    b.world.fail_next_moves(&gears[2], 1);
    b.world.fail_next_moves(&gears[7], 100);
    let mut events = b.events().await;
    let mut reports = b.reports().await;
    let running = b.start(b.config()).await;
    reports.report(WAIT, "a first report", |_| true).await;
    let moves = moves_to_targets(&b);
    let evacuate = Evacuate {
        moves: moves.clone(),
        parallelism: Some(3),
        deadline: None,
        watch: false,
        epoch: 0,
    };
    let id = b.ctl.send(&b.node, evacuate, Some("evac-1")).await;
    let ack = events.next(WAIT).await;
    assert!(
        matches!(&ack.msg, Message::Ack(a) if a.cmd == id && a.command == "cmd.evacuate"),
        "{ack:?}"
    );
    assert_eq!(ack.corr.as_deref(), Some("evac-1"));
    let (progress, final_event) = progress_until_done(&mut events, id).await;
    assert_eq!(progress.len(), 10);
    assert!(
        progress.windows(2).all(|w| w[1].remaining < w[0].remaining),
        "remaining decreases"
    );
    check_result(&final_event, &gears);
    for m in &moves {
        let at = b.world.locate(&m.gear);
        if m.gear == gears[7] {
            assert_eq!(at, vec![b.node.clone()]);
        } else {
            assert_eq!(
                at,
                vec![m.target.clone()],
                "gear {} exactly once at its target",
                m.gear
            );
        }
    }
    let r = reports
        .report(WAIT, "a report without the finished operation", |r| {
            r.operation.is_none()
        })
        .await;
    assert_eq!(r.gears.total(), 1);
    evacuation_sent_again(&b, &mut events, moves, &gears[7]).await;
    running.stop().await;
}

/// Progress events of command `id` (one per gear, of 10) until its
/// final event.
async fn progress_until_done(events: &mut Verified, id: Uuid) -> (Vec<Progress>, Envelope) {
    let mut progress = Vec::new();
    loop {
        let e = events.next(WAIT).await;
        match &e.msg {
            Message::Progress(p) => {
                assert_eq!(p.cmd, id);
                assert_eq!(e.corr.as_deref(), Some("evac-1"));
                assert_eq!(p.results.len(), 1, "one progress event per gear");
                assert_eq!(p.total, 10);
                assert_eq!(p.moved + p.failed + p.remaining, 10);
                progress.push(p.clone());
            }
            Message::Done(_) => return (progress, e),
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// 9 moved, gear 2 after one retry; gear 7 failed after the configured
/// attempts and stays.
fn check_result(final_event: &Envelope, gears: &[String]) {
    match done(final_event) {
        CommandResult::Evacuated {
            moved,
            failed,
            results,
            gears_left,
        } => {
            assert_eq!((moved, failed, gears_left), (9, 1, 1));
            let r2 = results.iter().find(|r| r.gear == gears[2]).unwrap();
            assert_eq!(
                (r2.outcome, r2.attempts),
                (GearOutcome::Moved, 2),
                "retried once"
            );
            let r7 = results.iter().find(|r| r.gear == gears[7]).unwrap();
            assert_eq!(r7.outcome, GearOutcome::Failed);
            assert_eq!(r7.attempts, 3, "the configured attempts");
            assert!(r7.error.is_some());
        }
        other => panic!("{other:?}"),
    }
}

/// The same operation sent again: only the failed gear is tried again.
async fn evacuation_sent_again(b: &Bed, events: &mut Verified, moves: Vec<Move>, failed: &str) {
    b.world.fail_next_moves(failed, 0);
    let before = b.world.moves();
    let evacuate = Evacuate {
        moves,
        parallelism: None,
        deadline: None,
        watch: false,
        epoch: 0,
    };
    let id2 = b.ctl.send(&b.node, evacuate, Some("evac-1")).await;
    let e = events.outcome(id2, WAIT).await;
    match done(&e) {
        CommandResult::Evacuated { moved, failed, .. } => assert_eq!((moved, failed), (10, 0)),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        b.world.moves(),
        before + 1,
        "finished gears are not moved again"
    );
}

/// An evacuation interrupted by a stop resumes after the restart; no gear
/// is moved twice or lost.
pub async fn evacuation_resumes_after_restart(url: &str) {
    let b = Bed::new(url, "n-resume-", 12).await;
    let sd = b.state_dir();
    b.world.set_move_time(Duration::from_millis(150));
    let mut events = b.events().await;
    let running = b.start(b.config()).await;
    let moves = moves_to_targets(&b);
    let evacuate = Evacuate {
        moves: moves.clone(),
        parallelism: Some(2),
        deadline: None,
        watch: false,
        epoch: 0,
    };
    let id = b.ctl.send(&b.node, evacuate, Some("resume-1")).await;
    events
        .until(
            WAIT,
            "the third progress event",
            |e| matches!(&e.msg, Message::Progress(p) if p.moved >= 3),
        )
        .await;
    running.stop().await;
    let left_after_stop = b.world.gears_of(&b.node).len();
    assert!(left_after_stop > 0, "stopped mid-way");
    let st = gearshift_node::status::read(&sd).unwrap();
    let op = st
        .operation
        .expect("the unfinished evacuation is in the state directory");
    assert_eq!(op.remaining as usize, left_after_stop);

    let running = b.start(b.config()).await;
    let e = events.outcome(id, WAIT).await;
    match done(&e) {
        CommandResult::Evacuated {
            moved,
            failed,
            gears_left,
            ..
        } => assert_eq!((moved, failed, gears_left), (12, 0, 0)),
        other => panic!("{other:?}"),
    }
    for m in &moves {
        assert_eq!(b.world.locate(&m.gear), vec![m.target.clone()]);
    }
    assert_eq!(b.world.moves(), 12, "each gear moved exactly once");
    running.stop().await;
}
