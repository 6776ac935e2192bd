//! The journaled records: operations (sagas) and per-group state, plain
//! data, stored as JSON in the journal (see [`crate::journal`]).
//!
//! Each operation's state type lives beside the machine that drives it
//! ([`crate::core::scale_up`], [`crate::core::scale_down`]) and is
//! re-exported here; a group's record joins the policy's memory
//! ([`GroupMemory`]) and the exhaustion tracker's state ([`Supply`]).
//!
//! The serde names and shapes are the journal's on-disk format: a new
//! version must read what an older one wrote (see the tests below, which
//! hold records as the first versions wrote them).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::core::exhaustion::{Exhaustion, Supply};
pub use crate::core::operator::controls::{Cordon, Pause};
pub use crate::core::scale_down::{DownEnd, DownStep, DrainProgress, Origin, ScaleDown};
pub use crate::core::scale_up::{ScaleUp, UpStep};
pub use crate::policy::GroupMemory;

use crate::fleet::Fleet;

/// An operation id, `op-` and 12 hex digits: the `corr` of its commands and
/// decisions, and what a new node reports as `booted_for`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OpId(String);

impl OpId {
    /// A new id from a random (or, in tests, deterministic) UUID.
    pub fn new(u: Uuid) -> OpId {
        let s = u.simple().to_string();
        OpId(format!("op-{}", &s[..12]))
    }

    /// The id as it appears on the bus.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for OpId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl Borrow<str> for OpId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for OpId {
    fn from(s: &str) -> OpId {
        OpId(s.to_string())
    }
}

impl From<OpId> for String {
    fn from(id: OpId) -> String {
        id.0
    }
}

impl PartialEq<str> for OpId {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for OpId {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// A new operation id.
pub fn new_op_id(u: Uuid) -> OpId {
    OpId::new(u)
}

/// One operation: a scale-up or a scale-down saga.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Operation id (`corr` of its commands and decisions).
    pub id: OpId,
    /// The node group.
    pub group: GroupKey,
    /// The handler that acts for it.
    pub handler: String,
    /// Why it was started.
    pub reason: String,
    /// When it was decided.
    pub created: DateTime<Utc>,
    /// Last state change.
    pub updated: DateTime<Utc>,
    /// Handler calls issued so far; a result is only taken for the latest.
    pub call_seq: u32,
    /// The saga.
    pub body: OpBody,
}

impl Op {
    /// Whether the operation reached its end.
    pub fn is_done(&self) -> bool {
        match &self.body {
            OpBody::ScaleUp(u) => u.step.is_terminal(),
            OpBody::ScaleDown(d) => matches!(d.step, DownStep::Done),
        }
    }

    /// The short state name, for status and metrics.
    pub fn state(&self) -> &'static str {
        match &self.body {
            OpBody::ScaleUp(u) => u.step.name(),
            OpBody::ScaleDown(d) => d.state_name(),
        }
    }

    /// `scale_up` or `scale_down`.
    pub fn kind(&self) -> &'static str {
        match self.body {
            OpBody::ScaleUp(_) => "scale_up",
            OpBody::ScaleDown(_) => "scale_down",
        }
    }

    /// The node concerned, when known.
    pub fn node(&self) -> Option<&str> {
        match &self.body {
            OpBody::ScaleUp(u) => u.node.as_deref(),
            OpBody::ScaleDown(d) => Some(&d.node),
        }
    }

    /// The scale-down saga, if this is one.
    pub fn down(&self) -> Option<&ScaleDown> {
        match &self.body {
            OpBody::ScaleDown(d) => Some(d),
            OpBody::ScaleUp(_) => None,
        }
    }

    /// The scale-up, if this is one.
    pub fn up(&self) -> Option<&ScaleUp> {
        match &self.body {
            OpBody::ScaleUp(u) => Some(u),
            OpBody::ScaleDown(_) => None,
        }
    }
}

/// The two sagas.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum OpBody {
    /// Ask the cloud for one node.
    ScaleUp(ScaleUp),
    /// Empty and remove one node.
    ScaleDown(ScaleDown),
}

/// Per-group record: the policy's memory (cooldowns, stabilization, last
/// decision), the exhaustion tracker's state (backoff, quota, exhaustion)
/// and an operator's pause. Journaled as one flat JSON object, as the first
/// versions wrote it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupState {
    /// What the policy remembers between evaluations.
    #[serde(flatten)]
    pub memory: GroupMemory,
    /// Whether and when the cloud can supply a node to the group.
    #[serde(flatten)]
    pub supply: Supply,
    /// An operator's pause of the group (absent from earlier records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<Pause>,
}

