//! The scale-up operation: its whole life through the coordinator, then
//! the machine alone.

use crate::core::testkit::*;

#[test]
fn scale_up_joins_when_the_node_reports_its_operation() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = scale_up_op(&mut h);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    assert_eq!(up_step(&h, &op), UpStep::Requesting);
    let (_, call) = last_call(&h);
    let HandlerCall::Create(req) = call else {
        panic!()
    };
    assert_eq!(
        (req.op.as_str(), req.attempt, req.group.district.as_str()),
        (op.as_str(), 1, "d1")
    );
    answer(&mut h, CallResult::Create(Ok(CreateOutcome::default())));
    assert_eq!(up_step(&h, &op), UpStep::Booting { uncertain: false });
    h.advance(120);
    let mut r = rep("new-1", "d1", "small", 100, 0, 0);
    r.booted_for = Some(op.to_string());
    h.out.clear();
    h.report(r);
    assert_eq!(
        decisions(&h.out),
        vec![(DecisionKind::Joined, "d1".into(), Some("new-1".into()))]
    );
    assert_eq!(up_step(&h, &op), UpStep::Joined);
}

#[test]
fn unknown_outcome_is_looked_up_and_never_requested_twice() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = scale_up_op(&mut h);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(
        &mut h,
        CallResult::Create(Err(HandlerError::Transient("timeout".into()))),
    );
    assert_eq!(up_step(&h, &op), UpStep::Checking);
    assert!(matches!(last_call(&h).1, HandlerCall::Lookup { .. }));
    answer(&mut h, CallResult::Lookup(Ok(Lookup::Unknown)));
    assert_eq!(up_step(&h, &op), UpStep::Booting { uncertain: true });
    let creates = calls(&h.out)
        .iter()
        .filter(|c| matches!(c.1, HandlerCall::Create(_)))
        .count();
    assert_eq!(creates, 1);
    // NotFound: asking again is safe.
    let mut h = H::new(cfg_with(|_| {}));
    let op = scale_up_op(&mut h);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(
        &mut h,
        CallResult::Create(Err(HandlerError::Transient("timeout".into()))),
    );
    answer(&mut h, CallResult::Lookup(Ok(Lookup::NotFound)));
    let HandlerCall::Create(req) = last_call(&h).1 else {
        panic!()
    };
    assert_eq!(req.attempt, 2);
    assert_eq!(up_step(&h, &op), UpStep::Requesting);
    // A stale result (older call) is ignored.
    let stale = CallTag::Op {
        op: op.clone(),
        seq: 1,
    };
    assert!(
        h.core
            .on_handler_result(
                stale,
                CallResult::Create(Ok(CreateOutcome::default())),
                h.now
            )
            .is_empty()
    );
    assert_eq!(up_step(&h, &op), UpStep::Requesting);
}

#[test]
fn provision_timeout_then_backoff_doubles_to_its_maximum() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = scale_up_op(&mut h);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(&mut h, CallResult::Create(Ok(CreateOutcome::default())));
    h.advance(14 * 60);
    assert!(h.tick().is_empty());
    h.advance(60);
    let a = h.tick();
    assert_eq!(kinds(&a), vec![DecisionKind::ProvisionTimeout]);
    assert_eq!(up_step(&h, &op), UpStep::TimedOut);
    let gs = h.core.group_state(&g("d1", "small"));
    assert_eq!(gs.supply.backoff_until, Some(h.now + Duration::minutes(5)));
    // While backing off, the pressure is held.
    h.advance(60);
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(
        e.reasons
            .iter()
            .any(|r| r.rule == "target_district" && r.detail.contains("backoff")),
        "{e:?}"
    );
    // Consecutive failures: 5, 10, 20, 30, 30 minutes.
    let mut waits = vec![];
    for _ in 0..5 {
        let gs = h.core.group_state(&g("d1", "small"));
        h.now = gs.supply.backoff_until.unwrap();
        h.node("a", "d1", 95, 100);
        h.out.clear();
        h.eval();
        answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
        answer(
            &mut h,
            CallResult::Create(Err(HandlerError::Permanent("bad flavor".into()))),
        );
        let gs = h.core.group_state(&g("d1", "small"));
        waits.push((gs.supply.backoff_until.unwrap() - h.now).num_minutes());
    }
    assert_eq!(waits, vec![10, 20, 30, 30, 30]);
    // A join resets the backoff.
    h.now = h
        .core
        .group_state(&g("d1", "small"))
        .supply
        .backoff_until
        .unwrap();
    h.node("a", "d1", 95, 100);
    h.eval();
    let op = h.core.ops().find(|o| !o.is_done()).unwrap().id.clone();
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(&mut h, CallResult::Create(Ok(CreateOutcome::default())));
    let mut r = rep("n2", "d1", "small", 100, 0, 0);
    r.booted_for = Some(op.to_string());
    h.report(r);
    let gs = h.core.group_state(&g("d1", "small"));
    assert_eq!((gs.supply.up_failures, gs.supply.backoff_until), (0, None));
}

#[test]
fn busy_cloud_is_retried_after_a_wait() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = scale_up_op(&mut h);
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(
        &mut h,
        CallResult::Create(Err(HandlerError::Busy("stack UPDATE_IN_PROGRESS".into()))),
    );
    assert!(matches!(up_step(&h, &op), UpStep::Waiting { .. }));
    h.advance(29);
    assert!(calls(&h.tick()).is_empty());
    h.advance(1);
    let a = h.tick();
    let HandlerCall::Create(req) = calls(&a)[0].1.clone() else {
        panic!()
    };
    assert_eq!(req.attempt, 2);
}
