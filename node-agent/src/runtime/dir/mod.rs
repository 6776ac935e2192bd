//! The `dir` runtime: each gear is a directory of files, and a move proves
//! that no data is lost.
//!
//! Layout: this node's gears are the sub-directories of `root`; a target
//! node's gears live in `target_root` with `{target}` replaced by its name
//! (shared storage, or the same disk in tests). A gear's optional `.state`
//! file holds its state (as an OpenShift gear's `app-root/runtime/.state`);
//! without it the gear is `started`.
//!
//! A move, every step of which survives a crash:
//!
//! 1. copy the gear into `<target_root>/.incoming-<gear>`, hashing every
//!    source file (SHA-256) as it is read, fsyncing every file and directory;
//! 2. re-read every copied file and compare size and SHA-256 with the source,
//!    and the set of paths with the source's;
//! 3. rename `.incoming-<gear>` to `<gear>` and fsync the target root: the
//!    gear now exists at the target, complete;
//! 4. only then rename the source to `<root>/.removing-<gear>`, fsync, delete
//!    it and fsync again.
//!
//! Resuming after a crash looks at what exists: a leftover `.incoming-` copy
//! is discarded and copied again (step 1 or 2 was interrupted); a gear found
//! both here and at the target is compared file by file and, when identical,
//! the source is deleted (step 4 was interrupted) — the move is completed,
//! never duplicated; a gear found only at the target was already moved.

use std::fs;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use gearshift_proto::msg::{GearInfo, GearState};
use tokio_util::sync::CancellationToken;

mod files;
#[cfg(test)]
mod tests;

use super::{
    GearRuntime, Inventory, MoveCtx, MoveOutcome, NodeFacts, RuntimeError, check_gear_id,
    check_target,
};
use crate::config::DirSection;
use files::*;
pub use files::{Entry, Manifest, manifest};

/// Largest copy and hash buffer (a smaller file gets one its size);
/// cancellation and the bandwidth limit are checked per chunk. Small on
/// purpose: each parallel move holds one, and the node agent's memory is
/// counted on every node host.
const CHUNK: usize = 32 * 1024;
/// Prefix of a copy in progress at the target.
pub const INCOMING_PREFIX: &str = ".incoming-";
/// Prefix of a source being deleted.
pub const REMOVING_PREFIX: &str = ".removing-";

/// Gears as directories of files.
#[derive(Debug, Clone)]
pub struct DirRuntime {
    root: PathBuf,
    target_root: String,
    max_bytes_per_sec: u64,
    marker: String,
    facts: NodeFacts,
}

