//! The demo's result: what it saw of the broker agent's decisions, the
//! expectations checked at the end, and the summary (text or JSON).

use std::collections::{BTreeMap, BTreeSet};

use gearshift_proto::msg::{Decision, DecisionKind, GearInfo};
use serde::Serialize;

use super::ledger::{Inventory, NodeGears};
use super::workload::Placement;

/// The machine-readable result (`--json`).
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Every expectation met.
    pub ok: bool,
    /// Expectations not met.
    pub failures: Vec<String>,
    /// `memory`, `amqp` or `stomp`.
    pub transport: String,
    /// The bus URL without its password.
    pub bus: String,
    /// Seed of the workload.
    pub seed: u64,
    /// Time scale.
    pub speed: f64,
    /// Wall time of the run, in seconds (set-up and teardown included).
    pub duration_s: f64,
    /// Phase reached (`done` when the script ran to its end).
    pub phase: String,
    /// Node agents at the start.
    pub nodes_initial: u32,
    /// Nodes at the end.
    pub nodes_final: usize,
    /// Nodes booted by the simulated cloud.
    pub nodes_booted: Vec<String>,
    /// Nodes deleted by the simulated cloud.
    pub nodes_removed: Vec<String>,
    /// Scale-up decisions.
    pub scale_ups: u32,
    /// Scale-ups whose node joined.
    pub scale_ups_joined: u32,
    /// Completed scale-downs: sagas that emptied and removed their node.
    pub scale_downs: u32,
    /// Scale-down decisions (sagas started).
    pub scale_downs_started: u32,
    /// Scale-downs aborted or cancelled.
    pub scale_downs_aborted: u32,
    /// Decisions published by the broker agent.
    pub decisions: u32,
    /// Decisions by kind.
    pub decisions_by_kind: BTreeMap<String, u32>,
    /// Gears when the workload started.
    pub gears_before: u64,
    /// Gears the workload created.
    pub gears_created: u64,
    /// Gears the workload deleted.
    pub gears_deleted: u64,
    /// Gears found in the world at the end.
    pub gears_after: usize,
    /// Gears that should exist at the end (created and not deleted).
    pub gears_expected: usize,
    /// Expected gears found on no node (independent inventory).
    pub gears_lost: usize,
    /// Gears found on more than one node.
    pub gears_duplicated: usize,
    /// Gears found that should not exist.
    pub gears_unexpected: usize,
    /// Gear moves made by evacuations.
    pub gears_moved: u64,
    /// Highest active usage of the fleet, in percent.
    pub peak_usage_pct: f64,
    /// Placement requests sent by the workload.
    pub placement_requests: u64,
    /// Placement requests refused or unanswered.
    pub placement_refused: u64,
    /// Gears per node at the end.
    pub per_node: BTreeMap<String, NodeGears>,
    /// Durable queues of this run deleted at the end (real buses).
    pub queues_deleted: usize,
    /// Messages the broker agent refused, by reason (on a shared broker:
    /// other runs' traffic, signed by keys it does not trust).
    pub refused_messages: BTreeMap<String, u64>,
}

impl Summary {
    /// The human-readable summary.
    pub fn render(&self) -> String {
        let kinds: Vec<String> = self
            .decisions_by_kind
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        let nodes: Vec<String> = self
            .per_node
            .iter()
            .map(|(n, g)| format!("{n} ({} gears, {} active)", g.gears, g.active))
            .collect();
        let mut s = String::new();
        s.push_str(&format!(
            "\nSummary ({} bus, seed {}, speed {}, {:.1} s)\n",
            self.transport, self.seed, self.speed, self.duration_s
        ));
        s.push_str(&format!(
            "  scale-ups    {} decided, {} joined{}\n",
            self.scale_ups,
            self.scale_ups_joined,
            if self.nodes_booted.is_empty() {
                String::new()
            } else {
                format!(" ({})", self.nodes_booted.join(", "))
            }
        ));
        s.push_str(&format!(
            "  scale-downs  {} started, {} completed{}, {} aborted; {} gears moved\n",
            self.scale_downs_started,
            self.scale_downs,
            if self.nodes_removed.is_empty() {
                String::new()
            } else {
                format!(" ({} removed)", self.nodes_removed.join(", "))
            },
            self.scale_downs_aborted,
            self.gears_moved
        ));
        s.push_str(&format!(
            "  decisions    {} ({})\n",
            self.decisions,
            kinds.join(", ")
        ));
        s.push_str(&format!(
            "  gears        {} before, {} created, {} deleted, {} after; peak usage {:.1} %\n",
            self.gears_before,
            self.gears_created,
            self.gears_deleted,
            self.gears_after,
            self.peak_usage_pct
        ));
        s.push_str(&format!(
            "  inventory    {} expected, {} lost, {} duplicated, {} unexpected\n",
            self.gears_expected, self.gears_lost, self.gears_duplicated, self.gears_unexpected
        ));
        s.push_str(&format!(
            "  nodes        {} -> {}: {}\n",
            self.nodes_initial,
            self.nodes_final,
            nodes.join(", ")
        ));
        if self.ok {
            s.push_str(
                "  result       OK: the fleet grew, shrank, and every gear is where it should be\n",
            );
        } else {
            s.push_str("  result       FAILED\n");
            for f in &self.failures {
                s.push_str(&format!("    - {f}\n"));
            }
        }
        s
    }
}

