//! The node's brain without I/O: [`NodeCore`] decides what every command,
//! completion and move result means, and returns the [`Action`]s to carry out.
//!
//! `(state, input, now) -> (state, actions)`: [`NodeCore::handle`] changes
//! the core and returns what to do, in order. It never waits, reads a file or
//! touches the bus; the agent's driver (one task) carries out the actions and
//! feeds their results back as [`Input`]s, and the simulator's lite fleet
//! does the same for thousands of cores in one process.
//!
//! Durability is part of the protocol: an action that must be durable before
//! the command goes on is answered by an input (a journal entry by
//! [`Input::Journaled`], the active flag by [`Input::Persisted`], an
//! evacuation's first checkpoint by [`Input::PlanSaved`]), and the delivery's
//! [`Action::Ack`] comes only after it.
//!
//! | command | journaled | acknowledged once |
//! | --- | --- | --- |
//! | `cmd.deactivate`, `cmd.activate` | yes | the state file is fsynced |
//! | `cmd.evacuate` | yes | the plan's checkpoint is written |
//! | `cmd.remove` | yes | the result was published (confirmed) |
//! | `cmd.heat_signal` | yes | the result was queued for publication |
//! | `cmd.inventory`, `cmd.ping` | no (read-only; in-memory replay guard) | answered |
//!
//! Before any of that, a new command's leader epoch is fenced (`fence`):
//! older than the newest this node has seen, refused (`stale_epoch`);
//! newer, persisted ([`Action::PersistEpoch`], answered by
//! [`Input::EpochPersisted`]) before the command is journaled or acted upon.
//!
//! Commands are handled one at a time, in arrival order (later ones wait in
//! a queue); broadcast pings, move results and completions are handled at once.
//!
//! ## Layout
//! - this file: the inputs, actions and configuration, and the dispatch;
//! - `command`: intake (refusals, the journal's new / running /
//!   done-redelivered / replayed decision), pings and inventory;
//! - `fence`: leader epochs, stale ones refused, newer ones persisted first;
//! - `activation`: `cmd.deactivate` and `cmd.activate`;
//! - `evacuation`: `cmd.evacuate`, the per-gear scheduling and checkpoints,
//!   resumption after a restart;
//! - `refusals`: refused commands, their answers rate-limited per reason;
//! - `removal`: `cmd.remove` and `cmd.heat_signal`.

mod activation;
mod command;
mod evacuation;
mod fence;
mod refusals;
mod removal;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use chrono::{DateTime, Duration, Utc};
use gearshift_proto::msg::{
    CommandResult, Done, Failed, GearInfo, GearOutcome, HeatAction, Kind, Message, OperationStatus,
    Pong,
};
use gearshift_proto::{Envelope, Refusal, ReplayGuard};
use uuid::Uuid;

use crate::evacuate::plan::Plan;
use crate::heat::{SignalError, SignalOutcome};
use crate::runtime::MoveOutcome;
use crate::state::journal::{Journal, JournalEntry, StoredBody, StoredEvent};

pub use evacuation::Evac;
pub use refusals::{ANSWER_BURST, ANSWER_WINDOW};

/// How long a finished evacuation's checkpoint is kept after its result was published.
pub const CHECKPOINT_RETENTION_DAYS: i64 = 7;

/// The settings the core decides with (shared by every core of a process;
/// the agent rebuilds it on reload).
#[derive(Debug, Clone)]
pub struct CoreConfig {
    /// Commands whose `ts` is further than this from the clock are refused.
    pub time_window: Duration,
    /// Moves in flight at once when `cmd.evacuate` does not say.
    pub parallelism: u32,
    /// The Heat action `cmd.remove` runs; `None`: the node just stops.
    pub remove_action: Option<HeatAction>,
    /// Whether Heat signals can be sent (credentials are configured).
    pub heat: bool,
    /// Journal entries kept at most (the oldest finished go first).
    pub journal_capacity: usize,
    /// This process's boot id: a running journal entry from another boot
    /// was interrupted by a restart.
    pub boot: Uuid,
    /// When the agent started (pongs say it).
    pub started_at: DateTime<Utc>,
}

