//! The scale-down saga: every path through the coordinator, then the
//! machine alone.

use crate::core::testkit::*;

#[test]
fn full_scale_down_saga() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, cmd) = start_drain(&mut h);
    let a = done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gears(10) },
    );
    let (_, corr, evac_id, msg) = sends(&a).pop().unwrap();
    assert_eq!(corr, op);
    let Message::Evacuate(ev) = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(ev.moves.len(), 10);
    assert!(ev.moves.iter().all(|m| m.target == "a" || m.target == "b"));
    assert_eq!(down(&h, &op).step, DownStep::Evacuating);
    // Progress.
    let p = Message::Progress(Progress {
        cmd: evac_id,
        moved: 4,
        failed: 0,
        remaining: 6,
        total: 10,
        results: vec![],
    });
    h.core.on_event("c", Some(op.as_str()), &p, h.now);
    assert_eq!(down(&h, &op).progress.moved, 4);
    // Events from another node are ignored.
    assert!(
        h.core
            .on_event("b", Some(op.as_str()), &p, h.now)
            .is_empty()
    );
    done(
        &mut h,
        &op,
        evac_id,
        "cmd.evacuate",
        CommandResult::Evacuated {
            moved: 10,
            failed: 0,
            results: vec![],
            gears_left: 0,
        },
    );
    assert_eq!(down(&h, &op).step, DownStep::ConfirmingEmpty);
    // The report shows the node empty: remove it through the handler.
    h.advance(1);
    h.out.clear();
    let mut r = rep("c", "d1", "small", 100, 0, 0);
    r.active = false;
    h.report(r);
    let (_, call) = last_call(&h);
    let HandlerCall::Remove(req) = call else {
        panic!()
    };
    assert_eq!((req.node.as_str(), req.op.as_str()), ("c", op.as_str()));
    assert_eq!(down(&h, &op).step, DownStep::Removing);
    answer(
        &mut h,
        CallResult::Remove(Ok(RemoveOutcome {
            detail: "deleted".into(),
            gone: false,
        })),
    );
    assert_eq!(down(&h, &op).step, DownStep::ConfirmingGone);
    h.advance(30);
    let a = h.tick();
    assert!(matches!(calls(&a)[0].1, HandlerCall::Presence { .. }));
    let a = answer(&mut h, CallResult::Presence(Ok(Presence::Gone)));
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::Removed, "d1".into(), Some("c".into()))]
    );
    assert!(h.core.fleet().get("c").is_none());
    // A late report of the removed node does not bring it back.
    let mut late = rep("c", "d1", "small", 100, 0, 0);
    late.seq = 999;
    assert_eq!(
        h.core.on_report(late.clone(), h.now).unwrap_err(),
        crate::fleet::ReportRejected::Removed
    );
    // A new agent of that name (started after the removal) is a new node.
    late.started_at = h.now + Duration::seconds(1);
    assert!(h.core.on_report(late, h.now + Duration::seconds(2)).is_ok());
    assert_eq!(down(&h, &op).end, Some(DownEnd::Removed));
    assert_eq!(
        h.core.group_state(&g("d1", "small")).memory.last_scale_down,
        Some(h.now)
    );
}

#[test]
fn removal_is_confirmed_by_reports_stopping_when_the_handler_cannot_tell() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, cmd) = start_drain(&mut h);
    done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: vec![] },
    );
    // The inventory is empty; the removal waits for a report that agrees.
    assert_eq!(down(&h, &op).step, DownStep::ConfirmingEmpty);
    h.advance(1);
    let mut r = rep("c", "d1", "small", 100, 0, 0);
    r.active = false;
    h.report(r);
    assert_eq!(down(&h, &op).step, DownStep::Removing);
    answer(&mut h, CallResult::Remove(Ok(RemoveOutcome::default())));
    h.advance(30);
    h.tick();
    answer(&mut h, CallResult::Presence(Ok(Presence::Unknown)));
    assert_eq!(down(&h, &op).step, DownStep::ConfirmingGone);
    h.advance(31);
    let a = h.tick();
    assert_eq!(kinds(&a), vec![DecisionKind::Removed]);
}

