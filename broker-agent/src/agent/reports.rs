//! Node reports, a batch at a time (see [`super::intake`]): peeked and
//! coalesced, the newest of each node through the signed-message gate (the
//! batch's signatures checked together, see [`gearshift_proto::batch`]) and
//! the broker's own identity check, news first, an evaluation they make
//! due at once, then every delivery of the batch acknowledged.

use chrono::{DateTime, Utc};
use gearshift_bus::Delivery;
use gearshift_proto::msg::{Message, NodeReport};
use gearshift_service::refusals::{admit_deliveries, admit_delivery};
use uuid::Uuid;

use super::deliveries::{Log, REPORTS, after_gate};
use super::intake::{Peek, coalesce, peek};
use super::{Agent, Result2, RunState};
use crate::core::Core;

impl Agent {
    /// A batch of report deliveries. Reports are soft state: every delivery
    /// is acked, by the ack task, once the batch's effects are applied
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
        for (p, d) in c.stale {
            self.refuse(st, Log::Reports, &stale(p));
            done.push(d);
        }
        let (mut reports, superseded) = self.admit_newest(st, c.nodes, &mut done, now);
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
        // Waiting for the transport to write the acks would hold up the loop:
        // the ack task sends them (one cumulative ack on AMQP).
        st.report_acks.ack(done);
        Ok(())
    }

    /// Per node (deliveries newest first) the newest report that passes the
    /// gate, in rounds: each round's candidates — every node's next — have
    /// their signatures checked in one batch; a node whose candidate is
    /// refused offers its next in the next round. What a node's survivor
    /// supersedes is never verified. Every delivery ends in `done`; returns
    /// the survivors and how many were superseded.
    fn admit_newest(
        &self,
        st: &mut RunState,
        nodes: Vec<Vec<Delivery>>,
        done: &mut Vec<Delivery>,
        now: DateTime<Utc>,
    ) -> (Vec<Admitted>, u64) {
        let mut queues: Vec<std::vec::IntoIter<Delivery>> =
            nodes.into_iter().map(Vec::into_iter).collect();
        let mut round: Vec<usize> = (0..queues.len()).collect();
        let (mut admitted, mut superseded) = (Vec::with_capacity(queues.len()), 0u64);
        while !round.is_empty() {
            let heads: Vec<(usize, Delivery)> = round
                .drain(..)
                .filter_map(|i| queues[i].next().map(|d| (i, d)))
                .collect();
            let refs: Vec<&Delivery> = heads.iter().map(|(_, d)| d).collect();
            let verdicts = admit_deliveries(&self.gate(), &refs, REPORTS, now);
            for ((i, d), v) in heads.into_iter().zip(verdicts) {
                match self.own_report(st, v) {
                    Some(a) => {
                        admitted.push(a);
                        let rest = queues[i].by_ref();
                        let before = done.len();
                        done.extend(rest);
                        superseded += (done.len() - before) as u64;
                    }
                    None => round.push(i),
                }
                done.push(d);
            }
        }
        (admitted, superseded)
    }

    /// The gate, then the broker's own check that a node reports for itself.
    fn admit_report(
        &self,
        st: &mut RunState,
        d: &Delivery,
        now: DateTime<Utc>,
    ) -> Option<Admitted> {
        let verdict = admit_delivery(&self.gate(), d, REPORTS, now);
        self.own_report(st, verdict)
    }

    /// A gate's verdict on a report, and the broker's own check that the
    /// node reports for itself; a refusal is counted and logged.
    fn own_report(
        &self,
        st: &mut RunState,
        verdict: Result<gearshift_proto::Admitted, gearshift_proto::Refusal>,
    ) -> Option<Admitted> {
        let env = match verdict {
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

    /// Runs the early evaluations reports made due, if any (the periodic
    /// evaluation of every group keeps its time).
    async fn evaluate_if_due(&self, core: &mut Core, st: &mut RunState) -> Result2<()> {
        let now = Utc::now();
        if core.evaluation_due().is_some_and(|t| now >= t) {
            self.evaluate(core, st, now, false).await?;
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
