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

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use gearshift_proto::msg::{GearInfo, GearState};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{
    GearRuntime, Inventory, MoveCtx, MoveOutcome, NodeFacts, RuntimeError, check_gear_id,
    check_target,
};
use crate::config::DirSection;

/// Copy and hash buffer size; cancellation and the bandwidth limit are
/// checked per chunk. Small on purpose: each parallel move holds one, and
/// the node agent's memory is counted on every node host.
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

fn remove_tree(path: &Path, parent: &Path) -> Result<(), RuntimeError> {
    fs::remove_dir_all(path).map_err(|e| io(path, e))?;
    sync_dir(parent)
}

fn sync_dir(dir: &Path) -> Result<(), RuntimeError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, e))
}

/// One file of a gear: size and SHA-256 (or a symbolic link's target).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A directory.
    Dir,
    /// A regular file.
    File {
        /// Size in bytes.
        size: u64,
        /// SHA-256, hex.
        sha256: String,
    },
    /// A symbolic link and where it points.
    Link(PathBuf),
}

/// Relative path -> entry, for every entry below a gear directory.
pub type Manifest = BTreeMap<PathBuf, Entry>;

fn walk(
    root: &Path,
    rel: &Path,
    f: &mut dyn FnMut(&Path, &Path, &fs::Metadata) -> Result<(), RuntimeError>,
) -> Result<(), RuntimeError> {
    let dir = root.join(rel);
    // Names only: a directory entry keeps its open directory (and the C
    // library's 32 KiB read buffer) alive, one per level of the recursion.
    let mut names: Vec<_> = fs::read_dir(&dir)
        .map_err(|e| io(&dir, e))?
        .flatten()
        .map(|e| e.file_name())
        .collect();
    names.sort();
    for name in names {
        let rel_child = rel.join(&name);
        let path = dir.join(&name);
        let meta = fs::symlink_metadata(&path).map_err(|err| io(&path, err))?;
        f(&path, &rel_child, &meta)?;
        if meta.is_dir() {
            walk(root, &rel_child, f)?;
        }
    }
    Ok(())
}

fn hash_file(path: &Path, cancel: &CancellationToken) -> Result<(u64, String), RuntimeError> {
    let mut f = File::open(path).map_err(|e| io(path, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        if cancel.is_cancelled() {
            return Err(RuntimeError::Interrupted);
        }
        let n = f.read(&mut buf).map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        size += n as u64;
    }
    Ok((size, hex::encode(h.finalize())))
}

/// Hashes every file below `root`.
pub fn manifest(root: &Path, cancel: &CancellationToken) -> Result<Manifest, RuntimeError> {
    let mut m = Manifest::new();
    walk(root, Path::new(""), &mut |path, rel, meta| {
        let entry = if meta.is_dir() {
            Entry::Dir
        } else if meta.file_type().is_symlink() {
            Entry::Link(fs::read_link(path).map_err(|e| io(path, e))?)
        } else if meta.is_file() {
            let (size, sha256) = hash_file(path, cancel)?;
            Entry::File { size, sha256 }
        } else {
            return Err(io(path, "not a regular file, directory or symbolic link"));
        };
        m.insert(rel.to_path_buf(), entry);
        Ok(())
    })?;
    Ok(m)
}

struct Throttle {
    limit: u64,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    fn new(limit: u64) -> Self {
        Throttle {
            limit,
            start: Instant::now(),
            bytes: 0,
        }
    }

    fn account(&mut self, n: usize) {
        self.bytes += n as u64;
        if self.limit == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.limit as f64);
        let elapsed = self.start.elapsed();
        if due > elapsed {
            std::thread::sleep(due - elapsed);
        }
    }
}

/// Copies `src` into the existing directory `dst`; returns the source's
/// manifest, hashed from the bytes that were copied.
fn copy_tree(
    src: &Path,
    dst: &Path,
    cancel: &CancellationToken,
    throttle: &mut Throttle,
) -> Result<Manifest, RuntimeError> {
    let mut m = Manifest::new();
    fs::set_permissions(
        dst,
        fs::metadata(src).map_err(|e| io(src, e))?.permissions(),
    )
    .map_err(|e| io(dst, e))?;
    walk(src, Path::new(""), &mut |path, rel, meta| {
        if cancel.is_cancelled() {
            return Err(RuntimeError::Interrupted);
        }
        let to = dst.join(rel);
        let entry = if meta.is_dir() {
            fs::create_dir(&to).map_err(|e| io(&to, e))?;
            fs::set_permissions(&to, meta.permissions()).map_err(|e| io(&to, e))?;
            Entry::Dir
        } else if meta.file_type().is_symlink() {
            let link = fs::read_link(path).map_err(|e| io(path, e))?;
            std::os::unix::fs::symlink(&link, &to).map_err(|e| io(&to, e))?;
            Entry::Link(link)
        } else if meta.is_file() {
            let (size, sha256) = copy_file(path, &to, meta, cancel, throttle)?;
            Entry::File { size, sha256 }
        } else {
            return Err(io(path, "not a regular file, directory or symbolic link"));
        };
        m.insert(rel.to_path_buf(), entry);
        Ok(())
    })?;
    Ok(m)
}

