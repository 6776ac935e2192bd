//! The one retry policy of the bus: how long to wait before reconnecting
//! (AMQP and STOMP alike), before restarting a consumer, and for callers of
//! [`crate::backoff()`] elsewhere in the workspace.
//!
//! The exponential schedule is [`backon`]'s (`min`, doubling, capped at
//! `max`). Its own jitter adds up to 100 % of a step and may exceed `max`;
//! ours adds up to [`JITTER`] of a step and never exceeds `max`, so that
//! `reconnect_max` keeps meaning "the longest wait".

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::ConnectOptions;

/// The largest random addition to a step, as a fraction of it: enough to
/// spread a fleet that lost its broker at the same moment.
pub const JITTER: f64 = 0.2;

/// Steps after which the schedule stops growing even when `max` is far away
/// (`min × 2^16`).
const MAX_DOUBLINGS: u32 = 16;

/// Exponential backoff with jitter between `min` and `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// Waits from `min` (the first delay), doubling up to `max`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max }
    }

    /// The reconnect policy of both transports:
    /// [`ConnectOptions::reconnect_min`] to [`ConnectOptions::reconnect_max`].
    pub fn reconnect(opts: &ConnectOptions) -> Self {
        Self::new(opts.reconnect_min, opts.reconnect_max)
    }

    /// The longest delay.
    pub fn max(&self) -> Duration {
        self.max
    }

    fn schedule(&self) -> ExponentialBackoff {
        ExponentialBuilder::new()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .without_max_times()
            .build()
    }

    /// The delay before attempt `attempt` (0-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let step = self.schedule().nth(attempt.min(MAX_DOUBLINGS) as usize);
        self.jittered(step)
    }

    /// The delays of successive attempts, forever.
    pub fn delays(&self) -> Delays {
        Delays {
            policy: *self,
            schedule: self.schedule(),
            taken: 0,
            last: None,
        }
    }

    fn jittered(&self, step: Option<Duration>) -> Duration {
        let base = step.unwrap_or(self.max).min(self.max);
        let jitter = base.mul_f64(rand::random::<f64>() * JITTER);
        (base + jitter).min(self.max.max(self.min))
    }
}

/// The delays of one series of attempts (see [`Backoff::delays`]); start a
/// new series after a success.
#[derive(Debug)]
pub struct Delays {
    policy: Backoff,
    schedule: ExponentialBackoff,
    taken: u32,
    /// The step the schedule stopped growing at ([`MAX_DOUBLINGS`]).
    last: Option<Duration>,
}

impl Delays {
    /// How many delays were taken so far: the number of the attempt that
    /// follows the next delay, counting from 1.
    pub fn taken(&self) -> u32 {
        self.taken
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let step = match self.last {
            Some(step) => step,
            None => {
                let step = self.schedule.next().unwrap_or(self.policy.max);
                if self.taken >= MAX_DOUBLINGS {
                    self.last = Some(step);
                }
                step
            }
        };
        self.taken = self.taken.saturating_add(1);
        self.policy.jittered(Some(step))
    }
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// `d` is within `[base, base × 1.2]` (and backon's float steps).
    fn near(d: Duration, base: Duration) -> bool {
        let slack = MS(1);
        d + slack >= base && d <= base.mul_f64(1.0 + JITTER) + slack
    }

    #[test]
    fn doubles_from_min_with_bounded_jitter() {
        let b = Backoff::new(MS(100), MS(2000));
        for _ in 0..50 {
            assert!(near(b.delay(0), MS(100)), "{:?}", b.delay(0));
            assert!(near(b.delay(1), MS(200)));
            assert!(near(b.delay(3), MS(800)));
        }
    }

    #[test]
    fn never_exceeds_max() {
        let b = Backoff::new(MS(100), MS(2000));
        for attempt in [5, 6, 16, 17, 1000, u32::MAX] {
            for _ in 0..20 {
                let d = b.delay(attempt);
                assert!(d <= MS(2000) && d + MS(1) >= MS(2000), "{attempt}: {d:?}");
            }
        }
    }

    #[test]
    fn growth_stops_after_sixteen_doublings() {
        let b = Backoff::new(MS(1), Duration::from_secs(3600));
        let cap = MS(1) * (1 << 16);
        for attempt in [16, 17, 40] {
            assert!(near(b.delay(attempt), cap), "{:?}", b.delay(attempt));
        }
        let mut delays = b.delays();
        let last = delays.nth(40).unwrap();
        assert!(near(last, cap), "{last:?}");
        assert_eq!(delays.taken(), 41);
    }

    #[test]
    fn the_series_matches_the_numbered_delays() {
        let b = Backoff::new(MS(50), MS(500));
        let series: Vec<Duration> = b.delays().take(6).collect();
        let bases = [50, 100, 200, 400, 500, 500];
        for (d, base) in series.iter().zip(bases) {
            assert!(near(*d, MS(base)), "{d:?} vs {base}");
        }
    }

    #[test]
    fn degenerate_bounds() {
        // min above max: the old formula's answer, between max and min.
        let b = Backoff::new(MS(300), MS(100));
        for attempt in 0..4 {
            let d = b.delay(attempt);
            assert!(d >= MS(100) && d <= MS(120), "{d:?}");
        }
        assert_eq!(Backoff::new(MS(0), MS(0)).delay(3), MS(0));
        assert_eq!(Backoff::new(MS(0), MS(10)).delay(3), MS(0));
    }

    #[test]
    fn the_free_function_is_the_policy() {
        for attempt in 0..8 {
            let d = crate::backoff(attempt, MS(10), MS(400));
            let base = MS(10 * (1 << attempt)).min(MS(400));
            assert!(near(d, base), "{attempt}: {d:?}");
        }
    }
}
