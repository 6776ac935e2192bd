//! The coordinator as a whole: early evaluations, restarts.

use std::collections::BTreeMap;

use crate::core::testkit::*;

#[test]
fn a_report_over_a_threshold_asks_for_an_early_evaluation() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 50, 100);
    assert_eq!(h.core.evaluation_due(), None);
    h.node("a", "d1", 85, 100);
    assert_eq!(h.core.evaluation_due(), Some(h.now + Duration::seconds(1)));
    assert_eq!(h.core.take_pressure_seen(), Some(h.now));
}

/// A group already answered asks again only after REPEAT_PRESSURE; a new
/// crossing elsewhere in the meantime is not held behind that repeat.
#[test]
fn a_new_crossing_does_not_wait_behind_a_repeat() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.district_threshold = PerKey::all(80);
    }));
    h.node("a", "d1", 50, 100);
    h.node("b", "d2", 50, 100);
    // The last evaluation, just now, found d1 over its threshold.
    h.core.pressured = BTreeMap::from([(g("d1", "small"), h.now)]);
    // d1 is still over: its next evaluation waits for the repeat.
    h.node("a", "d1", 86, 100);
    let repeat = h.now + crate::core::REPEAT_PRESSURE;
    assert_eq!(h.core.evaluation_due(), Some(repeat));
    assert_eq!(h.core.take_pressure_seen(), None);
    // d2 crosses: evaluated react_delay later, its latency clock started.
    h.node("b", "d2", 90, 100);
    assert_eq!(h.core.evaluation_due(), Some(h.now + Duration::seconds(1)));
    assert_eq!(h.core.take_pressure_seen(), Some(h.now));
}

/// A profile's threshold is the profile's business: one early evaluation
/// of it, whichever of its groups' reports shows the crossing.
#[test]
fn a_profile_crossing_is_one_early_evaluation_of_the_profile() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 50, 100);
    h.node("b", "d2", 50, 100);
    // Profile small at 85 %: over its 80 %; no district over its 90 %.
    h.node("a", "d1", 85, 100);
    h.node("b", "d2", 85, 100);
    let profile = crate::policy::profile_key("small");
    assert_eq!(
        h.core.due,
        BTreeMap::from([(profile, h.now + Duration::seconds(1))])
    );
    h.advance(1);
    let acts = h.core.evaluate_due(h.now);
    // The plan's district (most free UIDs, then the first) gets the node.
    assert_eq!(kinds(&acts), [DecisionKind::ScaleUp]);
    assert_eq!(h.core.evaluation_due(), None);
}

/// An early evaluation covers only the groups that reports pushed over a
/// threshold, and decides for them what an evaluation of every group would.
#[test]
fn an_early_evaluation_covers_only_the_groups_over_a_threshold() {
    let fleet = |h: &mut H| {
        h.report(rep("a", "d1", "small", 100, 50, 0));
        h.report(rep("b", "d1", "large", 100, 50, 0));
        h.report(rep("b", "d1", "large", 100, 90, 0));
    };
    let mut early = H::new(cfg_with(|_| {}));
    fleet(&mut early);
    let due = early.now + Duration::seconds(1);
    assert_eq!(early.core.evaluation_due(), Some(due));
    assert!(early.core.evaluate_due(early.now).is_empty(), "not due yet");
    early.now = due;
    let acts = early.core.evaluate_due(due);
    let explained: Vec<String> = acts
        .iter()
        .filter_map(|a| match a {
            Action::Explain(x) => Some(format!("{}/{}", x.district, x.profile)),
            _ => None,
        })
        .collect();
    assert_eq!(explained, ["d1/large"]);
    assert_eq!(early.core.evaluation_due(), None);
    // The same decisions as an evaluation of every group at that instant.
    let mut all = H::new(cfg_with(|_| {}));
    fleet(&mut all);
    all.now = due;
    let full = all.eval();
    assert_eq!(decisions(&acts), decisions(&full));
    assert_eq!(kinds(&acts), [DecisionKind::ScaleUp]);
    // The profile was answered: it asks again only after REPEAT_PRESSURE.
    early.report(rep("b", "d1", "large", 100, 91, 0));
    assert_eq!(
        early.core.evaluation_due(),
        Some(due + crate::core::REPEAT_PRESSURE)
    );
}

#[test]
fn resume_resends_with_the_same_ids_and_looks_up_uncertain_creates() {
    let cfg = cfg_with(short_windows);
    let mut h = H::new(cfg.clone());
    let (op, cmd) = start_drain(&mut h);
    // Another group needs a node: its create is in flight at the crash.
    h.report(rep("x", "d2", "small", 100, 95, 0));
    h.core.group_mut(&g("d1", "small")).memory.last_decision = None;
    let up = {
        let (id, _) = h
            .core
            .start_scale_up(&g("d2", "small"), "test".into(), h.now);
        h.core.on_handler_result(
            CallTag::Op {
                op: id.clone(),
                seq: 1,
            },
            CallResult::Capacity(Ok(Capacity::unknown())),
            h.now,
        );
        id
    };
    assert_eq!(up_step(&h, &up), UpStep::Requesting);
    // "Restart": a new core from the journaled records.
    let restored = journaled(&h);
    let mut h2 = H::new(cfg);
    h2.core.restore(restored);
    let a = h2.core.resume(h2.now);
    let s = sends(&a);
    assert_eq!(s.len(), 1);
    assert_eq!((s[0].1.as_str(), s[0].2), (op.as_str(), cmd));
    let c = calls(&a);
    assert_eq!(c.len(), 1);
    assert!(matches!(c[0].1, HandlerCall::Lookup { .. }), "{c:?}");
    assert!(c.iter().all(|c| !matches!(c.1, HandlerCall::Create(_))));
}

