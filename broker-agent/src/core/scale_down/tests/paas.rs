//! The scale-down machine with `[paas] kind = "openshift"`: the district
//! commands, the broker-side moves, their refusals, retries and timeouts,
//! and a restart in the middle.

use crate::core::testkit::*;

use super::machine::{World, done_msg, event, report, sent};
use crate::core::actions::{Effect, Out, PaasCall};
use crate::core::scale_down::{DownInput, DownOutcome, MoveState, Origin};
use crate::paas::{Cause, Failure, Outcome as PaasOutcome, PaasKind};

fn openshift() -> World {
    let mut w = World::new();
    w.cfg.paas.kind = PaasKind::OpenShift;
    w.cfg.saga.evacuation_parallelism = 2;
    w
}

fn saga() -> ScaleDown {
    ScaleDown::new(
        "c",
        Origin::Policy {
            strategy: "least_busy".into(),
        },
        t0(),
    )
}

fn ctl(f: fn(String, String) -> PaasCall) -> PaasCall {
    f("d1".into(), "c".into())
}

fn deactivate() -> PaasCall {
    ctl(|district, host| PaasCall::Deactivate { district, host })
}

fn activate() -> PaasCall {
    ctl(|district, host| PaasCall::Activate { district, host })
}

fn remove_node() -> PaasCall {
    ctl(|district, host| PaasCall::RemoveNode { district, host })
}

