//! The file work of a move: walking, hashing, copying with a bandwidth
//! limit, fsyncing and verifying gear trees.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::{CHUNK, io};
use crate::runtime::RuntimeError;

pub(super) fn remove_tree(path: &Path, parent: &Path) -> Result<(), RuntimeError> {
    fs::remove_dir_all(path).map_err(|e| io(path, e))?;
    sync_dir(parent)
}

pub(super) fn sync_dir(dir: &Path) -> Result<(), RuntimeError> {
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

pub(super) fn walk(
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

pub(super) fn hash_file(
    path: &Path,
    cancel: &CancellationToken,
) -> Result<(u64, String), RuntimeError> {
    let mut f = File::open(path).map_err(|e| io(path, e))?;
    let len = f.metadata().map_err(|e| io(path, e))?.len();
    read_hashing(&mut f, len, path, cancel, |_| Ok(()))
}

/// The read buffer for a file of `len` bytes: room for all of it and the
/// read that finds its end, at least a page, at most [`CHUNK`]. Most files
/// of a gear are small, and each parallel move holds a buffer.
pub(super) fn buffer_for(len: u64) -> Vec<u8> {
    let size = usize::try_from(len.saturating_add(1)).unwrap_or(CHUNK);
    vec![0u8; size.clamp(4096, CHUNK)]
}

/// Reads `r` (the file at `path`, `len` bytes when opened) to its end in
/// chunks, hashing them and handing each to `each`; stops at a
/// cancellation. (size, SHA-256 hex)
pub(super) fn read_hashing(
    r: &mut File,
    len: u64,
    path: &Path,
    cancel: &CancellationToken,
    mut each: impl FnMut(&[u8]) -> Result<(), RuntimeError>,
) -> Result<(u64, String), RuntimeError> {
    let mut h = Sha256::new();
    let mut buf = buffer_for(len);
    let mut size = 0u64;
    loop {
        if cancel.is_cancelled() {
            return Err(RuntimeError::Interrupted);
        }
        let n = r.read(&mut buf).map_err(|e| io(path, e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        each(&buf[..n])?;
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

pub(super) struct Throttle {
    limit: u64,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    pub(super) fn new(limit: u64) -> Self {
        Throttle {
            limit,
            start: Instant::now(),
            bytes: 0,
        }
    }

    pub(super) fn account(&mut self, n: usize) {
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
pub(super) fn copy_tree(
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

pub(super) fn copy_file(
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
    let (size, sha256) = read_hashing(&mut r, meta.len(), from, cancel, |chunk| {
        w.write_all(chunk).map_err(|e| io(to, e))?;
        throttle.account(chunk.len());
        Ok(())
    })?;
    w.set_permissions(fs::Permissions::from_mode(meta.permissions().mode()))
        .map_err(|e| io(to, e))?;
    w.sync_all().map_err(|e| io(to, e))?;
    Ok((size, sha256))
}

/// fsyncs every directory below (and including) `root`, deepest first.
pub(super) fn sync_tree_dirs(root: &Path) -> Result<(), RuntimeError> {
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

pub(super) fn verify(gear: &str, source: &Manifest, copy: &Manifest) -> Result<(), RuntimeError> {
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
