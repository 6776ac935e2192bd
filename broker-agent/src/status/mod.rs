//! The status report: what `gearshift-broker status` prints, what the
//! admin reply carries, and what an embedding program (the demo) watches.
//!
//! Layout: this file holds the document and its rendering; `parts.rs` builds
//! it group by group, rebuilding only the groups whose inputs changed since
//! the last document ([`StatusBuilder`]); `nodes.rs` the node list, shared
//! group by group between documents ([`NodeList`]).

mod nodes;
mod parts;
#[cfg(test)]
mod tests;

pub use self::nodes::NodeList;
pub use self::parts::StatusBuilder;

use std::collections::BTreeMap;
use std::fmt::Write;

use chrono::{DateTime, Utc};
use gearshift_proto::msg::GroupStats;
use serde::{Deserialize, Serialize};

use crate::core::Core;
use crate::ops::{DrainProgress, OpBody};

/// Figures of one node group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupStatus {
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Handler name.
    pub handler: String,
    /// min_nodes.
    pub min_nodes: u32,
    /// max_nodes.
    pub max_nodes: u32,
    /// The `oo-stats` figures.
    pub stats: GroupStats,
    /// Exhausted since, with the cloud's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exhausted: Option<String>,
    /// No scale-up before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff_until: Option<DateTime<Utc>>,
    /// `paused by X until Y: reason`, while the group (or the fleet) is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
}

/// Figures of one profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileStatus {
    /// Profile.
    pub profile: String,
    /// The `oo-stats` figures summed over its districts.
    pub stats: GroupStats,
}

/// One operation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStatus {
    /// Operation id.
    pub id: String,
    /// `scale_up` or `scale_down`.
    pub kind: String,
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Current state.
    pub state: String,
    /// Whether it ended.
    pub done: bool,
    /// Why it started.
    pub reason: String,
    /// Started.
    pub created: DateTime<Utc>,
    /// Last change.
    pub updated: DateTime<Utc>,
    /// Evacuation progress (scale-down).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<DrainProgress>,
}

/// One node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Name.
    pub node: String,
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// Accepts gears.
    pub active: bool,
    /// Reporting recently.
    pub fresh: bool,
    /// Active gears.
    pub gears_active: u32,
    /// All gears.
    pub gears_total: u32,
    /// max_active_gears.
    pub max_active_gears: u32,
    /// Operator or report do-not-disrupt.
    pub do_not_disrupt: bool,
    /// `cordoned by X: reason`, while an operator keeps it out of placement
    /// and scale-down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cordoned: Option<String>,
    /// Last report received.
    pub last_report: DateTime<Utc>,
}

/// The whole status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The agent's name.
    pub agent: String,
    /// When this was taken.
    pub at: Option<DateTime<Utc>>,
    /// The stale-node breaker is open (no scaling).
    pub breaker_open: bool,
    /// `paused by X until Y: reason`, while the whole fleet is paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<String>,
    /// Per profile.
    pub profiles: Vec<ProfileStatus>,
    /// Per group.
    pub groups: Vec<GroupStatus>,
    /// Per node, group by group (in the order of `groups`), by name within a group.
    pub nodes: NodeList,
    /// Operations in flight, then the most recent finished ones.
    pub ops: Vec<OpStatus>,
    /// Refused messages by reason.
    pub refused: BTreeMap<String, u64>,
    /// The last reload (SIGHUP), when there was one since the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reload: Option<ReloadStatus>,
    /// Who leads the agent's cluster, as this agent sees it (`docs/ha.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ha: Option<crate::lead::HaStatus>,
}

/// How the last reload ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReloadStatus {
    /// When the agent took (or refused) it.
    pub at: DateTime<Utc>,
    /// The new file runs.
    pub applied: bool,
    /// Why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The changed keys that only apply at start (restart to change them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restart_keys: Vec<String>,
}

impl Status {
    /// A snapshot of `core` at `now`, every group built afresh (an agent
    /// keeps a [`StatusBuilder`] instead, which rebuilds only what changed).
    pub fn of(
        core: &Core,
        agent: &str,
        now: DateTime<Utc>,
        refused: &BTreeMap<String, u64>,
    ) -> Status {
        StatusBuilder::default().build(core, agent, now, refused)
    }

    /// Operations not finished.
    pub fn in_flight(&self) -> impl Iterator<Item = &OpStatus> {
        self.ops.iter().filter(|o| !o.done)
    }

