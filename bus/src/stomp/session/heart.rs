//! The heart-beat clock of one connection: when we must write something,
//! and when the broker's silence means it is gone. Time is passed in.

use std::time::{Duration, Instant};

use super::connect::HeartBeats;
use super::io::Lost;

/// Shortest pause between two heart-beats we send.
const MIN_SEND_GAP: Duration = Duration::from_millis(1);

/// What the two sides agreed on, and when each last wrote.
#[derive(Debug, Clone, Copy)]
pub(super) struct Clock {
    hb: HeartBeats,
    last_read: Instant,
    last_write: Instant,
}

/// What a timer asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Beat {
    /// Nothing is due yet.
    Idle,
    /// Write an EOL.
    Send,
}

impl Clock {
    /// A connection that just exchanged CONNECT and CONNECTED at `now`.
    pub fn new(hb: HeartBeats, now: Instant) -> Self {
        Clock {
            hb,
            last_read: now,
            last_write: now,
        }
    }

    /// Something (a frame or an EOL) arrived.
    pub fn read(&mut self, now: Instant) {
        self.last_read = now;
    }

    /// Something was written.
    pub fn wrote(&mut self, now: Instant) {
        self.last_write = now;
    }

    /// We write an EOL whenever we wrote nothing for half the negotiated
    /// interval, so that a late timer still keeps the promise.
    pub fn send_at(&self) -> Option<Instant> {
        let every = self.hb.send_every?;
        Some(self.last_write + (every / 2).max(MIN_SEND_GAP))
    }

    /// The broker is declared dead at this instant, unless a byte arrives.
    pub fn dead_at(&self) -> Option<Instant> {
        Some(self.last_read + self.hb.peer_timeout()?)
    }

    /// The earliest of [`Clock::send_at`] and [`Clock::dead_at`].
    pub fn next_deadline(&self) -> Option<Instant> {
        match (self.send_at(), self.dead_at()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What is due at `now`; `Err` once the broker is silent for too long.
    pub fn due(&self, now: Instant) -> Result<Beat, Lost> {
        if self.dead_at().is_some_and(|t| now >= t) {
            return Err(Lost::new(format!(
                "no heart-beat from the broker for {:?} (it promised one every {:?})",
                self.hb.peer_timeout().unwrap_or_default(),
                self.hb.expect_every.unwrap_or_default()
            )));
        }
        Ok(match self.send_at() {
            Some(t) if now >= t => Beat::Send,
            _ => Beat::Idle,
        })
    }
}
