//! The scale-down machine alone: its own state, a small fleet, no coordinator.

use crate::core::testkit::*;

use std::collections::BTreeSet;

use crate::core::actions::{Effect, Out};
use crate::core::facts::Facts;
use crate::core::scale_down::{DownCtx, DownInput, DownOutcome, Origin, Seen};
use crate::fleet::Fleet;
use crate::ops::Ops;

/// A victim `c` (10 gears) and two nodes with room, `a` and `b`.
pub(super) struct World {
    pub(super) cfg: BrokerConfig,
    pub(super) fleet: Fleet,
    ops: Ops,
    marks: BTreeSet<String>,
    next_id: u128,
}

impl World {
    pub(super) fn new() -> World {
        let mut fleet = Fleet::new();
        for (i, (n, active)) in [("a", 30), ("b", 20), ("c", 10)].into_iter().enumerate() {
            let mut r = rep(n, "d1", "small", 100, active, 0);
            r.seq = i as u64 + 1;
            fleet.accept(r, t0()).unwrap();
        }
        World {
            cfg: BrokerConfig::defaults(),
            fleet,
            ops: Ops::default(),
            marks: BTreeSet::new(),
            next_id: 0,
        }
    }

    /// Steps `d` (operation `op-…01` of group d1/small) with `input`.
    pub(super) fn step(
        &mut self,
        d: &mut ScaleDown,
        input: DownInput<'_>,
        now: DateTime<Utc>,
    ) -> Out<DownOutcome> {
        let (op, group) = (OpId::from("op-000000000001"), g("d1", "small"));
        let counter = &mut self.next_id;
        let mut ids = move || {
            *counter += 1;
            Uuid::from_u128(*counter)
        };
        let mut cx = DownCtx {
            op: &op,
            group: &group,
            reason: "test",
            cfg: &self.cfg,
            facts: Facts {
                fleet: &self.fleet,
                ops: &self.ops,
                marks: &self.marks,
                cordons: &Default::default(),
                started: t0() - Duration::hours(1),
                stale_intervals: 3,
            },
            planner: &RoomPlanner,
            ids: &mut ids,
        };
        d.step(&mut cx, input, now)
    }
}

pub(super) fn sent(out: &Out<DownOutcome>) -> (Uuid, Message) {
    match out.effects.as_slice() {
        [Effect::Send { node, id, msg }] if node == "c" => (*id, msg.clone()),
        other => panic!("expected one command to c, got {other:?}"),
    }
}

/// An event of node `from`, sent at `t0()`.
pub(super) fn event<'m>(from: &'m str, msg: &'m Message) -> DownInput<'m> {
    event_at(from, msg, t0())
}

/// An event of node `from`, sent at `sent` by its clock.
pub(super) fn event_at<'m>(from: &'m str, msg: &'m Message, sent: DateTime<Utc>) -> DownInput<'m> {
    DownInput::Event { from, msg, sent }
}

/// A report of the victim sent at `t0()`.
pub(super) fn report(total_gears: u32, busy: bool) -> DownInput<'static> {
    report_at(total_gears, busy, t0())
}

/// A report of the victim sent at `sent` by its clock.
pub(super) fn report_at(total_gears: u32, busy: bool, sent: DateTime<Utc>) -> DownInput<'static> {
    DownInput::Report(Seen {
        sent,
        total_gears,
        busy,
    })
}

pub(super) fn done_msg(cmd: Uuid, result: CommandResult) -> Message {
    Message::Done(Done {
        cmd,
        command: "cmd".into(),
        result,
    })
}

/// A drain of `c` started and planned from a four-gear inventory; the
/// evacuation's command id.
pub(super) fn evacuating(w: &mut World) -> (ScaleDown, Uuid) {
    let mut d = ScaleDown::new(
        "c",
        Origin::Policy {
            strategy: "least_busy".into(),
        },
        t0(),
    );
    let (deact, _) = sent(&w.step(&mut d, DownInput::Start, t0()));
    let inv = done_msg(deact, CommandResult::Deactivated { gears: gears(4) });
    let (evac, _) = sent(&w.step(&mut d, event("c", &inv), t0()));
    (d, evac)
}

#[test]
fn machine_deactivates_then_plans_from_the_inventory() {
    let mut w = World::new();
    let mut d = ScaleDown::new(
        "c",
        Origin::Policy {
            strategy: "least_busy".into(),
        },
        t0(),
    );
    let (deact, msg) = sent(&w.step(&mut d, DownInput::Start, t0()));
    assert!(matches!(msg, Message::Deactivate(ref x) if x.reason == "test"));
    assert_eq!((d.cmd, d.sends), (Some(deact), 1));
    // Events from another node, and answers to older commands, change nothing.
    let inv = done_msg(deact, CommandResult::Deactivated { gears: gears(4) });
    let other = event("b", &inv);
    assert_eq!(w.step(&mut d, other, t0()), Out::none());
    let old = done_msg(Uuid::nil(), CommandResult::Deactivated { gears: gears(4) });
    assert_eq!(w.step(&mut d, event("c", &old), t0()), Out::none());
    // The inventory: four moves to a and b.
    let out = w.step(&mut d, event("c", &inv), t0());
    let (_, msg) = sent(&out);
    let Message::Evacuate(ev) = msg else {
        panic!("{msg:?}")
    };
    assert_eq!(ev.moves.len(), 4);
    assert!(ev.moves.iter().all(|m| m.target == "a" || m.target == "b"));
    assert_eq!(
        (d.step.clone(), d.round, d.progress.total),
        (DownStep::Evacuating, 1, 4)
    );
}

