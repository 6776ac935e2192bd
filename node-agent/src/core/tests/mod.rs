//! Unit tests of the node core: no bus, no clock, no disk. [`World`]
//! carries out the core's actions on an in-memory disk and runtime and
//! feeds the completions back, or hands them to the test one by one.

mod activation;
mod commands;
mod evacuation;
mod fence;
mod removal;

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, TimeZone, Utc};
use gearshift_proto::msg::{GearInfo, GearState, Message, Pong};
use gearshift_proto::{Envelope, Refusal};
use uuid::Uuid;

use super::*;
use crate::evacuate::plan::Plan;
use crate::heat::{SignalError, SignalOutcome};
use crate::state::journal::JournalEntry;

/// What the in-memory effects should fail.
#[derive(Debug, Default, Clone)]
pub(super) struct Failures {
    pub journal: bool,
    pub state: bool,
    pub scan: bool,
    pub plan_load: bool,
    pub plan_save: bool,
}

/// A node core with an in-memory disk, runtime and bus.
pub(super) struct World {
    pub core: NodeCore,
    pub config: CoreConfig,
    pub now: DateTime<Utc>,
    pub gears: Vec<GearInfo>,
    pub fail: Failures,
    /// Answer moves at once (moving the gear away).
    pub auto_moves: bool,
    /// Answer confirmations at once.
    pub auto_confirm: bool,
    pub signal: Result<SignalOutcome, SignalError>,
    pub disk_active: bool,
    /// The state file's leader epoch.
    pub disk_epoch: u64,
    pub removed_at: Option<DateTime<Utc>>,
    pub journal: HashMap<Uuid, JournalEntry>,
    pub plans: HashMap<String, Plan>,
    /// Every checkpoint written, in order.
    pub saves: Vec<Plan>,
    pub events: Vec<Event>,
    pub pongs: Vec<(Pong, Reply)>,
    pub acks: Vec<(Tag, Option<Uuid>)>,
    pub moves: VecDeque<MoveStart>,
    pub confirms: Vec<Confirm>,
    pub log: Vec<Action>,
    next_tag: u64,
}

pub(super) fn t0() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 24, 12, 0, 0).unwrap()
}

pub(super) fn gear(id: &str) -> GearInfo {
    GearInfo {
        id: id.into(),
        app: None,
        state: GearState::Started,
        uid: None,
        bytes: None,
        do_not_disrupt: false,
    }
}

impl World {
    pub fn new() -> World {
        let mut config = CoreConfig::new(t0());
        config.boot = Uuid::from_u128(1);
        World {
            core: NodeCore::new(true, Journal::default()),
            config,
            now: t0(),
            gears: vec![gear("g0"), gear("g1")],
            fail: Failures::default(),
            auto_moves: true,
            auto_confirm: true,
            signal: Ok(SignalOutcome {
                status: 200,
                detail: "ok".into(),
            }),
            disk_active: true,
            disk_epoch: 0,
            removed_at: None,
            journal: HashMap::new(),
            plans: HashMap::new(),
            saves: Vec::new(),
            events: Vec::new(),
            pongs: Vec::new(),
            acks: Vec::new(),
            moves: VecDeque::new(),
            confirms: Vec::new(),
            log: Vec::new(),
            next_tag: 0,
        }
    }

    /// The same disk and runtime after a restart (new boot id, new core).
    pub fn restart(&mut self) {
        let entries = self.journal.values().cloned();
        self.core = NodeCore::new(self.disk_active, Journal::from_entries(entries))
            .with_epoch(self.disk_epoch);
        self.config.boot = Uuid::new_v4();
        self.moves.clear();
        self.confirms.clear();
    }

    /// One call of the core, nothing carried out.
    pub fn step(&mut self, input: Input) -> Vec<Action> {
        let cx = Cx {
            name: "n1",
            config: &self.config,
        };
        self.core.handle(cx, input, self.now)
    }

    /// Feeds `input` and every completion that follows; returns every action.
    pub fn feed(&mut self, input: Input) -> Vec<Action> {
        let mut all = Vec::new();
        let mut inputs = VecDeque::from([input]);
        while let Some(i) = inputs.pop_front() {
            for a in self.step(i) {
                if let Some(next) = self.carry_out(&a) {
                    inputs.push_back(next);
                }
                all.push(a);
            }
        }
        self.log.extend(all.iter().cloned());
        all
    }

    /// A delivery of `env` on the command queue.
    pub fn deliver(&mut self, env: Envelope, redelivered: bool) -> Vec<Action> {
        let c = self.command(Ok(env), redelivered);
        self.feed(Input::Command(c))
    }

    pub fn command(&mut self, admitted: Result<Envelope, Refusal>, redelivered: bool) -> Command {
        self.next_tag += 1;
        Command {
            tag: Tag(self.next_tag),
            redelivered,
            reply: Reply::default(),
            admitted,
        }
    }

    /// A fresh command from the broker agent.
    pub fn cmd(&self, msg: impl Into<Message>, corr: Option<&str>) -> Envelope {
        let e = Envelope::new_at("broker-agent", msg, self.now);
        match corr {
            Some(c) => e.with_corr(c),
            None => e,
        }
    }

    /// Sends a fresh command; returns its id.
    pub fn send(&mut self, msg: impl Into<Message>, corr: Option<&str>) -> Uuid {
        let env = self.cmd(msg, corr);
        let id = env.id;
        self.deliver(env, false);
        id
    }

