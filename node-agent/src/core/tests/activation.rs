//! `cmd.deactivate` and `cmd.activate`.

use gearshift_proto::msg::{Activate, CommandResult, Deactivate, Evacuate, Message, Move};

use super::*;
use crate::core::activation::REACTIVATED;

#[test]
fn deactivate_is_persisted_before_the_delivery_is_acknowledged() {
    let mut w = World::new();
    let env = w.cmd(
        Deactivate {
            reason: "scale-down".into(),
            epoch: 0,
        },
        Some("sd-1"),
    );
    let c = w.command(Ok(env.clone()), false);
    let a = w.step(Input::Command(c));
    assert!(
        matches!(&a[..], [Action::JournalBegin(e)] if e.id == env.id && e.corr.as_deref() == Some("sd-1"))
    );
    let a = w.step(Input::Journaled(Ok(())));
    match &a[..] {
        [
            Action::PersistActive {
                active: false,
                reason,
                by,
                ..
            },
        ] => {
            assert_eq!((reason.as_str(), *by), ("scale-down", env.id))
        }
        other => panic!("{other:?}"),
    }
    assert!(w.core.active(), "not inactive before the flag is durable");
    let a = w.step(Input::Persisted(Ok(())));
    assert!(!has_ack(&a), "{a:?}");
    assert!(!w.core.active());
    assert!(a.iter().any(|a| matches!(a, Action::RuntimeActive(false))));
    assert!(a.iter().any(|a| matches!(a, Action::ReportNow)));
    let a = w.step(Input::Scanned {
        scan: Scan::Deactivated,
        result: Ok(vec![gear("g0")]),
    });
    let journal = pos(&a, |a| matches!(a, Action::JournalWrite(_))).unwrap();
    let emit = pos(&a, |a| matches!(a, Action::Emit(e) if matches!(&e.msg, Message::Done(d) if matches!(&d.result, CommandResult::Deactivated { gears } if gears.len() == 1)))).unwrap();
    let ack = pos(
        &a,
        |a| matches!(a, Action::Ack { journaled: Some(id), .. } if *id == env.id),
    )
    .unwrap();
    assert!(journal < ack && emit < ack, "{a:?}");
}

#[test]
fn a_state_that_cannot_be_persisted_fails_and_changes_nothing() {
    let mut w = World::new();
    w.fail.state = true;
    let id = w.send(Deactivate::default(), None);
    match w.outcome(id) {
        Some(Message::Failed(f)) => {
            assert!(f.retryable && f.error.contains("cannot persist the node's state"))
        }
        other => panic!("{other:?}"),
    }
    assert!(w.core.active() && w.disk_active);
    assert!(w.acked(id), "the failure is final for this command");
}

#[test]
fn deactivated_without_a_gear_list_is_still_deactivated() {
    let mut w = World::new();
    w.fail.scan = true;
    let id = w.send(Deactivate::default(), None);
    assert!(
        matches!(w.outcome(id), Some(Message::Failed(f)) if f.retryable && f.error.contains("node deactivated, but its gears cannot be listed"))
    );
    assert!(!w.core.active() && !w.disk_active);
}

#[test]
fn activate_answers_activated_and_survives_a_restart() {
    let mut w = World::new();
    w.send(Deactivate::default(), None);
    w.restart();
    assert!(!w.core.active(), "the flag is loaded from disk");
    let id = w.send(Activate::default(), None);
    assert!(
        matches!(w.outcome(id), Some(Message::Done(d)) if d.result == CommandResult::Activated)
    );
    assert!(w.core.active() && w.disk_active);
    assert_eq!(w.counted("cmd.activate", "done"), 1);
}

#[test]
fn activate_while_evacuating_fails_the_pending_gears() {
    let mut w = World::new();
    w.auto_moves = false;
    w.gears = (0..6).map(|i| gear(&format!("g{i}"))).collect();
    let moves = w
        .gears
        .iter()
        .map(|g| Move {
            gear: g.id.clone(),
            target: "n2".into(),
        })
        .collect();
    let evac = w.send(
        Evacuate {
            moves,
            parallelism: Some(2),
            deadline: None,
            watch: false,
            epoch: 0,
        },
        Some("sd-1"),
    );
    assert_eq!(w.moves.len(), 2);
    let a = w.deliver(w.cmd(Activate::default(), Some("sd-1")), false);
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::CancelMoves(op) if op == "sd-1"))
    );
    // One move ends normally, the other stops at its safe point.
    let first = w.moves.pop_front().unwrap();
    w.feed(Input::Moved(MoveDone {
        op: first.op,
        idx: first.idx,
        result: MoveResult::Done(crate::runtime::MoveOutcome::Moved),
        attempts: 1,
    }));
    assert!(w.moves.len() == 1, "no new move starts after the abort");
    w.finish_moves(|_| MoveResult::Interrupted);
    match w.outcome(evac) {
        Some(Message::Done(d)) => match &d.result {
            CommandResult::Evacuated {
                moved,
                failed,
                results,
                ..
            } => {
                assert_eq!((*moved, *failed), (1, 5));
                let f = results.iter().find(|r| r.error.is_some()).unwrap();
                assert_eq!(
                    f.error.as_deref(),
                    Some(format!("cancelled: {REACTIVATED}").as_str())
                );
            }
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
    assert!(w.core.active());
}
