//! `gearshift-node status`: what the node is doing, read from the state
//! directory (works while the agent runs, and after it stopped).
//!
//! The active flag and evacuation progress come from the authoritative
//! files (`state.json`, the checkpoints); identity and gear counts from the
//! snapshot the agent rewrites at every report (`status.json`).

use chrono::{DateTime, Utc};
use gearshift_proto::msg::{GearCounts, OperationStatus};
use serde::{Deserialize, Serialize};

use crate::evacuate::plan::Plan;
use crate::state::{NodeState, StateDir, StateError, read_json};

/// The snapshot the agent writes to `status.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The node's identity.
    pub node: String,
    /// Agent version.
    pub agent_version: String,
    /// Agent process id.
    pub pid: u32,
    /// When the agent started.
    pub started_at: DateTime<Utc>,
    /// When this snapshot was written.
    pub updated_at: DateTime<Utc>,
    /// Gear runtime kind.
    pub runtime: String,
    /// Node profile.
    pub profile: Option<String>,
    /// District UUID.
    pub district: Option<String>,
    /// `max_active_gears`.
    pub max_active_gears: Option<u32>,
    /// Gear counts per state.
    pub gears: Option<GearCounts>,
    /// Gears that opted out of scale-down.
    pub pinned_gears: u32,
    /// Whether the bus is connected.
    pub bus_connected: bool,
    /// `seq` of the last report sent.
    pub last_report_seq: Option<u64>,
    /// When the last report was sent.
    pub last_report_at: Option<DateTime<Utc>>,
}

/// Everything `status` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The state directory.
    pub state_dir: String,
    /// Whether the node accepts gears (authoritative: `state.json`).
    pub active: bool,
    /// Why it last changed.
    pub reason: String,
    /// When it last changed.
    pub changed_at: Option<DateTime<Utc>>,
    /// Set once the node was removed.
    pub removed_at: Option<DateTime<Utc>>,
    /// Whether an agent holds the state directory's lock right now.
    pub agent_running: bool,
    /// The agent's last snapshot, if any.
    pub snapshot: Option<Snapshot>,
    /// The unfinished evacuation, if any (authoritative: its checkpoint).
    pub operation: Option<OperationStatus>,
    /// The most recent finished evacuation, if any.
    pub last_operation: Option<OperationStatus>,
}

/// Reads the status of the node whose state directory is `dir`.
pub fn read(dir: &std::path::Path) -> Result<Status, StateError> {
    let sd = StateDir::read_only(dir);
    if !dir.is_dir() {
        return Err(StateError::Io {
            path: dir.to_path_buf(),
            reason: "no such directory (has the agent ever run with this configuration?)".into(),
        });
    }
    let st: NodeState = sd.load_state()?;
    let snapshot: Option<Snapshot> = read_json(&sd.status_path()).unwrap_or(None);
    let mut operation = None;
    let mut last: Option<(DateTime<Utc>, OperationStatus)> = None;
    for path in sd.checkpoint_files()? {
        let Ok(Some(plan)) = read_json::<Plan>(&path) else {
            continue;
        };
        if !plan.finished {
            operation = Some(plan.status());
        } else if last.as_ref().is_none_or(|(t, _)| plan.updated_at > *t) {
            last = Some((plan.updated_at, plan.status()));
        }
    }
    let agent_running = match gearshift_service::lock::lock_dir(dir) {
        Ok(_lock) => false,
        Err(gearshift_service::lock::LockError::Busy(_)) => true,
        Err(_) => false,
    };
    Ok(Status {
        state_dir: dir.display().to_string(),
        active: st.active,
        reason: st.reason,
        changed_at: st.changed_at,
        removed_at: st.removed_at,
        agent_running,
        snapshot,
        operation,
        last_operation: last.map(|(_, s)| s),
    })
}

/// Renders a status for people.
pub fn render(s: &Status) -> String {
    use std::fmt::Write;
    let mut o = String::new();
    let snap = s.snapshot.as_ref();
    let _ = writeln!(
        o,
        "node:        {}",
        snap.map_or("(unknown: no snapshot yet)", |x| x.node.as_str())
    );
    let _ = writeln!(
        o,
        "agent:       {}",
        if s.agent_running {
            snap.map_or("running".to_string(), |x| {
                format!(
                    "running (pid {}, version {}, since {})",
                    x.pid, x.agent_version, x.started_at
                )
            })
        } else {
            "not running".to_string()
        }
    );
    let state = if s.active { "active" } else { "inactive" };
    let _ = write!(o, "state:       {state}");
    if let Some(t) = s.changed_at {
        let _ = write!(o, " since {t}");
    }
    if !s.reason.is_empty() {
        let _ = write!(o, " ({})", s.reason);
    }
    let _ = writeln!(o);
    if let Some(t) = s.removed_at {
        let _ = writeln!(o, "removed:     {t}");
    }
    if let Some(x) = snap {
        render_snapshot(&mut o, x);
    }
    render_operations(&mut o, s);
    o
}

/// The snapshot's lines: identity, gears, bus.
fn render_snapshot(o: &mut String, x: &Snapshot) {
    use std::fmt::Write;
    {
        let _ = writeln!(
            o,
            "profile:     {}   district: {}   runtime: {}",
            x.profile.as_deref().unwrap_or("?"),
            x.district.as_deref().unwrap_or("(none)"),
            x.runtime
        );
        if let Some(g) = &x.gears {
            let _ = writeln!(
                o,
                "gears:       {} total, {} active (max {}): {} started, {} idle, {} stopped, {} deploying, {} unknown; {} pinned",
                g.total(),
                g.active(),
                x.max_active_gears.unwrap_or(0),
                g.started,
                g.idle,
                g.stopped,
                g.deploying,
                g.unknown,
                x.pinned_gears
            );
        }
        let _ = writeln!(
            o,
            "bus:         {}   last report: {}",
            if x.bus_connected {
                "connected"
            } else {
                "disconnected"
            },
            x.last_report_at
                .map_or("never".to_string(), |t| t.to_string())
        );
        let _ = writeln!(o, "snapshot:    {}", x.updated_at);
    }
}

/// The evacuation in progress and the last one.
fn render_operations(o: &mut String, s: &Status) {
    use std::fmt::Write;
    match &s.operation {
        Some(op) => {
            let _ = writeln!(
                o,
                "operation:   {} {}: {}/{} done ({} moved, {} failed, {} remaining)",
                op.command,
                op.corr,
                op.moved + op.failed,
                op.total,
                op.moved,
                op.failed,
                op.remaining
            );
        }
        None => {
            let _ = writeln!(o, "operation:   none");
        }
    }
    if let Some(op) = &s.last_operation {
        let _ = writeln!(
            o,
            "last:        {} {}: {} moved, {} failed of {}",
            op.command, op.corr, op.moved, op.failed, op.total
        );
    }
}
