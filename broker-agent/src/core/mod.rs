//! The broker agent's brain, without I/O: `(state, input, now) -> (state,
//! actions)`.
//!
//! [`Core`] is the coordinator: it holds the fleet model, the operations,
//! each group's record and the operator's marks, routes every input (a
//! report, a node event, a handler result, a tick, an evaluation, an
//! operator request) to the machine it concerns, and returns [`Action`]s for
//! the driver to carry out. The driver journals the changed records
//! ([`Core::take_changes`]) *before* it carries out the actions, so an
//! effect never happens without its intent on disk.
//!
//! ## Layout
//! - [`scale_up`]: the scale-up operation's machine and state.
//! - [`scale_down`]: the scale-down saga's machine and state.
//! - [`exhaustion`]: backoff, quota failures and exhaustion per group.
//! - [`operator`]: operator requests (evacuate, drain, abort,
//!   do-not-disrupt, pause, resume, cordon, activate, status), the
//!   do-not-disrupt marks, and in [`operator::controls`] pauses and cordons.
//! - [`crate::policy`]: the read-only evaluation whose verdicts the
//!   coordinator applies (`evaluate.rs`).
//! - [`facts`]: the read-only view the policy and the machines share;
//!   [`actions`]: the vocabulary between machines, coordinator and driver.
//! - Here: the coordinator's state; `route.rs` sends each input to its
//!   machine, `drive.rs` steps a machine and addresses its effects,
//!   `operate.rs` carries out operator requests (pauses, cordons,
//!   activations, drains), `dry_run.rs` what a group whose handler is `log`
//!   gets instead of operations (decisions marked `dry_run`), `fence.rs`
//!   the leader epoch stamped on what the core emits and a node's
//!   `stale_epoch` refusal.
//!
//! Besides the journal's changes, the coordinator keeps the history records
//! of what it did (saga steps, operator requests) for the driver to append
//! ([`Core::take_history`]); decisions and explanations are recorded by the
//! driver as it publishes them.
//!
//! A new kind of step (a district command, a broker-side move) is a new
//! state and input of one machine; a new input kind is one routing function.

pub mod actions;
pub mod exhaustion;
pub mod facts;
pub mod operator;
pub mod scale_down;
pub mod scale_up;

mod drive;
mod dry_run;
mod evaluate;
mod fence;
mod operate;
mod route;

#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{GroupStats, NodeProperties};
use uuid::Uuid;

pub use self::actions::{
    Action, CallResult, CallTag, Changes, Effect, HandlerCall, Meta, Out, PaasCall, Restored,
    StaleEpoch, dur,
};
pub use self::facts::Facts;
use self::operator::Marks;
use self::operator::controls::Cordons;
use crate::config::BrokerConfig;
use crate::fleet::Fleet;
use crate::history::{Event, Record, SagaStep};
use crate::ops::{GroupState, Op, OpId, Ops};
use crate::planner::EvacuationPlanner;

/// How often reports of a group already over a threshold at the last
/// evaluation ask for another early one (see `route.rs`).
pub const REPEAT_PRESSURE: chrono::Duration = chrono::Duration::seconds(10);

/// The coordinator: the state, and the routing of inputs to the machines.
pub struct Core {
    pub(crate) cfg: Arc<BrokerConfig>,
    pub(crate) planner: Arc<dyn EvacuationPlanner>,
    pub(crate) fleet: Fleet,
    pub(crate) ops: Ops,
    pub(crate) groups: BTreeMap<GroupKey, GroupState>,
    pub(crate) marks: Marks,
    pub(crate) cordons: Cordons,
    pub(crate) meta: Meta,
    pub(crate) started: DateTime<Utc>,
    pub(crate) changes: Changes,
    pub(crate) idgen: Box<dyn FnMut() -> Uuid + Send>,
    /// The groups whose early evaluation is due, and when (a report pushed
    /// them over a threshold): see `route.rs`.
    pub(crate) due: BTreeMap<GroupKey, DateTime<Utc>>,
    /// When the first report since the last evaluation was consumed (decision latency).
    pub(crate) pressure_seen: Option<DateTime<Utc>>,
    /// The groups the last evaluation of each found over a threshold, and
    /// when it ran: their reports ask for an early evaluation at most every
    /// [`REPEAT_PRESSURE`] (see `route.rs`).
    pub(crate) pressured: BTreeMap<GroupKey, DateTime<Utc>>,
    /// When the last evaluation looked for nodes missing too long (see
    /// `evaluate.rs`: a scan of the whole fleet, not at every evaluation).
    pub(crate) forget_scanned: Option<DateTime<Utc>>,
    /// History records not yet taken by the driver.
    pub(crate) history: Vec<Record>,
    /// The kind of each handler the driver runs, by name (`log`: a dry run).
    pub(crate) handler_kinds: BTreeMap<String, String>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("nodes", &self.fleet.len())
            .field("ops", &self.ops.len())
            .finish_non_exhaustive()
    }
}

impl Core {
    /// A core with empty state, started at `now`.
    pub fn new(
        cfg: Arc<BrokerConfig>,
        planner: Arc<dyn EvacuationPlanner>,
        now: DateTime<Utc>,
    ) -> Self {
        Core {
            cfg,
            planner,
            fleet: Fleet::new(),
            ops: Ops::default(),
            groups: BTreeMap::new(),
            marks: Marks::default(),
            cordons: Cordons::default(),
            meta: Meta::default(),
            started: now,
            changes: Changes::default(),
            idgen: Box::new(Uuid::new_v4),
            due: BTreeMap::new(),
            pressured: Default::default(),
            pressure_seen: None,
            forget_scanned: None,
            history: vec![],
            handler_kinds: BTreeMap::new(),
        }
    }