impl CoreConfig {
    /// The defaults of `conf/node.toml` for a process started at `now`.
    pub fn new(now: DateTime<Utc>) -> Self {
        CoreConfig {
            time_window: Duration::minutes(5),
            parallelism: 4,
            remove_action: None,
            heat: false,
            journal_capacity: 10_000,
            boot: Uuid::new_v4(),
            started_at: now,
        }
    }
}

/// What a call of [`NodeCore::handle`] reads besides the core: the node's
/// name and the shared configuration.
#[derive(Debug, Clone, Copy)]
pub struct Cx<'a> {
    /// The node's name.
    pub name: &'a str,
    /// The configuration.
    pub config: &'a CoreConfig,
}

/// The driver's handle of a bus delivery, to acknowledge it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tag(pub u64);

/// Where a ping's answer goes (from the delivery's properties).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The requester's reply queue; `None`: publish on `event.<node>`.
    pub queue: Option<String>,
    /// The request's correlation id, echoed in the answer.
    pub correlation_id: Option<String>,
}

/// A delivery from the node's command queue, after the gate's decode,
/// kind and signature steps (the core checks time and replay itself: a
/// journaled redelivery is answered whatever its age).
#[derive(Debug, Clone)]
pub struct Command {
    /// The delivery, to acknowledge.
    pub tag: Tag,
    /// The bus says it was delivered before.
    pub redelivered: bool,
    /// Where a directed ping's pong goes.
    pub reply: Reply,
    /// The envelope, or why the gate refused it.
    pub admitted: Result<Envelope, Refusal>,
}

/// What a runtime scan is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scan {
    /// `cmd.deactivate` answers with the gear list.
    Deactivated,
    /// `cmd.inventory`.
    Inventory,
    /// `cmd.remove` checks that the node is empty.
    Remove,
    /// The evacuation `op` finished: how many gears are left.
    Evacuated(String),
}

/// A scan that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanError {
    /// What went wrong.
    pub message: String,
    /// Whether scanning again may succeed.
    pub retryable: bool,
    /// Gears in the last successful scan, if any.
    pub cached: Option<u32>,
}

/// An event whose publication the core waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirm {
    /// `cmd.remove`'s result: the delivery is acknowledged after it.
    Remove,
    /// The result of the evacuation `op`: its checkpoint then notes it.
    Evacuated(String),
}

/// Starts moving one gear of an evacuation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveStart {
    /// The evacuation.
    pub op: String,
    /// The gear's index in the plan.
    pub idx: u32,
    /// The gear.
    pub gear: String,
    /// Its target node.
    pub target: String,
    /// An earlier attempt may have begun (possibly before a crash).
    pub resumed: bool,
    /// No attempt starts after this instant.
    pub deadline: Option<DateTime<Utc>>,
    /// Watch the gear leave (the broker agent moves it) instead of moving it.
    pub watch: bool,
}

/// How one move ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MoveResult {
    /// Moved, found at its target, or missing.
    Done(MoveOutcome),
    /// Failed for good (retries exhausted or not retryable).
    Failed(String),
    /// Stopped at a safe point (the agent is stopping, or the evacuation
    /// was aborted): the gear stays pending.
    Interrupted,
}

/// A move that ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveDone {
    /// The evacuation.
    pub op: String,
    /// The gear's index in the plan.
    pub idx: u32,
    /// How it ended.
    pub result: MoveResult,
    /// Attempts made.
    pub attempts: u32,
}

