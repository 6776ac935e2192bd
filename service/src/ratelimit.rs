//! Rate limits per key: a flood of identical warnings or answers (a rogue or
//! misconfigured publisher, another fleet's traffic on a shared bus) must
//! not drown the log or the bus. Each key may pass `burst` times per
//! `window`; what is held back is counted, and reported with the next
//! occurrence that gets through (or by [`LogLimiter::drain`], once its window
//! is over, when the flood stopped).
//!
//! The clock is a type parameter ([`Moment`]): the logs use [`Instant`], the
//! pure state machines (the node's core) the `now` they are given.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// A point in time the limiter can measure from.
pub trait Moment: Copy {
    /// How long after `earlier` this is (zero if it is not after).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

impl Moment for chrono::DateTime<chrono::Utc> {
    fn since(self, earlier: Self) -> Duration {
        (self - earlier).to_std().unwrap_or(Duration::ZERO)
    }
}

/// What to do with one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict<M = Instant> {
    /// Let it through; `suppressed` occurrences of the same key were held
    /// back since `since` (`None` when none were).
    Log {
        /// Held-back occurrences to mention.
        suppressed: u64,
        /// When the first of them was held back.
        since: Option<M>,
    },
    /// Hold it back (it is counted).
    Suppress,
}

#[derive(Debug, Clone, Copy)]
struct Slot<M> {
    window_start: M,
    logged: u32,
    suppressed: u64,
    since: Option<M>,
}

/// Held-back occurrences of one key, reported by [`LogLimiter::drain`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held<M> {
    /// The key.
    pub key: String,
    /// How many were held back.
    pub count: u64,
    /// When the first of them was.
    pub since: M,
}

/// Per-key budget.
#[derive(Debug, Clone)]
pub struct LogLimiter<M: Moment = Instant> {
    window: Duration,
    burst: u32,
    slots: HashMap<String, Slot<M>>,
}

/// At most this many distinct keys are tracked; beyond it, new keys share one slot.
const MAX_KEYS: usize = 1024;

/// The slot new keys share once [`MAX_KEYS`] are tracked.
const OTHER: &str = "(other)";

impl<M: Moment> LogLimiter<M> {
    /// `burst` occurrences per key per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        LogLimiter {
            window,
            burst: burst.max(1),
            slots: HashMap::new(),
        }
    }

    /// Decides about one occurrence of `key` at `now`. Allocates only for a
    /// key not seen before.
    pub fn check(&mut self, key: &str, now: M) -> Verdict<M> {
        let key = if self.slots.len() >= MAX_KEYS && !self.slots.contains_key(key) {
            OTHER
        } else {
            key
        };
        if !self.slots.contains_key(key) {
            let fresh = Slot {
                window_start: now,
                logged: 0,
                suppressed: 0,
                since: None,
            };
            self.slots.insert(key.to_string(), fresh);
        }
        let Some(slot) = self.slots.get_mut(key) else {
            return Verdict::Suppress;
        };
        if now.since(slot.window_start) >= self.window {
            slot.window_start = now;
            slot.logged = 0;
        }
        if slot.logged < self.burst {
            slot.logged += 1;
            let suppressed = std::mem::take(&mut slot.suppressed);
            Verdict::Log {
                suppressed,
                since: slot.since.take(),
            }
        } else {
            slot.suppressed += 1;
            slot.since.get_or_insert(now);
            Verdict::Suppress
        }
    }

    /// Takes the held-back counts of the keys whose window is over at
    /// `now`: for a summary once a flood stopped.
    pub fn drain(&mut self, now: M) -> Vec<Held<M>> {
        let mut out = Vec::new();
        for (key, slot) in &mut self.slots {
            if slot.suppressed == 0 || now.since(slot.window_start) < self.window {
                continue;
            }
            out.push(Held {
                key: key.clone(),
                count: std::mem::take(&mut slot.suppressed),
                since: slot.since.take().unwrap_or(slot.window_start),
            });
        }
        self.slots
            .retain(|_, s| now.since(s.window_start) < self.window);
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out
    }
}

impl Default for LogLimiter<Instant> {
    /// Ten lines per key per minute.
    fn default() -> Self {
        Self::new(10, Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Verdict = Verdict::Log {
        suppressed: 0,
        since: None,
    };

    #[test]
    fn bursts_then_counts_then_reports_the_held_back() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(2, Duration::from_secs(60));
        assert_eq!(l.check("bad_signature", t0), NONE);
        assert_eq!(l.check("bad_signature", t0), NONE);
        let t_held = t0 + Duration::from_secs(1);
        for _ in 0..5 {
            assert_eq!(l.check("bad_signature", t_held), Verdict::Suppress);
        }
        // Another key has its own budget.
        assert_eq!(l.check("expired", t0), NONE);
        // A new window lets a line through, reporting the five held back.
        let t1 = t0 + Duration::from_secs(61);
        assert_eq!(
            l.check("bad_signature", t1),
            Verdict::Log {
                suppressed: 5,
                since: Some(t_held)
            }
        );
        assert_eq!(l.check("bad_signature", t1), NONE);
    }

    #[test]
    fn drain_reports_what_a_finished_window_held_back() {
        let t0 = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        let mut l = LogLimiter::new(1, Duration::from_secs(10));
        for _ in 0..4 {
            l.check("unsigned", t0);
        }
        l.check("malformed", t0);
        // The window is not over: nothing yet.
        assert!(l.drain(t0 + chrono::Duration::seconds(5)).is_empty());
        let held = l.drain(t0 + chrono::Duration::seconds(10));
        assert_eq!(
            held,
            [Held {
                key: "unsigned".into(),
                count: 3,
                since: t0
            }]
        );
        // Drained once; the idle slots are forgotten.
        assert!(l.drain(t0 + chrono::Duration::seconds(30)).is_empty());
        assert!(l.slots.is_empty());
    }

    #[test]
    fn bounded_number_of_keys() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(1, Duration::from_secs(60));
        for i in 0..(MAX_KEYS + 100) {
            l.check(&format!("k{i}"), t0);
        }
        assert!(l.slots.len() <= MAX_KEYS + 1);
    }
}
