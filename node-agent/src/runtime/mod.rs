//! Gear runtimes: where a node's gears live, what state they are in, and
//! how one moves to another node. The agent sees only [`GearRuntime`].
//!
//! | runtime | gears are | a move |
//! | --- | --- | --- |
//! | [`openshift`] | an OpenShift v2 node's gear directories | an operator command such as `oo-admin-move` |
//! | [`dir`] | directories of files | copy, verify every SHA-256, fsync, then delete the source |
//! | [`exec`] | whatever an operator command lists as JSON | an operator command |
//! | [`sim`] | entries of a shared in-memory [`sim::SimWorld`] | instant (or simulated time) |
//!
//! Moves must be safe to repeat: the evacuation calls `move_gear` again for
//! a gear whose move was interrupted by a crash, with [`MoveCtx::resumed`]
//! set, and the runtime completes a half-done move instead of starting a
//! second copy.

pub mod dir;
pub mod exec;
pub mod openshift;
pub mod sim;

mod command;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use gearshift_proto::msg::{DistrictInfo, GearCounts, GearInfo};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

use crate::config::{NodeConfig, RuntimeKind};

/// Facts about the node that the runtime reads from the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeFacts {
    /// Node profile (size class).
    pub profile: String,
    /// Most active gears the node may hold.
    pub max_active_gears: u32,
    /// The node's district, if districted.
    pub district: Option<DistrictInfo>,
}

/// Everything a scan of the runtime returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Node facts.
    pub facts: NodeFacts,
    /// Every gear on the node.
    pub gears: Vec<GearInfo>,
}

impl Inventory {
    /// Gear counts per state.
    pub fn counts(&self) -> GearCounts {
        counts(&self.gears)
    }

    /// Gears that opted out of scale-down.
    pub fn pinned(&self) -> u32 {
        self.gears.iter().filter(|g| g.do_not_disrupt).count() as u32
    }
}

/// Gear counts per state of a gear list.
pub fn counts(gears: &[GearInfo]) -> GearCounts {
    let mut c = GearCounts::default();
    for g in gears {
        c.add(g.state);
    }
    c
}

/// Memory figures, in MiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemInfo {
    /// `MemTotal`.
    pub total_mb: u64,
    /// `MemAvailable` (or `MemFree` on old kernels).
    pub free_mb: u64,
}

/// How a move ended, when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveOutcome {
    /// The gear was moved now (including completing a half-done move).
    Moved,
    /// The gear was already at its target: nothing was copied again.
    AlreadyMoved,
    /// The gear is neither here nor at the target.
    Missing,
}

/// Context of one move attempt.
#[derive(Debug, Clone, Default)]
pub struct MoveCtx {
    /// An earlier attempt at this gear may have started (possibly in a
    /// process that crashed): a gear found gone counts as already moved.
    pub resumed: bool,
    /// Cancelled when the agent stops; a runtime stops at a safe point
    /// and returns [`RuntimeError::Interrupted`].
    pub cancel: CancellationToken,
}

/// Why a runtime operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RuntimeError {
    /// A file or directory could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// An operator command failed.
    #[error("{program} failed ({status}): {stderr}")]
    Command {
        /// The program.
        program: String,
        /// Exit status description.
        status: String,
        /// Exit code, when it exited.
        code: Option<i32>,
        /// The end of its standard error.
        stderr: String,
    },
    /// An operation ran out of time.
    #[error("{what} timed out after {after:?}")]
    Timeout {
        /// What.
        what: String,
        /// Limit.
        after: Duration,
    },
    /// An operator command's output, or a host file, is not in the expected form.
    #[error("cannot parse {what}: {reason}")]
    Parse {
        /// What was parsed.
        what: String,
        /// Why it failed.
        reason: String,
    },
    /// A copy did not verify (checksum or size differs).
    #[error("gear {gear}: copy of {path} does not verify: {reason}")]
    Verify {
        /// The gear.
        gear: String,
        /// The file.
        path: String,
        /// What differs.
        reason: String,
    },
    /// The target already holds a different gear of the same id.
    #[error("gear {gear}: conflict at the target: {reason}")]
    Conflict {
        /// The gear.
        gear: String,
        /// What conflicts.
        reason: String,
    },
    /// A gear or node name that cannot be used safely.
    #[error("invalid {what} {name:?}: {reason}")]
    InvalidName {
        /// `gear` or `target`.
        what: &'static str,
        /// The name.
        name: String,
        /// Why.
        reason: String,
    },
    /// The target node is not known to this runtime.
    #[error("unknown target node {0:?}")]
    UnknownTarget(String),
    /// The agent is stopping; the move stopped at a safe point.
    #[error("interrupted: the agent is stopping")]
    Interrupted,
}

