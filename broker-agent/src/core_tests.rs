//! Policy and saga tests with fake time: every rule, every saga path.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use chrono::{DateTime, Duration, Utc};
use gearshift_handlers::{
    Capacity, CreateOutcome, GroupKey, HandlerError, Lookup, Presence, RemoveOutcome,
};
use gearshift_proto::msg::{
    CommandResult, DecisionKind, DistrictInfo, Done, Failed, GearCounts, GearInfo, GearState,
    Message, Move, NodeReport, Outcome, Progress,
};
use uuid::Uuid;

use super::*;
use crate::config::{BrokerConfig, VictimStrategy};
use crate::ops::{DownEnd, DownStep, OpBody, UpStep};
use crate::perkey::PerKey;
use crate::planner::{EvacuationPlanner, PlanInput};

/// Test double: gears go to the candidate with the most free active slots.
struct RoomPlanner;

impl EvacuationPlanner for RoomPlanner {
    fn plan(&self, input: &PlanInput<'_>) -> Result<Vec<Move>, String> {
        let mut room: Vec<(String, i64)> = input
            .candidates
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    i64::from(c.max_active_gears.unwrap_or(0))
                        - i64::from(c.gears_active.unwrap_or(0)),
                )
            })
            .collect();
        let mut moves = vec![];
        for g in input.gears {
            room.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            let Some(best) = room.first_mut() else {
                return Err("no candidate".into());
            };
            if best.1 <= 0 {
                return Err("no room".into());
            }
            if !matches!(g.state, GearState::Idle | GearState::Stopped) {
                best.1 -= 1;
            }
            moves.push(Move {
                gear: g.id.clone(),
                target: best.0.clone(),
            });
        }
        Ok(moves)
    }
}

fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap()
}

fn g(d: &str, p: &str) -> GroupKey {
    GroupKey {
        district: d.into(),
        profile: p.into(),
    }
}

struct H {
    core: Core,
    now: DateTime<Utc>,
    seq: u64,
    out: Vec<Action>,
}

fn cfg_with(f: impl FnOnce(&mut BrokerConfig)) -> Arc<BrokerConfig> {
    let mut c = BrokerConfig::defaults();
    c.policy.startup_grace = std::time::Duration::ZERO;
    f(&mut c);
    Arc::new(c)
}

impl H {
    fn new(cfg: Arc<BrokerConfig>) -> H {
        let n = Arc::new(AtomicU64::new(1));
        let core = Core::new(cfg, Arc::new(RoomPlanner), t0()).with_ids(move || {
            let n = u128::from(n.fetch_add(1, Ordering::SeqCst));
            Uuid::from_u128((n << 96) | n)
        });
        H {
            core,
            now: t0(),
            seq: 0,
            out: vec![],
        }
    }

    fn advance(&mut self, secs: i64) {
        self.now += Duration::seconds(secs);
    }

    fn report(&mut self, r: NodeReport) {
        let mut r = r;
        self.seq += 1;
        r.seq = self.seq;
        let a = self.core.on_report(r, self.now).expect("report accepted");
        self.out.extend(a);
    }

    fn node(&mut self, name: &str, district: &str, active: u32, max: u32) {
        self.report(rep(name, district, "small", max, active, 0));
    }

    fn eval(&mut self) -> Vec<Action> {
        let a = self.core.evaluate(self.now);
        self.out.extend(a.clone());
        a
    }

    fn tick(&mut self) -> Vec<Action> {
        let a = self.core.tick(self.now);
        self.out.extend(a.clone());
        a
    }
}

fn rep(node: &str, district: &str, profile: &str, max: u32, active: u32, idle: u32) -> NodeReport {
    NodeReport {
        node: node.into(),
        seq: 0,
        profile: profile.into(),
        district: (district != "_none").then(|| DistrictInfo {
            uuid: district.into(),
            active: true,
            first_uid: None,
            max_uid: None,
        }),
        max_active_gears: max,
        gears: GearCounts {
            started: active,
            idle,
            ..Default::default()
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 0,
        mem_total_mb: 0,
        started_at: t0() - Duration::hours(1),
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 10,
        agent_version: "t".into(),
    }
}

fn decisions(a: &[Action]) -> Vec<(DecisionKind, String, Option<String>)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Decide(d) => Some((d.decision, d.district.clone(), d.node.clone())),
            _ => None,
        })
        .collect()
}

