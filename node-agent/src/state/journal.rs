//! The command journal: the persisted replay guard.
//!
//! Every state-changing command the node accepts gets an entry, keyed by
//! the envelope id, written durably *before* the command has any effect.
//! When the same id arrives again the entry decides what happens:
//!
//! - **running**: the work is under way or was interrupted by a crash; it
//!   resumes (or the new delivery is attached to the running work), never
//!   starts twice;
//! - **finished**, and the earlier delivery was never acknowledged (or the
//!   bus marks this one redelivered): a genuine redelivery, so the stored
//!   result is published again and the delivery acknowledged;
//! - **finished** and already acknowledged: somebody published the same
//!   message again, a replay, refused.
//!
//! Ids not in the journal are checked against the time window by the
//! caller; entries are kept for at least the window (twice it, by
//! default), so every id still inside the window is remembered. The
//! journal is bounded: past its capacity the oldest finished entries go
//! first, as in [`gearshift_proto::ReplayGuard`].
//!
//! [`Journal`] is the entries in memory and every decision on them (the node
//! core owns it); [`JournalFiles`] reads and writes the directory, one file
//! per entry, for whoever carries out the core's actions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::{StateDir, StateError, list_json, read_json};

/// Sub-directory of journal entries.
pub const JOURNAL_DIR: &str = "journal";

/// Where a journaled command stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryStatus {
    /// Accepted; its effect is being applied (or was interrupted).
    Running,
    /// Done; `result` holds what was published.
    Finished,
}

/// A terminal event as published, kept for re-publication.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// `event.done` or `event.failed`.
    pub kind: String,
    /// The event body.
    pub body: StoredBody,
}

/// An event body kept as its JSON text. A finished entry stays in memory for
/// the whole retention window, and the tree of a 100-gear evacuation result
/// takes several times the bytes of its text (about 63 KB against 8 KB).
/// On disk it is the body itself, as any JSON value was before.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct StoredBody(Box<RawValue>);

impl StoredBody {
    /// The body in `json` (checked to be one JSON value).
    pub fn new(json: String) -> Result<StoredBody, serde_json::Error> {
        RawValue::from_string(json).map(StoredBody)
    }

    /// `null`: what is kept when a body could not be.
    pub fn null() -> StoredBody {
        StoredBody(RawValue::NULL.to_owned())
    }

    /// The JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// The body as a JSON value, to rebuild the typed message.
    pub fn to_value(&self) -> Result<serde_json::Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

impl PartialEq for StoredBody {
    fn eq(&self, other: &StoredBody) -> bool {
        self.json() == other.json()
    }
}

/// One accepted command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JournalEntry {
    /// The command's envelope id.
    pub id: Uuid,
    /// The command's kind (`cmd.deactivate`, ...).
    pub kind: String,
    /// The command's operation id.
    #[serde(default)]
    pub corr: Option<String>,
    /// The command's `ts`.
    pub ts: DateTime<Utc>,
    /// When this node accepted it.
    pub received_at: DateTime<Utc>,
    /// Running or finished.
    pub status: EntryStatus,
    /// The terminal event, once finished.
    #[serde(default)]
    pub result: Option<StoredEvent>,
    /// Whether a delivery of this id was acknowledged on the bus.
    #[serde(default)]
    pub acked: bool,
    /// The agent process (boot id) that accepted it.
    pub boot: Uuid,
}

/// What the journal knows about an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Never seen (or forgotten after the window).
    New,
    /// Accepted and not finished.
    Running,
    /// Finished, but no delivery of it was acknowledged: a redelivery.
    FinishedUnacked,
    /// Finished and acknowledged.
    FinishedAcked,
}

/// The journal's entries in memory: every decision, no I/O. The node core
/// owns it; [`JournalFiles`] writes the entries it hands back.
#[derive(Debug, Default, Clone)]
pub struct Journal {
    entries: HashMap<Uuid, JournalEntry>,
}

impl Journal {
    /// A journal holding `entries` (as [`JournalFiles::load`] read them).
    pub fn from_entries(entries: impl IntoIterator<Item = JournalEntry>) -> Journal {
        Journal {
            entries: entries.into_iter().map(|e| (e.id, e)).collect(),
        }
    }

