//! The `spool` handler: one JSON file per event in a directory that an
//! external system (a web server, a provisioning job) picks up.
//!
//! ## Files
//! `<dir>/<event>-<op>.json`, where `<event>` is `create-node` or
//! `remove-node` and `<op>` the operation id (letters, digits, `-`, `_`,
//! `.`; anything else becomes `_`). Each file is written to a temporary
//! name in the same directory, fsynced, renamed into place and the
//! directory fsynced, so a reader sees a whole file or none. A file that
//! already exists for the same event and operation is left as it is: the
//! handler is idempotent per operation id (a retried or resumed saga does
//! not write a second request). Readers should ignore names starting with
//! `.` (temporary files).
//!
//! ## Schema (`gearshift.spool/1`)
//! ```json
//! {
//!   "schema": "gearshift.spool/1",
//!   "event": "create-node",            // or "remove-node"
//!   "op": "5d1c0e1e-...",              // operation id; a new node reports it as booted_for
//!   "district": "d1", "profile": "small",
//!   "node": null,                      // remove-node: the host to remove
//!   "cloud_id": null,                  // remove-node: the cloud's id, when known
//!   "shape": { "flavor": "m1.medium", "image": "...", "availability_zone": null,
//!              "user_data": null, "volume_gb": 50, "volume_type": null, "key_name": null,
//!              "networks": [], "security_groups": [], "metadata": {} },   // create-node only
//!   "attempt": 1,
//!   "requested_at": "2024-05-01T10:00:00Z",
//!   "requested_by": "broker"           // the broker agent's name
//! }
//! ```
//! Fields are never removed within schema version 1; new optional ones may appear.

use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::config::SpoolConfig;
use crate::{
    CreateOutcome, CreateRequest, GroupKey, Handler, HandlerContext, HandlerError, Lookup,
    NodeShape, RemoveOutcome, RemoveRequest,
};

/// The schema name written in every file.
pub const SCHEMA: &str = "gearshift.spool/1";

/// One spool file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpoolEvent {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// `create-node` or `remove-node`.
    pub event: String,
    /// Operation id.
    pub op: String,
    /// District.
    pub district: String,
    /// Profile.
    pub profile: String,
    /// For `remove-node`: the host.
    pub node: Option<String>,
    /// For `remove-node`: the cloud's id, when known.
    pub cloud_id: Option<String>,
    /// For `create-node`: the node group's shape.
    pub shape: Option<NodeShape>,
    /// Attempt number (1 first).
    pub attempt: u32,
    /// When the broker agent wrote it (RFC 3339 UTC).
    pub requested_at: String,
    /// The broker agent's name.
    pub requested_by: String,
}

/// Writes spool files.
#[derive(Debug, Clone)]
pub struct SpoolHandler {
    dir: PathBuf,
    agent: String,
}

/// The file name part for an operation id.
fn safe(op: &str) -> String {
    op.chars()
        .take(128)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect::<String>()
        .trim_start_matches('.')
        .to_string()
}

impl SpoolHandler {
    /// A handler writing into `cfg.dir`.
    pub fn new(cfg: SpoolConfig, ctx: &HandlerContext) -> Self {
        SpoolHandler {
            dir: cfg.dir,
            agent: ctx.agent.clone(),
        }
    }

    /// The file for this event and operation.
    pub fn path_for(&self, event: &str, op: &str) -> PathBuf {
        self.dir.join(format!("{event}-{}.json", safe(op)))
    }

    async fn write(&self, ev: SpoolEvent) -> Result<(PathBuf, bool), HandlerError> {
        let path = self.path_for(&ev.event, &ev.op);
        let dir = self.dir.clone();
        let p = path.clone();
        tokio::task::spawn_blocking(move || write_atomic(&dir, &p, &ev))
            .await
            .map_err(|e| HandlerError::Transient(format!("spool writer task: {e}")))?
            .map(|fresh| (path, fresh))
    }
}