/// What the demo needs of every decision it sees.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) by_kind: BTreeMap<String, u32>,
    pub(super) total: u32,
    pub(super) up_ops: BTreeSet<String>,
    pub(super) joined: BTreeMap<String, String>,
    pub(super) down_ops: BTreeSet<String>,
    pub(super) removed: BTreeMap<String, String>,
    pub(super) aborted: u32,
    pub(super) lagged: u64,
}

impl Tally {
    pub(super) fn add(&mut self, d: &Decision) {
        self.total += 1;
        *self
            .by_kind
            .entry(d.decision.as_str().to_string())
            .or_default() += 1;
        let op = d.op.clone().unwrap_or_default();
        let node = d.node.clone().unwrap_or_default();
        match d.decision {
            DecisionKind::ScaleUp => {
                self.up_ops.insert(op);
            }
            DecisionKind::Joined => {
                self.joined.insert(op, node);
            }
            DecisionKind::ScaleDown => {
                self.down_ops.insert(op);
            }
            DecisionKind::Removed => {
                self.removed.insert(op, node);
            }
            DecisionKind::Aborted | DecisionKind::DrainCancelled => self.aborted += 1,
            _ => {}
        }
    }
}

/// `n` items of `v`, comma-separated.
fn first<T: ToString>(v: &[T], n: usize) -> String {
    v.iter()
        .take(n)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The independent inventory's verdict: no gear lost, duplicated or
/// unexpected, none left on a node the cloud deleted.
pub(super) fn inventory_failures(inv: &Inventory, lost_with_nodes: &[GearInfo]) -> Vec<String> {
    let mut failures = vec![];
    if !inv.missing.is_empty() {
        failures.push(format!(
            "{} gears lost: {}",
            inv.missing.len(),
            first(&inv.missing, 10)
        ));
    }
    if !inv.duplicated.is_empty() {
        failures.push(format!("gears on two nodes: {}", inv.duplicated.join("; ")));
    }
    if !inv.unexpected.is_empty() {
        failures.push(format!(
            "{} unexpected gears: {}",
            inv.unexpected.len(),
            first(&inv.unexpected, 10)
        ));
    }
    if !lost_with_nodes.is_empty() {
        failures.push(format!(
            "{} gears were on nodes when the cloud deleted them",
            lost_with_nodes.len()
        ));
    }
    failures
}

/// What the script must have caused: a scale-up whose node joined, a
/// scale-down saga that removed its node, placements answered.
pub(super) fn script_failures(tally: &Tally, placement: &Placement) -> Vec<String> {
    let mut failures = vec![];
    if tally.up_ops.is_empty() {
        failures.push("no scale-up was decided".into());
    } else if tally.joined.is_empty() {
        failures.push("no node booted for a scale-up joined".into());
    }
    if tally.down_ops.is_empty() {
        failures.push("no scale-down was decided".into());
    } else if tally.removed.is_empty() {
        failures.push("no scale-down saga removed its node".into());
    }
    if placement.refused > 0 && placement.requests == placement.refused {
        failures.push(format!(
            "every placement request was refused (last: {})",
            placement.last_refusal.clone().unwrap_or_default()
        ));
    }
    failures
}
