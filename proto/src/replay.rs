//! Replay detection: message ids seen within the time window.
//!
//! Messages older than the window are refused by [`TimePolicy`](crate::sign::TimePolicy),
//! so only ids within the window need remembering. The guard is bounded: when
//! full, the oldest ids are forgotten first (they are the next to age out).

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, Duration, Utc};
use uuid::Uuid;

use crate::error::AuthError;

/// Remembers message ids seen within a time window.
#[derive(Debug, Clone)]
pub struct ReplayGuard {
    window: Duration,
    capacity: usize,
    seen: HashMap<Uuid, DateTime<Utc>>,
    order: VecDeque<(DateTime<Utc>, Uuid)>,
}

impl ReplayGuard {
    /// A guard for `window`, remembering at most `capacity` ids.
    pub fn new(window: Duration, capacity: usize) -> Self {
        ReplayGuard {
            window,
            capacity: capacity.max(1),
            seen: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether `id` was already seen (and not yet forgotten).
    pub fn contains(&self, id: &Uuid) -> bool {
        self.seen.contains_key(id)
    }

    /// Records `id` sent at `ts`; refuses it if already seen.
    pub fn check_and_record(
        &mut self,
        id: Uuid,
        ts: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<(), AuthError> {
        self.expire(now);
        if self.seen.contains_key(&id) {
            return Err(AuthError::Replayed(id.to_string()));
        }
        while self.seen.len() >= self.capacity {
            match self.order.pop_front() {
                Some((_, old)) => {
                    self.seen.remove(&old);
                }
                None => break,
            }
        }
        self.seen.insert(id, ts);
        // Keep `order` sorted by ts so that expiry pops from the front.
        let pos = self.order.partition_point(|(t, _)| *t <= ts);
        self.order.insert(pos, (ts, id));
        Ok(())
    }

    /// Forgets ids whose `ts` is older than the window.
    pub fn expire(&mut self, now: DateTime<Utc>) {
        let cutoff = now - self.window;
        while let Some((t, id)) = self.order.front().copied() {
            if t >= cutoff {
                break;
            }
            self.order.pop_front();
            self.seen.remove(&id);
        }
    }

    /// The remembered ids with their timestamps, oldest first (for persistence).
    pub fn entries(&self) -> impl Iterator<Item = (Uuid, DateTime<Utc>)> + '_ {
        self.order.iter().map(|(t, id)| (*id, *t))
    }

    /// Number of remembered ids.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_repeats_and_forgets_after_window() {
        let now = Utc::now();
        let mut g = ReplayGuard::new(Duration::minutes(5), 100);
        let id = Uuid::new_v4();
        g.check_and_record(id, now, now).unwrap();
        assert!(matches!(
            g.check_and_record(id, now, now),
            Err(AuthError::Replayed(_))
        ));
        g.expire(now + Duration::minutes(6));
        assert!(g.is_empty());
    }

    #[test]
    fn bounded() {
        let now = Utc::now();
        let mut g = ReplayGuard::new(Duration::minutes(5), 3);
        for i in 0..10 {
            g.check_and_record(Uuid::new_v4(), now + Duration::milliseconds(i), now)
                .unwrap();
        }
        assert_eq!(g.len(), 3);
    }
}