/// Everything the core reacts to.
#[derive(Debug, Clone)]
pub enum Input {
    /// A delivery from the node's command queue.
    Command(Command),
    /// A broadcast ping, after the gate (`Err`: refused quietly).
    BroadcastPing {
        /// Where the pong goes.
        reply: Reply,
        /// The envelope, or why the gate refused it.
        admitted: Result<Envelope, Refusal>,
    },
    /// The current command's journal entry is durable (or could not be written).
    Journaled(Result<(), String>),
    /// The active flag is durable (or could not be written).
    Persisted(Result<(), String>),
    /// The epoch asked for by [`Action::PersistEpoch`] is durable (or
    /// could not be written).
    EpochPersisted(Result<(), String>),
    /// A runtime scan ended.
    Scanned {
        /// What it was for.
        scan: Scan,
        /// The gears, or why not.
        result: Result<Vec<GearInfo>, ScanError>,
    },
    /// The checkpoint asked for by [`Action::LoadPlan`] (`None`: there is none).
    PlanLoaded(Result<Option<Plan>, String>),
    /// The accepting checkpoint of `cmd.evacuate` is durable (or not).
    PlanSaved(Result<(), String>),
    /// The Heat signal ended.
    Signalled(Result<SignalOutcome, SignalError>),
    /// An event the core waits for was published (`ok`), or dropped.
    Confirmed {
        /// Which event.
        confirm: Confirm,
        /// Whether the bus confirmed it.
        ok: bool,
    },
    /// A delivery of journaled command `id` was acknowledged on the bus.
    Acked(Uuid),
    /// A move ended.
    Moved(MoveDone),
    /// At start: the checkpoints found in the state directory.
    Resume(Vec<Plan>),
    /// Stops every running evacuation early, with a reason.
    Abort(String),
    /// The agent is stopping: no new move or command starts, nothing is
    /// awaited any more.
    Stop,
    /// Housekeeping: forget old journal entries.
    Prune,
}

/// An event to publish on `event.<node>`.
#[derive(Debug, Clone)]
pub struct Event {
    /// The message.
    pub msg: Message,
    /// The envelope's `corr`.
    pub corr: Option<String>,
    /// May be dropped first when the outbox is full (progress).
    pub droppable: bool,
    /// Answer with [`Input::Confirmed`] once published.
    pub confirm: Option<Confirm>,
}

/// What the driver must do, in order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Write a journal entry durably (a failure is only logged).
    JournalWrite(JournalEntry),
    /// Write a new journal entry durably; answer [`Input::Journaled`].
    JournalBegin(JournalEntry),
    /// Delete these journal entries.
    JournalForget(Vec<Uuid>),
    /// Persist the active flag (fsync); answer [`Input::Persisted`].
    PersistActive {
        /// The new flag.
        active: bool,
        /// Why (the command's reason).
        reason: String,
        /// The command.
        by: Uuid,
        /// When.
        at: DateTime<Utc>,
    },
    /// Persist the newest leader epoch seen (fsync), in its own field of
    /// the state file (the journal is pruned); answer [`Input::EpochPersisted`].
    PersistEpoch(u64),
    /// Note in the state file that the node was removed (a failure is logged).
    PersistRemoved {
        /// When.
        at: DateTime<Utc>,
    },
    /// Tell the runtime the node is (in)active.
    RuntimeActive(bool),
    /// Scan the runtime; answer [`Input::Scanned`].
    Scan(Scan),
    /// Read the checkpoint of evacuation `op`; answer [`Input::PlanLoaded`].
    LoadPlan(String),
    /// Write a checkpoint; when `accept`, answer [`Input::PlanSaved`]
    /// (otherwise a failure is counted and logged: moves are idempotent).
    SavePlan {
        /// The plan as it is now.
        plan: Box<Plan>,
        /// The checkpoint that accepts a `cmd.evacuate`.
        accept: bool,
    },
    /// Delete the checkpoint of evacuation `op`.
    ForgetPlan(String),
    /// Send a Heat signal; answer [`Input::Signalled`].
    Signal {
        /// Which.
        action: HeatAction,
        /// Why (Heat keeps it where the API takes one).
        reason: String,
    },
    /// Queue an event for publication.
    Emit(Event),
    /// Answer a ping.
    Pong {
        /// The answer.
        pong: Pong,
        /// The ping's `corr`.
        corr: Option<String>,
        /// Where to.
        reply: Reply,
    },
    /// Acknowledge a delivery; when `journaled`, answer [`Input::Acked`] once it is.
    Ack {
        /// The delivery.
        tag: Tag,
        /// The journaled command it carried.
        journaled: Option<Uuid>,
    },
    /// Move a gear; answer [`Input::Moved`].
    StartMove(MoveStart),
    /// Stop the moves of evacuation `op` at their next safe point.
    CancelMoves(String),
    /// Log and count a refused message (`broadcast`: not addressed to this node).
    Refused {
        /// Why.
        refusal: Refusal,
        /// A broadcast ping (no `event.refused` goes out for it).
        broadcast: bool,
    },
    /// Count a command's outcome (`done`, `failed`, `refused`, `duplicate`, `accepted`).
    Count {
        /// The command's kind.
        kind: &'static str,
        /// The outcome.
        outcome: &'static str,
    },
    /// Count a finished gear move.
    GearMoved(GearOutcome),
    /// Report now (the state or an operation changed).
    ReportNow,
    /// `cmd.remove` completed: the agent stops, the node is going away.
    Removed,
}