fn kinds(a: &[Action]) -> Vec<DecisionKind> {
    decisions(a).into_iter().map(|d| d.0).collect()
}

fn explain<'a>(a: &'a [Action], district: &str) -> &'a gearshift_proto::msg::Explanation {
    a.iter()
        .find_map(|x| match x {
            Action::Explain(e) if e.district == district => Some(e),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no explanation for {district}"))
}

fn rule<'a>(
    e: &'a gearshift_proto::msg::Explanation,
    name: &str,
) -> &'a gearshift_proto::msg::Reason {
    e.reasons
        .iter()
        .find(|r| r.rule == name)
        .unwrap_or_else(|| panic!("no rule {name} in {:?}", e.reasons))
}

fn calls(a: &[Action]) -> Vec<(CallTag, HandlerCall)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Call { tag, call, .. } => Some((tag.clone(), call.clone())),
            _ => None,
        })
        .collect()
}

fn sends(a: &[Action]) -> Vec<(String, String, Uuid, Message)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Send {
                node,
                corr,
                id,
                msg,
            } => Some((node.clone(), corr.clone(), *id, msg.clone())),
            _ => None,
        })
        .collect()
}

fn gears(n: usize) -> Vec<GearInfo> {
    (0..n)
        .map(|i| GearInfo {
            id: format!("g{i}"),
            app: None,
            state: GearState::Started,
            uid: None,
            bytes: None,
            do_not_disrupt: false,
        })
        .collect()
}

// ------------------------------------------------------------ scale-up rules

#[test]
fn profile_threshold_scales_up_the_district_with_most_free_uids() {
    let mut h = H::new(cfg_with(|_| {}));
    // d1: 2 nodes at 90 active of 100 (180 gears in the district); d2: 1 node at 70.
    h.node("a", "d1", 89, 100);
    h.node("b", "d1", 89, 100);
    h.node("c", "d2", 70, 100);
    // profile: 248 active, 52 available -> 82.7 % >= 80.
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d2".into(), None)]
    );
    let e = explain(&a, "d2");
    assert_eq!(e.outcome, Outcome::ScaleUp);
    assert!(rule(e, "profile_threshold").ok);
    assert!(
        rule(e, "profile_threshold").detail.contains("82.7 %"),
        "{e:?}"
    );
    // The pre-flight capacity check is the first handler call.
    assert!(matches!(calls(&a)[0].1, HandlerCall::Capacity { .. }));
    // Booting nodes count: the next evaluation asks for nothing more.
    h.advance(11);
    h.node("a", "d1", 89, 100);
    h.node("b", "d1", 89, 100);
    h.node("c", "d2", 70, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
    assert!(!rule(explain(&a, "d1"), "profile_threshold").ok);
}

#[test]
fn below_profile_threshold_nothing_happens_and_is_explained() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 60, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::None);
    assert!(rule(e, "profile_threshold").detail.contains("60.0 %"));
    assert!(
        rule(e, "compact_threshold")
            .detail
            .contains(">= COMPACT_THRESHOLD 50")
    );
}

#[test]
fn district_threshold_scales_up_that_district() {
    let mut h = H::new(cfg_with(|c| c.policy.profile_threshold = PerKey::off()));
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 10, 100);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleUp, "d1".into(), None)]
    );
    assert!(rule(explain(&a, "d1"), "district_threshold").ok);
    // Per-district override: d1 at 95 % is fine when its threshold is 96.
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.district_threshold = PerKey::parse("90, d1: 96").unwrap();
    }));
    h.node("a", "d1", 95, 100);
    assert!(kinds(&h.eval()).is_empty());
}

#[test]
fn gear_up_threshold_asks_for_gear_up_size_worth_of_nodes() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.profile_threshold = PerKey::off();
        c.policy.gear_up_threshold = PerKey::parse("50, large: none").unwrap();
        c.policy.gear_up_size = PerKey::all(150);
    }));
    // 40 available < 50; 150 gears / 100 per node = 2 nodes.
    h.node("a", "d1", 60, 100);
    let a = h.eval();
    assert_eq!(
        kinds(&a),
        vec![DecisionKind::ScaleUp, DecisionKind::ScaleUp]
    );
    assert!(rule(explain(&a, "d1"), "gear_up_threshold").ok);
    // `large: none` disables the rule for that profile.
    h.report(rep("z", "d9", "large", 100, 60, 0));
    let a = h.eval();
    let e = explain(&a, "d9");
    assert!(e.reasons.iter().all(|r| r.rule != "gear_up_threshold"));
}