    /// The human-readable report.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let at = self
            .at
            .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
            .unwrap_or_default();
        let _ = writeln!(s, "broker agent {} at {at}", self.agent);
        if let Some(h) = &self.ha {
            let _ = writeln!(s, "{}", h.describe());
        }
        if self.breaker_open {
            let _ = writeln!(
                s,
                "BREAKER OPEN: too many nodes are missing; all scaling stopped"
            );
        }
        if let Some(p) = &self.paused {
            let _ = writeln!(s, "PAUSED: {p}");
        }
        if let Some(ReloadStatus {
            at,
            applied: false,
            error,
            ..
        }) = &self.reload
        {
            let e = error.as_deref().unwrap_or("");
            let at = at.format("%Y-%m-%d %H:%M:%S UTC");
            let _ = writeln!(s, "RELOAD REFUSED at {at}: {e}");
        }
        self.render_profiles(&mut s);
        self.render_groups(&mut s);
        self.render_ops(&mut s);
        let cordoned: Vec<String> = self
            .nodes
            .iter()
            .filter_map(|n| n.cordoned.as_ref().map(|c| format!("  {} {c}", n.node)))
            .collect();
        if !cordoned.is_empty() {
            let _ = writeln!(s, "\nCORDONED NODES:\n{}", cordoned.join("\n"));
        }
        if !self.refused.is_empty() {
            let r: Vec<String> = self
                .refused
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let _ = writeln!(s, "\nREFUSED MESSAGES: {}", r.join(" "));
        }
        s
    }

    fn render_profiles(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nPROFILE     NODES(act/inact/miss)  ACTIVE GEARS  AVAILABLE  EFFECTIVE  USAGE"
        );
        for p in &self.profiles {
            let t = &p.stats;
            let _ = writeln!(
                s,
                "{:<11} {:>5}/{}/{:<13} {:>12}  {:>9}  {:>9}  {:>5.1} %",
                p.profile,
                t.nodes_active,
                t.nodes_inactive,
                t.nodes_missing,
                t.gears_active,
                t.available_active_gears,
                t.effective_available_gears,
                t.usage_pct
            );
        }
    }

    fn render_groups(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nDISTRICT                          PROFILE     NODES(act/inact/miss)  USAGE    AVAIL  FREE UIDS  HANDLER  NOTE"
        );
        for g in &self.groups {
            let t = &g.stats;
            let mut note = String::new();
            if let Some(p) = &g.paused {
                note.push_str(&format!("PAUSED ({p}) "));
            }
            if let Some(e) = &g.exhausted {
                note.push_str(&format!("EXHAUSTED {e}"));
            }
            if let Some(b) = g.backoff_until {
                note.push_str(&format!(" backoff until {}", b.format("%H:%M:%S")));
            }
            let _ = writeln!(
                s,
                "{:<33} {:<11} {:>5}/{}/{:<13} {:>5.1} %  {:>5}  {:>9}  {:<7}  {}",
                g.district,
                g.profile,
                t.nodes_active,
                t.nodes_inactive,
                t.nodes_missing,
                t.usage_pct,
                t.available_active_gears,
                t.district_free_uids
                    .map_or_else(|| "-".to_string(), |u| u.to_string()),
                g.handler,
                note.trim()
            );
        }
    }

    fn render_ops(&self, s: &mut String) {
        let inflight: Vec<&OpStatus> = self.in_flight().collect();
        let _ = writeln!(s, "\nOPERATIONS IN FLIGHT: {}", inflight.len());
        for o in inflight {
            let prog = match &o.progress {
                Some(p) if p.total > 0 => format!(
                    "  [{}] {}/{} moved, {} failed",
                    bar(p.moved + p.failed, p.total),
                    p.moved,
                    p.total,
                    p.failed
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                s,
                "  {} {} {}/{} {} {}{}",
                o.id,
                o.kind,
                o.district,
                o.profile,
                o.node.as_deref().unwrap_or("(new node)"),
                o.state,
                prog
            );
        }
        let recent: Vec<&OpStatus> = self.ops.iter().filter(|o| o.done).take(10).collect();
        if !recent.is_empty() {
            let _ = writeln!(s, "\nRECENT OPERATIONS:");
            for o in recent {
                let _ = writeln!(
                    s,
                    "  {} {} {}/{} {} {} ({})",
                    o.id,
                    o.kind,
                    o.district,
                    o.profile,
                    o.node.as_deref().unwrap_or("-"),
                    o.state,
                    o.updated.format("%H:%M:%S")
                );
            }
        }
    }
}

/// Operations in flight, then the most recently finished, 50 at most.
pub(crate) fn ops_of(core: &Core) -> Vec<OpStatus> {
    let mut ops: Vec<OpStatus> = core
        .ops()
        .map(|o| OpStatus {
            id: o.id.to_string(),
            kind: o.kind().into(),
            district: o.group.district.clone(),
            profile: o.group.profile.clone(),
            node: o.node().map(str::to_string),
            state: o.state().into(),
            done: o.is_done(),
            reason: o.reason.clone(),
            created: o.created,
            updated: o.updated,
            progress: match &o.body {
                OpBody::ScaleDown(d) => Some(d.progress),
                _ => None,
            },
        })
        .collect();
    ops.sort_by(|a, b| a.done.cmp(&b.done).then(b.updated.cmp(&a.updated)));
    ops.truncate(50);
    ops
}

/// A 20-character progress bar.
pub fn bar(done: u32, total: u32) -> String {
    let width = 20usize;
    let filled = if total == 0 {
        width
    } else {
        (done.min(total) as usize * width) / total as usize
    };
    format!("{}{}", "#".repeat(filled), ".".repeat(width - filled))
}
