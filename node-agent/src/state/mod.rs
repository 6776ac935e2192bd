//! The state directory: everything the agent must remember across restarts.
//!
//! ```text
//! <dir>/lock                 flock held by the running agent
//! <dir>/state.json           active/inactive flag, report sequence reservation,
//!                            the newest leader epoch seen
//! <dir>/journal/<id>.json    one entry per accepted command (the persisted replay guard)
//! <dir>/evac/<key>.json      one checkpoint per evacuation operation
//! <dir>/status.json          a snapshot for `gearshift-node status` (not authoritative)
//! ```
//!
//! Every file is replaced atomically: written to a temporary file in the
//! same directory, fsynced, renamed over the old one, and the directory
//! fsynced, so a crash at any instant leaves either the old or the new
//! content, never a mix. Readers (`gearshift-node status`) need no lock.

pub mod journal;
pub mod seq;

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use gearshift_service::lock::{DirLock, LockError};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use sha2::{Digest, Sha256};
use thiserror::Error;
use uuid::Uuid;

/// Largest state file read (a checkpoint of 20,000 moves is a few MiB).
pub const MAX_STATE_FILE: u64 = 64 * 1024 * 1024;

/// Why the state directory could not be read or written.
#[derive(Debug, Error)]
pub enum StateError {
    /// Another agent holds the directory, or it cannot be created.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// A file could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A file holds something other than what the agent wrote.
    #[error("{path}: corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

fn io_err(path: &Path, e: impl std::fmt::Display) -> StateError {
    StateError::Io {
        path: path.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Writes `bytes` to `path` atomically (temp file, fsync, rename, directory fsync).
/// With `fsync` false the data still replaces the file atomically, but a
/// power loss may lose it (only the simulator asks for that).
pub fn write_atomic(path: &Path, bytes: &[u8], fsync: bool) -> Result<(), StateError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".tmp-{name}-{}", Uuid::new_v4().simple()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io_err(&tmp, e))?;
        f.write_all(bytes).map_err(|e| io_err(&tmp, e))?;
        if fsync {
            f.sync_all().map_err(|e| io_err(&tmp, e))?;
        }
        drop(f);
        fs::rename(&tmp, path).map_err(|e| io_err(path, e))?;
        if fsync {
            sync_dir(dir)?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// fsyncs a directory so that renames and deletions in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), StateError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

/// Serializes `value` as pretty JSON and writes it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T, fsync: bool) -> Result<(), StateError> {
    let mut bytes = serde_json::to_vec_pretty(value).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    bytes.push(b'\n');
    write_atomic(path, &bytes, fsync)
}

/// Reads a JSON file; `Ok(None)` when it does not exist.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StateError> {
    let f = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path, e)),
    };
    let len = f.metadata().map_err(|e| io_err(path, e))?.len();
    if len > MAX_STATE_FILE {
        return Err(StateError::Corrupt {
            path: path.to_path_buf(),
            reason: format!("{len} bytes (limit {MAX_STATE_FILE})"),
        });
    }
    let bytes = fs::read(path).map_err(|e| io_err(path, e))?;
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|e| StateError::Corrupt {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

/// The node's persistent flags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeState {
    /// False once deactivated; stays so across restarts until `cmd.activate`.
    pub active: bool,
    /// When `active` last changed.
    #[serde(default)]
    pub changed_at: Option<DateTime<Utc>>,
    /// Why (the command's reason).
    #[serde(default)]
    pub reason: String,
    /// The command that changed it.
    #[serde(default)]
    pub changed_by: Option<Uuid>,
    /// Report sequence numbers up to this value may have been used.
    #[serde(default)]
    pub seq_reserved: u64,
    /// Set once `cmd.remove` completed: the node is going away.
    #[serde(default)]
    pub removed_at: Option<DateTime<Utc>>,
    /// The newest broker leader epoch this node has seen: new commands of
    /// an older epoch are refused (`stale_epoch`). Only ever raised, and
    /// written before a command of a newer epoch is journaled. Absent: 0.
    #[serde(default)]
    pub epoch: u64,
}

impl Default for NodeState {
    fn default() -> Self {
        NodeState {
            active: true,
            changed_at: None,
            reason: String::new(),
            changed_by: None,
            seq_reserved: 0,
            removed_at: None,
            epoch: 0,
        }
    }
}

/// A locked state directory.
#[derive(Debug)]
pub struct StateDir {
    dir: PathBuf,
    fsync: bool,
    lock: std::sync::Mutex<Option<DirLock>>,
}

impl StateDir {
    /// Creates `dir` if needed, locks it and creates its sub-directories.
    pub fn open(dir: &Path, fsync: bool) -> Result<StateDir, StateError> {
        let lock = gearshift_service::lock::lock_dir(dir)?;
        let s = StateDir {
            dir: dir.to_path_buf(),
            fsync,
            lock: std::sync::Mutex::new(Some(lock)),
        };
        for sub in [journal::JOURNAL_DIR, EVAC_DIR] {
            let p = dir.join(sub);
            fs::create_dir_all(&p).map_err(|e| io_err(&p, e))?;
        }
        s.clean_temp_files();
        Ok(s)
    }

    /// Opens `dir` for reading only, without the lock (for `status`).
    pub fn read_only(dir: &Path) -> StateDir {
        StateDir {
            dir: dir.to_path_buf(),
            fsync: false,
            lock: std::sync::Mutex::new(None),
        }
    }

