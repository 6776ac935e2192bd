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

// ------------------------------------------------------- the machine alone

use crate::core::actions::Effect;
use crate::core::exhaustion::{Supply, SupplyInput};

fn decided(out: &crate::core::exhaustion::SupplyOut) -> Vec<DecisionKind> {
    out.effects
        .iter()
        .map(|e| match e {
            Effect::Decide(n) => n.kind,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[test]
fn machine_backoff_doubles_to_its_maximum_and_a_join_ends_it() {
    let p = BrokerConfig::defaults().policy;
    let grp = g("d1", "small");
    let mut s = Supply::default();
    let mut waits = vec![];
    for _ in 0..5 {
        let out = s.step(
            &grp,
            &p,
            SupplyInput::Failed(HandlerError::Permanent("x".into())),
            t0(),
        );
        assert!(out.changed && out.effects.is_empty() && !out.check);
        waits.push((s.backoff_until.unwrap() - t0()).num_minutes());
    }
    assert_eq!(waits, vec![5, 10, 20, 30, 30]);
    assert_eq!(s.quota_failures, 0);
    s.step(&grp, &p, SupplyInput::Joined, t0());
    assert_eq!((s.up_failures, s.backoff_until), (0, None));
}

#[test]
fn machine_exhausts_after_quota_failures_checks_periodically_and_lifts() {
    let p = BrokerConfig::defaults().policy;
    let grp = g("d1", "small");
    let quota = || SupplyInput::Failed(HandlerError::Quota("instances 10/10".into()));
    let mut s = Supply::default();
    assert!(decided(&s.step(&grp, &p, quota(), t0())).is_empty());
    let out = s.step(&grp, &p, quota(), t0());
    assert_eq!(decided(&out), vec![DecisionKind::Exhausted]);
    let ex = s.exhausted.clone().unwrap();
    assert_eq!(ex.next_check, t0() + Duration::minutes(5));
    // Once exhausted, more quota failures say nothing new.
    assert!(decided(&s.step(&grp, &p, quota(), t0())).is_empty());
    // A non-quota failure resets the quota count but not the exhaustion.
    s.step(
        &grp,
        &p,
        SupplyInput::Failed(HandlerError::Busy("b".into())),
        t0(),
    );
    assert_eq!(s.quota_failures, 0);
    assert!(s.exhausted.is_some());
    // The check is due at `next_check`, then five minutes later.
    assert!(
        !s.step(&grp, &p, SupplyInput::Tick, t0() + Duration::minutes(4))
            .check
    );
    let at = t0() + Duration::minutes(5);
    assert!(s.step(&grp, &p, SupplyInput::Tick, at).check);
    assert!(!s.check_due(at));
    let none = Capacity {
        nodes_available: Some(0),
        detail: "full".into(),
    };
    let out = s.step(&grp, &p, SupplyInput::Capacity(Ok(none)), at);
    assert!(out.effects.is_empty() && out.changed);
    let out = s.step(&grp, &p, SupplyInput::Capacity(Ok(Capacity::unknown())), at);
    assert_eq!(decided(&out), vec![DecisionKind::ExhaustionLifted]);
    assert_eq!(s.exhausted, None);
    // One more quota failure exhausts it again.
    assert_eq!(s.quota_failures, p.exhausted_after_quota_failures - 1);
    assert_eq!(
        decided(&s.step(&grp, &p, quota(), at)),
        vec![DecisionKind::Exhausted]
    );
}

#[test]
fn machine_capacity_answers_for_a_group_that_is_not_exhausted_change_nothing() {
    let p = BrokerConfig::defaults().policy;
    let mut s = Supply::default();
    let out = s.step(
        &g("d1", "small"),
        &p,
        SupplyInput::Capacity(Ok(Capacity::unknown())),
        t0(),
    );
    assert!(!out.changed && out.effects.is_empty());
    assert_eq!(s, Supply::default());
}