fn paas_calls(out: &Out<DownOutcome>) -> Vec<PaasCall> {
    out.effects
        .iter()
        .filter_map(|e| match e {
            Effect::Paas(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

fn moved_gears(out: &Out<DownOutcome>) -> Vec<String> {
    paas_calls(out)
        .into_iter()
        .filter_map(|c| match c {
            PaasCall::Move { gear, .. } => Some(gear),
            _ => None,
        })
        .collect()
}

fn answer(
    w: &mut World,
    d: &mut ScaleDown,
    call: PaasCall,
    outcome: PaasOutcome,
    now: DateTime<Utc>,
) -> Out<DownOutcome> {
    w.step(
        d,
        DownInput::Result(CallResult::Paas { call, outcome }),
        now,
    )
}

/// `oo-admin-move` of `gear` answered `outcome`.
fn mv(
    w: &mut World,
    d: &mut ScaleDown,
    gear: &str,
    outcome: PaasOutcome,
    now: DateTime<Utc>,
) -> Out<DownOutcome> {
    let call = move_of(gear, d);
    answer(w, d, call, outcome, now)
}

fn move_of(gear: &str, d: &ScaleDown) -> PaasCall {
    let m = d.broker_moves.iter().find(|m| m.gear == gear).unwrap();
    PaasCall::Move {
        gear: gear.into(),
        target: m.target.clone(),
    }
}

/// Five gears: g0 and g1 of application `shop`, the others alone.
fn app_gears() -> Vec<GearInfo> {
    let mut gs = gears(5);
    gs[0].app = Some("shop".into());
    gs[1].app = Some("shop".into());
    gs
}

/// Deactivated in the district and on the node, planned; the evacuation's id.
fn moving(w: &mut World) -> (ScaleDown, Uuid, Out<DownOutcome>) {
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    let (deact, _) = sent(&answer(w, &mut d, deactivate(), PaasOutcome::Done, t0()));
    let inv = done_msg(deact, CommandResult::Deactivated { gears: app_gears() });
    let out = w.step(&mut d, event("c", &inv), t0());
    let Some(Effect::Send { id, .. }) = out.effects.first() else {
        panic!("{out:?}")
    };
    (d.clone(), *id, out)
}

#[test]
fn openshift_deactivates_in_the_district_before_telling_the_node() {
    let mut w = openshift();
    let mut d = saga();
    let out = w.step(&mut d, DownInput::Start, t0());
    assert_eq!(paas_calls(&out), vec![deactivate()]);
    assert!(out.touched, "journaled before the command runs");
    assert_eq!(
        (d.step.clone(), d.district_deactivated, d.state_name()),
        (
            DownStep::DistrictDeactivating,
            true,
            "deactivating_in_district"
        )
    );
    // An answer to another command changes nothing.
    assert_eq!(
        answer(&mut w, &mut d, activate(), PaasOutcome::Done, t0()),
        Out::none()
    );
    // Already inactive counts as done: the node is told next.
    let already = PaasOutcome::AlreadyInState {
        detail: "Node already inactive".into(),
    };
    let (_, msg) = sent(&answer(&mut w, &mut d, deactivate(), already, t0()));
    assert!(matches!(msg, Message::Deactivate(_)));
    assert_eq!(d.step, DownStep::Deactivating);
}

#[test]
fn a_refused_deactivation_aborts_with_its_cause_and_undoes_nothing() {
    let mut w = openshift();
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    let refused = PaasOutcome::refused(
        Cause::NotInDistrict,
        "Node with server identity: c is not in district",
    );
    let out = answer(&mut w, &mut d, deactivate(), refused, t0());
    assert!(paas_calls(&out).is_empty() && !d.district_deactivated);
    let Some(DownOutcome::Ended(DownEnd::Aborted { reason })) = out.outcome else {
        panic!("{out:?}")
    };
    assert!(reason.contains("not_in_district"), "{reason}");
    assert!(d.refusal.as_deref().unwrap().contains("not_in_district"));
}

#[test]
fn a_retryable_district_failure_runs_again_then_gives_up_and_reactivates() {
    let mut w = openshift();
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    // A timeout: again after paas_retry (10 s); nothing before.
    let out = answer(&mut w, &mut d, deactivate(), PaasOutcome::TimedOut, t0());
    assert!(out.touched && out.effects.is_empty());
    // A late answer of the timed-out run while waiting is ignored.
    assert_eq!(
        answer(&mut w, &mut d, deactivate(), PaasOutcome::Done, t0()),
        Out::none()
    );
    assert_eq!(
        w.step(&mut d, DownInput::Tick, t0() + Duration::seconds(5)),
        Out::none()
    );
    let t = t0() + Duration::seconds(10);
    assert_eq!(
        paas_calls(&w.step(&mut d, DownInput::Tick, t)),
        vec![deactivate()]
    );
    assert_eq!(d.paas_attempts, 2);
    // No answer at all within the bound counts as a timeout.
    let late = t + Duration::minutes(5);
    let out = w.step(&mut d, DownInput::Tick, late);
    assert!(out.effects.is_empty() && d.paas_retry_at.is_some());
    let late = late + Duration::seconds(10);
    assert_eq!(
        paas_calls(&w.step(&mut d, DownInput::Tick, late)),
        vec![deactivate()]
    );
    // The third run fails too: the last run may have applied, so undo it.
    let unreachable = PaasOutcome::refused(Cause::NodeUnreachable, "Node c is unreachable");
    let out = answer(&mut w, &mut d, deactivate(), unreachable, late);
    assert_eq!(paas_calls(&out), vec![activate()]);
    assert_eq!(d.step, DownStep::DistrictActivating { cancel: false });
    let out = answer(&mut w, &mut d, activate(), PaasOutcome::Done, late);
    let Some(DownOutcome::Ended(DownEnd::Aborted { reason })) = out.outcome else {
        panic!("{out:?}")
    };
    assert!(
        reason.contains("node_unreachable") && reason.contains("ran 3 times"),
        "{reason}"
    );
}

#[test]
fn broker_moves_are_bounded_one_per_application_and_the_node_only_watches() {
    let mut w = openshift();
    let (mut d, _, out) = moving(&mut w);
    let Some(Effect::Send {
        msg: Message::Evacuate(ev),
        ..
    }) = out.effects.first()
    else {
        panic!("{out:?}")
    };
    assert!(ev.watch && ev.parallelism == Some(5) && ev.moves.len() == 5);
    // Parallelism 2; g1 waits for g0 (same application).
    assert_eq!(moved_gears(&out), vec!["g0", "g2"]);
    assert!(d.moving() && d.step == DownStep::Evacuating);
    let out = mv(&mut w, &mut d, "g0", PaasOutcome::Done, t0());
    assert_eq!(moved_gears(&out), vec!["g1"]);
    // A move answered twice, or of a gear not running, changes nothing.
    assert_eq!(
        mv(&mut w, &mut d, "g0", PaasOutcome::Done, t0()),
        Out::none()
    );
    // A retryable failure: the gear runs again after paas_retry, others go first.
    let out = mv(&mut w, &mut d, "g2", PaasOutcome::TimedOut, t0());
    assert_eq!(moved_gears(&out), vec!["g3"]);
    assert_eq!(d.progress.moved, 1);
    let out = mv(&mut w, &mut d, "g1", PaasOutcome::Done, t0());
    assert_eq!(moved_gears(&out), vec!["g4"]);
    assert!(
        w.step(&mut d, DownInput::Tick, t0()).effects.is_empty(),
        "g2 not due, two running"
    );
    mv(&mut w, &mut d, "g3", PaasOutcome::Done, t0());
    let t = t0() + Duration::seconds(10);
    assert_eq!(moved_gears(&w.step(&mut d, DownInput::Tick, t)), vec!["g2"]);
    let g2 = d.broker_moves.iter().find(|m| m.gear == "g2").unwrap();
    assert_eq!((g2.attempts, g2.state), (2, MoveState::Running));
    mv(&mut w, &mut d, "g4", PaasOutcome::Done, t);
    // Every move done: wait for the node's own report to show it empty.
    mv(&mut w, &mut d, "g2", PaasOutcome::Done, t);
    assert_eq!(d.step, DownStep::ConfirmingEmpty);
    assert_eq!((d.progress.moved, d.progress.remaining), (5, 0));
    let busy = report(1, true);
    assert_eq!(w.step(&mut d, busy, t), Out::none());
    // Empty: remove-node in the district, then the cloud removal.
    let empty = report(0, false);
    let out = w.step(&mut d, empty, t);
    assert_eq!(paas_calls(&out), vec![remove_node()]);
    assert!(d.is_removing() && d.state_name() == "removing_from_district");
    let out = answer(&mut w, &mut d, remove_node(), PaasOutcome::Done, t);
    assert!(matches!(&out.effects[..], [Effect::Call(HandlerCall::Remove(r))] if r.node == "c"));
    assert_eq!(d.step, DownStep::Removing);
}

#[test]
fn a_refused_move_ends_the_round_early_and_plans_again() {
    let mut w = openshift();
    w.cfg.saga.evacuation_parallelism = 5;
    let (mut d, _, out) = moving(&mut w);
    assert_eq!(moved_gears(&out), vec!["g0", "g2", "g3", "g4"]);
    let full = PaasOutcome::refused(Cause::TargetFull, "Insufficient disk");
    mv(&mut w, &mut d, "g2", full, t0());
    for g in ["g0", "g3", "g4"] {
        mv(&mut w, &mut d, g, PaasOutcome::Done, t0());
    }
    assert_eq!(d.step, DownStep::Evacuating, "g1 still to move");
    let out = mv(&mut w, &mut d, "g1", PaasOutcome::Done, t0());
    // Settled with a failure: ask the inventory again at once.
    let (_, msg) = sent(&out);
    assert!(matches!(msg, Message::Inventory(_)));
    assert_eq!(d.step, DownStep::Inventorying);
    assert!(d.refusal.as_deref().unwrap().contains("target_full"));
}

#[test]
fn a_refused_remove_node_reactivates_the_node_then_its_district() {
    let mut w = openshift();
    let (mut d, _, _) = moving(&mut w);
    for g in ["g0", "g2", "g1", "g3", "g4"] {
        mv(&mut w, &mut d, g, PaasOutcome::Done, t0());
    }
    let empty = report(0, false);
    w.step(&mut d, empty, t0());
    let has = PaasOutcome::refused(
        Cause::NodeHasGears,
        "Node with server identity: c has gears",
    );
    let (act, msg) = sent(&answer(&mut w, &mut d, remove_node(), has, t0()));
    assert!(matches!(msg, Message::Activate(ref a) if a.reason.contains("node_has_gears")));
    let activated = done_msg(act, CommandResult::Activated);
    let out = w.step(&mut d, event("c", &activated), t0());
    assert_eq!(paas_calls(&out), vec![activate()]);
    let out = answer(&mut w, &mut d, activate(), PaasOutcome::Done, t0());
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Aborted { ref reason })) if reason.contains("node_has_gears")
    ));
}

