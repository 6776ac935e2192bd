//! `cmd.evacuate`: acceptance, scheduling, checkpoints, resumption.

use chrono::Duration;
use gearshift_proto::msg::{CommandResult, Evacuate, GearOutcome, Message, Move};

use super::*;
use crate::evacuate::plan::GearStatus;
use crate::runtime::MoveOutcome;

fn world(n: usize) -> World {
    let mut w = World::new();
    w.gears = (0..n).map(|i| gear(&format!("g{i}"))).collect();
    w
}

fn evacuate(w: &World, parallelism: Option<u32>) -> Evacuate {
    Evacuate {
        moves: w
            .gears
            .iter()
            .enumerate()
            .map(|(i, g)| Move {
                gear: g.id.clone(),
                target: format!("t{}", i % 2),
            })
            .collect(),
        parallelism,
        deadline: None,
        watch: false,
        epoch: 0,
    }
}

fn evacuated(w: &World, id: Uuid) -> (u32, u32, u32) {
    match w.outcome(id) {
        Some(Message::Done(d)) => match &d.result {
            CommandResult::Evacuated {
                moved,
                failed,
                gears_left,
                ..
            } => (*moved, *failed, *gears_left),
            other => panic!("{other:?}"),
        },
        other => panic!("{other:?}"),
    }
}

fn progress(w: &World) -> Vec<(u32, u32, u32)> {
    w.events
        .iter()
        .filter_map(|e| match &e.msg {
            Message::Progress(p) => Some((p.moved, p.failed, p.remaining)),
            _ => None,
        })
        .collect()
}

#[test]
fn accepted_once_the_plan_is_durable_then_moved_with_progress() {
    let mut w = world(5);
    w.auto_moves = false;
    let env = w.cmd(evacuate(&w, Some(2)), Some("op-1"));
    let c = w.command(Ok(env.clone()), false);
    w.step(Input::Command(c));
    assert!(
        matches!(&w.step(Input::Journaled(Ok(())))[..], [Action::LoadPlan(op)] if op == "op-1")
    );
    let a = w.step(Input::PlanLoaded(Ok(None)));
    assert!(matches!(&a[..], [Action::SavePlan { accept: true, plan }] if plan.gears.len() == 5));
    let a = w.feed(Input::PlanSaved(Ok(())));
    let ack_event = pos(
        &a,
        |a| matches!(a, Action::Emit(e) if matches!(e.msg, Message::Ack(_))),
    )
    .unwrap();
    let ack = pos(
        &a,
        |a| matches!(a, Action::Ack { journaled: Some(id), .. } if *id == env.id),
    )
    .unwrap();
    let started = pos(
        &a,
        |a| matches!(a, Action::SavePlan { accept: false, plan } if plan.gears[0].started),
    )
    .unwrap();
    let first_move = pos(&a, |a| matches!(a, Action::StartMove(_))).unwrap();
    assert!(
        ack_event < ack && ack < started && started < first_move,
        "{a:?}"
    );
    assert_eq!(w.moves.len(), 2, "parallelism 2");
    assert_eq!(w.counted("cmd.evacuate", "accepted"), 1);
    assert_eq!(w.core.operation().map(|o| o.remaining), Some(5));
    // Never more than two in flight.
    while let Some(m) = w.moves.pop_front() {
        w.feed(Input::Moved(MoveDone {
            op: m.op,
            idx: m.idx,
            result: MoveResult::Done(MoveOutcome::Moved),
            attempts: 1,
        }));
        assert!(w.moves.len() <= 2);
    }
    assert_eq!(
        progress(&w),
        [(1, 0, 4), (2, 0, 3), (3, 0, 2), (4, 0, 1), (5, 0, 0)]
    );
    assert!(
        w.events
            .iter()
            .filter(|e| matches!(e.msg, Message::Progress(_)))
            .all(|e| e.droppable)
    );
    assert_eq!(
        evacuated(&w, env.id),
        (5, 0, 5),
        "the runtime still lists them"
    );
    let saved = &w.plans["op-1"];
    assert!(saved.finished && saved.done_published, "{saved:?}");
    assert_eq!(
        w.journal[&env.id].status,
        crate::state::journal::EntryStatus::Finished
    );
    assert!(w.core.operation().is_none() && w.core.settled());
}

