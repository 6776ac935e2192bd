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
    h.core.on_event("c", Some(op.as_str()), &p, h.now, h.now);
    assert_eq!(down(&h, &op).progress.moved, 4);
    // Events from another node are ignored.
    assert!(
        h.core
            .on_event("b", Some(op.as_str()), &p, h.now, h.now)
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
        h.core.on_report(late.clone(), h.now, h.now).unwrap_err(),
        crate::fleet::ReportRejected::Removed
    );
    // A new agent of that name (started after the removal) is a new node.
    late.started_at = h.now + Duration::seconds(1);
    assert!(
        h.core
            .on_report(late, h.now, h.now + Duration::seconds(2))
            .is_ok()
    );
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

/// A process that stopped while its remove request was in flight: the
/// next one (a restart, or a standby taking over) does not send a second
/// remove-node for the operation but confirms the removal; it asks again
/// only when the node goes on reporting twice its stale window later.
#[test]
fn a_resumed_removal_is_confirmed_not_requested_twice() {
    let removing = |h: &mut H| {
        let op = drain_to_removal(h, 3);
        assert_eq!(down(h, &op).step, DownStep::Removing);
        let restored = journaled(h);
        let mut h2 = H::new(cfg_with(short_windows));
        h2.now = h.now;
        h2.core.restore(restored);
        let a = h2.core.resume(h2.now);
        h2.out.extend(a.clone());
        let c = calls(&a);
        assert!(
            c.iter().all(|c| !matches!(c.1, HandlerCall::Remove(_))),
            "no second remove-node: {c:?}"
        );
        assert!(
            matches!(c.as_slice(), [(_, HandlerCall::Presence { .. })]),
            "{c:?}"
        );
        assert_eq!(down(&h2, &op).step, DownStep::ConfirmingGone);
        (h2, op)
    };
    // The first request did reach the cloud: the node goes silent.
    let mut h = H::new(cfg_with(short_windows));
    let (mut h2, op) = removing(&mut h);
    answer(&mut h2, CallResult::Presence(Ok(Presence::Unknown)));
    h2.advance(40);
    h2.tick();
    assert_eq!(kinds(&h2.out), vec![DecisionKind::Removed]);
    assert!(
        calls(&h2.out)
            .iter()
            .all(|c| !matches!(c.1, HandlerCall::Remove(_)))
    );
    assert_eq!(down(&h2, &op).end, Some(DownEnd::Removed));
    // It did not: the node reports on, and after twice its stale window
    // (3 intervals of 10 s) the removal is asked again, once.
    let mut h = H::new(cfg_with(short_windows));
    let (mut h2, op2) = removing(&mut h);
    answer(&mut h2, CallResult::Presence(Ok(Presence::Present)));
    let mut r = rep("c", "d1", "small", 100, 0, 0);
    r.active = false;
    let mut asked = 0;
    for _ in 0..8 {
        h2.advance(10);
        h2.report(r.clone());
        let a = h2.tick();
        asked += calls(&a)
            .iter()
            .filter(|c| matches!(c.1, HandlerCall::Remove(_)))
            .count();
    }
    assert_eq!(
        asked, 1,
        "asked again once the node was seen alive long after"
    );
    assert_eq!(down(&h2, &op2).step, DownStep::Removing);
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
    let a = h.core.on_event("c", Some(op2.as_str()), &f, h.now, h.now);
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
    let (op, _) = deactivated_drain(&mut h, 10);
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

/// A restarted agent resumes a drain and hears from part of the fleet
/// first, whose figures read as pressure: the drain is not cancelled on
/// them during the start-up grace (found by the fault campaign), only once
/// the grace is over and the pressure is still there.
#[test]
fn a_resumed_drain_is_not_cancelled_on_a_partial_fleet_during_the_grace() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, _) = deactivated_drain(&mut h, 10);
    let restored = journaled(&h);
    let mut h2 = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.startup_grace = std::time::Duration::from_secs(30);
    }));
    h2.now = h.now;
    h2.core.restore(restored);
    h2.core.resume(h2.now);
    // Only a nearly full node has reported to the new process.
    h2.advance(1);
    h2.node("a", "d1", 95, 100);
    let a = h2.eval();
    assert!(
        sends(&a)
            .iter()
            .all(|s| !matches!(s.3, Message::Activate(_))),
        "no re-activation during the grace: {a:?}"
    );
    assert_ne!(explain(&a, "d1").outcome, Outcome::DrainCancelled);
    assert!(down(&h2, &op).end.is_none());
    // After the grace, with the pressure real, the drain is cancelled.
    h2.advance(30);
    h2.node("a", "d1", 95, 100);
    h2.node("b", "d1", 95, 100);
    let a = h2.eval();
    assert_eq!(explain(&a, "d1").outcome, Outcome::DrainCancelled);
}

mod confirm;
mod machine;
mod paas;

#[test]
fn cancelled_and_failed_drains_set_the_scale_down_cooldown() {
    // Cancelled: pressure returned during the drain.
    let mut h = H::new(cfg_with(short_windows));
    let (op, _) = start_drain(&mut h);
    h.advance(10);
    h.node("a", "d1", 95, 100);
    h.node("b", "d1", 95, 100);
    let mut c = rep("c", "d1", "small", 100, 10, 0);
    c.active = false;
    h.report(c);
    let (_, _, act, _) = sends(&h.eval()).pop().unwrap();
    done(&mut h, &op, act, "cmd.activate", CommandResult::Activated);
    assert_eq!(down(&h, &op).end, Some(DownEnd::Cancelled));
    let m = h.core.group_state(&g("d1", "small")).memory;
    assert_eq!(m.last_scale_down, Some(h.now));
    // Aborted by an operator: the failure cooldown and the scale-down one.
    let mut h = H::new(cfg_with(short_windows));
    let (op, _) = start_drain(&mut h);
    let a = h.core.operator_abort(op.as_str(), "bob", h.now).unwrap();
    let (_, _, cmd, _) = sends(&a).pop().unwrap();
    done(&mut h, &op, cmd, "cmd.activate", CommandResult::Activated);
    let m = h.core.group_state(&g("d1", "small")).memory;
    assert_eq!(
        (m.last_failure, m.last_scale_down),
        (Some(h.now), Some(h.now))
    );
    // So the next evaluation does not drain again at once.
    refresh(&mut h, 60, QUIET);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "cooldown_after_scale_down").ok);
}

/// While a cancelled drain's node is being re-activated, its free slots
/// count as capacity on the way back: an evaluation in between asks for no
/// new node (the cancel already answered the pressure).
#[test]
fn a_node_being_reactivated_counts_as_capacity() {
    let mut h = H::new(cfg_with(short_windows));
    let (op, _) = start_drain(&mut h);
    h.advance(10);
    h.node("a", "d1", 95, 100);
    h.node("b", "d1", 95, 100);
    let mut c = rep("c", "d1", "small", 100, 10, 0);
    c.active = false;
    h.report(c);
    let a = h.eval();
    assert!(
        a.iter()
            .any(|x| matches!(x, Action::Explain(e) if e.summary.contains("PROFILE_THRESHOLD"))),
        "the cancel says why: {a:?}"
    );
    assert_eq!(down(&h, &op).step, DownStep::Reactivating { cancel: true });
    // Another report, another evaluation before the node answers.
    h.advance(1);
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
}
