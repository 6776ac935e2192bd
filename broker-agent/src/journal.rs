//! The durable journal: operations, group policy memory (and group pauses),
//! operator marks and cordons, the breaker state and the fleet's pause, in
//! one redb file (`<state_dir>/journal.redb`).
//!
//! The driver commits the records a step changed (one write transaction,
//! fsync'ed on commit) before it carries out the step's effects, so a broker
//! agent killed at any point restarts from a state that is never behind what
//! it did.

use std::path::{Path, PathBuf};

use gearshift_handlers::GroupKey;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use thiserror::Error;

use crate::core::{Changes, Core, Meta, Restored};
use crate::ops::{GroupState, Op};

const OPS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("ops");
const GROUPS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("groups");
const MARKS: TableDefinition<'_, &str, u8> = TableDefinition::new("do_not_disrupt");
const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");
const CORDONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("cordons");

/// Why the journal failed. Any of these stops the agent: it must not act
/// on what it cannot record.
#[derive(Debug, Error)]
pub enum JournalError {
    /// The database could not be opened, read or written.
    #[error("journal {path}: {reason}")]
    Store {
        /// The file.
        path: PathBuf,
        /// What redb said.
        reason: String,
    },
    /// A record could not be decoded (written by an incompatible version?).
    #[error("journal {path}: record {key:?} in {table}: {reason}")]
    Record {
        /// The file.
        path: PathBuf,
        /// Table.
        table: &'static str,
        /// Key.
        key: String,
        /// Decoder's message.
        reason: String,
    },
}