#[test]
fn expected_active_percent_needs_room_in_the_district() {
    let mut h = H::new(cfg_with(|_| {}));
    // capacity 6000 UIDs; 5 % expected active: a 100-gear node holds 2000 gears.
    let mut r = rep("a", "d1", "small", 100, 90, 4000);
    r.gears.stopped = 100;
    h.report(r);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held, "{e:?}");
    assert!(e.summary.contains("district_room"), "{}", e.summary);
    // With 50 % expected active, 200 UIDs are enough.
    let mut h = H::new(cfg_with(|c| {
        c.policy.gear_expected_active_percent = PerKey::parse("5, small: 50").unwrap()
    }));
    let mut r = rep("a", "d1", "small", 100, 90, 4000);
    r.gears.stopped = 100;
    h.report(r);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
}

#[test]
fn missing_nodes_hold_scaling() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 90, 100);
    h.node("b", "d1", 90, 100);
    h.node("c", "d1", 90, 100);
    h.advance(25);
    h.node("a", "d1", 90, 100);
    h.node("b", "d1", 90, 100);
    h.advance(10); // c last reported 35 s ago: missing (3 x 10 s)
    let a = h.eval();
    assert!(kinds(&a).is_empty(), "{:?}", kinds(&a));
    let e = explain(&a, "d1");
    assert!(!rule(e, "missing_nodes").ok);
    assert_eq!(e.stats.nodes_missing, 1);
}

#[test]
fn min_and_max_nodes() {
    let mut h = H::new(cfg_with(|c| {
        c.groups.push(crate::config::GroupConfig {
            district: "d1".into(),
            profile: "small".into(),
            handler: None,
            min_nodes: Some(2),
            max_nodes: Some(3),
            victim_strategy: None,
            shape: None,
        });
    }));
    // A configured group with no node at all: min_nodes asks for 2.
    let a = h.eval();
    assert_eq!(
        kinds(&a),
        vec![DecisionKind::ScaleUp, DecisionKind::ScaleUp]
    );
    // max_nodes: 3 full nodes; the group cannot grow.
    let mut h = H::new(cfg_with(|c| c.group_defaults.max_nodes = 3));
    for n in ["a", "b", "c"] {
        h.node(n, "d1", 95, 100);
    }
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(
        e.summary.contains("max_nodes") || rule(e, "target_district").detail.contains("max_nodes"),
        "{e:?}"
    );
}

#[test]
fn breaker_stops_all_scaling_while_too_many_nodes_are_stale() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 95, 100);
    h.node("b", "d2", 95, 100);
    h.node("c", "d3", 10, 100);
    h.advance(31);
    h.node("a", "d1", 95, 100); // b and c missing: 2 of 3 > 45 %
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::BreakerOpen]);
    assert!(!rule(explain(&a, "d1"), "breaker").ok);
    h.advance(1);
    h.node("b", "d2", 95, 100);
    h.node("c", "d3", 10, 100);
    let a = h.eval();
    assert_eq!(kinds(&a)[0], DecisionKind::BreakerClosed);
}

#[test]
fn startup_grace_holds_decisions() {
    let mut h = H::new(cfg_with(|c| {
        c.policy.startup_grace = std::time::Duration::from_secs(30)
    }));
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "startup_grace").ok);
    h.advance(30);
    h.node("a", "d1", 95, 100);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleUp]);
}

#[test]
fn a_report_over_a_threshold_asks_for_an_early_evaluation() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 50, 100);
    assert_eq!(h.core.evaluation_due(), None);
    h.node("a", "d1", 85, 100);
    assert_eq!(h.core.evaluation_due(), Some(h.now + Duration::seconds(1)));
    assert_eq!(h.core.take_pressure_seen(), Some(h.now));
}

// ------------------------------------------------------- scale-up lifecycle

fn scale_up_op(h: &mut H) -> OpId {
    h.node("a", "d1", 95, 100);
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleUp]);
    h.core
        .ops()
        .find(|o| o.kind() == "scale_up" && !o.is_done())
        .unwrap()
        .id
        .clone()
}

