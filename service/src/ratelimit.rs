//! Rate-limited logging: a flood of identical warnings (a rogue or
//! misconfigured publisher, another fleet's traffic on a shared bus) must not
//! drown the log. Each key may log `burst` lines per `window`; what is held
//! back is counted and reported with the next line that gets through.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What to do with one occurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed` occurrences of the same key were held back since
    /// the last line that got through.
    Log {
        /// Held-back occurrences to mention.
        suppressed: u64,
    },
    /// Do not log it (it is counted).
    Suppress,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    window_start: Instant,
    logged: u32,
    suppressed: u64,
}

/// Per-key log budget.
#[derive(Debug, Clone)]
pub struct LogLimiter {
    window: Duration,
    burst: u32,
    slots: HashMap<String, Slot>,
}

/// At most this many distinct keys are tracked; beyond it, new keys share one slot.
const MAX_KEYS: usize = 1024;

impl LogLimiter {
    /// `burst` lines per key per `window`.
    pub fn new(burst: u32, window: Duration) -> Self {
        LogLimiter {
            window,
            burst: burst.max(1),
            slots: HashMap::new(),
        }
    }

    /// Decides about one occurrence of `key` at `now`.
    pub fn check(&mut self, key: &str, now: Instant) -> Verdict {
        let key = if self.slots.len() >= MAX_KEYS && !self.slots.contains_key(key) {
            "(other)"
        } else {
            key
        };
        let slot = self.slots.entry(key.to_string()).or_insert(Slot {
            window_start: now,
            logged: 0,
            suppressed: 0,
        });
        if now.duration_since(slot.window_start) >= self.window {
            slot.window_start = now;
            slot.logged = 0;
        }
        if slot.logged < self.burst {
            slot.logged += 1;
            let suppressed = std::mem::take(&mut slot.suppressed);
            Verdict::Log { suppressed }
        } else {
            slot.suppressed += 1;
            Verdict::Suppress
        }
    }
}

impl Default for LogLimiter {
    /// Ten lines per key per minute.
    fn default() -> Self {
        Self::new(10, Duration::from_secs(60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_counts_then_reports_the_held_back() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(2, Duration::from_secs(60));
        assert_eq!(l.check("bad_signature", t0), Verdict::Log { suppressed: 0 });
        assert_eq!(l.check("bad_signature", t0), Verdict::Log { suppressed: 0 });
        for _ in 0..5 {
            assert_eq!(l.check("bad_signature", t0), Verdict::Suppress);
        }
        // Another key has its own budget.
        assert_eq!(l.check("expired", t0), Verdict::Log { suppressed: 0 });
        // A new window lets a line through, reporting the five held back.
        let t1 = t0 + Duration::from_secs(61);
        assert_eq!(l.check("bad_signature", t1), Verdict::Log { suppressed: 5 });
        assert_eq!(l.check("bad_signature", t1), Verdict::Log { suppressed: 0 });
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