/// The journal file.
pub struct Journal {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

fn group_key(g: &GroupKey) -> String {
    // District UUIDs and profile names never contain a NUL.
    format!("{}\u{0}{}", g.district, g.profile)
}

fn parse_group_key(s: &str) -> Option<GroupKey> {
    let (d, p) = s.split_once('\u{0}')?;
    Some(GroupKey {
        district: d.into(),
        profile: p.into(),
    })
}

impl Journal {
    /// Opens (or creates) `<dir>/journal.redb`.
    pub fn open(dir: &Path) -> Result<Journal, JournalError> {
        let path = dir.join("journal.redb");
        let db = Database::create(&path).map_err(|e| JournalError::Store {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let j = Journal { db, path };
        // Create the tables so that reads of a fresh file succeed.
        j.write(|_| Ok(()))?;
        Ok(j)
    }

    fn store<E: std::fmt::Display>(&self, e: E) -> JournalError {
        JournalError::Store {
            path: self.path.clone(),
            reason: e.to_string(),
        }
    }

    fn write(
        &self,
        f: impl FnOnce(&redb::WriteTransaction) -> Result<(), JournalError>,
    ) -> Result<(), JournalError> {
        let tx = self.db.begin_write().map_err(|e| self.store(e))?;
        {
            tx.open_table(OPS).map_err(|e| self.store(e))?;
            tx.open_table(GROUPS).map_err(|e| self.store(e))?;
            tx.open_table(MARKS).map_err(|e| self.store(e))?;
            tx.open_table(META).map_err(|e| self.store(e))?;
            tx.open_table(CORDONS).map_err(|e| self.store(e))?;
        }
        f(&tx)?;
        tx.commit().map_err(|e| self.store(e))
    }

    /// Reads everything back.
    pub fn load(&self) -> Result<Restored, JournalError> {
        let tx = self.db.begin_read().map_err(|e| self.store(e))?;
        let mut r = Restored::default();
        let rec = |table: &'static str, key: &str, e: serde_json::Error| JournalError::Record {
            path: self.path.clone(),
            table,
            key: key.to_string(),
            reason: e.to_string(),
        };
        let t = tx.open_table(OPS).map_err(|e| self.store(e))?;
        for row in t.iter().map_err(|e| self.store(e))? {
            let (k, v) = row.map_err(|e| self.store(e))?;
            let op: Op = serde_json::from_slice(v.value()).map_err(|e| rec("ops", k.value(), e))?;
            r.ops.push(op);
        }
        let t = tx.open_table(GROUPS).map_err(|e| self.store(e))?;
        for row in t.iter().map_err(|e| self.store(e))? {
            let (k, v) = row.map_err(|e| self.store(e))?;
            let Some(g) = parse_group_key(k.value()) else {
                continue;
            };
            let s: GroupState =
                serde_json::from_slice(v.value()).map_err(|e| rec("groups", k.value(), e))?;
            r.groups.push((g, s));
        }
        let t = tx.open_table(MARKS).map_err(|e| self.store(e))?;
        for row in t.iter().map_err(|e| self.store(e))? {
            let (k, _) = row.map_err(|e| self.store(e))?;
            r.marks.insert(k.value().to_string());
        }
        let t = tx.open_table(CORDONS).map_err(|e| self.store(e))?;
        for row in t.iter().map_err(|e| self.store(e))? {
            let (k, v) = row.map_err(|e| self.store(e))?;
            let c = serde_json::from_slice(v.value()).map_err(|e| rec("cordons", k.value(), e))?;
            r.cordons.insert(k.value().to_string(), c);
        }
        let t = tx.open_table(META).map_err(|e| self.store(e))?;
        if let Some(v) = t.get("meta").map_err(|e| self.store(e))? {
            r.meta =
                serde_json::from_slice::<Meta>(v.value()).map_err(|e| rec("meta", "meta", e))?;
        }
        Ok(r)
    }

    /// Writes the records `ch` names, as they are in `core`, in one transaction.
    pub fn commit(&self, core: &Core, ch: &Changes) -> Result<(), JournalError> {
        if ch.is_empty() {
            return Ok(());
        }
        self.write(|tx| {
            let mut ops = tx.open_table(OPS).map_err(|e| self.store(e))?;
            for id in &ch.ops {
                match core.op(id.as_str()) {
                    Some(op) => {
                        ops.insert(id.as_str(), json(op).as_slice())
                            .map_err(|e| self.store(e))?;
                    }
                    None => {
                        ops.remove(id.as_str()).map_err(|e| self.store(e))?;
                    }
                }
            }
            for id in &ch.deleted_ops {
                ops.remove(id.as_str()).map_err(|e| self.store(e))?;
            }
            let mut groups = tx.open_table(GROUPS).map_err(|e| self.store(e))?;
            for g in &ch.groups {
                let s = core.group_state(g);
                groups
                    .insert(group_key(g).as_str(), json(&s).as_slice())
                    .map_err(|e| self.store(e))?;
            }
            if ch.marks {
                let mut marks = tx.open_table(MARKS).map_err(|e| self.store(e))?;
                marks.retain(|_, _| false).map_err(|e| self.store(e))?;
                for m in core.marks() {
                    marks.insert(m.as_str(), 1u8).map_err(|e| self.store(e))?;
                }
            }
            if ch.cordons {
                let mut cordons = tx.open_table(CORDONS).map_err(|e| self.store(e))?;
                cordons.retain(|_, _| false).map_err(|e| self.store(e))?;
                for (node, c) in core.cordons().nodes() {
                    cordons
                        .insert(node.as_str(), json(c).as_slice())
                        .map_err(|e| self.store(e))?;
                }
            }
            if ch.meta {
                let mut meta = tx.open_table(META).map_err(|e| self.store(e))?;
                meta.insert("meta", json(core.meta()).as_slice())
                    .map_err(|e| self.store(e))?;
            }
            Ok(())
        })
    }
}

impl Journal {
    /// Replaces everything with `r` in one transaction (a takeover loading
    /// the replicated journal of the previous leader).
    pub fn replace(&self, r: &Restored) -> Result<(), JournalError> {
        self.write(|tx| {
            let mut ops = tx.open_table(OPS).map_err(|e| self.store(e))?;
            ops.retain(|_, _| false).map_err(|e| self.store(e))?;
            for op in &r.ops {
                ops.insert(op.id.as_str(), json(op).as_slice())
                    .map_err(|e| self.store(e))?;
            }
            let mut groups = tx.open_table(GROUPS).map_err(|e| self.store(e))?;
            groups.retain(|_, _| false).map_err(|e| self.store(e))?;
            for (g, s) in &r.groups {
                groups
                    .insert(group_key(g).as_str(), json(s).as_slice())
                    .map_err(|e| self.store(e))?;
            }
            let mut marks = tx.open_table(MARKS).map_err(|e| self.store(e))?;
            marks.retain(|_, _| false).map_err(|e| self.store(e))?;
            for m in &r.marks {
                marks.insert(m.as_str(), 1u8).map_err(|e| self.store(e))?;
            }
            let mut cordons = tx.open_table(CORDONS).map_err(|e| self.store(e))?;
            cordons.retain(|_, _| false).map_err(|e| self.store(e))?;
            for (node, c) in &r.cordons {
                cordons
                    .insert(node.as_str(), json(c).as_slice())
                    .map_err(|e| self.store(e))?;
            }
            let mut meta = tx.open_table(META).map_err(|e| self.store(e))?;
            meta.insert("meta", json(&r.meta).as_slice())
                .map_err(|e| self.store(e))?;
            Ok(())
        })
    }
}

/// JSON of a plain data record (cannot fail for these types).
fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{DateTime, Utc};