    /// Delivers `env` and makes its journal entry durable, carrying out
    /// nothing else; returns what the core does next.
    pub fn begin(&mut self, env: &Envelope) -> Vec<Action> {
        let c = self.command(Ok(env.clone()), false);
        for a in self.step(Input::Command(c)) {
            if let Action::JournalBegin(e) = a {
                self.journal.insert(e.id, e);
            }
        }
        self.step(Input::Journaled(Ok(())))
    }

    /// Ends the moves started so far with `result`, one at a time.
    pub fn finish_moves(&mut self, result: impl Fn(&MoveStart) -> MoveResult) {
        while let Some(m) = self.moves.pop_front() {
            let r = result(&m);
            self.feed(Input::Moved(MoveDone {
                op: m.op.clone(),
                idx: m.idx,
                result: r,
                attempts: 1,
            }));
        }
    }

    /// The terminal event (`done` or `failed`) for command `id`.
    pub fn outcome(&self, id: Uuid) -> Option<&Message> {
        self.events.iter().map(|e| &e.msg).find(|m| match m {
            Message::Done(d) => d.cmd == id,
            Message::Failed(f) => f.cmd == id,
            Message::Refused(r) => r.cmd == Some(id),
            _ => false,
        })
    }

    /// Whether the delivery of journaled command `id` was acknowledged.
    pub fn acked(&self, id: Uuid) -> bool {
        self.acks.iter().any(|(_, j)| *j == Some(id))
    }

    pub fn counted(&self, kind: &str, outcome: &str) -> usize {
        self.log
            .iter()
            .filter(|a| matches!(a, Action::Count { kind: k, outcome: o } if *k == kind && *o == outcome))
            .count()
    }

    fn carry_out(&mut self, a: &Action) -> Option<Input> {
        match a {
            Action::JournalBegin(e) => {
                if self.fail.journal {
                    return Some(Input::Journaled(Err("disk full".into())));
                }
                self.journal.insert(e.id, e.clone());
                Some(Input::Journaled(Ok(())))
            }
            Action::JournalWrite(e) => {
                self.journal.insert(e.id, e.clone());
                None
            }
            Action::JournalForget(ids) => {
                for id in ids {
                    self.journal.remove(id);
                }
                None
            }
            Action::PersistActive { active, .. } => {
                if self.fail.state {
                    return Some(Input::Persisted(Err("read-only file system".into())));
                }
                self.disk_active = *active;
                Some(Input::Persisted(Ok(())))
            }
            Action::PersistEpoch(epoch) => {
                if self.fail.state {
                    return Some(Input::EpochPersisted(Err("read-only file system".into())));
                }
                self.disk_epoch = self.disk_epoch.max(*epoch);
                Some(Input::EpochPersisted(Ok(())))
            }
            Action::PersistRemoved { at } => {
                self.removed_at = Some(*at);
                None
            }
            Action::Scan(scan) => Some(Input::Scanned {
                scan: scan.clone(),
                result: if self.fail.scan {
                    Err(ScanError {
                        message: "runtime down".into(),
                        retryable: true,
                        cached: Some(7),
                    })
                } else {
                    Ok(self.gears.clone())
                },
            }),
            other => self.carry_out_more(other),
        }
    }

    fn carry_out_more(&mut self, a: &Action) -> Option<Input> {
        match a {
            Action::LoadPlan(op) => Some(Input::PlanLoaded(if self.fail.plan_load {
                Err("corrupt".into())
            } else {
                Ok(self.plans.get(op).cloned())
            })),
            Action::SavePlan { plan, accept } => {
                if self.fail.plan_save && *accept {
                    return Some(Input::PlanSaved(Err("disk full".into())));
                }
                self.plans.insert(plan.corr.clone(), (**plan).clone());
                self.saves.push((**plan).clone());
                accept.then_some(Input::PlanSaved(Ok(())))
            }
            Action::ForgetPlan(op) => {
                self.plans.remove(op);
                None
            }
            Action::Signal { .. } => Some(Input::Signalled(self.signal.clone())),
            Action::Emit(e) => {
                self.events.push(e.clone());
                let confirm = e.confirm.clone()?;
                if self.auto_confirm {
                    return Some(Input::Confirmed { confirm, ok: true });
                }
                self.confirms.push(confirm);
                None
            }
            Action::Pong { pong, reply, .. } => {
                self.pongs.push((pong.clone(), reply.clone()));
                None
            }
            Action::Ack { tag, journaled } => {
                self.acks.push((*tag, *journaled));
                journaled.map(Input::Acked)
            }
            Action::StartMove(m) => {
                self.moves.push_back(m.clone());
                if !self.auto_moves {
                    return None;
                }
                let m = self.moves.pop_back()?;
                let had = self.gears.iter().position(|g| g.id == m.gear);
                let outcome = match had {
                    Some(p) => {
                        self.gears.remove(p);
                        crate::runtime::MoveOutcome::Moved
                    }
                    None => crate::runtime::MoveOutcome::AlreadyMoved,
                };
                Some(Input::Moved(MoveDone {
                    op: m.op,
                    idx: m.idx,
                    result: MoveResult::Done(outcome),
                    attempts: 1,
                }))
            }
            _ => None,
        }
    }
}

/// Whether `actions` hold an acknowledgement.
pub(super) fn has_ack(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::Ack { .. }))
}

/// The position of the first action matching `f`.
pub(super) fn pos(actions: &[Action], f: impl Fn(&Action) -> bool) -> Option<usize> {
    actions.iter().position(f)
}

#[test]
fn an_idle_core_is_a_few_words() {
    // The simulator holds one per lite node, a hundred thousand of them.
    let size = std::mem::size_of::<NodeCore>();
    println!("NodeCore: {size} bytes");
    assert!(size <= 160, "{size} bytes");
}