    /// Releases the lock (when the agent stopped): another agent may open
    /// the directory even while stray references to this value remain.
    pub fn unlock(&self) {
        let mut l = self.lock.lock().unwrap_or_else(|p| p.into_inner());
        *l = None;
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Whether writes are fsynced.
    pub fn fsync(&self) -> bool {
        self.fsync
    }

    /// Removes temporary files a crash left behind.
    fn clean_temp_files(&self) {
        for sub in [
            Path::new(""),
            Path::new(journal::JOURNAL_DIR),
            Path::new(EVAC_DIR),
        ] {
            let d = self.dir.join(sub);
            let Ok(rd) = fs::read_dir(&d) else { continue };
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(".tmp-") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }

    fn state_path(&self) -> PathBuf {
        self.dir.join("state.json")
    }

    /// The node's flags (defaults when the file does not exist yet).
    pub fn load_state(&self) -> Result<NodeState, StateError> {
        Ok(read_json(&self.state_path())?.unwrap_or_default())
    }

    /// Persists the node's flags durably.
    pub fn save_state(&self, s: &NodeState) -> Result<(), StateError> {
        write_json(&self.state_path(), s, self.fsync)
    }

    /// Path of the status snapshot.
    pub fn status_path(&self) -> PathBuf {
        self.dir.join("status.json")
    }

    /// Writes the status snapshot (atomically, without fsync: it is rebuilt on every report).
    pub fn save_status<T: Serialize>(&self, status: &T) -> Result<(), StateError> {
        write_json(&self.status_path(), status, false)
    }

    /// Path of the checkpoint of the evacuation operation `corr`.
    pub fn checkpoint_path(&self, corr: &str) -> PathBuf {
        self.dir
            .join(EVAC_DIR)
            .join(format!("{}.json", checkpoint_key(corr)))
    }

    /// Every checkpoint file.
    pub fn checkpoint_files(&self) -> Result<Vec<PathBuf>, StateError> {
        list_json(&self.dir.join(EVAC_DIR))
    }

    /// Writes a JSON file below the state directory, durably.
    pub fn write<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), StateError> {
        write_json(path, value, self.fsync)
    }

    /// Deletes a file below the state directory, durably.
    pub fn remove(&self, path: &Path) -> Result<(), StateError> {
        match fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(path, e)),
        }
        if self.fsync
            && let Some(parent) = path.parent()
        {
            sync_dir(parent)?;
        }
        Ok(())
    }
}

/// Sub-directory of evacuation checkpoints.
pub const EVAC_DIR: &str = "evac";

/// File-name key of an operation id: readable prefix plus a hash, so that any
/// `corr` (up to 128 bytes of anything) maps to a safe, unique file name.
pub fn checkpoint_key(corr: &str) -> String {
    let safe: String = corr
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(40)
        .collect();
    let h = Sha256::digest(corr.as_bytes());
    format!("{safe}-{}", hex::encode(&h[..8]))
}

/// The `.json` files of a directory, sorted.
pub fn list_json(dir: &Path) -> Result<Vec<PathBuf>, StateError> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_err(dir, e)),
    };
    let mut out: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "json")
                && !p
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with('.'))
        })
        .collect();
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_leaves_no_temp_files() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("x.json");
        write_json(&p, &NodeState::default(), true).unwrap();
        let s = NodeState {
            active: false,
            ..NodeState::default()
        };
        write_json(&p, &s, true).unwrap();
        assert_eq!(read_json::<NodeState>(&p).unwrap(), Some(s));
        let names: Vec<_> = fs::read_dir(d.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("x.json")]);
    }

    #[test]
    fn state_survives_reopen_and_lock_is_exclusive() {
        let d = tempfile::tempdir().unwrap();
        {
            let s = StateDir::open(d.path(), true).unwrap();
            assert!(s.load_state().unwrap().active, "a new node is active");
            assert!(
                StateDir::open(d.path(), true).is_err(),
                "second agent refused"
            );
            let mut st = s.load_state().unwrap();
            st.active = false;
            s.save_state(&st).unwrap();
        }
        let s = StateDir::open(d.path(), true).unwrap();
        assert!(!s.load_state().unwrap().active);
    }

    #[test]
    fn corrupt_file_is_reported_not_defaulted() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path(), true).unwrap();
        fs::write(d.path().join("state.json"), b"{not json").unwrap();
        assert!(matches!(s.load_state(), Err(StateError::Corrupt { .. })));
    }

    #[test]
    fn checkpoint_keys_are_safe_and_distinct() {
        let a = checkpoint_key("op/../../etc");
        let b = checkpoint_key("op....etc");
        assert!(!a.contains('/') && !a.contains(".."));
        assert_ne!(a, b);
        assert_eq!(
            checkpoint_key("scale-down-1"),
            checkpoint_key("scale-down-1")
        );
    }

    #[test]
    fn stale_temp_files_are_cleaned_on_open() {
        let d = tempfile::tempdir().unwrap();
        fs::create_dir_all(d.path().join("evac")).unwrap();
        fs::write(d.path().join("evac/.tmp-x.json-123"), b"half").unwrap();
        let _s = StateDir::open(d.path(), true).unwrap();
        assert!(!d.path().join("evac/.tmp-x.json-123").exists());
    }
}