fn last_call(h: &H) -> (CallTag, HandlerCall) {
    calls(&h.out).last().cloned().unwrap()
}

fn answer(h: &mut H, r: CallResult) -> Vec<Action> {
    let (tag, _) = last_call(h);
    let a = h.core.on_handler_result(tag, r, h.now);
    h.out.extend(a.clone());
    a
}

fn up_step(h: &H, id: &str) -> UpStep {
    match &h.core.op(id).unwrap().body {
        OpBody::ScaleUp(u) => u.step.clone(),
        _ => panic!(),
    }
}

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
    r.booted_for = Some(op.clone());
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
    assert_eq!(gs.backoff_until, Some(h.now + Duration::minutes(5)));
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
        h.now = gs.backoff_until.unwrap();
        h.node("a", "d1", 95, 100);
        h.out.clear();
        h.eval();
        answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
        answer(
            &mut h,
            CallResult::Create(Err(HandlerError::Permanent("bad flavor".into()))),
        );
        let gs = h.core.group_state(&g("d1", "small"));
        waits.push((gs.backoff_until.unwrap() - h.now).num_minutes());
    }
    assert_eq!(waits, vec![10, 20, 30, 30, 30]);
    // A join resets the backoff.
    h.now = h.core.group_state(&g("d1", "small")).backoff_until.unwrap();
    h.node("a", "d1", 95, 100);
    h.eval();
    let op = h.core.ops().find(|o| !o.is_done()).unwrap().id.clone();
    answer(&mut h, CallResult::Capacity(Ok(Capacity::unknown())));
    answer(&mut h, CallResult::Create(Ok(CreateOutcome::default())));
    let mut r = rep("n2", "d1", "small", 100, 0, 0);
    r.booted_for = Some(op);
    h.report(r);
    let gs = h.core.group_state(&g("d1", "small"));
    assert_eq!((gs.up_failures, gs.backoff_until), (0, None));
}

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
    assert!(h.core.group_state(&g("d1", "small")).exhausted.is_some());
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
    assert!(h.core.group_state(&g("d1", "small")).exhausted.is_none());
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

// --------------------------------------------------------- scale-down rules

fn quiet_fleet(h: &mut H, loads: &[(&str, u32)]) {
    for (n, l) in loads {
        h.node(n, "d1", *l, 100);
    }
}

fn refresh(h: &mut H, secs: i64, loads: &[(&str, u32)]) {
    h.advance(secs);
    quiet_fleet(h, loads);
}

const QUIET: &[(&str, u32)] = &[("a", 30), ("b", 20), ("c", 10)];

#[test]
fn compact_threshold_waits_for_the_stabilization_window_then_drains_the_least_busy() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert_eq!(e.outcome, Outcome::Held);
    assert!(rule(e, "compact_threshold").ok);
    assert!(!rule(e, "stabilization").ok);
    for _ in 0..59 {
        refresh(&mut h, 10, QUIET);
        assert!(kinds(&h.eval()).is_empty());
    }
    refresh(&mut h, 10, QUIET);
    let a = h.eval();
    assert_eq!(
        decisions(&a),
        vec![(DecisionKind::ScaleDown, "d1".into(), Some("c".into()))]
    );
    let s = sends(&a);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].0, "c");
    assert!(matches!(s[0].3, Message::Deactivate(_)));
    // Usage back above the threshold resets the window.
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, QUIET);
    h.eval();
    refresh(&mut h, 300, &[("a", 95), ("b", 60), ("c", 40)]);
    h.eval();
    assert_eq!(h.core.group_state(&g("d1", "small")).underused_since, None);
}

fn short_windows(c: &mut BrokerConfig) {
    c.policy.scale_down_stabilization = std::time::Duration::ZERO;
}

#[test]
fn cooldowns_hold_scale_down() {
    // After a scale-up.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).last_scale_up = Some(h.now - Duration::minutes(9));
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "cooldown_after_scale_up").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    // After a scale-down.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).last_scale_down = Some(h.now - Duration::minutes(4));
    assert!(!rule(explain(&h.eval(), "d1"), "cooldown_after_scale_down").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    // After a failure.
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).last_failure = Some(h.now - Duration::minutes(2));
    assert!(!rule(explain(&h.eval(), "d1"), "cooldown_after_failure").ok);
    refresh(&mut h, 60, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
}