#[test]
fn failures_and_counts_reach_the_result() {
    let mut w = world(4);
    w.auto_moves = false;
    let id = w.send(evacuate(&w, None), Some("op"));
    w.gears.clear();
    w.finish_moves(|m| match m.idx {
        1 => MoveResult::Failed("disk full".into()),
        2 => MoveResult::Done(MoveOutcome::Missing),
        _ => MoveResult::Done(MoveOutcome::Moved),
    });
    assert_eq!(evacuated(&w, id), (3, 1, 0));
    let moved: Vec<_> = w
        .log
        .iter()
        .filter_map(|a| match a {
            Action::GearMoved(o) => Some(*o),
            _ => None,
        })
        .collect();
    assert_eq!(
        moved.iter().filter(|o| **o == GearOutcome::Failed).count(),
        1
    );
}

#[test]
fn a_checkpoint_that_cannot_be_written_or_read_fails_the_command() {
    let mut w = world(2);
    w.fail.plan_save = true;
    let id = w.send(evacuate(&w, None), Some("a"));
    assert!(
        matches!(w.outcome(id), Some(Message::Failed(f)) if f.retryable && f.error.contains("cannot write the evacuation checkpoint"))
    );
    assert!(w.moves.is_empty() && w.gears.len() == 2);
    w.fail.plan_save = false;
    w.fail.plan_load = true;
    let id = w.send(evacuate(&w, None), Some("b"));
    assert!(
        matches!(w.outcome(id), Some(Message::Failed(f)) if !f.retryable && f.error.contains("checkpoint unreadable"))
    );
    assert!(w.acked(id));
}

#[test]
fn the_same_operation_joins_and_another_waits() {
    let mut w = world(3);
    w.auto_moves = false;
    w.send(evacuate(&w, Some(1)), Some("op"));
    let again = w.send(evacuate(&w, Some(1)), Some("op"));
    assert!(
        w.events
            .iter()
            .any(|e| matches!(&e.msg, Message::Ack(a) if a.cmd == again))
    );
    assert_eq!(w.counted("cmd.evacuate", "duplicate"), 1);
    assert!(w.acked(again) && w.moves.len() == 1, "no second run");
    let other = w.send(evacuate(&w, None), Some("other"));
    assert!(
        matches!(w.outcome(other), Some(Message::Failed(f)) if f.retryable && f.error.contains("another evacuation (op)"))
    );
}

#[test]
fn sent_again_after_it_finished_only_failed_gears_move_again() {
    let mut w = world(3);
    w.auto_moves = false;
    let evac = evacuate(&w, None);
    w.send(evac.clone(), Some("op"));
    w.finish_moves(|m| {
        if m.idx == 1 {
            MoveResult::Failed("boom".into())
        } else {
            MoveResult::Done(MoveOutcome::Moved)
        }
    });
    let id = w.send(evac.clone(), Some("op"));
    let again: Vec<u32> = w.moves.iter().map(|m| m.idx).collect();
    assert_eq!(again, [1], "finished gears are not moved again");
    w.finish_moves(|_| MoveResult::Done(MoveOutcome::Moved));
    assert_eq!(evacuated(&w, id).0, 3);
    // Nothing left to do: the result is published again, nothing moves.
    let id = w.send(evac, Some("op"));
    assert!(w.moves.is_empty());
    assert_eq!(evacuated(&w, id).0, 3);
}

