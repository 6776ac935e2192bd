//! The district part of a scale-up: add-node on the first report, joined
//! only once the report shows the district, and every way it fails; then the
//! matching of nodes that report without an operation id.

use super::{seen, up_cx};
use crate::core::PaasCall;
use crate::core::actions::{Effect, Out};
use crate::core::scale_up::{Match, ScaleUp, UpInput, UpOutcome, claim};
use crate::core::testkit::*;
use crate::paas::{Cause, Failure, Outcome as PaasOutcome, PaasKind};

fn openshift() -> BrokerConfig {
    let mut c = BrokerConfig::defaults();
    c.paas.kind = PaasKind::OpenShift;
    c
}

/// A scale-up of the machine alone, booting.
fn booting(cx: &crate::core::scale_up::UpCtx<'_>) -> ScaleUp {
    let mut u = ScaleUp::new();
    u.step(
        cx,
        UpInput::Result(CallResult::Capacity(Ok(Capacity::unknown()))),
        t0(),
    );
    u.step(
        cx,
        UpInput::Result(CallResult::Create(Ok(CreateOutcome::default()))),
        t0(),
    );
    assert_eq!(u.step, UpStep::Booting { uncertain: false });
    u
}

fn only_paas(out: &Out<UpOutcome>) -> PaasCall {
    match out.effects.as_slice() {
        [Effect::Paas(c)] => c.clone(),
        other => panic!("expected one PaaS call, got {other:?}"),
    }
}

fn add_node() -> PaasCall {
    PaasCall::AddNode {
        district: "d1".into(),
        host: "n1".into(),
        profile: "small".into(),
    }
}

fn paas(outcome: PaasOutcome) -> UpInput {
    UpInput::Result(CallResult::Paas {
        call: add_node(),
        outcome,
    })
}

fn failed_with(u: &ScaleUp, out: &Out<UpOutcome>, needle: &str) {
    assert!(
        matches!(&u.step, UpStep::Failed { kind, error } if kind == "district" && error.contains(needle)),
        "{:?}",
        u.step
    );
    assert!(matches!(out.outcome, Some(UpOutcome::Failed(_))), "{out:?}");
    assert!(
        matches!(&out.effects[..], [Effect::Decide(n)] if n.kind == DecisionKind::HandlerFailed && n.reason.contains(needle)),
        "{out:?}"
    );
}

#[test]
fn undistricted_node_is_added_and_joins_when_its_report_shows_the_district() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000011"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    let at = t0() + Duration::minutes(3);
    let out = u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), at);
    assert_eq!(
        only_paas(&out),
        PaasCall::AddNode {
            district: "d1".into(),
            host: "n1".into(),
            profile: "small".into()
        }
    );
    assert!(out.touched && out.outcome.is_none());
    assert_eq!(u.step, UpStep::Adding { retry_at: None });
    assert_eq!((u.node.as_deref(), u.seen_at), (Some("n1"), Some(at)));
    // Not joined while add-node runs, nor after it until the report shows it.
    let undistricted = UpInput::Report(seen("n1", None, "small", 0));
    assert_eq!(u.step(&cx, undistricted.clone(), at), Out::none());
    let out = u.step(&cx, paas(PaasOutcome::Done), at);
    assert_eq!(out, Out::touched());
    assert_eq!(u.step, UpStep::Districting);
    assert!(u.detail.contains("waiting for its report"), "{}", u.detail);
    assert_eq!(u.step(&cx, undistricted, at), Out::none());
    // Another node's report in the district is not this one's.
    let other = UpInput::Report(seen("n2", Some("d1"), "small", 0));
    assert_eq!(u.step(&cx, other, at), Out::none());
    let out = u.step(&cx, UpInput::Report(seen("n1", Some("d1"), "small", 0)), at);
    assert_eq!(out.outcome, Some(UpOutcome::Joined));
    assert!(
        matches!(&out.effects[..], [Effect::Decide(n)] if n.kind == DecisionKind::Joined
            && n.reason.contains("in district d1")
            && n.reason.contains("operation id")),
        "{out:?}"
    );
    assert_eq!(u.step, UpStep::Joined);
}

#[test]
fn a_node_already_in_the_district_or_a_group_without_districts_joins_at_once() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000012"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    let out = u.step(
        &cx,
        UpInput::Report(seen("n1", Some("d1"), "small", 0)),
        t0(),
    );
    assert_eq!(out.outcome, Some(UpOutcome::Joined));
    let group = g("_none", "small");
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    let out = u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    assert_eq!(out.outcome, Some(UpOutcome::Joined));
}

