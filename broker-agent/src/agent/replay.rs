//! The operator requests' replay record, kept in the state directory so
//! that a request replayed after a restart (within its time window) is
//! still refused.
//!
//! One small JSON file, `admin-replay.json`, rewritten (temporary file,
//! fsync, rename) after every request it admits: requests are rare, and the
//! record is bounded by [`CAPACITY`] ids younger than the window.

use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};
use gearshift_proto::gate::Replay;
use gearshift_proto::{AuthError, ReplayGuard};
use uuid::Uuid;

/// File name in the state directory.
pub const FILE: &str = "admin-replay.json";
/// Most ids remembered (the oldest are forgotten first).
pub const CAPACITY: usize = 10_000;

/// A [`ReplayGuard`] persisted after each id it records.
#[derive(Debug)]
pub struct PersistedReplay {
    guard: ReplayGuard,
    path: PathBuf,
}

impl PersistedReplay {
    /// The record in `dir` (empty when the file is missing or unreadable,
    /// which is logged), for ids younger than `window`.
    pub fn open(dir: &Path, window: Duration, now: DateTime<Utc>) -> PersistedReplay {
        let path = dir.join(FILE);
        let mut guard = ReplayGuard::new(window, CAPACITY);
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Vec<(Uuid, DateTime<Utc>)>>(&bytes) {
                Ok(entries) => {
                    for (id, ts) in entries.into_iter().rev().take(CAPACITY) {
                        let _ = guard.check_and_record(id, ts, now);
                    }
                }
                Err(e) => tracing::error!(path = %path.display(), error = %e,
                    "admin replay record unreadable: starting an empty one"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::error!(path = %path.display(), error = %e,
                "admin replay record unreadable: starting an empty one"),
        }
        guard.expire(now);
        PersistedReplay { guard, path }
    }

    /// Number of remembered ids.
    pub fn len(&self) -> usize {
        self.guard.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.guard.is_empty()
    }

    fn save(&self) -> std::io::Result<()> {
        let entries: Vec<(Uuid, DateTime<Utc>)> = self.guard.entries().collect();
        let bytes = serde_json::to_vec(&entries).map_err(std::io::Error::other)?;
        gearshift_service::atomic::write_atomic(&self.path, &bytes, true)
    }
}

impl Replay for PersistedReplay {
    fn check_and_record(
        &mut self,
        id: Uuid,
        ts: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError> {
        self.guard.check_and_record(id, ts, now)?;
        // A record that cannot be written still protects this run; the
        // failure is loud because a restart would forget the id.
        if let Err(e) = self.save() {
            tracing::error!(path = %self.path.display(), error = %e,
                "admin replay record not saved: a restart would forget this request");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_id_is_refused_after_a_reopen_until_it_ages_out() {
        let dir = tempfile::tempdir().unwrap();
        let now = Utc::now();
        let window = Duration::minutes(10);
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut r = PersistedReplay::open(dir.path(), window, now);
        r.check_and_record(a, now, now).unwrap();
        r.check_and_record(b, now - Duration::minutes(8), now)
            .unwrap();
        drop(r);

        let mut r = PersistedReplay::open(dir.path(), window, now);
        assert_eq!(r.len(), 2);
        assert!(matches!(
            r.check_and_record(a, now, now),
            Err(AuthError::Replayed(_))
        ));
        // Five minutes later b is older than the window: forgotten.
        let later = now + Duration::minutes(5);
        let r = PersistedReplay::open(dir.path(), window, later);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn a_damaged_file_starts_an_empty_record() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        let r = PersistedReplay::open(dir.path(), Duration::minutes(10), Utc::now());
        assert!(r.is_empty());
    }
}