    /// The entry for `id`.
    pub fn get(&self, id: &Uuid) -> Option<&JournalEntry> {
        self.entries.get(id)
    }

    /// What the journal knows about `id`.
    pub fn seen(&self, id: &Uuid) -> Seen {
        match self.entries.get(id) {
            None => Seen::New,
            Some(e) if e.status == EntryStatus::Running => Seen::Running,
            Some(e) if e.acked => Seen::FinishedAcked,
            Some(_) => Seen::FinishedUnacked,
        }
    }

    /// Records a newly accepted command, once its file is durable.
    pub fn insert(&mut self, entry: JournalEntry) {
        self.entries.insert(entry.id, entry);
    }

    /// Marks `id` finished with the event that was (or is about to be)
    /// published; returns the entry to write.
    pub fn finish(&mut self, id: &Uuid, result: StoredEvent) -> Option<JournalEntry> {
        let e = self.entries.get_mut(id)?;
        e.status = EntryStatus::Finished;
        e.result = Some(result);
        Some(e.clone())
    }

    /// Finishes every running entry of `kind` for operation `corr` (or with
    /// id `id`): the commands that (re)started one evacuation. Returns the
    /// entries to write.
    pub fn finish_operation(
        &mut self,
        kind: &str,
        corr: Option<&str>,
        id: &Uuid,
        result: &StoredEvent,
    ) -> Vec<JournalEntry> {
        let ids: Vec<Uuid> = self
            .entries
            .values()
            .filter(|e| {
                e.status == EntryStatus::Running
                    && e.kind == kind
                    && (e.id == *id || (corr.is_some() && e.corr.as_deref() == corr))
            })
            .map(|e| e.id)
            .collect();
        ids.iter()
            .filter_map(|i| self.finish(i, result.clone()))
            .collect()
    }

    /// Notes that a delivery of `id` was acknowledged; returns the entry to
    /// write when that changed it.
    pub fn mark_acked(&mut self, id: &Uuid) -> Option<JournalEntry> {
        let e = self.entries.get_mut(id)?;
        if e.acked {
            return None;
        }
        e.acked = true;
        Some(e.clone())
    }

    /// Entries still running (interrupted by a crash, when called at start).
    pub fn running(&self) -> Vec<JournalEntry> {
        let mut v: Vec<_> = self
            .entries
            .values()
            .filter(|e| e.status == EntryStatus::Running)
            .cloned()
            .collect();
        v.sort_by_key(|e| e.received_at);
        v
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Forgets finished entries whose `ts` is older than `retention`, then
    /// the oldest finished entries beyond `capacity`. Running entries stay,
    /// except those of quick commands (not `cmd.evacuate`) accepted by an
    /// earlier process (`boot` differs) and older than `retention`: their
    /// redelivery can no longer come. Returns the ids forgotten (their files
    /// are to be deleted).
    pub fn prune(
        &mut self,
        now: DateTime<Utc>,
        retention: Duration,
        capacity: usize,
        boot: Uuid,
    ) -> Vec<Uuid> {
        let cutoff = now - retention;
        let mut finished: Vec<(DateTime<Utc>, Uuid)> = self
            .entries
            .values()
            .filter(|e| {
                e.status == EntryStatus::Finished
                    || (e.boot != boot && e.kind != "cmd.evacuate" && e.ts < cutoff)
            })
            .map(|e| (e.ts, e.id))
            .collect();
        finished.sort();
        let mut doomed = Vec::new();
        let mut remaining = self.entries.len();
        for (ts, id) in finished {
            if ts < cutoff || remaining > capacity {
                doomed.push(id);
                remaining -= 1;
            } else {
                break;
            }
        }
        for id in &doomed {
            self.entries.remove(id);
        }
        doomed
    }
}

/// The journal's directory: one file per entry, replaced atomically.
#[derive(Debug, Clone)]
pub struct JournalFiles {
    dir: PathBuf,
    fsync: bool,
}

impl JournalFiles {
    /// The journal directory of `state`.
    pub fn new(state: &StateDir) -> JournalFiles {
        JournalFiles {
            dir: state.path().join(JOURNAL_DIR),
            fsync: state.fsync(),
        }
    }