/// Writes `ev` to `path` atomically; `Ok(false)` if it already existed.
fn write_atomic(dir: &Path, path: &Path, ev: &SpoolEvent) -> Result<bool, HandlerError> {
    let io = |what: &str, e: std::io::Error| {
        let msg = format!("spool {what} {}: {e}", path.display());
        if matches!(
            e.kind(),
            std::io::ErrorKind::PermissionDenied
                | std::io::ErrorKind::NotADirectory
                | std::io::ErrorKind::ReadOnlyFilesystem
        ) {
            HandlerError::Permanent(msg)
        } else {
            HandlerError::Transient(msg)
        }
    };
    if !dir.is_dir() {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|e| io("mkdir", e))?;
    }
    if path.exists() {
        return Ok(false);
    }
    let bytes =
        serde_json::to_vec_pretty(ev).map_err(|e| HandlerError::Permanent(e.to_string()))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("event.json");
    let tmp = dir.join(format!(".{name}.{}.tmp", uuid::Uuid::new_v4().simple()));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io("create", e))?;
        f.write_all(&bytes).map_err(|e| io("write", e))?;
        f.write_all(b"\n").map_err(|e| io("write", e))?;
        f.sync_all().map_err(|e| io("fsync", e))?;
        drop(f);
        // link() fails if the name exists, so two writers never replace each
        // other's file; the loser's request is the same operation anyway.
        match std::fs::hard_link(&tmp, path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                let _ = std::fs::remove_file(&tmp);
                return Ok(false);
            }
            Err(e) => return Err(io("rename", e)),
        }
        std::fs::remove_file(&tmp).map_err(|e| io("remove temporary", e))?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io("fsync directory", e))?;
        Ok(true)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[async_trait]
impl Handler for SpoolHandler {
    fn kind(&self) -> &'static str {
        "spool"
    }

    async fn create_node(&self, req: &CreateRequest) -> Result<CreateOutcome, HandlerError> {
        let ev = SpoolEvent {
            schema: SCHEMA.into(),
            event: "create-node".into(),
            op: req.op.clone(),
            district: req.group.district.clone(),
            profile: req.group.profile.clone(),
            node: None,
            cloud_id: None,
            shape: Some(req.shape.clone()),
            attempt: req.attempt,
            requested_at: now(),
            requested_by: self.agent.clone(),
        };
        let (path, fresh) = self.write(ev).await?;
        Ok(CreateOutcome {
            node: None,
            cloud_id: None,
            detail: format!(
                "{} {}",
                if fresh { "spooled" } else { "already spooled" },
                path.display()
            ),
        })
    }

    async fn remove_node(&self, req: &RemoveRequest) -> Result<RemoveOutcome, HandlerError> {
        let ev = SpoolEvent {
            schema: SCHEMA.into(),
            event: "remove-node".into(),
            op: req.op.clone(),
            district: req.group.district.clone(),
            profile: req.group.profile.clone(),
            node: Some(req.node.clone()),
            cloud_id: req.cloud_id.clone(),
            shape: None,
            attempt: req.attempt,
            requested_at: now(),
            requested_by: self.agent.clone(),
        };
        let (path, fresh) = self.write(ev).await?;
        Ok(RemoveOutcome {
            detail: format!(
                "{} {}",
                if fresh { "spooled" } else { "already spooled" },
                path.display()
            ),
            gone: false,
        })
    }

    /// The request reached the spool if its file exists.
    async fn lookup(&self, op: &str, _group: &GroupKey) -> Result<Lookup, HandlerError> {
        let path = self.path_for("create-node", op);
        Ok(if path.exists() {
            Lookup::Found(CreateOutcome {
                node: None,
                cloud_id: None,
                detail: format!("already spooled {}", path.display()),
            })
        } else {
            Lookup::NotFound
        })
    }
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_ids_make_safe_names() {
        assert_eq!(safe("../../etc/passwd"), "_.._etc_passwd");
        assert_eq!(safe("5d1c0e1e-aa"), "5d1c0e1e-aa");
    }
}