#[test]
fn a_restart_resumes_without_moving_a_gear_twice() {
    let mut w = world(6);
    w.auto_moves = false;
    let id = w.send(evacuate(&w, Some(2)), Some("op"));
    let first = w.moves.pop_front().unwrap();
    w.feed(Input::Moved(MoveDone {
        op: first.op.clone(),
        idx: first.idx,
        result: MoveResult::Done(MoveOutcome::Moved),
        attempts: 1,
    }));
    // Crash: the moves in flight never report.
    let in_flight: Vec<u32> = w.moves.iter().map(|m| m.idx).collect();
    w.restart();
    let plans: Vec<Plan> = w.plans.values().cloned().collect();
    w.feed(Input::Resume(plans));
    let resumed: Vec<(u32, bool)> = w.moves.iter().map(|m| (m.idx, m.resumed)).collect();
    assert_eq!(
        resumed,
        in_flight.iter().map(|i| (*i, true)).collect::<Vec<_>>(),
        "the gears in flight resume first, flagged"
    );
    assert!(
        !w.moves.iter().any(|m| m.idx == first.idx),
        "a moved gear is not moved again"
    );
    w.finish_moves(|_| MoveResult::Done(MoveOutcome::Moved));
    assert_eq!(evacuated(&w, id).0, 6);
    // The command's redelivery after the restart gets the result again.
    let plan = &w.plans["op"];
    assert!(plan.gears.iter().all(|g| g.status == GearStatus::Moved));
}

#[test]
fn stopping_interrupts_and_keeps_pending_gears() {
    let mut w = world(4);
    w.auto_moves = false;
    w.send(evacuate(&w, Some(2)), Some("op"));
    w.feed(Input::Stop);
    assert!(!w.core.settled(), "moves in flight are waited for");
    w.finish_moves(|m| {
        if m.idx == 0 {
            MoveResult::Done(MoveOutcome::Moved)
        } else {
            MoveResult::Interrupted
        }
    });
    assert!(w.moves.is_empty(), "no move starts while stopping");
    assert!(w.core.settled());
    let plan = &w.plans["op"];
    assert!(!plan.finished);
    assert_eq!(plan.counts(), (1, 0, 3, 4));
    assert!(
        w.core.operation().is_some(),
        "the last report still shows it"
    );
}

#[test]
fn a_passed_deadline_fails_what_has_not_started() {
    let mut w = world(3);
    let mut e = evacuate(&w, None);
    e.deadline = Some(w.now - Duration::seconds(1));
    let id = w.send(e, Some("late"));
    assert!(w.log.iter().all(|a| !matches!(a, Action::StartMove(_))));
    assert_eq!(evacuated(&w, id), (0, 3, 3));
    let plan = &w.plans["late"];
    assert_eq!(
        plan.gears[0].error.as_deref(),
        Some("deadline passed before the move started")
    );
}

#[test]
fn results_left_unpublished_are_published_at_start_and_old_checkpoints_go() {
    let mut w = world(1);
    let id = w.send(evacuate(&w, None), Some("op"));
    let mut unpublished = w.plans["op"].clone();
    unpublished.done_published = false;
    let mut old = unpublished.clone();
    old.corr = "old".into();
    old.done_published = true;
    old.updated_at = w.now - Duration::days(8);
    w.plans.insert("op".into(), unpublished.clone());
    w.restart();
    w.events.clear();
    w.auto_confirm = false;
    let a = w.feed(Input::Resume(vec![unpublished, old]));
    assert!(
        a.iter()
            .any(|a| matches!(a, Action::ForgetPlan(op) if op == "old"))
    );
    assert_eq!(evacuated(&w, id).0, 1);
    assert!(
        w.core.operation().is_none(),
        "a republished result is no operation"
    );
    assert!(!w.plans["op"].done_published);
    w.feed(Input::Confirmed {
        confirm: Confirm::Evacuated("op".into()),
        ok: true,
    });
    assert!(w.plans["op"].done_published);
}