#[test]
fn add_node_checks_come_first_profile_gears_and_other_district() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000013"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    for (s, needle) in [
        (seen("n1", None, "large", 0), "profile_mismatch"),
        (seen("n1", None, "small", 2), "node_has_gears"),
        (seen("n1", Some("d9"), "small", 0), "in district d9"),
    ] {
        let mut u = booting(&cx);
        let out = u.step(&cx, UpInput::Report(s), t0());
        failed_with(&u, &out, needle);
    }
}

#[test]
fn add_node_refused_fails_the_operation_with_the_cause() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000014"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    let refused = PaasOutcome::refused(
        Cause::ProfileMismatch,
        "Error for node 'n1': Node with server identity: n1 is of node profile 'large' and needs to be 'small' to add to district 'd1'",
    );
    let out = u.step(&cx, paas(refused), t0());
    failed_with(&u, &out, "profile_mismatch");
    // A tool that cannot run fails it too, with why.
    let mut u = booting(&cx);
    u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    let cannot_run =
        PaasOutcome::failed(Failure::NotExecutable, "cannot run oo-admin-ctl-district");
    let out = u.step(&cx, paas(cannot_run), t0());
    failed_with(&u, &out, "not_executable");
    // A permanent failure (sudo refusing) too.
    let mut u = booting(&cx);
    u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    let out = u.step(
        &cx,
        paas(PaasOutcome::failed(
            Failure::NotPermitted,
            "sudo: a password is required",
        )),
        t0(),
    );
    failed_with(&u, &out, "not_permitted");
}

#[test]
fn retryable_add_node_failure_waits_retries_then_gives_up() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000015"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    let unreachable = || {
        paas(PaasOutcome::refused(
            Cause::NodeUnreachable,
            "Cannot connect to node.",
        ))
    };
    let mut now = t0();
    for attempt in 1..cfg.saga.command_attempts {
        let out = u.step(&cx, unreachable(), now);
        assert_eq!(out, Out::touched());
        let UpStep::Adding { retry_at: Some(at) } = u.step.clone() else {
            panic!("{:?}", u.step)
        };
        assert_eq!(
            u.step(&cx, UpInput::Tick, at - Duration::seconds(1)),
            Out::none()
        );
        // A result while waiting is stale.
        assert_eq!(u.step(&cx, paas(PaasOutcome::Done), now), Out::none());
        now = at;
        let out = u.step(&cx, UpInput::Tick, now);
        assert!(matches!(only_paas(&out), PaasCall::AddNode { .. }));
        assert_eq!(u.add_attempts, attempt + 1);
    }
    let out = u.step(&cx, unreachable(), now);
    failed_with(&u, &out, "node_unreachable");
}