    use super::*;
    use crate::config::BrokerConfig;
    use crate::core::testkit::NoPlan;

    #[test]
    fn commit_then_load_round_trips_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let mut core = Core::new(Arc::new(BrokerConfig::defaults()), Arc::new(NoPlan), now);
        let g = GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        };
        let (id, _) = core.start_scale_up(&g, "test".into(), now);
        core.set_do_not_disrupt("n1", true);
        let pause = crate::ops::Pause {
            by: "alice".into(),
            reason: "upgrade".into(),
            since: now,
            until: None,
        };
        core.pause(None, pause.clone());
        core.pause(Some(&g), pause.clone());
        let cordon = crate::ops::Cordon {
            by: "bob".into(),
            reason: "disk".into(),
            since: now,
            op: None,
        };
        core.cordon("n2", Some(cordon.clone()));
        core.meta.breaker_open = true;
        core.changes.meta = true;
        let j = Journal::open(dir.path()).unwrap();
        let ch = core.take_changes();
        j.commit(&core, &ch).unwrap();
        drop(j);
        let j = Journal::open(dir.path()).unwrap();
        let r = j.load().unwrap();
        assert_eq!(r.ops.len(), 1);
        assert_eq!(r.ops[0], core.op(id.as_str()).unwrap().clone());
        assert_eq!(r.groups, vec![(g.clone(), core.group_state(&g))]);
        assert!(r.marks.contains("n1"));
        assert!(r.meta.breaker_open);
        assert_eq!(r.meta.fleet_pause, Some(pause.clone()));
        assert_eq!(r.groups[0].1.paused, Some(pause));
        assert_eq!(r.cordons.get("n2"), Some(&cordon));
        // Unmark and delete.
        core.set_do_not_disrupt("n1", false);
        core.cordon("n2", None);
        let mut ch = core.take_changes();
        ch.deleted_ops.insert(id.clone());
        j.commit(&core, &ch).unwrap();
        let r = j.load().unwrap();
        assert!(r.marks.is_empty());
        assert!(r.cordons.is_empty());
        assert!(r.ops.is_empty());
    }

    #[test]
    fn replace_writes_a_replicated_journal_exactly() {
        let dir = tempfile::tempdir().unwrap();
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let cfg = Arc::new(BrokerConfig::defaults());
        let g = GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        };
        // The leader's journal, as a standby receives it.
        let mut leader = Core::new(cfg.clone(), Arc::new(NoPlan), now);
        leader.start_scale_up(&g, "test".into(), now);
        leader.set_do_not_disrupt("n1", true);
        leader.set_epoch(42);
        let replicated: Restored =
            serde_json::from_value(serde_json::to_value(leader.journaled()).unwrap()).unwrap();
        // The standby's own, older journal has other records.
        let j = Journal::open(dir.path()).unwrap();
        let mut own = Core::new(cfg, Arc::new(NoPlan), now);
        own.start_scale_up(&g, "stale".into(), now);
        own.set_do_not_disrupt("n9", true);
        let ch = own.take_changes();
        j.commit(&own, &ch).unwrap();
        j.replace(&replicated).unwrap();
        let r = j.load().unwrap();
        assert_eq!(r.ops, replicated.ops);
        assert_eq!(r.marks, replicated.marks);
        assert_eq!(r.meta.epoch, 42);
        assert_eq!(r.groups, replicated.groups);
    }
}
