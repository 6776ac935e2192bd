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

/// A scale-up whose create call timed out: its outcome is unknown.
fn create_timed_out(h: &mut H) -> OpId {
    let op = scale_up_op(h);
    answer(h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(
        h,
        CallResult::Create(Err(HandlerError::Transient("timeout".into()))),
    );
    op
}

#[test]
fn unknown_outcome_is_looked_up_and_never_requested_twice() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = create_timed_out(&mut h);
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
    let op = create_timed_out(&mut h);
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

/// A create whose fate nobody can tell (the agent that asked stopped, the
/// handler cannot look it up) that never brings a node: not a cloud
/// failure, so no backoff, and the next evaluation asks again at once.
#[test]
fn an_uncertain_create_that_never_joins_ends_without_backoff() {
    let mut h = H::new(cfg_with(|_| {}));
    let op = create_timed_out(&mut h);
    answer(&mut h, CallResult::Lookup(Ok(Lookup::Unknown)));
    assert_eq!(up_step(&h, &op), UpStep::Booting { uncertain: true });
    h.advance(15 * 60);
    let a = h.tick();
    assert_eq!(kinds(&a), vec![DecisionKind::ProvisionTimeout]);
    let Some(Action::Decide(d)) = a.iter().find(|x| matches!(x, Action::Decide(_))) else {
        panic!("{a:?}")
    };
    assert!(d.reason.contains("no backoff"), "{}", d.reason);
    assert_eq!(up_step(&h, &op), UpStep::TimedOut);
    let gs = h.core.group_state(&g("d1", "small"));
    assert_eq!(gs.supply.backoff_until, None);
    assert_eq!(gs.supply.up_failures, 0);
    // Still under pressure: the next evaluation asks for a node again.
    h.advance(60);
    h.node("a", "d1", 95, 100);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
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

// ------------------------------------------------------- the machine alone

use crate::core::actions::{Effect, Out};
use crate::core::scale_up::{Match, ScaleUp, Sighting, UpCtx, UpInput, UpOutcome};

fn up_cx<'a>(op: &'a OpId, group: &'a GroupKey, cfg: &'a BrokerConfig) -> UpCtx<'a> {
    UpCtx {
        op,
        group,
        created: t0(),
        cfg,
    }
}

/// Node `node`'s report as the machine reads it, matched by its operation id.
fn seen(node: &str, district: Option<&str>, profile: &str, gears: u32) -> Sighting {
    Sighting {
        node: node.into(),
        profile: profile.into(),
        district: district.map(str::to_string),
        gears,
        matched: Match::OperationId,
    }
}

fn only_call(out: &Out<UpOutcome>) -> HandlerCall {
    match out.effects.as_slice() {
        [Effect::Call(c)] => c.clone(),
        other => panic!("expected one call, got {other:?}"),
    }
}

#[test]
fn machine_preflight_create_boot_then_provision_timeout() {
    let cfg = BrokerConfig::defaults();
    let (op, group) = (OpId::from("op-000000000001"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = ScaleUp::new();
    let out = u.step(&cx, UpInput::Start, t0());
    assert!(matches!(only_call(&out), HandlerCall::Capacity { .. }));
    assert!(out.touched);
    let out = u.step(
        &cx,
        UpInput::Result(CallResult::Capacity(Ok(Capacity::unknown()))),
        t0(),
    );
    let HandlerCall::Create(req) = only_call(&out) else {
        panic!("{out:?}")
    };
    assert_eq!((req.op.as_str(), req.attempt), ("op-000000000001", 1));
    assert_eq!(u.step, UpStep::Requesting);
    let booted = CreateOutcome {
        node: Some("n9".into()),
        ..Default::default()
    };
    let at = t0() + Duration::seconds(5);
    let out = u.step(&cx, UpInput::Result(CallResult::Create(Ok(booted))), at);
    assert_eq!(out, Out::touched());
    assert_eq!(u.step, UpStep::Booting { uncertain: false });
    assert_eq!((u.node.as_deref(), u.requested_at), (Some("n9"), Some(at)));
    // The provision timeout runs from the request.
    let out = u.step(&cx, UpInput::Tick, at + Duration::minutes(14));
    assert_eq!(out, Out::none());
    let out = u.step(&cx, UpInput::Tick, at + Duration::minutes(15));
    assert_eq!(out.outcome, Some(UpOutcome::TimedOut));
    assert!(matches!(
        &out.effects[..],
        [Effect::Decide(n)] if n.kind == DecisionKind::ProvisionTimeout && n.reason.contains("op-000000000001")
    ));
    assert!(u.step.is_terminal());
}

#[test]
fn machine_never_creates_twice_on_a_doubt() {
    let cfg = BrokerConfig::defaults();
    let (op, group) = (OpId::from("op-000000000002"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = ScaleUp::new();
    u.step(
        &cx,
        UpInput::Result(CallResult::Capacity(Ok(Capacity::unknown()))),
        t0(),
    );
    let timeout = Err(HandlerError::Transient("timeout".into()));
    let out = u.step(&cx, UpInput::Result(CallResult::Create(timeout)), t0());
    assert!(matches!(only_call(&out), HandlerCall::Lookup { .. }));
    assert_eq!(u.step, UpStep::Checking);
    // A restart while checking asks again, never creates.
    let out = u.step(&cx, UpInput::Resume, t0());
    assert!(matches!(only_call(&out), HandlerCall::Lookup { .. }));
    let out = u.step(
        &cx,
        UpInput::Result(CallResult::Lookup(Ok(Lookup::Unknown))),
        t0(),
    );
    assert!(out.effects.is_empty());
    assert_eq!(u.step, UpStep::Booting { uncertain: true });
    assert_eq!(u.attempt, 1);
    // An answer that does not fit the step changes nothing.
    let stray = UpInput::Result(CallResult::Create(Ok(CreateOutcome::default())));
    assert_eq!(u.step(&cx, stray, t0()), Out::none());
}

#[test]
fn machine_quota_at_preflight_fails_and_joins_or_aborts_end_it() {
    let cfg = BrokerConfig::defaults();
    let (op, group) = (OpId::from("op-000000000003"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = ScaleUp::new();
    let full = Capacity {
        nodes_available: Some(0),
        detail: "cores 40/40".into(),
    };
    let out = u.step(&cx, UpInput::Result(CallResult::Capacity(Ok(full))), t0());
    assert!(matches!(out.outcome, Some(UpOutcome::Failed(ref e)) if e.is_quota()));
    assert!(matches!(&u.step, UpStep::Failed { kind, .. } if kind == "quota"));
    // A join after the end changes nothing.
    let join = UpInput::Report(seen("n1", Some("d1"), "small", 0));
    assert_eq!(u.step(&cx, join.clone(), t0()), Out::none());
    let mut u = ScaleUp::new();
    let out = u.step(&cx, join, t0());
    assert_eq!(out.outcome, Some(UpOutcome::Joined));
    assert_eq!(u.node.as_deref(), Some("n1"));
    let mut u = ScaleUp::new();
    let out = u.step(&cx, UpInput::Abort { by: "alice".into() }, t0());
    assert_eq!(out, Out::touched());
    assert!(matches!(&u.step, UpStep::Failed { kind, .. } if kind == "aborted"));
}

mod join;
