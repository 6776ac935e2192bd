//! Operator requests (`gearshift-broker status|evacuate|drain|abort|
//! do-not-disrupt|pause|resume|cordon|uncordon|activate`): what an operator
//! may ask, what is refused and why, and the answers.
//!
//! [`decide`] reads the facts and turns a request into an [`Order`] for the
//! coordinator (start a drain, abort an operation, mark, pause or cordon,
//! activate a node, answer) or a refusal; [`Marks`] and
//! [`controls`] are the state it owns: do-not-disrupt marks, pauses and
//! cordons. The answers' wording is part of the operator interface.

pub mod controls;

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{AdminReply, AdminRequest};

use self::controls::{Cordon, Pause};
use crate::core::facts::Facts;
use crate::ops::{OpBody, OpId, Origin};

/// Nodes an operator marked do-not-disrupt (journaled).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Marks {
    nodes: BTreeSet<String>,
}

impl Marks {
    /// Marks as journaled.
    pub fn from_set(nodes: BTreeSet<String>) -> Marks {
        Marks { nodes }
    }

    /// The marked nodes.
    pub fn nodes(&self) -> &BTreeSet<String> {
        &self.nodes
    }

    /// Marks or unmarks `node`; whether that changed anything.
    pub fn set(&mut self, node: &str, on: bool) -> bool {
        if on {
            self.nodes.insert(node.to_string())
        } else {
            self.nodes.remove(node)
        }
    }
}

/// A drain an operator asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Evacuation {
    /// The node's group.
    pub group: GroupKey,
    /// The node.
    pub node: String,
    /// Who asked.
    pub origin: Origin,
    /// Why, for the decision.
    pub reason: String,
    /// A maintenance drain: keep the emptied node (inactive, cordoned).
    pub keep: bool,
}

/// An abort an operator asked for.
#[derive(Debug, Clone, PartialEq)]
pub enum Abort {
    /// Of a drain: the node is re-activated.
    Drain {
        /// The operation.
        op: OpId,
        /// Why.
        why: String,
    },
    /// Of a scale-up.
    ScaleUp {
        /// The operation.
        op: OpId,
        /// Who asked.
        by: String,
    },
}

impl Abort {
    /// The operation aborted.
    pub fn op(&self) -> &OpId {
        match self {
            Abort::Drain { op, .. } | Abort::ScaleUp { op, .. } => op,
        }
    }
}

/// What the coordinator must do for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Order {
    /// Start a scale-down, then answer [`evacuating`].
    Evacuate(Evacuation),
    /// Abort an operation, then answer [`aborting`].
    Abort(Abort),
    /// Mark or unmark a node, then answer [`marked`].
    Mark {
        /// The node.
        node: String,
        /// Mark (true) or unmark.
        on: bool,
    },
    /// Answer with the status document.
    Status,
    /// Pause the fleet (`None`) or a group, then answer [`paused`].
    Pause {
        /// The group; none: the fleet.
        group: Option<GroupKey>,
        /// Who, why, until when.
        pause: Pause,
    },
    /// Lift a pause, then answer [`resumed`].
    Resume {
        /// The group; none: the fleet.
        group: Option<GroupKey>,
    },
    /// Cordon (`Some`) or uncordon a node, then answer [`cordoned`].
    Cordon {
        /// The node.
        node: String,
        /// Who and why; none: uncordon.
        cordon: Option<Cordon>,
    },
    /// Send `cmd.activate` to the node and lift its cordon, then answer [`activating`].
    Activate {
        /// The node.
        node: String,
    },
}