#[test]
fn a_node_that_reports_after_the_removal_request_is_gone_once_silent() {
    // Found by the fault campaign: the cloud stops a node some time after
    // the remove request, and the node reports until then.
    let mut h = H::new(cfg_with(short_windows));
    let (op, cmd) = start_drain(&mut h);
    done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: vec![] },
    );
    h.advance(1);
    let mut r = rep("c", "d1", "small", 100, 0, 0);
    r.active = false;
    h.report(r.clone());
    assert_eq!(down(&h, &op).step, DownStep::Removing);
    answer(&mut h, CallResult::Remove(Ok(RemoveOutcome::default())));
    assert_eq!(down(&h, &op).step, DownStep::ConfirmingGone);
    // Two more reports while the cloud gets to it, then silence.
    for _ in 0..2 {
        h.advance(2);
        r.seq += 1;
        h.report(r.clone());
        h.tick();
        assert_eq!(down(&h, &op).step, DownStep::ConfirmingGone);
    }
    h.advance(60);
    let a = h.tick();
    assert_eq!(kinds(&a), vec![DecisionKind::Removed]);
}

#[test]
fn abort_reactivates_the_node_after_failed_evacuation_rounds() {
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.saga.evacuation_attempts = 2;
    }));
    let (op, cmd) = start_drain(&mut h);
    let a = done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gears(3) },
    );
    let mut evac = sends(&a).pop().unwrap().2;
    for round in 1..=2 {
        let left = CommandResult::Evacuated {
            moved: 2,
            failed: 1,
            results: vec![],
            gears_left: 1,
        };
        let a = done(&mut h, &op, evac, "cmd.evacuate", left);
        if round == 1 {
            let (_, _, inv, msg) = sends(&a).pop().unwrap();
            assert!(matches!(msg, Message::Inventory(_)));
            let a = done(
                &mut h,
                &op,
                inv,
                "cmd.inventory",
                CommandResult::Inventory { gears: gears(1) },
            );
            evac = sends(&a).pop().unwrap().2;
        } else {
            let (_, _, act, msg) = sends(&a).pop().unwrap();
            assert!(matches!(msg, Message::Activate(_)));
            assert_eq!(down(&h, &op).step, DownStep::Reactivating { cancel: false });
            let a = done(&mut h, &op, act, "cmd.activate", CommandResult::Activated);
            assert_eq!(kinds(&a), vec![DecisionKind::Aborted]);
        }
    }
    assert!(matches!(down(&h, &op).end, Some(DownEnd::Aborted { .. })));
    assert_eq!(
        h.core.group_state(&g("d1", "small")).memory.last_failure,
        Some(h.now)
    );
}

#[test]
fn command_timeouts_resend_then_abort_and_non_retryable_failures_abort() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, first) = start_drain(&mut h);
    h.advance(120);
    let a = h.tick();
    let (_, _, second, _) = sends(&a).pop().unwrap();
    assert_ne!(first, second, "a re-send after a timeout has a new id");
    h.advance(120);
    h.tick();
    h.advance(120);
    let a = h.tick();
    let (_, _, _, msg) = sends(&a).pop().unwrap();
    assert!(matches!(msg, Message::Activate(_)), "{msg:?}");
    // Non-retryable failure of the evacuation: abort at once.
    let mut h = H::new(cfg_with(short_windows));
    let (op2, cmd) = start_drain(&mut h);
    let a = done(
        &mut h,
        &op2,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gears(2) },
    );
    let evac = sends(&a).pop().unwrap().2;
    let f = Message::Failed(Failed {
        cmd: evac,
        command: "cmd.evacuate".into(),
        error: "disk full".into(),
        retryable: false,
        http_status: None,
    });
    let a = h.core.on_event("c", Some(op2.as_str()), &f, h.now);
    assert!(matches!(sends(&a).pop().unwrap().3, Message::Activate(_)));
    let _ = op;
}

#[test]
fn pinned_gear_in_the_inventory_aborts() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, cmd) = start_drain(&mut h);
    let mut gs = gears(2);
    gs[1].do_not_disrupt = true;
    let a = done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gs },
    );
    assert!(matches!(sends(&a).pop().unwrap().3, Message::Activate(_)));
}

#[test]
fn returning_pressure_cancels_the_drain_instead_of_booting_a_node() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, cmd) = start_drain(&mut h);
    done(
        &mut h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gears(10) },
    );
    // Load returns: a and b nearly full, c inactive.
    h.advance(10);
    h.node("a", "d1", 95, 100);
    h.node("b", "d1", 95, 100);
    let mut c = rep("c", "d1", "small", 100, 10, 0);
    c.active = false;
    h.report(c);
    let a = h.eval();
    let k = kinds(&a);
    assert!(!k.contains(&DecisionKind::ScaleUp), "{k:?}");
    assert_eq!(explain(&a, "d1").outcome, Outcome::DrainCancelled);
    let (_, _, act, msg) = sends(&a).pop().unwrap();
    assert!(matches!(msg, Message::Activate(_)));
    let a = done(&mut h, &op, act, "cmd.activate", CommandResult::Activated);
    assert_eq!(kinds(&a), vec![DecisionKind::DrainCancelled]);
    assert_eq!(down(&h, &op).end, Some(DownEnd::Cancelled));
}