impl RuntimeError {
    /// Whether trying again later may succeed.
    pub fn is_retryable(&self) -> bool {
        match self {
            RuntimeError::Io { .. }
            | RuntimeError::Timeout { .. }
            | RuntimeError::Verify { .. } => true,
            // sysexits: EX_TEMPFAIL (75) and being killed by a signal are
            // temporary; the other EX_* codes (usage, data, permission,
            // configuration) will not change by retrying. Other codes: retry.
            RuntimeError::Command { code, .. } => !matches!(code, Some(64..=74) | Some(76..=78)),
            RuntimeError::Parse { .. }
            | RuntimeError::Conflict { .. }
            | RuntimeError::InvalidName { .. }
            | RuntimeError::UnknownTarget(_)
            | RuntimeError::Interrupted => false,
        }
    }
}

/// A node's gears: listing, facts and moves.
#[async_trait]
pub trait GearRuntime: Send + Sync + 'static {
    /// `openshift`, `dir`, `exec` or `sim`.
    fn kind(&self) -> &'static str;

    /// Scans the node: facts and every gear.
    async fn inventory(&self) -> Result<Inventory, RuntimeError>;

    /// Moves `gear` to the node `target`. Safe to call again for the same
    /// gear after an interruption (see the module documentation).
    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError>;

    /// Whether `gear` is on this node: what a broker-side move is watched
    /// by (`cmd.evacuate` with `watch`). By default from a full scan.
    async fn holds(&self, gear: &str) -> Result<bool, RuntimeError> {
        Ok(self.inventory().await?.gears.iter().any(|g| g.id == gear))
    }

    /// Memory figures (`/proc/meminfo` unless the runtime simulates them).
    async fn memory(&self) -> Option<MemInfo> {
        tokio::fs::read_to_string("/proc/meminfo")
            .await
            .ok()
            .and_then(|t| parse_meminfo(&t))
    }

    /// When the host booted (`btime` of `/proc/stat`), for the broker's
    /// `oldest`/`newest` victim strategies; `None` when unknown.
    async fn booted_at(&self) -> Option<chrono::DateTime<chrono::Utc>> {
        let text = tokio::fs::read_to_string("/proc/stat").await.ok()?;
        parse_btime(&text)
    }

    /// Told when the node becomes active or inactive (the simulator's
    /// placement uses it; host runtimes keep no such flag).
    async fn set_active(&self, _active: bool) -> Result<(), RuntimeError> {
        Ok(())
    }
}

/// A shared runtime.
pub type SharedRuntime = Arc<dyn GearRuntime>;

/// The boot time in `/proc/stat` (`btime <seconds since the epoch>`).
pub fn parse_btime(text: &str) -> Option<chrono::DateTime<chrono::Utc>> {
    let line = text.lines().find(|l| l.starts_with("btime "))?;
    let secs = line["btime ".len()..].trim().parse::<i64>().ok()?;
    chrono::DateTime::from_timestamp(secs, 0)
}

/// Parses `/proc/meminfo` (`MemTotal`, `MemAvailable`, falling back to `MemFree`).
pub fn parse_meminfo(text: &str) -> Option<MemInfo> {
    let mut fields: HashMap<&str, u64> = HashMap::new();
    for line in text.lines().take(200) {
        let Some((k, rest)) = line.split_once(':') else {
            continue;
        };
        let mut it = rest.split_whitespace();
        let Some(v) = it.next().and_then(|v| v.parse::<u64>().ok()) else {
            continue;
        };
        let unit = it.next().unwrap_or("");
        let kb = match unit {
            "kB" | "KB" | "kb" => v,
            "" => v / 1024,
            _ => continue,
        };
        fields.insert(k.trim(), kb);
    }
    let total = *fields.get("MemTotal")?;
    let free = fields
        .get("MemAvailable")
        .or_else(|| fields.get("MemFree"))
        .copied()?;
    Some(MemInfo {
        total_mb: total / 1024,
        free_mb: free / 1024,
    })
}

/// Runs blocking file work of a runtime off the async threads; a task that
/// died is an I/O error at `path`.
pub(crate) async fn blocking<T: Send + 'static>(
    path: &std::path::Path,
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, RuntimeError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RuntimeError::Io {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?
}

/// Checks that a gear id is safe to use as a file name and a command argument.
pub fn check_gear_id(gear: &str) -> Result<(), RuntimeError> {
    let bad = |reason: &str| RuntimeError::InvalidName {
        what: "gear",
        name: gear.chars().take(64).collect(),
        reason: reason.into(),
    };
    if gear.is_empty() || gear.len() > 255 {
        return Err(bad("must be 1..=255 bytes long"));
    }
    if !gear
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err(bad("may only contain letters, digits, '-', '_' and '.'"));
    }
    if gear.starts_with(['.', '-']) || gear.contains("..") {
        return Err(bad("must not start with '.' or '-' nor contain '..'"));
    }
    Ok(())
}