#[test]
fn a_restart_while_adding_asks_again_and_already_added_counts() {
    let cfg = openshift();
    let (op, group) = (OpId::from("op-000000000016"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    let out = u.step(&cx, UpInput::Resume, t0());
    assert!(matches!(only_paas(&out), PaasCall::AddNode { .. }));
    let already = PaasOutcome::AlreadyInState {
        detail: "Node with server identity: n1 is already a member of district: d1".into(),
    };
    u.step(&cx, paas(already), t0());
    assert_eq!(u.step, UpStep::Districting);
}

#[test]
fn without_a_paas_it_waits_for_the_district_then_fails_at_the_deadline() {
    let cfg = BrokerConfig::defaults();
    assert_eq!(cfg.paas.kind, PaasKind::None);
    let (op, group) = (OpId::from("op-000000000017"), g("d1", "small"));
    let cx = up_cx(&op, &group, &cfg);
    let mut u = booting(&cx);
    let out = u.step(&cx, UpInput::Report(seen("n1", None, "small", 0)), t0());
    assert_eq!(out, Out::touched());
    assert_eq!(u.step, UpStep::Districting);
    assert!(u.detail.contains("outside gearshift"), "{}", u.detail);
    let deadline = t0() + crate::core::dur(cfg.policy.provision_timeout);
    let early = deadline - Duration::seconds(1);
    assert_eq!(u.step(&cx, UpInput::Tick, early), Out::none());
    let out = u.step(&cx, UpInput::Tick, deadline);
    failed_with(&u, &out, "did not report district d1");
}

// ------------------------------------------- nodes without an operation id

/// Starts a scale-up of `group` and answers its handler up to `Booting`.
fn boot(h: &mut H, group: &GroupKey) -> OpId {
    let (id, acts) = h.core.start_scale_up(group, "test".into(), h.now);
    h.out.extend(acts);
    answer(h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(h, CallResult::Create(Ok(CreateOutcome::default())));
    assert_eq!(up_step(h, &id), UpStep::Booting { uncertain: false });
    id
}

/// A new node's first report, undistricted, its agent started now.
fn fresh(h: &H, node: &str) -> NodeReport {
    let mut r = rep(node, "_none", "small", 100, 0, 0);
    r.started_at = h.now;
    r
}

#[test]
fn nodes_without_an_operation_id_claim_the_oldest_open_scale_up_one_each() {
    let mut h = H::new(cfg_with(|c| c.paas.kind = PaasKind::OpenShift));
    h.node("a", "d1", 50, 100);
    let d1 = g("d1", "small");
    let first = boot(&mut h, &d1);
    h.advance(10);
    let second = boot(&mut h, &d1);
    h.advance(60);
    // A node the fleet already knows claims nothing, even restarted.
    h.out.clear();
    let mut known = rep("a", "d1", "small", 100, 50, 0);
    known.started_at = h.now;
    h.report(known);
    assert!(paas_calls(&h.out).is_empty());
    // The first new node takes the oldest operation and is added to d1.
    h.report(fresh(&h, "new-1"));
    let calls = paas_calls(&h.out);
    assert_eq!(calls.len(), 1, "{calls:?}");
    let (op, PaasCall::AddNode { district, host, .. }) = calls[0].clone() else {
        panic!("{calls:?}")
    };
    assert_eq!((district.as_str(), host.as_str()), ("d1", "new-1"));
    assert_eq!(op, first);
    assert_eq!(up_step(&h, &first), UpStep::Adding { retry_at: None });
    assert_eq!(up_step(&h, &second), UpStep::Booting { uncertain: false });
    // Its next report (still undistricted) does not claim the second one.
    h.out.clear();
    h.report(fresh(&h, "new-1"));
    assert!(paas_calls(&h.out).is_empty());
    assert_eq!(up_step(&h, &second), UpStep::Booting { uncertain: false });
    // add-node done, then the report in d1: joined, and the decision says how.
    let done = CallResult::Paas {
        call: calls[0].1.clone(),
        outcome: PaasOutcome::Done,
    };
    let a = h.core.on_handler_result(CallTag::Paas(op), done, h.now);
    assert!(a.is_empty(), "{a:?}");
    assert_eq!(up_step(&h, &first), UpStep::Districting);
    h.out.clear();
    let mut in_d1 = rep("new-1", "d1", "small", 100, 0, 0);
    in_d1.started_at = h.now;
    h.report(in_d1);
    assert_eq!(up_step(&h, &first), UpStep::Joined);
    let joined: Vec<_> = h
        .out
        .iter()
        .filter_map(|a| match a {
            Action::Decide(d) if d.decision == DecisionKind::Joined => Some(d.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0].op.as_deref(), Some(first.as_str()));
    assert!(
        joined[0].reason.contains("first new node"),
        "{:?}",
        joined[0]
    );
    // The second new node takes the second operation.
    h.report(fresh(&h, "new-2"));
    assert_eq!(up_step(&h, &second), UpStep::Adding { retry_at: None });
    // No more open operations: a third new node claims nothing.
    h.out.clear();
    h.report(fresh(&h, "new-3"));
    assert!(paas_calls(&h.out).is_empty());
}

#[test]
fn claim_needs_the_profile_the_group_an_agent_started_after_the_decision() {
    let mut h = H::new(cfg_with(|c| c.paas.kind = PaasKind::OpenShift));
    let d1 = g("d1", "small");
    h.advance(100);
    let op = boot(&mut h, &d1);
    let ops = &h.core.ops;
    let r = fresh(&h, "n1");
    assert_eq!(
        claim(ops, &r, true),
        Some((op.clone(), Match::FirstNewNode))
    );
    // Only a node the fleet never saw.
    assert_eq!(claim(ops, &r, false), None);
    // Another profile, another district, an agent older than the decision.
    let mut large = fresh(&h, "n1");
    large.profile = "large".into();
    assert_eq!(claim(ops, &large, true), None);
    let mut d2 = rep("n1", "d2", "small", 100, 0, 0);
    d2.started_at = h.now;
    assert_eq!(claim(ops, &d2, true), None);
    let mut old = fresh(&h, "n1");
    old.started_at = h.now - Duration::seconds(200);
    assert_eq!(claim(ops, &old, true), None);
    // Its own operation id wins; a finished operation is not reopened.
    let mut named = fresh(&h, "n1");
    named.booted_for = Some(op.to_string());
    assert_eq!(
        claim(ops, &named, false),
        Some((op.clone(), Match::OperationId))
    );
    named.booted_for = Some("op-ffffffffffff".into());
    assert_eq!(claim(ops, &named, true), None);
}