// ------------------------------------------------------- the machine alone

use std::collections::BTreeSet;

use crate::core::actions::{Effect, Out};
use crate::core::facts::Facts;
use crate::core::scale_down::{DownCtx, DownInput, DownOutcome, Origin};
use crate::fleet::Fleet;
use crate::ops::Ops;

/// A victim `c` (10 gears) and two nodes with room, `a` and `b`.
struct World {
    cfg: BrokerConfig,
    fleet: Fleet,
    ops: Ops,
    marks: BTreeSet<String>,
    next_id: u128,
}

impl World {
    fn new() -> World {
        let mut fleet = Fleet::new();
        for (i, (n, active)) in [("a", 30), ("b", 20), ("c", 10)].into_iter().enumerate() {
            let mut r = rep(n, "d1", "small", 100, active, 0);
            r.seq = i as u64 + 1;
            fleet.accept(r, t0()).unwrap();
        }
        World {
            cfg: BrokerConfig::defaults(),
            fleet,
            ops: Ops::default(),
            marks: BTreeSet::new(),
            next_id: 0,
        }
    }

    /// Steps `d` (operation `op-…01` of group d1/small) with `input`.
    fn step(
        &mut self,
        d: &mut ScaleDown,
        input: DownInput<'_>,
        now: DateTime<Utc>,
    ) -> Out<DownOutcome> {
        let (op, group) = (OpId::from("op-000000000001"), g("d1", "small"));
        let counter = &mut self.next_id;
        let mut ids = move || {
            *counter += 1;
            Uuid::from_u128(*counter)
        };
        let mut cx = DownCtx {
            op: &op,
            group: &group,
            reason: "test",
            cfg: &self.cfg,
            facts: Facts {
                fleet: &self.fleet,
                ops: &self.ops,
                marks: &self.marks,
                started: t0() - Duration::hours(1),
                stale_intervals: 3,
            },
            planner: &RoomPlanner,
            ids: &mut ids,
        };
        d.step(&mut cx, input, now)
    }
}

fn sent(out: &Out<DownOutcome>) -> (Uuid, Message) {
    match out.effects.as_slice() {
        [Effect::Send { node, id, msg }] if node == "c" => (*id, msg.clone()),
        other => panic!("expected one command to c, got {other:?}"),
    }
}

fn done_msg(cmd: Uuid, result: CommandResult) -> Message {
    Message::Done(Done {
        cmd,
        command: "cmd".into(),
        result,
    })
}

#[test]
fn machine_deactivates_plans_and_follows_the_evacuation() {
    let mut w = World::new();
    let mut d = ScaleDown::new(
        "c",
        Origin::Policy {
            strategy: "least_busy".into(),
        },
        t0(),
    );
    let (deact, msg) = sent(&w.step(&mut d, DownInput::Start, t0()));
    assert!(matches!(msg, Message::Deactivate(ref x) if x.reason == "test"));
    assert_eq!((d.cmd, d.sends), (Some(deact), 1));
    // Events from another node, and answers to older commands, change nothing.
    let inv = done_msg(deact, CommandResult::Deactivated { gears: gears(4) });
    let other = DownInput::Event {
        from: "b",
        msg: &inv,
    };
    assert_eq!(w.step(&mut d, other, t0()), Out::none());
    let old = done_msg(Uuid::nil(), CommandResult::Deactivated { gears: gears(4) });
    assert_eq!(
        w.step(
            &mut d,
            DownInput::Event {
                from: "c",
                msg: &old
            },
            t0()
        ),
        Out::none()
    );
    // The inventory: four moves to a and b.
    let out = w.step(
        &mut d,
        DownInput::Event {
            from: "c",
            msg: &inv,
        },
        t0(),
    );
    let (evac, msg) = sent(&out);
    let Message::Evacuate(ev) = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(ev.moves.len(), 4);
    assert!(ev.moves.iter().all(|m| m.target == "a" || m.target == "b"));
    assert_eq!(
        (d.step.clone(), d.round, d.progress.total),
        (DownStep::Evacuating, 1, 4)
    );
    let p = Message::Progress(Progress {
        cmd: evac,
        moved: 3,
        failed: 0,
        remaining: 1,
        total: 4,
        results: vec![],
    });
    assert!(
        w.step(&mut d, DownInput::Event { from: "c", msg: &p }, t0())
            .touched
    );
    assert_eq!((d.progress.moved, d.progress.moved_total), (3, 3));
    // All moved; the node has not reported empty yet.
    let evacuated = done_msg(
        evac,
        CommandResult::Evacuated {
            moved: 4,
            failed: 0,
            results: vec![],
            gears_left: 0,
        },
    );
    let out = w.step(
        &mut d,
        DownInput::Event {
            from: "c",
            msg: &evacuated,
        },
        t0(),
    );
    assert!(out.effects.is_empty());
    assert_eq!(d.step, DownStep::ConfirmingEmpty);
    // A busy report with gears waits; an empty one removes through the handler.
    let busy = DownInput::Report {
        total_gears: 2,
        busy: true,
    };
    assert_eq!(w.step(&mut d, busy, t0()), Out::none());
    let out = w.step(
        &mut d,
        DownInput::Report {
            total_gears: 0,
            busy: false,
        },
        t0(),
    );
    assert!(
        matches!(&out.effects[..], [Effect::Call(HandlerCall::Remove(r))] if r.node == "c" && r.attempt == 1)
    );
    assert_eq!(d.step, DownStep::Removing);
}

