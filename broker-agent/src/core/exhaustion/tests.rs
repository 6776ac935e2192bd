//! Exhaustion tracking: through the coordinator, then the machine alone.

use crate::core::testkit::*;

#[test]
fn quota_failures_exhaust_a_group_without_blocking_others_and_capacity_lifts_it() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.backoff_initial = std::time::Duration::from_secs(1);
        c.policy.backoff_max = std::time::Duration::from_secs(1);
    }));
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 50, 100);
    // First failure: a quota error from create.
    h.eval();
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    let a = answer(
        &mut h,
        CallResult::Create(Err(HandlerError::Quota("instances 10/10".into()))),
    );
    assert_eq!(kinds(&a), vec![DecisionKind::HandlerFailed]);
    // Second: the pre-flight says 0 nodes fit.
    h.advance(2);
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 50, 100);
    h.eval();
    let a = answer(
        &mut h,
        CallResult::Capacity(Ok(Capacity {
            nodes_available: Some(0),
            detail: "cores 40/40".into(),
        })),
    );
    assert_eq!(
        kinds(&a),
        vec![DecisionKind::HandlerFailed, DecisionKind::Exhausted]
    );
    assert!(
        h.core
            .group_state(&g("d1", "small"))
            .supply
            .exhausted
            .is_some()
    );
    // d1 is held as exhausted; d2 still scales when it needs to.
    h.advance(2);
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 95, 100);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d2".into(), None)]
    );
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(!rule(e, "exhausted").ok);
    // The periodic check: still none, then capacity returns.
    h.advance(300);
    let a = h.tick();
    let (tag, call) = calls(&a).pop().unwrap();
    assert!(matches!(call, HandlerCall::Capacity { .. }));
    assert_eq!(tag, CallTag::Group(g("d1", "small")));
    let r = h.core.on_handler_result(
        tag.clone(),
        CallResult::Capacity(Ok(Capacity {
            nodes_available: Some(0),
            detail: "still full".into(),
        })),
        h.now,
    );
    assert!(r.is_empty());
    let r = h.core.on_handler_result(
        tag,
        CallResult::Capacity(Ok(Capacity {
            nodes_available: Some(3),
            detail: "3 fit".into(),
        })),
        h.now,
    );
    assert_eq!(kinds(&r), vec![DecisionKind::ExhaustionLifted]);
    assert!(
        h.core
            .group_state(&g("d1", "small"))
            .supply
            .exhausted
            .is_none()
    );
}
