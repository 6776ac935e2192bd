//! Report sequence numbers that increase strictly across restarts.
//!
//! A report's `seq` is the time in microseconds since the epoch, bumped by
//! one when the clock did not move (or went back). To survive a restart
//! with a clock that went backwards, the agent persists a *reservation*: a
//! value above every `seq` it may have used. A restarted agent starts above
//! the reservation. Reservations run [`RESERVE_AHEAD_US`] ahead, so the file
//! is written about once every ten minutes rather than on every report.

/// How far ahead of the current `seq` a reservation reaches (10 minutes).
pub const RESERVE_AHEAD_US: u64 = 600 * 1_000_000;

/// Hands out sequence numbers.
#[derive(Debug, Clone)]
pub struct SeqAllocator {
    last: u64,
    reserved: u64,
    ahead: u64,
}

impl SeqAllocator {
    /// Starts above `persisted_reservation`, the value read from the state file.
    pub fn new(persisted_reservation: u64) -> Self {
        Self::with_ahead(persisted_reservation, RESERVE_AHEAD_US)
    }

    /// Like [`SeqAllocator::new`] with an explicit reservation step.
    pub fn with_ahead(persisted_reservation: u64, ahead: u64) -> Self {
        SeqAllocator {
            last: persisted_reservation,
            reserved: persisted_reservation,
            ahead: ahead.max(1),
        }
    }

    /// The next `seq` for a report sent at `now_us`. When the second value
    /// is `Some(r)`, `r` must be persisted before the report is sent.
    pub fn next(&mut self, now_us: u64) -> (u64, Option<u64>) {
        let seq = now_us.max(self.last.saturating_add(1));
        self.last = seq;
        if seq > self.reserved {
            self.reserved = seq.saturating_add(self.ahead);
            (seq, Some(self.reserved))
        } else {
            (seq, None)
        }
    }

    /// Rolls back a reservation that could not be persisted: the next call
    /// asks for persistence again.
    pub fn reservation_failed(&mut self, previous: u64) {
        self.reserved = previous;
    }

    /// The current reservation.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strictly_increasing_even_when_the_clock_stalls_or_goes_back() {
        let mut a = SeqAllocator::new(0);
        let (s1, r1) = a.next(1_000);
        assert_eq!(s1, 1_000);
        assert!(r1.is_some());
        let (s2, r2) = a.next(1_000);
        assert_eq!(s2, 1_001);
        assert_eq!(r2, None);
        let (s3, _) = a.next(10);
        assert_eq!(s3, 1_002);
    }

    #[test]
    fn restart_with_clock_behind_continues_above_everything_used() {
        let mut a = SeqAllocator::with_ahead(0, 100);
        let mut persisted = 0;
        let mut used = 0;
        for t in [1_000u64, 1_050, 1_099, 1_101, 1_250] {
            let (s, r) = a.next(t);
            if let Some(r) = r {
                persisted = r;
            }
            used = used.max(s);
        }
        // Restart with a clock far behind.
        let mut b = SeqAllocator::with_ahead(persisted, 100);
        let (s, r) = b.next(5);
        assert!(s > used, "{s} must exceed {used}");
        assert!(r.is_some(), "the first seq after a restart reserves again");
    }

    #[test]
    fn failed_reservation_is_retried() {
        let mut a = SeqAllocator::with_ahead(0, 100);
        let (_, r) = a.next(10);
        assert_eq!(r, Some(110));
        a.reservation_failed(0);
        let (_, r) = a.next(11);
        assert_eq!(r, Some(111));
    }
}