#[test]
fn decisions_wait_for_reports_newer_than_the_last_decision() {
    let mut h = H::new(cfg_with(short_windows));
    quiet_fleet(&mut h, QUIET);
    h.core.group_mut(&g("d1", "small")).last_decision = Some(h.now + Duration::seconds(1));
    h.advance(2);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    assert!(!rule(explain(&a, "d1"), "fresh_reports").ok);
    refresh(&mut h, 1, QUIET);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
}

#[test]
fn gear_down_threshold_triggers_scale_down() {
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::off();
        c.policy.gear_down_threshold = PerKey::all(150);
    }));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 60)]);
    let a = h.eval();
    assert!(!rule(explain(&a, "d1"), "gear_down_threshold").ok);
    refresh(&mut h, 10, &[("a", 40), ("b", 40), ("c", 40)]);
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    assert!(rule(explain(&a, "d1"), "gear_down_threshold").ok);
}

#[test]
fn victim_choice_strategies_and_opt_outs() {
    let pick = |strategy: VictimStrategy, prep: &dyn Fn(&mut H)| -> Option<String> {
        let mut h = H::new(cfg_with(|c| {
            short_windows(c);
            c.policy.victim_strategy = strategy;
        }));
        prep(&mut h);
        decisions(&h.eval()).into_iter().find_map(|d| d.2)
    };
    let base = |h: &mut H| {
        let mut a = rep("a", "d1", "small", 100, 5, 10);
        a.started_at = t0() - Duration::hours(3);
        let mut b = rep("b", "d1", "small", 100, 3, 0);
        b.started_at = t0() - Duration::hours(1);
        let mut c = rep("c", "d1", "small", 100, 0, 0);
        c.started_at = t0() - Duration::hours(2);
        h.report(a);
        h.report(b);
        h.report(c);
    };
    assert_eq!(pick(VictimStrategy::LeastBusy, &base).as_deref(), Some("c"));
    assert_eq!(pick(VictimStrategy::Oldest, &base).as_deref(), Some("a"));
    assert_eq!(pick(VictimStrategy::Newest, &base).as_deref(), Some("b"));
    assert_eq!(pick(VictimStrategy::EmptyOnly, &base).as_deref(), Some("c"));
    // Inactive nodes come first, whatever the strategy.
    let inactive_b = |h: &mut H| {
        base(h);
        let mut b = rep("b", "d1", "small", 100, 3, 0);
        b.active = false;
        h.report(b);
    };
    assert_eq!(
        pick(VictimStrategy::LeastBusy, &inactive_b).as_deref(),
        Some("b")
    );
    // empty_only with no empty node: nothing.
    let no_empty = |h: &mut H| quiet_fleet(h, QUIET);
    assert_eq!(pick(VictimStrategy::EmptyOnly, &no_empty), None);
    // Do-not-disrupt (report or operator mark) and pinned gears are never victims.
    let opted_out = |h: &mut H| {
        quiet_fleet(h, QUIET);
        let mut c = rep("c", "d1", "small", 100, 10, 0);
        c.do_not_disrupt = true;
        h.report(c);
        let mut b = rep("b", "d1", "small", 100, 20, 0);
        b.pinned_gears = 1;
        h.report(b);
        h.core.set_do_not_disrupt("a", true);
    };
    assert_eq!(pick(VictimStrategy::LeastBusy, &opted_out), None);
}

#[test]
fn absorb_and_no_flap_checks() {
    // c has 45 active gears; a and b have 10 + 10 free slots: cannot absorb.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::all(79);
    }));
    quiet_fleet(&mut h, &[("a", 90), ("b", 90), ("c", 45)]);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert!(kinds(&a).is_empty(), "{e:?}");
    assert!(!rule(e, "absorb").ok || !rule(e, "no_flap").ok);
    // Room enough, but removing c would push usage over 80 %: no_flap holds.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.policy.compact_threshold = PerKey::all(79);
    }));
    quiet_fleet(&mut h, &[("a", 78), ("b", 78), ("c", 30)]);
    let a = h.eval();
    let e = explain(&a, "d1");
    assert!(rule(e, "absorb").ok);
    assert!(!rule(e, "no_flap").ok, "{e:?}");
}