fn io(path: &Path, e: impl std::fmt::Display) -> RuntimeError {
    RuntimeError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

impl DirRuntime {
    /// A runtime for the layout in `cfg`, reporting `facts`. Creates `root`.
    pub fn new(cfg: &DirSection, facts: NodeFacts) -> Result<Self, RuntimeError> {
        fs::create_dir_all(&cfg.root).map_err(|e| io(&cfg.root, e))?;
        Ok(DirRuntime {
            root: cfg.root.clone(),
            target_root: cfg.target_root.clone(),
            max_bytes_per_sec: cfg.max_bytes_per_sec,
            marker: cfg.do_not_disrupt_marker.clone(),
            facts,
        })
    }

    /// The gear directory of `target` (its `target_root`).
    pub fn target_root(&self, target: &str) -> PathBuf {
        PathBuf::from(self.target_root.replace("{target}", target))
    }

    fn scan(&self) -> Result<Inventory, RuntimeError> {
        let mut gears = Vec::new();
        for entry in fs::read_dir(&self.root)
            .map_err(|e| io(&self.root, e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || check_gear_id(&name).is_err() {
                continue;
            }
            let Ok(meta) = fs::symlink_metadata(entry.path()) else {
                continue;
            };
            if !meta.is_dir() {
                continue;
            }
            let state = fs::read_to_string(entry.path().join(".state"))
                .map(|s| GearState::parse_lenient(&s))
                .unwrap_or(GearState::Started);
            gears.push(GearInfo {
                id: name,
                app: None,
                state,
                uid: None,
                bytes: None,
                do_not_disrupt: !self.marker.is_empty() && entry.path().join(&self.marker).exists(),
            });
        }
        gears.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(Inventory {
            facts: self.facts.clone(),
            gears,
        })
    }

    fn move_blocking(
        &self,
        gear: &str,
        target: &str,
        cancel: &CancellationToken,
    ) -> Result<MoveOutcome, RuntimeError> {
        check_gear_id(gear)?;
        check_target(target)?;
        let dst_root = self.target_root(target);
        if dst_root == self.root {
            return Err(RuntimeError::InvalidName {
                what: "target",
                name: target.into(),
                reason: "is this node".into(),
            });
        }
        if !dst_root.is_dir() {
            return Err(RuntimeError::UnknownTarget(target.into()));
        }
        let src = self.root.join(gear);
        let dst = dst_root.join(gear);
        let removing = self.root.join(format!("{REMOVING_PREFIX}{gear}"));
        let incoming = dst_root.join(format!("{INCOMING_PREFIX}{gear}"));

        if removing.exists() && !src.exists() {
            if dst.is_dir() {
                // Step 4 was interrupted after the rename: finish deleting.
                remove_tree(&removing, &self.root)?;
                return Ok(MoveOutcome::AlreadyMoved);
            }
            // The target copy vanished after the source was set aside:
            // bring the source back and move it again.
            fs::rename(&removing, &src).map_err(|e| io(&src, e))?;
            sync_dir(&self.root)?;
        }
        match (src.is_dir(), dst.is_dir()) {
            (false, true) => Ok(MoveOutcome::AlreadyMoved),
            (false, false) => Ok(MoveOutcome::Missing),
            (true, true) => {
                // Step 4 never started: complete the move if the copy is whole.
                let a = manifest(&src, cancel)?;
                let b = manifest(&dst, cancel)?;
                if a != b {
                    return Err(RuntimeError::Conflict {
                        gear: gear.into(),
                        reason: format!(
                            "{} exists and differs from this node's copy",
                            dst.display()
                        ),
                    });
                }
                self.delete_source(&src, &removing)?;
                Ok(MoveOutcome::Moved)
            }
            (true, false) => {
                if incoming.exists() {
                    remove_tree(&incoming, &dst_root)?;
                }
                let mut throttle = Throttle::new(self.max_bytes_per_sec);
                fs::create_dir(&incoming).map_err(|e| io(&incoming, e))?;
                let source = copy_tree(&src, &incoming, cancel, &mut throttle)?;
                sync_tree_dirs(&incoming)?;
                let copied = manifest(&incoming, cancel)?;
                verify(gear, &source, &copied)?;
                fs::rename(&incoming, &dst).map_err(|e| io(&dst, e))?;
                sync_dir(&dst_root)?;
                self.delete_source(&src, &removing)?;
                Ok(MoveOutcome::Moved)
            }
        }
    }

    fn delete_source(&self, src: &Path, removing: &Path) -> Result<(), RuntimeError> {
        fs::rename(src, removing).map_err(|e| io(src, e))?;
        sync_dir(&self.root)?;
        remove_tree(removing, &self.root)
    }
}

#[async_trait]
impl GearRuntime for DirRuntime {
    fn kind(&self) -> &'static str {
        "dir"
    }

    async fn inventory(&self) -> Result<Inventory, RuntimeError> {
        let me = self.clone();
        super::blocking(&self.root, move || me.scan()).await
    }

    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError> {
        let me = self.clone();
        let (gear, target, cancel) = (gear.to_string(), target.to_string(), ctx.cancel.clone());
        super::blocking(&self.root, move || {
            me.move_blocking(&gear, &target, &cancel)
        })
        .await
    }
}