    /// Loads every entry. Unreadable entries are moved aside (renamed
    /// `.corrupt-<name>`) and reported in the returned warnings.
    pub fn load(&self) -> Result<(Journal, Vec<String>), StateError> {
        let mut entries = Vec::new();
        let mut warnings = Vec::new();
        for path in list_json(&self.dir)? {
            match read_json::<JournalEntry>(&path) {
                Ok(Some(e)) if file_id(&path) == Some(e.id) => entries.push(e),
                Ok(Some(_)) | Ok(None) => {}
                Err(err) => {
                    warnings.push(err.to_string());
                    if let Some(name) = path.file_name() {
                        let aside = self
                            .dir
                            .join(format!(".corrupt-{}", name.to_string_lossy()));
                        let _ = std::fs::rename(&path, aside);
                    }
                }
            }
        }
        Ok((Journal::from_entries(entries), warnings))
    }

    fn path(&self, id: &Uuid) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Writes an entry durably.
    pub fn write(&self, e: &JournalEntry) -> Result<(), StateError> {
        super::write_json(&self.path(&e.id), e, self.fsync)
    }

    /// Deletes the entries `ids` (missing files are fine).
    pub fn remove(&self, ids: &[Uuid]) -> Result<(), StateError> {
        for id in ids {
            let p = self.path(id);
            match std::fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(StateError::Io {
                        path: p,
                        reason: e.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

fn file_id(path: &Path) -> Option<Uuid> {
    Uuid::parse_str(path.file_stem()?.to_str()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ts: DateTime<Utc>, kind: &str) -> JournalEntry {
        JournalEntry {
            id: Uuid::new_v4(),
            kind: kind.into(),
            corr: Some("op".into()),
            ts,
            received_at: ts,
            status: EntryStatus::Running,
            result: None,
            acked: false,
            boot: Uuid::nil(),
        }
    }

    fn done() -> StoredEvent {
        StoredEvent {
            kind: "event.done".into(),
            body: StoredBody::new(r#"{"x":1}"#.into()).unwrap(),
        }
    }

    #[test]
    fn replay_state_persists_across_reload() {
        let d = tempfile::tempdir().unwrap();
        let now = Utc::now();
        let (a, b, c) = (
            entry(now, "cmd.deactivate"),
            entry(now, "cmd.evacuate"),
            entry(now, "cmd.activate"),
        );
        {
            let s = StateDir::open(d.path(), true).unwrap();
            let files = JournalFiles::new(&s);
            let (mut j, w) = files.load().unwrap();
            assert!(w.is_empty());
            for e in [&a, &b, &c] {
                files.write(e).unwrap();
                j.insert(e.clone());
            }
            files.write(&j.finish(&a.id, done()).unwrap()).unwrap();
            files.write(&j.mark_acked(&a.id).unwrap()).unwrap();
            files.write(&j.finish(&c.id, done()).unwrap()).unwrap();
        }
        let s = StateDir::open(d.path(), true).unwrap();
        let (j, _) = JournalFiles::new(&s).load().unwrap();
        assert_eq!(j.seen(&a.id), Seen::FinishedAcked);
        assert_eq!(j.seen(&b.id), Seen::Running);
        assert_eq!(j.seen(&c.id), Seen::FinishedUnacked);
        assert_eq!(j.seen(&Uuid::new_v4()), Seen::New);
        assert_eq!(j.get(&a.id).unwrap().result, Some(done()));
        assert_eq!(j.running().len(), 1);
    }

    #[test]
    fn a_result_is_kept_as_its_text_and_a_tree_on_disk_still_loads() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path(), true).unwrap();
        let files = JournalFiles::new(&s);
        let text = r#"{"results":[{"gear":"g1","outcome":"moved"}],"moved":1}"#;
        let mut e = entry(Utc::now(), "cmd.evacuate");
        e.status = EntryStatus::Finished;
        e.result = Some(StoredEvent {
            kind: "event.done".into(),
            body: StoredBody::new(text.into()).unwrap(),
        });
        files.write(&e).unwrap();
        let on_disk: serde_json::Value =
            serde_json::from_slice(&std::fs::read(files.path(&e.id)).unwrap()).unwrap();
        assert_eq!(
            on_disk["result"]["body"],
            serde_json::from_str::<serde_json::Value>(text).unwrap(),
            "the body is embedded as JSON, not as a string"
        );
        // An entry whose body was written as an indented tree, keys in
        // another order, as any JSON writer may: read back whole.
        let mut tree = serde_json::to_value(&e).unwrap();
        tree["result"]["body"] =
            serde_json::json!({"moved": 1, "results": [{"outcome": "moved", "gear": "g1"}]});
        std::fs::write(
            files.path(&e.id),
            serde_json::to_string_pretty(&tree).unwrap(),
        )
        .unwrap();
        let (j, warnings) = files.load().unwrap();
        assert!(warnings.is_empty(), "{warnings:?}");
        let body = &j.get(&e.id).unwrap().result.as_ref().unwrap().body;
        assert_eq!(
            body.to_value().unwrap(),
            serde_json::from_str::<serde_json::Value>(text).unwrap()
        );
        assert!(StoredBody::new("{not json".into()).is_err());
        assert_eq!(StoredBody::null().json(), "null");
    }

    #[test]
    fn prune_keeps_running_and_recent_entries() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path(), true).unwrap();
        let files = JournalFiles::new(&s);
        let (mut j, _) = files.load().unwrap();
        let now = Utc::now();
        let old_running = entry(now - Duration::hours(3), "cmd.evacuate");
        let old_done = entry(now - Duration::hours(3), "cmd.deactivate");
        let recent_done = entry(now - Duration::minutes(1), "cmd.activate");
        for e in [&old_running, &old_done, &recent_done] {
            files.write(e).unwrap();
            j.insert(e.clone());
        }
        files
            .write(&j.finish(&old_done.id, done()).unwrap())
            .unwrap();
        files
            .write(&j.finish(&recent_done.id, done()).unwrap())
            .unwrap();
        let pruned = j.prune(now, Duration::minutes(10), 100, Uuid::new_v4());
        files.remove(&pruned).unwrap();
        assert_eq!(pruned.len(), 1);
        assert_eq!(j.seen(&old_running.id), Seen::Running);
        assert_eq!(j.seen(&old_done.id), Seen::New);
        assert_ne!(j.seen(&recent_done.id), Seen::New);
        assert!(
            !d.path()
                .join(JOURNAL_DIR)
                .join(format!("{}.json", old_done.id))
                .exists()
        );
    }

    #[test]
    fn prune_bounds_the_journal_oldest_first() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path(), false).unwrap();
        let files = JournalFiles::new(&s);
        let (mut j, _) = files.load().unwrap();
        let now = Utc::now();
        let mut ids = Vec::new();
        for i in 0..20 {
            let e = entry(now - Duration::seconds(100 - i), "cmd.activate");
            ids.push(e.id);
            files.write(&e).unwrap();
            j.insert(e.clone());
            files.write(&j.finish(&e.id, done()).unwrap()).unwrap();
        }
        files
            .remove(&j.prune(now, Duration::hours(1), 5, Uuid::nil()))
            .unwrap();
        assert_eq!(j.len(), 5);
        assert_eq!(j.seen(&ids[0]), Seen::New);
        assert_ne!(j.seen(&ids[19]), Seen::New);
    }

    #[test]
    fn corrupt_entries_are_set_aside() {
        let d = tempfile::tempdir().unwrap();
        let s = StateDir::open(d.path(), true).unwrap();
        let bad = d
            .path()
            .join(JOURNAL_DIR)
            .join(format!("{}.json", Uuid::new_v4()));
        std::fs::write(&bad, b"{\"id\":").unwrap();
        let (j, w) = JournalFiles::new(&s).load().unwrap();
        assert!(j.is_empty());
        assert_eq!(w.len(), 1);
        assert!(!bad.exists());
    }
}