#[test]
fn disruption_budget_and_min_nodes() {
    let mut h = H::new(cfg_with(short_windows));
    let loads: Vec<(String, u32)> = (0..5).map(|i| (format!("n{i}"), 5)).collect();
    let l: Vec<(&str, u32)> = loads.iter().map(|(n, v)| (n.as_str(), *v)).collect();
    quiet_fleet(&mut h, &l);
    assert_eq!(kinds(&h.eval()), vec![DecisionKind::ScaleDown]);
    refresh(&mut h, 10, &l);
    let a = h.eval();
    assert!(kinds(&a).is_empty());
    let e = explain(&a, "d1");
    assert!(!rule(e, "disruption_budget").ok);
    assert!(rule(e, "disruption_budget").detail.contains("budget 1"));
    // min_nodes: a group at its minimum is not drained.
    let mut h = H::new(cfg_with(|c| {
        short_windows(c);
        c.group_defaults.min_nodes = 3;
    }));
    quiet_fleet(&mut h, QUIET);
    let a = h.eval();
    assert!(!rule(explain(&a, "d1"), "min_nodes").ok || kinds(&a).is_empty());
    assert!(kinds(&a).is_empty());
}

// ---------------------------------------------------------- scale-down saga

fn start_drain(h: &mut H) -> (OpId, Uuid) {
    quiet_fleet(h, QUIET);
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    let (node, corr, id, _) = sends(&a).pop().unwrap();
    assert_eq!(node, "c");
    (corr, id)
}

fn done(h: &mut H, op: &str, cmd: Uuid, command: &str, result: CommandResult) -> Vec<Action> {
    let msg = Message::Done(Done {
        cmd,
        command: command.into(),
        result,
    });
    let a = h.core.on_event("c", Some(op), &msg, h.now);
    h.out.extend(a.clone());
    a
}

fn down(h: &H, op: &str) -> crate::ops::ScaleDown {
    match &h.core.op(op).unwrap().body {
        OpBody::ScaleDown(d) => d.clone(),
        _ => panic!(),
    }
}

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
    h.core.on_event("c", Some(&op), &p, h.now);
    assert_eq!(down(&h, &op).progress.moved, 4);
    // Events from another node are ignored.
    assert!(h.core.on_event("b", Some(&op), &p, h.now).is_empty());
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
        h.core.group_state(&g("d1", "small")).last_scale_down,
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
        h.core.group_state(&g("d1", "small")).last_failure,
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
    let a = h.core.on_event("c", Some(&op2), &f, h.now);
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

#[test]
fn operator_evacuate_and_abort() {
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60), ("c", 30)]);
    // Thresholds do not apply to an operator's request; room does.
    let (op, a) = h.core.operator_evacuate("c", "alice", h.now).unwrap();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    assert!(
        h.core
            .operator_evacuate("c", "alice", h.now)
            .unwrap_err()
            .contains("already")
    );
    assert!(h.core.operator_evacuate("zz", "alice", h.now).is_err());
    h.core.set_do_not_disrupt("b", true);
    assert!(
        h.core
            .operator_evacuate("b", "alice", h.now)
            .unwrap_err()
            .contains("do-not-disrupt")
    );
    let a = h.core.operator_abort(&op, "alice", h.now).unwrap();
    assert!(matches!(sends(&a).pop().unwrap().3, Message::Activate(_)));
    // No room: a (60 active) cannot go onto b (40 free) alone.
    let mut h = H::new(cfg_with(|_| {}));
    quiet_fleet(&mut h, &[("a", 60), ("b", 60)]);
    assert!(
        h.core
            .operator_evacuate("a", "bob", h.now)
            .unwrap_err()
            .contains("room")
    );
}

/// What the journal holds of `h`'s core, as a restarted agent reads it back.
fn journaled(h: &H) -> Restored {
    Restored {
        ops: h.core.ops().cloned().collect(),
        groups: h.core.group_states().clone().into_iter().collect(),
        marks: h.core.marks().clone(),
        meta: h.core.meta().clone(),
    }
}

#[test]
fn resume_resends_with_the_same_ids_and_looks_up_uncertain_creates() {
    let cfg = cfg_with(short_windows);
    let mut h = H::new(cfg.clone());
    let (op, cmd) = start_drain(&mut h);
    // Another group needs a node: its create is in flight at the crash.
    h.report(rep("x", "d2", "small", 100, 95, 0));
    h.core.group_mut(&g("d1", "small")).last_decision = None;
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
