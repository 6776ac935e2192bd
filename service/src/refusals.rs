//! Logging refusals from the [`gearshift_proto::gate`] without letting a
//! flood drown the log: every refusal is counted by the caller, each reason
//! logs a bounded sample ([`LogLimiter`]), and the next line that gets
//! through says how many were held back.

use std::sync::Mutex;
use std::time::Instant;

use chrono::{DateTime, Utc};
use gearshift_bus::Delivery;
use gearshift_proto::{Admitted, Expect, Gate, Refusal};

use crate::ratelimit::{LogLimiter, Verdict};

/// Runs `gate` on a delivery. One the transport dropped for its size
/// ([`Delivery::too_large`]) is refused as `too_large` without a look at its
/// (absent) body, so that it is counted and answered like any other refusal.
pub fn admit_delivery(
    gate: &Gate<'_>,
    d: &Delivery,
    expect: Expect,
    now: DateTime<Utc>,
) -> Result<Admitted, Refusal> {
    match &d.too_large {
        Some(t) => Err(Refusal::oversized(t.size, t.limit)),
        None => gate.admit(&d.payload, expect, now),
    }
}

/// [`admit_delivery`] of many deliveries, their signatures checked in one
/// batch ([`Gate::admit_many`]); the verdicts in order.
pub fn admit_deliveries(
    gate: &Gate<'_>,
    ds: &[&Delivery],
    expect: Expect,
    now: DateTime<Utc>,
) -> Vec<Result<Admitted, Refusal>> {
    let whole: Vec<&[u8]> = ds
        .iter()
        .filter(|d| d.too_large.is_none())
        .map(|d| &d.payload[..])
        .collect();
    let mut admitted = gate.admit_many(&whole, expect, now).into_iter();
    // One verdict per message: the whole ones' come from `admitted` in order.
    ds.iter()
        .filter_map(|d| match &d.too_large {
            Some(t) => Some(Err(Refusal::oversized(t.size, t.limit))),
            None => admitted.next(),
        })
        .collect()
}

/// Rate-limited log of refused messages for one receiver.
#[derive(Debug)]
pub struct RefusalLog {
    what: &'static str,
    limiter: Mutex<LogLimiter>,
}

impl RefusalLog {
    /// A log whose lines say `what` was refused (`"command"`, `"report"`, ...),
    /// with the default budget of ten lines per reason per minute.
    pub fn new(what: &'static str) -> Self {
        RefusalLog {
            what,
            limiter: Mutex::new(LogLimiter::default()),
        }
    }

    /// Logs one refusal, or holds it back if its reason is over budget.
    pub fn log(&self, r: &Refusal) {
        let verdict = self
            .limiter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check(r.reason, Instant::now());
        let (what, reason, detail) = (self.what, r.reason, r.detail.as_str());
        let (kind, from, id) = (r.kind_label(), r.from.as_deref(), r.id);
        match verdict {
            Verdict::Log { suppressed: 0, .. } => {
                tracing::warn!(what, reason, kind, from, id = ?id, detail, "message refused")
            }
            Verdict::Log { suppressed, .. } => tracing::warn!(
                what,
                reason,
                kind,
                from,
                id = ?id,
                detail,
                suppressed,
                "message refused ({suppressed} more refused for this reason were not logged)"
            ),
            Verdict::Suppress => {
                tracing::debug!(what, reason, kind, from, id = ?id, detail, "message refused")
            }
        }
    }
}