#[test]
fn machine_follows_the_evacuation_until_the_node_reports_empty() {
    let mut w = World::new();
    let (mut d, evac) = evacuating(&mut w);
    let p = Message::Progress(Progress {
        cmd: evac,
        moved: 3,
        failed: 0,
        remaining: 1,
        total: 4,
        results: vec![],
    });
    assert!(w.step(&mut d, event("c", &p), t0()).touched);
    assert_eq!((d.progress.moved, d.progress.moved_total), (3, 3));
    // All moved; the node has not reported empty yet.
    let evacuated = done_msg(
        evac,
        CommandResult::Evacuated {
            moved: 4,
            failed: 0,
            results: vec![],
            gears_left: 0,
        },
    );
    let out = w.step(&mut d, event("c", &evacuated), t0());
    assert!(out.effects.is_empty());
    assert_eq!(d.step, DownStep::ConfirmingEmpty);
    // A busy report with gears waits; an empty one removes through the handler.
    let busy = report(2, true);
    assert_eq!(w.step(&mut d, busy, t0()), Out::none());
    let out = w.step(&mut d, report(0, false), t0());
    assert!(
        matches!(&out.effects[..], [Effect::Call(HandlerCall::Remove(r))] if r.node == "c" && r.attempt == 1)
    );
    assert_eq!(d.step, DownStep::Removing);
}

#[test]
fn machine_aborts_until_the_point_of_return_and_ends_when_reactivated() {
    let mut w = World::new();
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    w.step(&mut d, DownInput::Start, t0());
    let abort = || DownInput::Abort {
        why: "operator alice aborted it".into(),
        cancel: false,
    };
    let (act, msg) = sent(&w.step(&mut d, abort(), t0()));
    assert!(matches!(msg, Message::Activate(ref a) if a.reason.contains("scale-down aborted")));
    assert_eq!(d.step, DownStep::Reactivating { cancel: false });
    // Not cancellable any more: a second abort says nothing.
    assert_eq!(w.step(&mut d, abort(), t0()), Out::none());
    // A restart re-sends the activate with the same id.
    let (again, _) = sent(&w.step(&mut d, DownInput::Resume, t0()));
    assert_eq!(again, act);
    let activated = done_msg(act, CommandResult::Activated);
    let out = w.step(&mut d, event("c", &activated), t0());
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Aborted { .. }))
    ));
    assert!(matches!(&out.effects[..], [Effect::Decide(n)] if n.kind == DecisionKind::Aborted));
    assert_eq!(d.state_name(), "aborted");
    // Past the point of return (removing), an abort is refused.
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::Removing;
    assert_eq!(w.step(&mut d, abort(), t0()), Out::none());
}

#[test]
fn machine_removal_ends_when_the_handler_says_gone_or_fails_at_its_deadline() {
    let mut w = World::new();
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::ConfirmingEmpty;
    w.step(&mut d, report(0, false), t0());
    let accepted = CallResult::Remove(Ok(RemoveOutcome::default()));
    w.step(&mut d, DownInput::Result(accepted), t0());
    assert_eq!(
        (d.step.clone(), d.removed_at),
        (DownStep::ConfirmingGone, Some(t0()))
    );
    // The presence poll is due after `presence_poll`.
    assert_eq!(
        w.step(&mut d, DownInput::Tick, t0() + Duration::seconds(29)),
        Out::none()
    );
    let out = w.step(&mut d, DownInput::Tick, t0() + Duration::seconds(30));
    assert!(matches!(
        &out.effects[..],
        [Effect::Call(HandlerCall::Presence { .. })]
    ));
    let gone = CallResult::Presence(Ok(Presence::Gone));
    let out = w.step(
        &mut d,
        DownInput::Result(gone),
        t0() + Duration::seconds(31),
    );
    assert_eq!(out.outcome, Some(DownOutcome::Ended(DownEnd::Removed)));
    // A handler that never accepts: failed at the remove timeout.
    let mut d = ScaleDown::new("c", Origin::Operator { by: "alice".into() }, t0());
    d.step = DownStep::ConfirmingEmpty;
    w.step(&mut d, report(0, false), t0());
    let refused = CallResult::Remove(Err(HandlerError::Transient("503".into())));
    w.step(&mut d, DownInput::Result(refused), t0());
    let out = w.step(&mut d, DownInput::Tick, t0() + Duration::minutes(15));
    let kinds: Vec<_> = out
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::Decide(n) => Some(n.kind),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        vec![DecisionKind::HandlerFailed, DecisionKind::Aborted]
    );
    assert!(matches!(
        out.outcome,
        Some(DownOutcome::Ended(DownEnd::Failed { .. }))
    ));
}