/// A drain resumed by a new process whose fleet is still empty: the plan
/// waits for the other nodes' reports during the start-up grace instead of
/// aborting, and a plan that still finds no room after it aborts as usual.
#[test]
fn a_resumed_drain_plans_once_the_fleet_has_reported() {
    let restart = |grace_secs: u64| {
        let mut h = H::new(cfg_with(short_windows));
        let (op, cmd) = start_drain(&mut h);
        let restored = journaled(&h);
        let mut h2 = H::new(cfg_with(|c| {
            short_windows(c);
            c.policy.startup_grace = std::time::Duration::from_secs(grace_secs);
        }));
        h2.core.restore(restored);
        h2.core.resume(h2.now);
        // The victim answers the re-sent deactivate before anyone reported.
        let a = done(
            &mut h2,
            &op,
            cmd,
            "cmd.deactivate",
            CommandResult::Deactivated { gears: gears(10) },
        );
        (h2, op, a)
    };

    let (mut h, op, a) = restart(30);
    assert!(sends(&a).is_empty(), "{a:?}");
    let d = down(&h, &op);
    assert_eq!(d.step, DownStep::Deactivating);
    assert!(d.replan_at.is_some());
    assert_eq!(d.abort_reason, None);
    // The others report; the next tick plans.
    h.node("a", "d1", 30, 100);
    h.node("b", "d1", 20, 100);
    h.advance(1);
    let a = h.tick();
    let s = sends(&a);
    assert_eq!(s.len(), 1, "{a:?}");
    let Message::Evacuate(ev) = &s[0].3 else {
        panic!("{:?}", s[0].3)
    };
    assert_eq!(ev.moves.len(), 10);
    let d = down(&h, &op);
    assert_eq!(
        (d.step, d.round, d.replan_at),
        (DownStep::Evacuating, 1, None)
    );

    // Nobody reports within the grace: the drain aborts and the node is
    // re-activated, as it would have been without a grace.
    let (mut h, op, _) = restart(5);
    for _ in 0..4 {
        h.advance(1);
        h.tick();
        assert_eq!(down(&h, &op).step, DownStep::Deactivating);
    }
    h.advance(1);
    let a = h.tick();
    assert!(
        sends(&a)
            .iter()
            .any(|s| matches!(s.3, Message::Activate(_))),
        "{a:?}"
    );
    let d = down(&h, &op);
    assert_eq!(d.step, DownStep::Reactivating { cancel: false });
    assert!(d.abort_reason.unwrap().contains("no evacuation plan"));

    // Without a grace (the tests' default) the plan fails at once.
    let (h, op, a) = restart(0);
    assert!(
        sends(&a)
            .iter()
            .any(|s| matches!(s.3, Message::Activate(_)))
    );
    assert_eq!(down(&h, &op).step, DownStep::Reactivating { cancel: false });
}

#[test]
fn operator_requests_are_answered_with_what_they_set_off() {
    use gearshift_proto::msg::AdminRequest;
    use std::collections::BTreeMap;

    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 30)]);
    let refused = BTreeMap::from([("stale".to_string(), 2u64)]);
    let ask = |h: &mut H, req| {
        h.core
            .on_operator("alice", req, "broker-1", &refused, h.now)
    };
    let (r, acts) = ask(&mut h, AdminRequest::Status);
    assert!(r.ok && acts.is_empty());
    assert_eq!(r.data["agent"], "broker-1");
    assert_eq!(r.data["refused"]["stale"], 2);
    let (r, _) = ask(
        &mut h,
        AdminRequest::DoNotDisrupt {
            node: "b".into(),
            on: true,
        },
    );
    assert_eq!(r.message, "b is marked do-not-disrupt");
    assert!(h.core.take_changes().marks);
    let (r, acts) = ask(&mut h, AdminRequest::Evacuate { node: "b".into() });
    assert!(!r.ok && r.message.contains("do-not-disrupt") && acts.is_empty());
    let (r, acts) = ask(&mut h, AdminRequest::Evacuate { node: "c".into() });
    let op = r.data["op"].as_str().unwrap().to_string();
    assert_eq!(r.message, format!("evacuating c as {op}"));
    assert_eq!(kinds(&acts), vec![DecisionKind::ScaleDown]);
    let (r, acts) = ask(&mut h, AdminRequest::Abort { op: op.clone() });
    assert_eq!(r.message, format!("aborting {op}"));
    assert!(matches!(
        sends(&acts).pop().unwrap().3,
        Message::Activate(_)
    ));
    let (r, _) = ask(
        &mut h,
        AdminRequest::Abort {
            op: "op-none".into(),
        },
    );
    assert_eq!((r.ok, r.message.as_str()), (false, "no operation op-none"));
}
