//! What a replay found: every decision with its virtual time, the nodes
//! booted and removed, the peak usage of each group, and what the replay
//! cost (wall time, reports per second).

use std::collections::BTreeMap;
use std::fmt::Write;

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::{Decision, GroupStats};
use serde::Serialize;

use super::world::{NodeChange, World};
use crate::harness::scenario::round1;

/// One decision the configuration would take.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    /// Virtual time.
    pub at: DateTime<Utc>,
    /// `scale_up`, `scale_down`, `joined`, `removed`, ...
    pub kind: String,
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Node, when the decision names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Why.
    pub reason: String,
}

impl Step {
    pub(super) fn of(d: &Decision, at: DateTime<Utc>) -> Step {
        Step {
            at,
            kind: kind_name(d),
            district: d.district.clone(),
            profile: d.profile.clone(),
            node: d.node.clone(),
            reason: d.reason.clone(),
        }
    }
}

fn kind_name(d: &Decision) -> String {
    serde_json::to_value(d.decision)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{:?}", d.decision))
}

/// The highest usage a group reached, and when.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Peak {
    /// `district/profile`.
    pub group: String,
    /// Usage, percent.
    pub usage_pct: f64,
    /// Active gears then.
    pub gears_active: u32,
    /// Active nodes then.
    pub nodes_active: u32,
    /// When.
    pub at: DateTime<Utc>,
}

impl Peak {
    pub(super) fn of(g: &GroupKey, s: &GroupStats, at: DateTime<Utc>) -> Peak {
        Peak {
            group: format!("{}/{}", g.district, g.profile),
            usage_pct: s.usage_pct,
            gears_active: s.gears_active,
            nodes_active: s.nodes_active,
            at,
        }
    }
}

/// The replay's result (`--json` prints it as one object).
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// Virtual time of the first report.
    pub start: DateTime<Utc>,
    /// Virtual time the replay ended.
    pub end: DateTime<Utc>,
    /// Every decision, in order.
    pub decisions: Vec<Step>,
    /// Decisions by kind.
    pub decision_counts: BTreeMap<String, u32>,
    /// Nodes the simulated cloud booted.
    pub booted: Vec<NodeChange>,
    /// Nodes the simulated cloud deleted.
    pub removed: Vec<NodeChange>,
    /// Peak usage per group.
    pub peaks: Vec<Peak>,
    /// Highest usage of any group, percent.
    pub peak_usage_pct: f64,
    /// Reports read from the trace.
    pub reports: u64,
    /// Reports the core refused (a removed node's late report, ...).
    pub refused: u64,
    /// Evaluations.
    pub evaluations: u64,
    /// Explanations published.
    pub explanations: u64,
    /// Commands sent to nodes.
    pub commands: u64,
    /// Handler calls.
    pub calls: u64,
    /// Wall time of the replay, seconds.
    pub wall_secs: f64,
    /// Reports replayed per wall second.
    pub reports_per_sec: f64,
    #[serde(skip)]
    pub(super) steps: Vec<Step>,
    #[serde(skip)]
    peaks_by_group: BTreeMap<String, Peak>,
}

impl Outcome {
    pub(super) fn new(start: DateTime<Utc>) -> Outcome {
        Outcome {
            start,
            end: start,
            decisions: vec![],
            decision_counts: BTreeMap::new(),
            booted: vec![],
            removed: vec![],
            peaks: vec![],
            peak_usage_pct: 0.0,
            reports: 0,
            refused: 0,
            evaluations: 0,
            explanations: 0,
            commands: 0,
            calls: 0,
            wall_secs: 0.0,
            reports_per_sec: 0.0,
            steps: vec![],
            peaks_by_group: BTreeMap::new(),
        }
    }

    pub(super) fn peak(&mut self, p: Peak) {
        let e = self
            .peaks_by_group
            .entry(p.group.clone())
            .or_insert_with(|| p.clone());
        if p.usage_pct > e.usage_pct {
            *e = p;
        }
    }

    pub(super) fn finish(&mut self, end: DateTime<Utc>, world: &World, wall: std::time::Duration) {
        self.end = end;
        self.decisions = std::mem::take(&mut self.steps);
        for d in &self.decisions {
            *self.decision_counts.entry(d.kind.clone()).or_default() += 1;
        }
        self.booted = world.booted.clone();
        self.removed = world.removed.clone();
        self.peaks = self.peaks_by_group.values().cloned().collect();
        self.peak_usage_pct = round1(self.peaks.iter().map(|p| p.usage_pct).fold(0.0, f64::max));
        self.wall_secs = wall.as_secs_f64();
        self.reports_per_sec = (self.reports as f64 / self.wall_secs.max(1e-9)).round();
    }

    /// The human-readable result.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let span = self.end - self.start;
        let _ = writeln!(
            s,
            "replay of {} reports, {} to {} ({}h{:02}m of virtual time)",
            self.reports,
            self.start.format("%Y-%m-%d %H:%M:%S"),
            self.end.format("%Y-%m-%d %H:%M:%S"),
            span.num_hours(),
            span.num_minutes() % 60
        );
        let _ = writeln!(s, "\nDECISIONS ({})", self.decisions.len());
        for d in &self.decisions {
            let node = d
                .node
                .as_deref()
                .map(|n| format!(" {n}"))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "  {}  {:<12} {}/{}{node}: {}",
                d.at.format("%m-%d %H:%M:%S"),
                d.kind,
                d.district,
                d.profile,
                d.reason
            );
        }
        render_nodes(&mut s, "NODES BOOTED", &self.booted);
        render_nodes(&mut s, "NODES REMOVED", &self.removed);
        let _ = writeln!(s, "\nPEAK USAGE {:.1} %", self.peak_usage_pct);
        for p in &self.peaks {
            let _ = writeln!(
                s,
                "  {:<40} {:>5.1} % ({} active gears on {} nodes) at {}",
                p.group,
                p.usage_pct,
                p.gears_active,
                p.nodes_active,
                p.at.format("%m-%d %H:%M:%S")
            );
        }
        let _ = writeln!(
            s,
            "\nreplayed in {:.2} s of wall time: {:.0} reports/s, {} evaluations, {} commands, {} handler calls",
            self.wall_secs, self.reports_per_sec, self.evaluations, self.commands, self.calls
        );
        s
    }
}

fn render_nodes(s: &mut String, title: &str, nodes: &[NodeChange]) {
    let _ = writeln!(s, "\n{title} ({})", nodes.len());
    for n in nodes {
        let at = n.at.format("%m-%d %H:%M:%S");
        let _ = writeln!(s, "  {at}  {} ({}/{})", n.node, n.district, n.profile);
    }
}