#[test]
fn machine_aborts_until_the_point_of_return_and_ends_when_reactivated() {
    let mut w = World::new();
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    w.step(&mut d, DownInput::Start, t0());
    let abort = || DownInput::Abort {
        why: "operator alice aborted it".into(),
        cancel: false,
    };
    let (act, msg) = sent(&w.step(&mut d, abort(), t0()));
    assert!(matches!(msg, Message::Activate(ref a) if a.reason.contains("scale-down aborted")));
    assert_eq!(d.step, DownStep::Reactivating { cancel: false });
    // Not cancellable any more: a second abort says nothing.
    assert_eq!(w.step(&mut d, abort(), t0()), Out::none());
    // A restart re-sends the activate with the same id.
    let (again, _) = sent(&w.step(&mut d, DownInput::Resume, t0()));
    assert_eq!(again, act);
    let activated = done_msg(act, CommandResult::Activated);
    let out = w.step(
        &mut d,
        DownInput::Event {
            from: "c",
            msg: &activated,
        },
        t0(),
    );
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Aborted { .. }))
    ));
    assert!(matches!(&out.effects[..], [Effect::Decide(n)] if n.kind == DecisionKind::Aborted));
    assert_eq!(d.state_name(), "aborted");
    // Past the point of return (removing), an abort is refused.
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::Removing;
    assert_eq!(w.step(&mut d, abort(), t0()), Out::none());
}

#[test]
fn machine_removal_ends_when_the_handler_says_gone_or_fails_at_its_deadline() {
    let mut w = World::new();
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::ConfirmingEmpty;
    w.step(
        &mut d,
        DownInput::Report {
            total_gears: 0,
            busy: false,
        },
        t0(),
    );
    let accepted = CallResult::Remove(Ok(RemoveOutcome::default()));
    w.step(&mut d, DownInput::Result(accepted), t0());
    assert_eq!(
        (d.step.clone(), d.removed_at),
        (DownStep::ConfirmingGone, Some(t0()))
    );
    // The presence poll is due after `presence_poll`.
    assert_eq!(
        w.step(&mut d, DownInput::Tick, t0() + Duration::seconds(29)),
        Out::none()
    );
    let out = w.step(&mut d, DownInput::Tick, t0() + Duration::seconds(30));
    assert!(matches!(
        &out.effects[..],
        [Effect::Call(HandlerCall::Presence { .. })]
    ));
    let gone = CallResult::Presence(Ok(Presence::Gone));
    let out = w.step(
        &mut d,
        DownInput::Result(gone),
        t0() + Duration::seconds(31),
    );
    assert_eq!(out.outcome, Some(DownOutcome::Ended(DownEnd::Removed)));
    // A handler that never accepts: failed at the remove timeout.
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::ConfirmingEmpty;
    w.step(
        &mut d,
        DownInput::Report {
            total_gears: 0,
            busy: false,
        },
        t0(),
    );
    let refused = CallResult::Remove(Err(HandlerError::Transient("503".into())));
    w.step(&mut d, DownInput::Result(refused), t0());
    let out = w.step(&mut d, DownInput::Tick, t0() + Duration::minutes(15));
    let kinds: Vec<_> = out
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Decide(n) => Some(n.kind),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![DecisionKind::HandlerFailed, DecisionKind::Aborted]
    );
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Failed { .. }))
    ));
}
