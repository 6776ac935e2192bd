//! The test harness of the core's tests: a core with fake time and
//! deterministic ids, a planner double, report builders and action filters.
//! Shared by the tests beside each machine, the policy's and the
//! coordinator's.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

// What the tests read and write, in one import (`use crate::core::testkit::*`).
pub(crate) use chrono::{DateTime, Duration, Utc};
pub(crate) use gearshift_handlers::{
    Capacity, CreateOutcome, GroupKey, HandlerError, Lookup, Presence, RemoveOutcome,
};
pub(crate) use gearshift_proto::msg::{
    CommandResult, DecisionKind, DistrictInfo, Done, Failed, GearCounts, GearInfo, GearState,
    Message, Move, NodeReport, Outcome, Progress,
};
pub(crate) use uuid::Uuid;

pub(crate) use crate::config::{BrokerConfig, VictimStrategy};
pub(crate) use crate::core::{Action, CallResult, CallTag, Core, HandlerCall, Restored};
pub(crate) use crate::ops::{DownEnd, DownStep, OpBody, OpId, ScaleDown, UpStep};
pub(crate) use crate::perkey::PerKey;
use crate::planner::{EvacuationPlanner, PlanInput};

/// Test double: a planner that never plans (for tests that need no moves).
pub(crate) struct NoPlan;

impl EvacuationPlanner for NoPlan {
    fn plan(&self, _: &PlanInput<'_>) -> Result<Vec<Move>, String> {
        Err("none".into())
    }
}

/// Test double: gears go to the candidate with the most free active slots.
pub(crate) struct RoomPlanner;

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

pub(crate) fn t0() -> DateTime<Utc> {
    DateTime::from_timestamp(1_800_000_000, 0).unwrap()
}

pub(crate) fn g(d: &str, p: &str) -> GroupKey {
    GroupKey {
        district: d.into(),
        profile: p.into(),
    }
}

pub(crate) struct H {
    pub core: Core,
    pub now: DateTime<Utc>,
    pub seq: u64,
    pub out: Vec<Action>,
}

pub(crate) fn cfg_with(f: impl FnOnce(&mut BrokerConfig)) -> Arc<BrokerConfig> {
    let mut c = BrokerConfig::defaults();
    c.policy.startup_grace = std::time::Duration::ZERO;
    // A handler that acts (the default, `log`, is a dry run).
    c.group_defaults.handler = "cloud".into();
    f(&mut c);
    Arc::new(c)
}

impl H {
    pub(crate) fn new(cfg: Arc<BrokerConfig>) -> H {
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

    pub(crate) fn advance(&mut self, secs: i64) {
        self.now += Duration::seconds(secs);
    }

    pub(crate) fn report(&mut self, r: NodeReport) {
        let mut r = r;
        self.seq += 1;
        r.seq = self.seq;
        let a = self
            .core
            .on_report(r, self.now, self.now)
            .expect("report accepted");
        self.out.extend(a);
    }

    pub(crate) fn node(&mut self, name: &str, district: &str, active: u32, max: u32) {
        self.report(rep(name, district, "small", max, active, 0));
    }

    pub(crate) fn eval(&mut self) -> Vec<Action> {
        let a = self.core.evaluate(self.now);
        self.out.extend(a.clone());
        a
    }

    pub(crate) fn tick(&mut self) -> Vec<Action> {
        let a = self.core.tick(self.now);
        self.out.extend(a.clone());
        a
    }
}

pub(crate) fn rep(
    node: &str,
    district: &str,
    profile: &str,
    max: u32,
    active: u32,
    idle: u32,
) -> NodeReport {
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
        booted_at: None,
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 10,
        agent_version: "t".into(),
    }
}

pub(crate) fn decisions(a: &[Action]) -> Vec<(DecisionKind, String, Option<String>)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Decide(d) => Some((d.decision, d.district.clone(), d.node.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn kinds(a: &[Action]) -> Vec<DecisionKind> {
    decisions(a).into_iter().map(|d| d.0).collect()
}

pub(crate) fn explain<'a>(
    a: &'a [Action],
    district: &str,
) -> &'a gearshift_proto::msg::Explanation {
    a.iter()
        .find_map(|x| match x {
            Action::Explain(e) if e.district == district => Some(e),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no explanation for {district}"))
}

pub(crate) fn rule<'a>(
    e: &'a gearshift_proto::msg::Explanation,
    name: &str,
) -> &'a gearshift_proto::msg::Reason {
    e.reasons
        .iter()
        .find(|r| r.rule == name)
        .unwrap_or_else(|| panic!("no rule {name} in {:?}", e.reasons))
}