/// The order for `req` from `from`, or why it is refused.
pub fn decide(
    facts: &Facts<'_>,
    from: &str,
    req: AdminRequest,
    now: DateTime<Utc>,
) -> Result<Order, String> {
    match req {
        AdminRequest::Status => Ok(Order::Status),
        AdminRequest::Evacuate { node } => evacuate(facts, &node, from, now).map(Order::Evacuate),
        AdminRequest::Abort { op } => abort(facts, &op, from).map(Order::Abort),
        AdminRequest::DoNotDisrupt { node, on } => Ok(Order::Mark { node, on }),
        AdminRequest::Drain { node, keep } => {
            let mut ev = evacuate(facts, &node, from, now)?;
            if keep {
                ev.keep = true;
                ev.reason = format!(
                    "operator {from} asked to drain {node} for maintenance (kept, not removed)"
                );
            }
            Ok(Order::Evacuate(ev))
        }
        AdminRequest::Pause {
            district,
            profile,
            reason,
            until,
        } => {
            if until.is_some_and(|u| u <= now) {
                return Err("the pause would already be over (until is in the past)".into());
            }
            let pause = Pause {
                by: from.to_string(),
                reason,
                since: now,
                until,
            };
            Ok(Order::Pause {
                group: scope(district, profile),
                pause,
            })
        }
        AdminRequest::Resume { district, profile } => Ok(Order::Resume {
            group: scope(district, profile),
        }),
        AdminRequest::Cordon { node, on, reason } => {
            if on && facts.fleet.get(&node).is_none() {
                return Err(format!("no node {node:?} is reporting"));
            }
            let cordon = on.then(|| Cordon {
                by: from.to_string(),
                reason,
                since: now,
                op: None,
            });
            Ok(Order::Cordon { node, cordon })
        }
        AdminRequest::Activate { node } => {
            activate(facts, &node).map(|()| Order::Activate { node })
        }
    }
}

/// The group of a request's `district` and `profile` (none: the fleet).
fn scope(district: Option<String>, profile: Option<String>) -> Option<GroupKey> {
    match (district, profile) {
        (Some(district), Some(profile)) => Some(GroupKey { district, profile }),
        _ => None,
    }
}

/// Whether `node` can be activated: known, not being drained, inactive or cordoned.
fn activate(facts: &Facts<'_>, node: &str) -> Result<(), String> {
    let e = facts
        .fleet
        .get(node)
        .ok_or_else(|| format!("no node {node:?} is reporting"))?;
    if let Some(op) = facts.saga_of(node) {
        return Err(format!(
            "{node} is being drained by {}: abort that operation instead",
            op.id
        ));
    }
    if e.is_active() && !facts.cordoned(node) {
        return Err(format!("{node} is already active and not cordoned"));
    }
    Ok(())
}

/// A scale-down of `node` at an operator's request. Thresholds and budgets
/// do not apply; do-not-disrupt, pinned gears and room do.
pub fn evacuate(
    facts: &Facts<'_>,
    node: &str,
    by: &str,
    now: DateTime<Utc>,
) -> Result<Evacuation, String> {
    let e = facts
        .fleet
        .get(node)
        .ok_or_else(|| format!("no node {node:?} is reporting"))?;
    if !e.is_fresh(now, facts.stale_intervals) {
        return Err(format!("{node} is missing (no recent report)"));
    }
    if let Some(op) = facts.saga_of(node) {
        return Err(format!("{node} is already being drained by {}", op.id));
    }
    if facts.do_not_disrupt(node) {
        return Err(format!("{node} is marked do-not-disrupt"));
    }
    if e.report.pinned_gears > 0 {
        return Err(format!(
            "{node} has {} gears that opted out of scale-down",
            e.report.pinned_gears
        ));
    }
    let group = e.group();
    let room = facts.room_without(&group, node, now);
    if room < e.total_gears() {
        return Err(format!(
            "the rest of {group} has room for {room} gears, {node} has {}",
            e.total_gears()
        ));
    }
    Ok(Evacuation {
        group,
        node: node.to_string(),
        origin: Origin::Operator { by: by.to_string() },
        reason: format!("operator {by} asked to evacuate {node}"),
        keep: false,
    })
}