fn copy_file(
    from: &Path,
    to: &Path,
    meta: &fs::Metadata,
    cancel: &CancellationToken,
    throttle: &mut Throttle,
) -> Result<(u64, String), RuntimeError> {
    let mut r = File::open(from).map_err(|e| io(from, e))?;
    let mut w = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .map_err(|e| io(to, e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut size = 0u64;
    loop {
        if cancel.is_cancelled() {
            return Err(RuntimeError::Interrupted);
        }
        let n = r.read(&mut buf).map_err(|e| io(from, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        w.write_all(&buf[..n]).map_err(|e| io(to, e))?;
        size += n as u64;
        throttle.account(n);
    }
    w.set_permissions(fs::Permissions::from_mode(meta.permissions().mode()))
        .map_err(|e| io(to, e))?;
    w.sync_all().map_err(|e| io(to, e))?;
    Ok((size, hex::encode(h.finalize())))
}

/// fsyncs every directory below (and including) `root`, deepest first.
fn sync_tree_dirs(root: &Path) -> Result<(), RuntimeError> {
    let mut dirs = vec![root.to_path_buf()];
    walk(root, Path::new(""), &mut |path, _, meta| {
        if meta.is_dir() {
            dirs.push(path.to_path_buf());
        }
        Ok(())
    })?;
    for d in dirs.iter().rev() {
        sync_dir(d)?;
    }
    Ok(())
}

fn verify(gear: &str, source: &Manifest, copy: &Manifest) -> Result<(), RuntimeError> {
    for (path, want) in source {
        match copy.get(path) {
            Some(got) if got == want => {}
            Some(got) => {
                return Err(RuntimeError::Verify {
                    gear: gear.into(),
                    path: path.display().to_string(),
                    reason: format!("expected {want:?}, found {got:?}"),
                });
            }
            None => {
                return Err(RuntimeError::Verify {
                    gear: gear.into(),
                    path: path.display().to_string(),
                    reason: "missing from the copy".into(),
                });
            }
        }
    }
    if let Some(extra) = copy.keys().find(|p| !source.contains_key(*p)) {
        return Err(RuntimeError::Verify {
            gear: gear.into(),
            path: extra.display().to_string(),
            reason: "not in the source".into(),
        });
    }
    Ok(())
}

#[async_trait]
impl GearRuntime for DirRuntime {
    fn kind(&self) -> &'static str {
        "dir"
    }

    async fn inventory(&self) -> Result<Inventory, RuntimeError> {
        let me = self.clone();
        tokio::task::spawn_blocking(move || me.scan())
            .await
            .map_err(|e| io(&self.root, e))?
    }

    async fn move_gear(
        &self,
        gear: &str,
        target: &str,
        ctx: &MoveCtx,
    ) -> Result<MoveOutcome, RuntimeError> {
        let me = self.clone();
        let (gear, target, cancel) = (gear.to_string(), target.to_string(), ctx.cancel.clone());
        tokio::task::spawn_blocking(move || me.move_blocking(&gear, &target, &cancel))
            .await
            .map_err(|e| io(&self.root, e))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixture {
        _d: tempfile::TempDir,
        base: PathBuf,
        rt: DirRuntime,
    }

    fn fixture() -> Fixture {
        let d = tempfile::tempdir().unwrap();
        let base = d.path().to_path_buf();
        for n in ["n1", "n2"] {
            fs::create_dir_all(base.join(n)).unwrap();
        }
        let rt = DirRuntime::new(
            &DirSection {
                root: base.join("n1"),
                target_root: format!("{}/{{target}}", base.display()),
                ..DirSection::default()
            },
            NodeFacts {
                profile: "small".into(),
                max_active_gears: 10,
                district: None,
            },
        )
        .unwrap();
        Fixture { _d: d, base, rt }
    }

    fn make_gear(dir: &Path, seed: u8) {
        fs::create_dir_all(dir.join("app-root/data")).unwrap();
        fs::write(dir.join("app-root/data/blob"), vec![seed; 300_000]).unwrap();
        fs::write(dir.join("README"), format!("gear {seed}")).unwrap();
        fs::write(dir.join(".state"), "idle").unwrap();
        std::os::unix::fs::symlink("app-root/data/blob", dir.join("link")).unwrap();
    }

    #[tokio::test]
    async fn move_copies_verifies_and_deletes() {
        let f = fixture();
        make_gear(&f.base.join("n1/g1"), 7);
        let before = manifest(&f.base.join("n1/g1"), &CancellationToken::new()).unwrap();
        let inv = f.rt.inventory().await.unwrap();
        assert_eq!(inv.gears.len(), 1);
        assert_eq!(inv.gears[0].state, GearState::Idle);
        let out =
            f.rt.move_gear("g1", "n2", &MoveCtx::default())
                .await
                .unwrap();
        assert_eq!(out, MoveOutcome::Moved);
        assert!(!f.base.join("n1/g1").exists());
        let after = manifest(&f.base.join("n2/g1"), &CancellationToken::new()).unwrap();
        assert_eq!(before, after);
        assert_eq!(
            fs::read_link(f.base.join("n2/g1/link")).unwrap(),
            PathBuf::from("app-root/data/blob")
        );
        // Again: already there, nothing copied.
        assert_eq!(
            f.rt.move_gear("g1", "n2", &MoveCtx::default())
                .await
                .unwrap(),
            MoveOutcome::AlreadyMoved
        );
        assert_eq!(
            f.rt.move_gear("nope", "n2", &MoveCtx::default())
                .await
                .unwrap(),
            MoveOutcome::Missing
        );
        assert!(matches!(
            f.rt.move_gear("g1", "n9", &MoveCtx::default()).await,
            Err(RuntimeError::UnknownTarget(_))
        ));
    }

    #[tokio::test]
    async fn half_done_moves_are_completed_not_duplicated() {
        let f = fixture();
        // Crash during the copy: a partial .incoming copy is discarded.
        make_gear(&f.base.join("n1/g1"), 1);
        fs::create_dir_all(f.base.join("n2/.incoming-g1/app-root")).unwrap();
        fs::write(f.base.join("n2/.incoming-g1/README"), "partial").unwrap();
        assert_eq!(
            f.rt.move_gear("g1", "n2", &MoveCtx::default())
                .await
                .unwrap(),
            MoveOutcome::Moved
        );
        assert!(!f.base.join("n2/.incoming-g1").exists());
        assert_eq!(
            fs::read_to_string(f.base.join("n2/g1/README")).unwrap(),
            "gear 1"
        );

        // Crash after the rename into place, before the source was deleted.
        make_gear(&f.base.join("n1/g2"), 2);
        make_gear(&f.base.join("n2/g2"), 2);
        assert_eq!(
            f.rt.move_gear("g2", "n2", &MoveCtx::default())
                .await
                .unwrap(),
            MoveOutcome::Moved
        );
        assert!(!f.base.join("n1/g2").exists());

        // Crash while deleting the source.
        make_gear(&f.base.join("n1/.removing-g3"), 3);
        make_gear(&f.base.join("n2/g3"), 3);
        assert_eq!(
            f.rt.move_gear("g3", "n2", &MoveCtx::default())
                .await
                .unwrap(),
            MoveOutcome::AlreadyMoved
        );
        assert!(!f.base.join("n1/.removing-g3").exists());

        // A different gear of the same id at the target is a conflict; nothing is deleted.
        make_gear(&f.base.join("n1/g4"), 4);
        make_gear(&f.base.join("n2/g4"), 5);
        let e =
            f.rt.move_gear("g4", "n2", &MoveCtx::default())
                .await
                .unwrap_err();
        assert!(matches!(e, RuntimeError::Conflict { .. }));
        assert!(!e.is_retryable());
        assert!(f.base.join("n1/g4").exists());

        // Listing ignores work-in-progress directories.
        fs::create_dir_all(f.base.join("n1/.removing-g9")).unwrap();
        let inv = f.rt.inventory().await.unwrap();
        let ids: Vec<_> = inv.gears.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(ids, ["g4"]);
    }

    #[test]
    fn cancellation_leaves_the_source_intact_and_the_next_attempt_finishes() {
        let f = fixture();
        make_gear(&f.base.join("n1/g1"), 9);
        let cancel = CancellationToken::new();
        cancel.cancel();
        let e = f.rt.move_blocking("g1", "n2", &cancel).unwrap_err();
        assert_eq!(e, RuntimeError::Interrupted);
        assert!(f.base.join("n1/g1/README").exists());
        assert!(!f.base.join("n2/g1").exists());
        let out =
            f.rt.move_blocking("g1", "n2", &CancellationToken::new())
                .unwrap();
        assert_eq!(out, MoveOutcome::Moved);
    }

    #[test]
    fn verify_detects_every_difference() {
        let mk = |entries: &[(&str, Entry)]| -> Manifest {
            entries
                .iter()
                .map(|(p, e)| (PathBuf::from(p), e.clone()))
                .collect()
        };
        let file = |s: &str| Entry::File {
            size: 1,
            sha256: s.into(),
        };
        let a = mk(&[("a", file("x")), ("d", Entry::Dir)]);
        assert!(verify("g", &a, &a).is_ok());
        assert!(verify("g", &a, &mk(&[("a", file("y")), ("d", Entry::Dir)])).is_err());
        assert!(verify("g", &a, &mk(&[("a", file("x"))])).is_err());
        assert!(
            verify(
                "g",
                &a,
                &mk(&[("a", file("x")), ("d", Entry::Dir), ("e", Entry::Dir)])
            )
            .is_err()
        );
    }

    #[test]
    fn throttle_limits_bandwidth() {
        let mut t = Throttle::new(1_000_000);
        let start = Instant::now();
        t.account(200_000);
        assert!(start.elapsed() >= Duration::from_millis(190));
    }
}
