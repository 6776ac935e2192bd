//! An exclusive lock on a state directory, so that two agents cannot share it.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use thiserror::Error;

/// Why the state directory could not be locked.
#[derive(Debug, Error)]
pub enum LockError {
    /// Another process holds the lock.
    #[error("state directory {0} is in use by another agent (lock file {0}/lock is held)")]
    Busy(PathBuf),
    /// The directory or lock file could not be created.
    #[error("state directory {path}: {reason}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// Why.
        reason: String,
    },
}

/// Holds the lock until dropped.
#[derive(Debug)]
pub struct DirLock {
    _lock: Flock<File>,
    path: PathBuf,
}

impl DirLock {
    /// The locked directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Creates `dir` if needed and takes an exclusive, non-blocking `flock` on `dir/lock`.
pub fn lock_dir(dir: &Path) -> Result<DirLock, LockError> {
    let io = |e: std::io::Error| LockError::Io {
        path: dir.to_path_buf(),
        reason: e.to_string(),
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(io)?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(DirLock {
            _lock: lock,
            path: dir.to_path_buf(),
        }),
        Err((_, nix::errno::Errno::EWOULDBLOCK)) => Err(LockError::Busy(dir.to_path_buf())),
        Err((_, e)) => Err(io(std::io::Error::from(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_until_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let a = lock_dir(dir.path()).unwrap();
        assert!(matches!(lock_dir(dir.path()), Err(LockError::Busy(_))));
        drop(a);
        lock_dir(dir.path()).unwrap();
    }
}