/// The command being handled, and what it waits for.
#[derive(Debug)]
struct Current {
    env: Envelope,
    tag: Tag,
    /// The journal entry of a journaled command.
    entry: Option<JournalEntry>,
    wait: Wait,
}

/// What the current command waits for.
#[derive(Debug)]
enum Wait {
    /// A newer leader epoch is being persisted.
    Epoch(u64),
    Journal,
    State {
        active: bool,
    },
    Scan,
    Plan,
    Save(Box<Plan>),
    Signal {
        removal: bool,
        action: HeatAction,
    },
    Confirm,
}

/// One node's core state. Small when idle (a few words and the journal),
/// so that the simulator can hold a hundred thousand of them.
#[derive(Debug)]
pub struct NodeCore {
    active: bool,
    stopping: bool,
    removed: bool,
    /// The newest leader epoch seen, as persisted.
    epoch: u64,
    journal: Journal,
    pings: Option<Box<ReplayGuard>>,
    current: Option<Box<Current>>,
    queue: VecDeque<Command>,
    evacs: Vec<Evac>,
    answers: refusals::Answers,
}

impl NodeCore {
    /// A core for a node whose persisted flag is `active`, with the journal
    /// it loaded.
    pub fn new(active: bool, journal: Journal) -> NodeCore {
        NodeCore {
            active,
            stopping: false,
            removed: false,
            epoch: 0,
            journal,
            pings: None,
            current: None,
            queue: VecDeque::new(),
            evacs: Vec::new(),
            answers: None,
        }
    }

    /// The same core, knowing that leader epoch `epoch` was persisted (the
    /// state file's `epoch`, read at start).
    pub fn with_epoch(mut self, epoch: u64) -> NodeCore {
        self.epoch = epoch;
        self
    }

    /// Whether the node accepts gears (as persisted).
    pub fn active(&self) -> bool {
        self.active
    }

    /// The operation in progress, as reports show it.
    pub fn operation(&self) -> Option<OperationStatus> {
        self.evacs
            .iter()
            .find(|e| e.shows_in_reports())
            .map(|e| e.plan().status())
    }

    /// The journal.
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// `cmd.remove` completed.
    pub fn removed(&self) -> bool {
        self.removed
    }

    /// Nothing is under way that a stopping agent should wait for: no
    /// command in progress, no evacuation with moves in flight or finishing.
    pub fn settled(&self) -> bool {
        self.current.is_none() && self.evacs.iter().all(|e| !e.busy())
    }

