//! What the bus reports about itself ([`BusHealth`]), and the refusal
//! backoff of declarations and consumers.

use std::sync::atomic::Ordering;

use tokio::time::Instant;

use super::{Shared, State};
use crate::error::BusError;
use crate::health::BusHealth;

impl Shared {
    /// Waits while `what` is in its refusal backoff (bounded by `deadline`).
    pub(super) async fn wait_out_refusal(
        &self,
        what: &str,
        deadline: Instant,
    ) -> Result<(), BusError> {
        let until = self
            .refusals
            .lock()
            .ok()
            .and_then(|r| r.hold(what, std::time::Instant::now()));
        if let Some(until) = until {
            let until = Instant::from_std(until);
            if until > deadline {
                tokio::time::sleep_until(deadline).await;
                return Err(BusError::Timeout {
                    what: format!("waiting for the broker to accept {what:?} again"),
                    after: self.opts.op_timeout,
                });
            }
            tokio::time::sleep_until(until).await;
        }
        Ok(())
    }

    /// Records a refusal of `what` (only [`BusError::Server`]: the broker's answer).
    pub(crate) fn note_failure(&self, what: &str, e: &BusError) {
        if let BusError::Server(reason) = e
            && let Ok(mut r) = self.refusals.lock()
        {
            r.refused(what, reason, std::time::Instant::now());
        }
    }

    /// `what` was accepted.
    pub(crate) fn note_success(&self, what: &str) {
        if let Ok(mut r) = self.refusals.lock() {
            r.succeeded(what);
        }
    }

    pub(super) fn health(&self) -> BusHealth {
        let connected = match &*self.state.borrow() {
            State::Up(l) => !l.lost.is_cancelled(),
            State::Down(_) | State::Closed => false,
        };
        let mut h = BusHealth {
            connected,
            too_large_total: self.too_large.load(Ordering::Relaxed),
            ..BusHealth::default()
        };
        if let Ok(mut r) = self.refusals.lock() {
            r.forget_stale(std::time::Instant::now());
            r.report(&mut h);
        }
        h
    }
}