    /// Uses `f` for new ids (deterministic tests).
    pub fn with_ids(mut self, f: impl FnMut() -> Uuid + Send + 'static) -> Self {
        self.idgen = Box::new(f);
        self
    }

    /// Loads journaled state.
    pub fn restore(&mut self, r: Restored) {
        for op in r.ops {
            self.ops.insert(op);
        }
        self.groups.extend(r.groups);
        self.marks = Marks::from_set(r.marks);
        for node in r.cordons.keys() {
            self.fleet.set_cordoned(node, true);
        }
        self.cordons = Cordons::from_map(r.cordons);
        self.meta = r.meta;
    }

    /// Forgets everything the journal holds, keeping the fleet model warm:
    /// a leader stepping down (the journal it loads at its next takeover is
    /// the truth, not what it held when it stopped deciding).
    pub fn forget_journaled(&mut self) {
        for node in self.cordons.nodes().keys() {
            self.fleet.set_cordoned(node, false);
        }
        self.ops = Ops::default();
        self.groups.clear();
        self.marks = Marks::default();
        self.cordons = Cordons::default();
        self.meta = Meta::default();
        self.changes = Changes::default();
        self.history.clear();
        self.due.clear();
        self.pressure_seen = None;
        self.pressured = Default::default();
    }

    /// What the journal holds, as [`Core::restore`] takes it back.
    pub fn journaled(&self) -> Restored {
        Restored {
            ops: self.ops.iter().cloned().collect(),
            groups: self
                .groups
                .iter()
                .map(|(g, s)| (g.clone(), s.clone()))
                .collect(),
            marks: self.marks.nodes().clone(),
            cordons: self.cordons.nodes().clone(),
            meta: self.meta.clone(),
        }
    }

    /// Replaces the configuration (SIGHUP).
    pub fn set_config(&mut self, cfg: Arc<BrokerConfig>) {
        self.cfg = cfg;
    }

    /// The configuration.
    pub fn config(&self) -> &BrokerConfig {
        &self.cfg
    }

    /// The fleet model.
    pub fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    /// Every operation, finished ones included.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.ops.iter()
    }

    /// One operation.
    pub fn op(&self, id: &str) -> Option<&Op> {
        self.ops.get(id)
    }

    /// A group's record (policy memory and supply).
    pub fn group_state(&self, g: &GroupKey) -> GroupState {
        self.groups.get(g).cloned().unwrap_or_default()
    }

    /// Every group with a record.
    pub fn group_states(&self) -> &BTreeMap<GroupKey, GroupState> {
        &self.groups
    }

    /// Operator do-not-disrupt marks.
    pub fn marks(&self) -> &BTreeSet<String> {
        self.marks.nodes()
    }

    /// Cordoned nodes, with why.
    pub fn cordons(&self) -> &Cordons {
        &self.cordons
    }

    /// The breaker state and the fleet's pause.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The records changed since the last call; the driver journals them
    /// before carrying out the actions returned with them.
    pub fn take_changes(&mut self) -> Changes {
        std::mem::take(&mut self.changes)
    }

    /// The history records since the last call (saga steps, operator
    /// requests), oldest first.
    pub fn take_history(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.history)
    }

    pub(crate) fn record(&mut self, at: DateTime<Utc>, event: Event) {
        self.history.push(Record { at, event });
    }

    /// Records an operation's state change, if `before` differs (`None`: created).
    pub(crate) fn note_step(
        &mut self,
        id: &OpId,
        before: Option<&'static str>,
        now: DateTime<Utc>,
    ) {
        let Some(op) = self.ops.get(id) else {
            return;
        };
        let to = op.state();
        if before == Some(to) {
            return;
        }
        let step = SagaStep {
            op: id.to_string(),
            kind: op.kind().to_string(),
            district: op.group.district.clone(),
            profile: op.group.profile.clone(),
            node: op.node().map(str::to_string),
            from: before.map(str::to_string),
            to: to.to_string(),
        };
        self.record(now, Event::Saga(step));
    }

    /// When an early evaluation is due, if one is (the earliest of the
    /// groups': [`Core::evaluate_due`] runs it).
    pub fn evaluation_due(&self) -> Option<DateTime<Utc>> {
        self.due.values().min().copied()
    }

    /// Decision latency start: the first report that showed pressure since
    /// the last evaluation, taken by the driver when a decision is published.
    pub fn take_pressure_seen(&mut self) -> Option<DateTime<Utc>> {
        self.pressure_seen.take()
    }

    /// What the policy and the machines read, now.
    pub fn facts(&self) -> Facts<'_> {
        Facts {
            fleet: &self.fleet,
            ops: &self.ops,
            marks: self.marks.nodes(),
            cordons: &self.cordons,
            started: self.started,
            stale_intervals: self.cfg.policy.stale_after_intervals,
        }
    }

    /// `oo-stats` figures of a group, excluding nodes being removed.
    pub fn group_stats(&self, g: &GroupKey, now: DateTime<Utc>) -> GroupStats {
        self.facts().group_stats(g, now)
    }

    /// `oo-stats` figures of a profile.
    pub fn profile_stats(&self, profile: &str, now: DateTime<Utc>) -> GroupStats {
        self.facts().profile_stats(profile, now)
    }

    /// Active, fresh nodes of the group other than `victim` and draining
    /// nodes, as placement candidates.
    pub fn candidates(
        &self,
        g: &GroupKey,
        victim: &str,
        now: DateTime<Utc>,
    ) -> Vec<NodeProperties> {
        self.facts().candidates(g, victim, now)
    }

    /// A group's record, marked for the journal.
    pub(crate) fn group_mut(&mut self, g: &GroupKey) -> &mut GroupState {
        self.changes.groups.insert(g.clone());
        self.groups.entry(g.clone()).or_default()
    }
}