/// Every operation, in flight and finished, by id.
#[derive(Debug, Default)]
pub struct Ops {
    by_id: BTreeMap<OpId, Op>,
    /// [`Ops::removing_known`], remembered with the fleet membership it was
    /// computed for; every change to an operation forgets it.
    removing: Mutex<Option<(u64, Arc<BTreeSet<String>>)>>,
    /// The ids of the operations in flight, remembered until an operation
    /// changes: finished operations stay (up to `saga.history`), and the
    /// ones in flight are looked for on every report.
    open: Mutex<Option<Arc<Vec<OpId>>>>,
}

impl Clone for Ops {
    fn clone(&self) -> Self {
        Ops {
            by_id: self.by_id.clone(),
            removing: Mutex::default(),
            open: Mutex::default(),
        }
    }
}

impl Ops {
    /// One operation, by its id or the id's string.
    pub fn get<Q: Ord + ?Sized>(&self, id: &Q) -> Option<&Op>
    where
        OpId: Borrow<Q>,
    {
        self.by_id.get(id)
    }

    /// One operation, to step it.
    pub fn get_mut<Q: Ord + ?Sized>(&mut self, id: &Q) -> Option<&mut Op>
    where
        OpId: Borrow<Q>,
    {
        self.changed();
        self.by_id.get_mut(id)
    }

    /// Adds (or replaces) an operation.
    pub fn insert(&mut self, op: Op) {
        self.changed();
        self.by_id.insert(op.id.clone(), op);
    }

    /// Takes an operation out (to step it while reading the others).
    pub fn remove(&mut self, id: &OpId) -> Option<Op> {
        self.changed();
        self.by_id.remove(id)
    }

    fn changed(&mut self) {
        *self.removing.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
        *self.open.get_mut().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Every operation, by id.
    pub fn iter(&self) -> impl Iterator<Item = &Op> {
        self.by_id.values()
    }

    /// Operations not finished, by id.
    pub fn in_flight(&self) -> impl Iterator<Item = &Op> {
        let ids = {
            let mut memo = self.open.lock().unwrap_or_else(|p| p.into_inner());
            memo.get_or_insert_with(|| {
                Arc::new(
                    self.iter()
                        .filter(|o| !o.is_done())
                        .map(|o| o.id.clone())
                        .collect(),
                )
            })
            .clone()
        };
        (0..ids.len()).filter_map(move |i| self.by_id.get(&ids[i]))
    }

    /// Ids of the operations not finished.
    pub fn in_flight_ids(&self) -> Vec<OpId> {
        self.in_flight().map(|o| o.id.clone()).collect()
    }

    /// Number of operations, finished ones included.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether there is no operation at all.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// The scale-down in flight of `node`, if any.
    pub fn saga_of(&self, node: &str) -> Option<&Op> {
        self.in_flight()
            .find(|op| op.down().is_some_and(|d| d.node == node))
    }

    /// Nodes whose removal is under way or done: not capacity, not missing.
    pub fn removing_nodes(&self) -> BTreeSet<String> {
        self.iter()
            .filter_map(Op::down)
            .filter(|d| d.is_removing())
            .map(|d| d.node.clone())
            .collect()
    }

    /// The [`Ops::removing_nodes`] that `fleet` knows: the same figures
    /// when excluded from the fleet's (which only counts nodes it knows),
    /// and few. Remembered until an operation changes or a node joins or
    /// leaves the fleet: asked for on every report.
    pub fn removing_known(&self, fleet: &Fleet) -> Arc<BTreeSet<String>> {
        let mut memo = self.removing.lock().unwrap_or_else(|p| p.into_inner());
        let members = fleet.membership();
        if let Some((m, set)) = memo.as_ref()
            && *m == members
        {
            return set.clone();
        }
        let set: Arc<BTreeSet<String>> = Arc::new(
            self.iter()
                .filter_map(Op::down)
                .filter(|d| d.is_removing() && fleet.get(&d.node).is_some())
                .map(|d| d.node.clone())
                .collect(),
        );
        *memo = Some((members, set.clone()));
        set
    }

    /// Nodes with a scale-down in flight.
    pub fn draining_nodes(&self) -> BTreeSet<String> {
        self.in_flight()
            .filter_map(Op::down)
            .map(|d| d.node.clone())
            .collect()
    }

    /// Drops the oldest finished operations beyond `keep`; returns their ids.
    pub fn prune(&mut self, keep: usize) -> Vec<OpId> {
        let mut done: Vec<(DateTime<Utc>, OpId)> = self
            .iter()
            .filter(|o| o.is_done())
            .map(|o| (o.updated, o.id.clone()))
            .collect();
        if done.len() <= keep {
            return vec![];
        }
        done.sort();
        let excess = done.len() - keep;
        let gone: Vec<OpId> = done.into_iter().take(excess).map(|(_, id)| id).collect();
        self.changed();
        for id in &gone {
            self.by_id.remove(id);
        }
        gone
    }
}

#[cfg(test)]
mod tests;