/// Checks that a target node name is safe to use in a path and a command argument.
pub fn check_target(target: &str) -> Result<(), RuntimeError> {
    crate::config::valid_node_name(target)
        .and_then(|()| {
            if target.contains("..") {
                Err("must not contain '..'".to_string())
            } else {
                Ok(())
            }
        })
        .map_err(|reason| RuntimeError::InvalidName {
            what: "target",
            name: target.chars().take(64).collect(),
            reason,
        })
}

/// Builds the runtime a configuration file asks for. The `sim` kind gets a
/// private [`sim::SimWorld`] holding only this node.
pub fn from_config(cfg: &NodeConfig, node: &str) -> Result<SharedRuntime, RuntimeError> {
    let facts = NodeFacts {
        profile: cfg.runtime.facts.profile.clone(),
        max_active_gears: cfg.runtime.facts.max_active_gears,
        district: cfg
            .runtime
            .facts
            .district_uuid
            .as_ref()
            .map(|uuid| DistrictInfo {
                uuid: uuid.clone(),
                active: true,
                first_uid: cfg.runtime.facts.district_first_uid,
                max_uid: cfg.runtime.facts.district_max_uid,
            }),
    };
    Ok(match cfg.runtime.kind {
        RuntimeKind::Openshift => {
            Arc::new(openshift::OpenshiftRuntime::new(&cfg.runtime.openshift))
        }
        RuntimeKind::Dir => Arc::new(dir::DirRuntime::new(&cfg.runtime.dir, facts)?),
        RuntimeKind::Exec => Arc::new(exec::ExecRuntime::new(&cfg.runtime.exec, facts)),
        RuntimeKind::Sim => {
            let world = sim::SimWorld::new();
            world.add_node(node, facts);
            world.set_memory(node, cfg.runtime.sim.mem_total_mb);
            world.set_move_time(cfg.runtime.sim.move_time);
            world.populate(node, cfg.runtime.sim.gears, cfg.runtime.sim.idle_percent);
            Arc::new(sim::SimRuntime::new(world, node))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gearshift_proto::msg::GearState;

    #[test]
    fn btime() {
        let t = "cpu  1 2 3\nbtime 1700000000\nprocesses 5\n";
        assert_eq!(parse_btime(t).map(|d| d.timestamp()), Some(1_700_000_000));
        assert_eq!(parse_btime("cpu 1\n"), None);
        assert_eq!(parse_btime("btime soon\n"), None);
    }

    #[test]
    fn meminfo() {
        let t = "MemTotal:       16318412 kB\nMemFree:          512000 kB\nMemAvailable:    8159206 kB\nBuffers: 1 kB\n";
        assert_eq!(
            parse_meminfo(t),
            Some(MemInfo {
                total_mb: 15935,
                free_mb: 7967
            })
        );
        let old = "MemTotal: 2048 kB\nMemFree: 1024 kB\n";
        assert_eq!(parse_meminfo(old).unwrap().free_mb, 1);
        assert_eq!(parse_meminfo("garbage"), None);
    }

    #[test]
    fn counts_follow_oo_stats() {
        let g = |state| GearInfo {
            id: "g".into(),
            app: None,
            state,
            uid: None,
            bytes: None,
            do_not_disrupt: false,
        };
        let c = counts(&[
            g(GearState::Started),
            g(GearState::Idle),
            g(GearState::Stopped),
            g(GearState::Deploying),
            g(GearState::Unknown),
        ]);
        assert_eq!(c.total(), 5);
        assert_eq!(c.active(), 3, "active = total - idle - stopped");
    }

    #[test]
    fn names() {
        assert!(check_gear_id("5480c40bac2c4a2cd2000007").is_ok());
        assert!(check_gear_id("app-1.g_2").is_ok());
        for bad in ["", "../x", "a/b", ".hidden", "-rf", "a..b", "a b"] {
            assert!(check_gear_id(bad).is_err(), "{bad:?}");
        }
        assert!(check_target("node-2.example.com").is_ok());
        assert!(check_target("../etc").is_err());
        assert!(check_target("a/b").is_err());
    }

    #[test]
    fn retryable_classification() {
        let cmd = |code| RuntimeError::Command {
            program: "x".into(),
            status: "exit".into(),
            code,
            stderr: String::new(),
        };
        assert!(cmd(Some(1)).is_retryable());
        assert!(cmd(Some(75)).is_retryable());
        assert!(cmd(None).is_retryable());
        assert!(!cmd(Some(64)).is_retryable());
        assert!(!RuntimeError::Interrupted.is_retryable());
        assert!(
            RuntimeError::Verify {
                gear: "g".into(),
                path: "f".into(),
                reason: "r".into()
            }
            .is_retryable()
        );
    }
}
