//! What a bus reports about itself ([`BusHealth`]), and the bookkeeping of
//! refused operations both transports share (`Refusals`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::backoff::Backoff;

/// A bus's state for metrics and health checks ([`crate::Bus::health`]).
///
/// The agents export it: `connected` as a gauge, `refused_total` and
/// `too_large_total` as counters, `refusing.len()` as a gauge (non-zero: the
/// broker refuses something the bus keeps retrying, for example a user
/// without rights on a queue).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BusHealth {
    /// A connection is up and its subscriptions restored.
    pub connected: bool,
    /// Operations the broker refused since the bus was made: a SUBSCRIBE or
    /// SEND answered with an ERROR frame (STOMP), a declaration or consumer
    /// refused with a channel error (AMQP).
    pub refused_total: u64,
    /// What the broker refused last and has not accepted since, oldest
    /// first. Attempts at each wait out a backoff that grows with every
    /// refusal; an entry goes once an attempt succeeds, or after a minute
    /// (at least twice the longest reconnect delay) without one.
    pub refusing: Vec<Refusing>,
    /// Deliveries over the transport's size limit, dropped and handed on
    /// as [`crate::api::TooLarge`] deliveries.
    pub too_large_total: u64,
}

impl BusHealth {
    /// Connected, nothing refused: what a bus that tracks nothing reports.
    pub fn healthy() -> Self {
        BusHealth {
            connected: true,
            ..BusHealth::default()
        }
    }

    /// Disconnected, or the broker refuses something.
    pub fn is_degraded(&self) -> bool {
        !self.connected || !self.refusing.is_empty()
    }
}

/// One destination (STOMP) or queue (AMQP) the broker refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusing {
    /// The destination or queue.
    pub destination: String,
    /// The broker's reason, as it gave it.
    pub reason: String,
    /// Refusals in a row.
    pub attempts: u32,
}

/// How long a refusal is remembered without a new attempt, at least.
const MEMORY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
struct Entry {
    reason: String,
    attempts: u32,
    /// No new attempt before this instant.
    until: Instant,
    last: Instant,
}

/// Refused destinations with their backoff, and the counters of
/// [`BusHealth`]. Pure: time is passed in.
#[derive(Debug)]
pub(crate) struct Refusals {
    policy: Backoff,
    memory: Duration,
    by_destination: HashMap<String, Entry>,
    total: u64,
}

impl Refusals {
    /// Backs off with `policy`; entries are forgotten after a minute, or
    /// twice its longest delay when that is longer, without a new attempt.
    pub fn new(policy: Backoff) -> Self {
        Refusals {
            policy,
            memory: MEMORY.max(policy.max() * 2),
            by_destination: HashMap::new(),
            total: 0,
        }
    }

    /// The broker refused `destination` at `now`: the delay until the next
    /// attempt, which grows with every refusal in a row.
    pub fn refused(&mut self, destination: &str, reason: &str, now: Instant) -> Duration {
        self.total += 1;
        self.forget_stale(now);
        let e = self
            .by_destination
            .entry(destination.to_string())
            .or_insert_with(|| Entry {
                reason: String::new(),
                attempts: 0,
                until: now,
                last: now,
            });
        let delay = self.policy.delay(e.attempts);
        e.attempts = e.attempts.saturating_add(1);
        e.reason = reason.to_string();
        e.until = now + delay;
        e.last = now;
        tracing::warn!(
            destination,
            reason,
            attempt = e.attempts,
            retry_in = ?delay,
            "the broker refused an operation; backing off"
        );
        delay
    }

    /// An attempt on `destination` succeeded.
    pub fn succeeded(&mut self, destination: &str) {
        if let Some(e) = self.by_destination.remove(destination) {
            tracing::info!(
                destination,
                after = e.attempts,
                "the broker accepts an operation it refused before"
            );
        }
    }

    /// When an attempt on `destination` may be made, if not at `now`.
    pub fn hold(&self, destination: &str, now: Instant) -> Option<Instant> {
        self.by_destination
            .get(destination)
            .map(|e| e.until)
            .filter(|until| *until > now)
    }

    /// Forgets refusals without an attempt for a long while.
    pub fn forget_stale(&mut self, now: Instant) {
        let memory = self.memory;
        self.by_destination
            .retain(|_, e| now.saturating_duration_since(e.last) < memory);
    }

    /// A refusal counted without a destination (an ERROR the session cannot
    /// tie to a frame).
    pub fn count(&mut self) {
        self.total += 1;
    }

    /// Fills the refusal part of `h`.
    pub fn report(&self, h: &mut BusHealth) {
        h.refused_total = self.total;
        let mut list: Vec<(&String, &Entry)> = self.by_destination.iter().collect();
        list.sort_by_key(|(d, e)| (e.last, (*d).clone()));
        h.refusing = list
            .into_iter()
            .map(|(d, e)| Refusing {
                destination: d.clone(),
                reason: e.reason.clone(),
                attempts: e.attempts,
            })
            .collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn refusals_back_off_per_destination_and_clear_on_success() {
        let now = Instant::now();
        let mut r = Refusals::new(Backoff::new(MS(100), MS(1000)));
        let d1 = r.refused("/queue/a", "not authorized", now);
        assert!(d1 >= MS(100) && d1 <= MS(120), "{d1:?}");
        assert_eq!(r.hold("/queue/a", now), Some(now + d1));
        assert_eq!(r.hold("/queue/a", now + d1), None, "held until then only");
        assert_eq!(r.hold("/queue/b", now), None, "per destination");
        let d2 = r.refused("/queue/a", "not authorized", now + d1);
        assert!(d2 >= MS(200) && d2 <= MS(240), "{d2:?}");
        let mut h = BusHealth::healthy();
        r.report(&mut h);
        assert_eq!(h.refused_total, 2);
        assert_eq!(h.refusing.len(), 1);
        assert_eq!(h.refusing[0].attempts, 2);
        assert!(h.is_degraded());
        r.succeeded("/queue/a");
        r.count();
        let mut h = BusHealth::healthy();
        r.report(&mut h);
        assert_eq!((h.refused_total, h.refusing.len()), (3, 0));
        assert!(!h.is_degraded());
        // Forgotten after a minute without an attempt.
        r.refused("/queue/c", "x", now);
        r.forget_stale(now + Duration::from_secs(61));
        assert_eq!(r.hold("/queue/c", now), None);
    }
}