#[test]
fn a_refused_reactivation_fails_and_names_the_operator_command() {
    let mut w = openshift();
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    // A cancel before the node was told: straight to the district.
    let cancel = DownInput::Abort {
        why: "pressure returned".into(),
        cancel: true,
    };
    assert_eq!(paas_calls(&w.step(&mut d, cancel, t0())), vec![activate()]);
    assert_eq!(d.state_name(), "cancelling_in_district");
    let unresponsive = PaasOutcome::refused(Cause::NodeUnresponsive, "Node c is unresponsive");
    let out = answer(&mut w, &mut d, activate(), unresponsive, t0());
    let Some(DownOutcome::Ended(DownEnd::Failed { reason })) = out.outcome else {
        panic!("{out:?}")
    };
    assert!(
        reason.contains("node_unresponsive") && reason.contains("gearshift-broker activate c"),
        "{reason}"
    );
}

#[test]
fn a_command_that_cannot_run_aborts_without_retrying() {
    let mut w = openshift();
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    let missing = PaasOutcome::failed(Failure::NotExecutable, "cannot run oo-admin-ctl-district");
    let out = answer(&mut w, &mut d, deactivate(), missing, t0());
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Aborted { .. }))
    ));
    assert_eq!(d.paas_attempts, 1);
}