/// Aborting operation `id` at an operator's request.
pub fn abort(facts: &Facts<'_>, id: &str, by: &str) -> Result<Abort, String> {
    let op = facts
        .ops
        .get(id)
        .ok_or_else(|| format!("no operation {id}"))?;
    if op.is_done() {
        return Err(format!("{id} already ended ({})", op.state()));
    }
    match &op.body {
        OpBody::ScaleDown(d) if d.step.cancellable() => Ok(Abort::Drain {
            op: op.id.clone(),
            why: format!("operator {by} aborted it"),
        }),
        OpBody::ScaleDown(d) => Err(format!(
            "{id} is past the point of return ({}): the node is empty and being removed",
            d.step.name()
        )),
        OpBody::ScaleUp(_) => Ok(Abort::ScaleUp {
            op: op.id.clone(),
            by: by.to_string(),
        }),
    }
}

/// A successful answer.
pub fn ok(message: String, data: serde_json::Value) -> AdminReply {
    AdminReply {
        ok: true,
        message,
        data,
    }
}

/// A refusal.
pub fn refused(message: String) -> AdminReply {
    AdminReply {
        ok: false,
        message,
        data: serde_json::Value::Null,
    }
}

/// The answer to an evacuation (a maintenance drain with `keep`) that
/// started as `op`.
pub fn evacuating(node: &str, op: &OpId, keep: bool) -> AdminReply {
    let what = if keep {
        format!("draining {node} for maintenance as {op}: it stays, inactive and cordoned")
    } else {
        format!("evacuating {node} as {op}")
    };
    ok(what, serde_json::json!({ "op": op, "keep": keep }))
}

fn scope_name(group: Option<&GroupKey>) -> String {
    group.map_or_else(|| "the fleet".to_string(), |g| g.to_string())
}

/// The answer to a pause.
pub fn paused(group: Option<&GroupKey>, p: &Pause) -> AdminReply {
    ok(
        format!("{} {}", scope_name(group), p.describe()),
        serde_json::json!({ "until": p.until }),
    )
}

/// The answer to a resume; a refusal when nothing was paused.
pub fn resumed(group: Option<&GroupKey>, was: Option<&Pause>) -> AdminReply {
    match was {
        Some(p) => ok(
            format!("{} resumed (was {})", scope_name(group), p.describe()),
            serde_json::Value::Null,
        ),
        None => refused(format!("{} is not paused", scope_name(group))),
    }
}

/// The answer to a (un)cordon.
pub fn cordoned(node: &str, on: bool) -> AdminReply {
    ok(
        if on {
            format!("{node} is cordoned: no gear goes there, no scale-down chooses it")
        } else {
            format!("{node} is no longer cordoned")
        },
        serde_json::Value::Null,
    )
}

/// The answer to an activation (`op`: the command's operation id when one was sent).
pub fn activating(node: &str, op: Option<&OpId>, uncordoned: bool) -> AdminReply {
    let mut parts = vec![];
    if let Some(op) = op {
        parts.push(format!("cmd.activate sent to {node} as {op}"));
    }
    if uncordoned {
        parts.push(format!("{node} is no longer cordoned"));
    }
    ok(parts.join("; "), serde_json::json!({ "op": op }))
}

/// The answer to an abort.
pub fn aborting(op: &OpId) -> AdminReply {
    ok(format!("aborting {op}"), serde_json::json!({ "op": op }))
}

/// The answer to a (un)marking.
pub fn marked(node: &str, on: bool) -> AdminReply {
    ok(
        format!(
            "{node} is {}marked do-not-disrupt",
            if on { "" } else { "no longer " }
        ),
        serde_json::Value::Null,
    )
}

/// The answer to a status request.
pub fn status(s: &crate::status::Status) -> AdminReply {
    ok("status".into(), serde_json::to_value(s).unwrap_or_default())
}

#[cfg(test)]
mod tests;
