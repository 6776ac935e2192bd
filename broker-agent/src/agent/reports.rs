//! Node reports, a batch at a time (see [`super::intake`]): peeked and
//! coalesced, the newest of each node through the signed-message gate and
//! the broker's own identity check, news first, an evaluation they make
//! due at once, then every delivery of the batch acknowledged.

use chrono::{DateTime, Utc};
use gearshift_bus::Delivery;
use gearshift_proto::msg::{Message, NodeReport};
use gearshift_service::refusals::admit_delivery;
use uuid::Uuid;

use super::deliveries::{Log, REPORTS, ack, after_gate};
use super::intake::{Peek, coalesce, peek};
use super::{Agent, Result2, RunState};
use crate::core::Core;

impl Agent {
    /// A batch of report deliveries. Reports are soft state: every delivery
    /// is acked, on a task of its own, once the batch's effects are applied
    /// (superseded ones included: their survivor's effect is applied).
    pub(super) async fn on_report_batch(
        &self,
        core: &mut Core,
        st: &mut RunState,
        batch: Vec<Delivery>,
    ) -> Result2<()> {
        let now = Utc::now();
        let peeked = batch.into_iter().map(|d| (peek(&d.payload), d)).collect();
        let c = coalesce(peeked, |n| core.fleet().get(n).map(|e| e.report.seq));
        let mut done: Vec<Delivery> = Vec::with_capacity(c.stale.len());
        let mut superseded = 0u64;
        for (p, d) in c.stale {
            self.refuse(st, Log::Reports, &stale(p));
            done.push(d);
        }
        let mut reports = vec![];
        for newest_first in c.nodes {
            let mut found = false;
            for d in newest_first {
                if found {
                    superseded += 1;
                } else if let Some(r) = self.admit_report(st, &d, now) {
                    reports.push(r);
                    found = true;
                }
                done.push(d);
            }
        }
        for d in c.other {
            reports.extend(self.admit_report(st, &d, now));
            done.push(d);
        }
        self.metrics.superseded(superseded);
        // News first: an evaluation it makes due runs before the keep-alives.
        let intervals = core.config().policy.stale_after_intervals;
        let (news, rest): (Vec<_>, Vec<_>) = reports
            .into_iter()
            .partition(|a| core.fleet().is_news(&a.report, now, intervals));
        for r in news {
            self.take_report(core, st, r, now).await?;
            self.evaluate_if_due(core, st).await?;
        }
        for r in rest {
            self.take_report(core, st, r, now).await?;
        }
        self.evaluate_if_due(core, st).await?;
        // Waiting for the transport to write the acks would hold up the loop.
        self.tracker.spawn(async move {
            for d in done {
                ack(d).await;
            }
        });
        Ok(())
    }

    /// The gate, then the broker's own check that a node reports for itself.
    fn admit_report(
        &self,
        st: &mut RunState,
        d: &Delivery,
        now: DateTime<Utc>,
    ) -> Option<Admitted> {
        let env = match admit_delivery(&self.gate(), d, REPORTS, now) {
            Ok(a) => a.envelope,
            Err(r) => {
                self.refuse(st, Log::Reports, &r);
                return None;
            }
        };
        let (id, from, sent) = (env.id, env.from, env.ts);
        let Message::Report(report) = env.msg else {
            return None;
        };
        if report.node != from {
            let detail = format!("{from} sent a report for {}", report.node);
            self.refuse(st, Log::Reports, &after_gate(id, from, "identity", &detail));
            return None;
        }
        Some(Admitted { id, sent, report })
    }

    /// An admitted report into the core, its actions carried out.
    async fn take_report(
        &self,
        core: &mut Core,
        st: &mut RunState,
        Admitted { id, sent, report }: Admitted,
        now: DateTime<Utc>,
    ) -> Result2<()> {
        let node = report.node.clone();
        if let Some(t) = st.trace.as_mut() {
            t.record(now, &report);
        }
        match core.on_report(report, sent, now) {
            Ok(acts) => {
                self.metrics.report();
                self.apply(core, st, acts, now).await
            }
            Err(e) => {
                let r = after_gate(id, node, e.label(), &format!("{e:?}"));
                self.refuse(st, Log::Reports, &r);
                Ok(())
            }
        }
    }

    /// Runs the evaluation a report made due, if any.
    async fn evaluate_if_due(&self, core: &mut Core, st: &mut RunState) -> Result2<()> {
        let now = Utc::now();
        if core.evaluation_due().is_some_and(|t| now >= t) {
            st.next_eval = tokio::time::Instant::now() + self.cfg.policy.interval;
            self.evaluate(core, st, now).await?;
        }
        Ok(())
    }
}

/// A report through the gate.
struct Admitted {
    /// Its envelope's id.
    id: Uuid,
    /// Its envelope's `ts`: when the node sent it, by its clock.
    sent: DateTime<Utc>,
    report: NodeReport,
}

/// A report no newer than the fleet's, refused without verifying it (so
/// its sender and `seq` are what it claims).
fn stale(p: Peek) -> gearshift_proto::Refusal {
    let detail = format!(
        "report {} (unverified) is not newer than the node's last accepted one",
        p.seq
    );
    let mut r = after_gate(Uuid::nil(), p.from, "stale_seq", &detail);
    r.id = None;
    r
}