pub(crate) fn calls(a: &[Action]) -> Vec<(CallTag, HandlerCall)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Call { tag, call, .. } => Some((tag.clone(), call.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn paas_calls(a: &[Action]) -> Vec<(OpId, crate::core::PaasCall)> {
    a.iter()
        .filter_map(|x| match x {
            Action::Paas { op, call } => Some((op.clone(), call.clone())),
            _ => None,
        })
        .collect()
}

pub(crate) fn sends(a: &[Action]) -> Vec<(String, OpId, Uuid, Message)> {
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

pub(crate) fn gears(n: usize) -> Vec<GearInfo> {
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

pub(crate) fn scale_up_op(h: &mut H) -> OpId {
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

pub(crate) fn last_call(h: &H) -> (CallTag, HandlerCall) {
    calls(&h.out).last().cloned().unwrap()
}

pub(crate) fn answer(h: &mut H, r: CallResult) -> Vec<Action> {
    let (tag, _) = last_call(h);
    let a = h.core.on_handler_result(tag, r, h.now);
    h.out.extend(a.clone());
    a
}

pub(crate) fn up_step(h: &H, id: &OpId) -> UpStep {
    match &h.core.op(id.as_str()).unwrap().body {
        OpBody::ScaleUp(u) => u.step.clone(),
        _ => panic!(),
    }
}

pub(crate) fn quiet_fleet(h: &mut H, loads: &[(&str, u32)]) {
    for (n, l) in loads {
        h.node(n, "d1", *l, 100);
    }
}

pub(crate) fn refresh(h: &mut H, secs: i64, loads: &[(&str, u32)]) {
    h.advance(secs);
    quiet_fleet(h, loads);
}

pub(crate) const QUIET: &[(&str, u32)] = &[("a", 30), ("b", 20), ("c", 10)];

pub(crate) fn short_windows(c: &mut BrokerConfig) {
    c.policy.scale_down_stabilization = std::time::Duration::ZERO;
}

pub(crate) fn start_drain(h: &mut H) -> (OpId, Uuid) {
    quiet_fleet(h, QUIET);
    let a = h.eval();
    assert_eq!(kinds(&a), vec![DecisionKind::ScaleDown]);
    let (node, corr, id, _) = sends(&a).pop().unwrap();
    assert_eq!(node, "c");
    (corr, id)
}

/// [`start_drain`], then the node deactivated with `n` gears, evacuated,
/// and reporting itself empty: the saga asks the handler to remove it.
/// [`start_drain`], then the node deactivated with `n` gears: the
/// operation and what the coordinator did next.
pub(crate) fn deactivated_drain(h: &mut H, n: usize) -> (OpId, Vec<Action>) {
    let (op, cmd) = start_drain(h);
    let a = done(
        h,
        &op,
        cmd,
        "cmd.deactivate",
        CommandResult::Deactivated { gears: gears(n) },
    );
    (op, a)
}

pub(crate) fn drain_to_removal(h: &mut H, n: usize) -> OpId {
    let (op, a) = deactivated_drain(h, n);
    let (_, _, evac, _) = sends(&a).pop().expect("cmd.evacuate");
    let evacuated = CommandResult::Evacuated {
        moved: n as u32,
        failed: 0,
        results: vec![],
        gears_left: 0,
    };
    done(h, &op, evac, "cmd.evacuate", evacuated);
    h.advance(1);
    let mut r = rep("c", "d1", "small", 100, 0, 0);
    r.active = false;
    h.report(r);
    op
}

pub(crate) fn done(
    h: &mut H,
    op: &OpId,
    cmd: Uuid,
    command: &str,
    result: CommandResult,
) -> Vec<Action> {
    let msg = Message::Done(Done {
        cmd,
        command: command.into(),
        result,
    });
    let a = h.core.on_event("c", Some(op.as_str()), &msg, h.now, h.now);
    h.out.extend(a.clone());
    a
}

pub(crate) fn down(h: &H, op: &OpId) -> ScaleDown {
    match &h.core.op(op.as_str()).unwrap().body {
        OpBody::ScaleDown(d) => d.clone(),
        _ => panic!(),
    }
}

/// What the journal holds of `h`'s core, as a restarted agent reads it back.
pub(crate) fn journaled(h: &H) -> Restored {
    Restored {
        ops: h.core.ops().cloned().collect(),
        groups: h.core.group_states().clone().into_iter().collect(),
        marks: h.core.marks().clone(),
        cordons: h.core.cordons().nodes().clone(),
        meta: h.core.meta().clone(),
    }
}