#[test]
fn a_restart_resumes_from_the_journal_and_runs_running_moves_again() {
    let mut w = openshift();
    let (d, evac, _) = moving(&mut w);
    // What the journal holds, read back by a new process.
    let json = serde_json::to_string(&d).unwrap();
    let mut back: ScaleDown = serde_json::from_str(&json).unwrap();
    assert_eq!(back, d);
    let out = w.step(&mut back, DownInput::Resume, t0());
    match &out.effects[0] {
        Effect::Send { id, msg, .. } => {
            assert_eq!(
                *id, evac,
                "the same command id: a node that has it refuses a replay"
            );
            assert!(matches!(msg, Message::Evacuate(e) if e.watch));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(moved_gears(&out), vec!["g0", "g2"]);
    // A move that finished before the crash is answered "already so".
    let already = PaasOutcome::AlreadyInState {
        detail: "gear is already on a".into(),
    };
    mv(&mut w, &mut back, "g0", already, t0());
    assert_eq!(back.progress.moved, 1);
    // A district step resumes by running its command again.
    let mut d = saga();
    w.step(&mut d, DownInput::Start, t0());
    let mut back: ScaleDown = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
    let out = w.step(&mut back, DownInput::Resume, t0());
    assert_eq!(paas_calls(&out), vec![deactivate()]);
}

#[test]
fn without_openshift_no_paas_command_runs() {
    let mut w = World::new();
    let mut d = saga();
    let (deact, _) = sent(&w.step(&mut d, DownInput::Start, t0()));
    let inv = done_msg(deact, CommandResult::Deactivated { gears: app_gears() });
    let out = w.step(&mut d, event("c", &inv), t0());
    let (_, msg) = sent(&out);
    assert!(matches!(msg, Message::Evacuate(ref e) if !e.watch && e.parallelism == Some(4)));
    assert!(!d.moving());
}

#[test]
fn the_coordinator_runs_paas_commands_and_routes_their_answers() {
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.paas.kind = PaasKind::OpenShift;
    }));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    let (op, call) = a
        .iter()
        .find_map(|x| match x {
            Action::Paas { op, call } => Some((op.clone(), call.clone())),
            _ => None,
        })
        .expect("a PaaS command");
    assert!(matches!(&call, PaasCall::Deactivate { host, .. } if host == "c"));
    assert!(
        h.core.take_changes().ops.contains(&op),
        "journaled with the action"
    );
    let a = h.core.on_handler_result(
        CallTag::Paas(op.clone()),
        CallResult::Paas {
            call,
            outcome: PaasOutcome::Done,
        },
        h.now,
    );
    assert!(matches!(&sends(&a)[..], [(n, _, _, Message::Deactivate(_))] if n == "c"));
    // An answer for an unknown operation is dropped.
    let stray = CallResult::Paas {
        call: remove_node(),
        outcome: PaasOutcome::Done,
    };
    assert!(
        h.core
            .on_handler_result(CallTag::Paas(OpId::from("op-x")), stray, h.now)
            .is_empty()
    );
}
