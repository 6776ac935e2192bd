//! Reports, node events and pings: each through the signed-message gate
//! ([`Gate`]), each refusal counted (`refused_total{reason}` and the
//! status's `refused`) and logged at a bounded rate.

use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{Delivery, OutMessage};
use gearshift_proto::gate::{Step, clip};
use gearshift_proto::msg::{Kind, Pong};
use gearshift_proto::sign::TimePolicy;
use gearshift_proto::{Envelope, Expect, Gate, Refusal};
use gearshift_service::refusals::{RefusalLog, admit_delivery};

use super::{Agent, Result2, RunState, VERSION};
use crate::core::{Core, dur};

/// Reports: node reports only, fresh.
pub(super) const REPORTS: Expect = Expect::kinds(|k| k == Kind::Report);
/// Node events wait in a durable queue: their age is no reason to refuse
/// them, and their effects are idempotent on the command id. Any kind is
/// taken (a pong to a ping without a reply queue rides `event.<node>` too)
/// and only node events are acted upon, as before the gate.
const EVENTS: Expect = Expect::any().any_age();
/// Pings, fresh.
const PINGS: Expect = Expect::kinds(|k| k == Kind::Ping);

impl Agent {
    /// The gate with this agent's keys and time window.
    pub(super) fn gate(&self) -> Gate<'_> {
        Gate::new(
            &self.keyring,
            TimePolicy {
                window: dur(self.cfg.keys.time_window),
            },
        )
    }

    /// Counts a refusal by reason and logs it (rate-limited per reason).
    pub(super) fn refuse(&self, st: &mut RunState, log: Log, r: &Refusal) {
        *st.refused.entry(r.reason.to_string()).or_default() += 1;
        self.metrics.refused(r.reason);
        log.of(st).log(r);
    }

    /// Node events, in order: their changes are journaled in one commit,
    /// then their actions carried out, then each is acknowledged.
    pub(super) async fn on_event_deliveries(
        &self,
        core: &mut Core,
        st: &mut RunState,
        batch: Vec<Delivery>,
    ) -> Result2<()> {
        let now = Utc::now();
        let mut acts = vec![];
        for d in &batch {
            match admit_delivery(&self.gate(), d, EVENTS, now) {
                Ok(a) if a.envelope.kind().is_node_event() => {
                    let env = a.envelope;
                    acts.extend(core.on_event(
                        &env.from,
                        env.corr.as_deref(),
                        &env.msg,
                        env.ts,
                        now,
                    ));
                }
                Ok(_) => {}
                Err(r) => self.refuse(st, Log::Events, &r),
            }
        }
        // apply journals before it acts; ack only after that.
        self.apply(core, st, acts, now).await?;
        for d in batch {
            ack(d).await;
        }
        Ok(())
    }

    /// A ping: answered with a pong on its reply queue.
    pub(super) async fn on_ping(&self, st: &mut RunState, d: Delivery) {
        let now = Utc::now();
        let ping = match admit_delivery(&self.gate(), &d, PINGS, now) {
            Ok(a) => a.envelope,
            Err(r) => {
                self.refuse(st, Log::Pings, &r);
                return;
            }
        };
        let Some(q) = d.reply_to.clone() else { return };
        let pong = Pong {
            agent: self.cfg.agent.name.clone(),
            role: "broker".into(),
            version: VERSION.into(),
            started_at: now,
            received_at: now,
            ping: ping.id,
            active: None,
        };
        let e = Envelope::new(&self.cfg.agent.name, pong).with_ttl(Duration::from_secs(60));
        let mut m = OutMessage::new(q.clone(), self.signer.seal(e)).transient();
        m.correlation_id = d.correlation_id.clone();
        let _ = self.bus.send_to_queue(&q, m).await;
    }
}

/// Which refusal log a refusal goes to.
#[derive(Debug, Clone, Copy)]
pub(super) enum Log {
    Reports,
    Events,
    Admin,
    Pings,
}

impl Log {
    pub(super) fn of(self, st: &RunState) -> &RefusalLog {
        match self {
            Log::Reports => &st.logs.reports,
            Log::Events => &st.logs.events,
            Log::Admin => &st.logs.admin,
            Log::Pings => &st.logs.pings,
        }
    }
}

/// A report that passed the gate but not the broker's own checks.
pub(super) fn after_gate(
    id: uuid::Uuid,
    from: String,
    reason: &'static str,
    detail: &str,
) -> Refusal {
    Refusal {
        step: Step::Auth,
        reason,
        detail: clip(detail),
        id: Some(id),
        from: Some(from),
        kind: Some(Kind::Report),
        corr: None,
    }
}

/// Acknowledges `d`; a failed ack only means the message comes again.
pub(super) async fn ack(d: Delivery) {
    if let Err(e) = d.ack().await {
        tracing::warn!(error = %e, "ack failed; the message will come again");
    }
}

/// Acknowledges report batches in the order they were taken, each in as few
/// frames as the transport allows ([`Delivery::ack_all`]): a cumulative
/// acknowledgement must never overtake an earlier batch's, so one task
/// sends them all, one batch after the other.
pub(super) struct OrderedAcks {
    tx: tokio::sync::mpsc::UnboundedSender<Vec<Delivery>>,
}

impl OrderedAcks {
    /// The task on `tracker`; it ends with this handle.
    pub fn start(tracker: &tokio_util::task::TaskTracker) -> Self {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<Delivery>>();
        tracker.spawn(async move {
            while let Some(batch) = rx.recv().await {
                if let Err(e) = Delivery::ack_all(batch).await {
                    tracing::warn!(error = %e, "ack failed; the messages will come again");
                }
            }
        });
        OrderedAcks { tx }
    }

    /// Queues a batch's acknowledgements (at most a prefetch's worth wait).
    pub fn ack(&self, batch: Vec<Delivery>) {
        if self.tx.send(batch).is_err() {
            tracing::warn!("the ack task ended; the messages will come again");
        }
    }
}
