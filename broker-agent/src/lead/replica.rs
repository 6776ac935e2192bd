//! The replicated journal: the leader publishes its whole journal
//! ([`Restored`]) after every commit and every few seconds; each standby
//! keeps the newest it received and, when it takes over, loads it in place
//! of its own journal when it is newer (written under a greater epoch).

use gearshift_proto::msg::JournalSnapshot;

use crate::core::{Core, Restored};

/// The newest replicated journal a standby holds.
#[derive(Debug, Default)]
pub struct Replica {
    newest: Option<Held>,
}

#[derive(Debug)]
struct Held {
    epoch: u64,
    seq: u64,
    agent: String,
    journal: Restored,
}

/// The snapshot of `core`'s journal, the `seq`th of its epoch, from `agent`.
pub fn snapshot(core: &Core, agent: &str, seq: u64) -> JournalSnapshot {
    JournalSnapshot {
        agent: agent.to_string(),
        epoch: core.meta().epoch,
        seq,
        journal: serde_json::to_value(core.journaled()).unwrap_or_default(),
    }
}

impl Replica {
    /// Keeps `s` when it is newer than what is held (greater epoch, or the
    /// same epoch and a greater sequence number). Returns whether it was
    /// kept, or why it could not be read.
    pub fn offer(&mut self, s: JournalSnapshot) -> Result<bool, String> {
        if let Some(h) = &self.newest
            && (s.epoch, s.seq) <= (h.epoch, h.seq)
        {
            return Ok(false);
        }
        let journal: Restored = serde_json::from_value(s.journal).map_err(|e| e.to_string())?;
        self.newest = Some(Held {
            epoch: s.epoch,
            seq: s.seq,
            agent: s.agent,
            journal,
        });
        Ok(true)
    }

    /// The held journal when it was written under an epoch greater than
    /// `own_epoch` (the epoch of this agent's own journal), with its writer.
    pub fn newer_than(&self, own_epoch: u64) -> Option<(&str, &Restored)> {
        self.newest
            .as_ref()
            .filter(|h| h.epoch > own_epoch)
            .map(|h| (h.agent.as_str(), &h.journal))
    }

    /// `(epoch, seq)` of the held journal.
    pub fn version(&self) -> Option<(u64, u64)> {
        self.newest.as_ref().map(|h| (h.epoch, h.seq))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use chrono::{DateTime, Utc};
    use gearshift_handlers::GroupKey;

    use super::*;
    use crate::config::BrokerConfig;
    use crate::core::testkit::NoPlan;

    fn leader(epoch: u64) -> Core {
        let now = DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap();
        let mut core = Core::new(Arc::new(BrokerConfig::defaults()), Arc::new(NoPlan), now);
        let g = GroupKey {
            district: "d1".into(),
            profile: "small".into(),
        };
        core.start_scale_up(&g, "test".into(), now);
        core.set_epoch(epoch);
        core
    }

    #[test]
    fn the_newest_snapshot_is_kept_and_restores_the_ops() {
        let core = leader(10);
        let mut r = Replica::default();
        assert!(r.offer(snapshot(&core, "a", 2)).unwrap());
        // Older: same epoch, smaller seq; or an older epoch.
        assert!(!r.offer(snapshot(&core, "a", 1)).unwrap());
        assert!(!r.offer(snapshot(&leader(9), "b", 7)).unwrap());
        assert_eq!(r.version(), Some((10, 2)));
        let (agent, j) = r.newer_than(9).unwrap();
        assert_eq!(agent, "a");
        assert_eq!(j, &core.journaled());
        assert_eq!(j.ops.len(), 1);
        // Not newer than a journal of the same or a later epoch.
        assert!(r.newer_than(10).is_none());
        assert!(r.newer_than(11).is_none());
        assert!(r.offer(snapshot(&leader(11), "b", 0)).unwrap());
        assert_eq!(r.version(), Some((11, 0)));
    }

    #[test]
    fn an_unreadable_snapshot_is_refused_and_the_held_one_kept() {
        let mut r = Replica::default();
        r.offer(snapshot(&leader(5), "a", 0)).unwrap();
        let bad = JournalSnapshot {
            agent: "x".into(),
            epoch: 6,
            seq: 0,
            journal: serde_json::json!({"ops": "not a list"}),
        };
        assert!(r.offer(bad).is_err());
        assert_eq!(r.version(), Some((5, 0)));
    }
}