    /// Changes the core by `input` at `now`; returns what to do, in order.
    pub fn handle(&mut self, cx: Cx<'_>, input: Input, now: DateTime<Utc>) -> Vec<Action> {
        let mut out = Vec::new();
        match input {
            Input::Command(c) => self.on_command(cx, c, now, &mut out),
            Input::BroadcastPing { reply, admitted } => {
                self.on_broadcast_ping(cx, reply, admitted, now, &mut out)
            }
            Input::Journaled(r) => self.on_journaled(cx, r, now, &mut out),
            Input::Persisted(r) => self.on_persisted(cx, r, &mut out),
            Input::EpochPersisted(r) => self.on_epoch_persisted(cx, r, now, &mut out),
            Input::Scanned {
                scan: Scan::Evacuated(op),
                result,
            } => self.on_evacuation_scanned(&op, result, now, &mut out),
            Input::Scanned { scan, result } => self.on_scanned(cx, scan, result, now, &mut out),
            Input::PlanLoaded(r) => self.on_plan_loaded(cx, r, now, &mut out),
            Input::PlanSaved(r) => self.on_plan_saved(r, now, &mut out),
            Input::Signalled(r) => self.on_signalled(r, now, &mut out),
            Input::Confirmed { confirm, ok } => self.on_confirmed(confirm, ok, &mut out),
            Input::Acked(id) => {
                if let Some(e) = self.journal.mark_acked(&id) {
                    out.push(Action::JournalWrite(e));
                }
            }
            Input::Moved(m) => self.on_moved(m, now, &mut out),
            Input::Resume(plans) => self.resume(plans, now, &mut out),
            Input::Abort(reason) => self.abort_evacuations(&reason, &mut out),
            Input::Stop => self.stop(now, &mut out),
            Input::Prune => {
                let retention = cx.config.time_window * 2;
                let forgotten = self.journal.prune(
                    now,
                    retention,
                    cx.config.journal_capacity.max(16),
                    cx.config.boot,
                );
                if !forgotten.is_empty() {
                    tracing::debug!(removed = forgotten.len(), "journal pruned");
                    out.push(Action::JournalForget(forgotten));
                }
                self.summarize_refusals(now, &mut out);
            }
        }
        self.next_command(cx, now, &mut out);
        out
    }

    /// The agent is stopping: no move starts any more; events the core
    /// waited for are no longer awaited.
    fn stop(&mut self, now: DateTime<Utc>, out: &mut Vec<Action>) {
        self.stopping = true;
        self.evacs.retain(|e| !e.awaits_publication());
        if self
            .current
            .as_ref()
            .is_some_and(|c| matches!(c.wait, Wait::Confirm))
        {
            self.on_confirmed(Confirm::Remove, false, out);
        }
        for e in &mut self.evacs {
            e.advance(false, true, now, out);
        }
    }
}

/// `event.done` for the command `env`.
fn done(env: &Envelope, result: CommandResult) -> Message {
    Done {
        cmd: env.id,
        command: env.kind().as_str().into(),
        result,
    }
    .into()
}

/// `event.failed` for the command `env`.
fn failed(env: &Envelope, error: &str, retryable: bool, http_status: Option<u16>) -> Message {
    Failed {
        cmd: env.id,
        command: env.kind().as_str().into(),
        error: gearshift_proto::gate::clip(error),
        retryable,
        http_status,
    }
    .into()
}

/// The outcome label of a terminal event.
fn outcome(msg: &Message) -> &'static str {
    if msg.kind() == Kind::Done {
        "done"
    } else {
        "failed"
    }
}

/// The journal's copy of a terminal event.
fn stored(msg: &Message) -> StoredEvent {
    // Text written from the typed body: it is valid JSON by construction.
    let body = StoredBody::new(msg.body_json()).unwrap_or_else(|e| {
        tracing::error!(error = %e, kind = %msg.kind(), "result not kept for re-publication");
        StoredBody::null()
    });
    StoredEvent {
        kind: msg.kind().as_str().to_string(),
        body,
    }
}

/// An event that is not awaited and not droppable.
fn event(msg: impl Into<Message>, corr: Option<&str>) -> Action {
    Action::Emit(Event {
        msg: msg.into(),
        corr: corr.map(str::to_string),
        droppable: false,
        confirm: None,
    })
}
