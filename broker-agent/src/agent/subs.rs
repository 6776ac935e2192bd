//! The agent's subscriptions (retried on every tick until all are up) and
//! the placement service it runs beside them.

use std::sync::Arc;
use std::time::Duration;

use gearshift_bus::{BusError, ConsumeOptions, Delivery, QueueSpec, Subscription};
use gearshift_proto::routing;
use tokio_util::sync::CancellationToken;

use super::Agent;

/// Most node events handled in one journal commit.
const EVENT_BATCH: usize = 256;
/// Reports in flight from the bounded report queue (see `report_backlog`),
/// and the most taken in one batch.
const REPORT_PREFETCH: u16 = 1024;

/// How long a small report batch waits for more deliveries: at a steady
/// rate one wake-up, one batch verification and one round of acks then
/// serve many reports instead of one each. A report waits this much at
/// most (a crossing's decision latency includes it).
const REPORT_LINGER: Duration = Duration::from_millis(5);
/// A report batch this large is taken at once.
const LINGER_BELOW: usize = 32;

/// What the agent consumes; `None` until subscribed (or after the bus ended one).
/// Only the leader consumes the shared queues (events, admin).
#[derive(Default)]
pub(super) struct Subs {
    pub reports: Option<Subscription>,
    pub events: Option<Subscription>,
    pub admin: Option<Subscription>,
    pub pings: Option<Subscription>,
    pub ha: super::ha::HaSubs,
    pub leading: bool,
}

impl Subs {
    /// Whether every subscription is up.
    pub fn complete(&self) -> bool {
        self.reports.is_some()
            && self.pings.is_some()
            && self.ha.complete()
            && (!self.leading || (self.events.is_some() && self.admin.is_some()))
    }

    /// `first` and the events already received: they share one journal
    /// commit (each is acked after it).
    pub fn event_batch(&mut self, first: Delivery) -> Vec<Delivery> {
        batch_of(first, self.events.as_mut(), EVENT_BATCH)
    }

    /// `first` and the reports already received (coalesced per node); a
    /// small batch waits up to [`REPORT_LINGER`] for more.
    pub async fn report_batch(&mut self, first: Delivery) -> Vec<Delivery> {
        let most = usize::from(REPORT_PREFETCH);
        let mut batch = batch_of(first, self.reports.as_mut(), most);
        let Some(s) = self.reports.as_mut() else {
            return batch;
        };
        let until = tokio::time::Instant::now() + REPORT_LINGER;
        while batch.len() < LINGER_BELOW {
            match tokio::time::timeout_at(until, s.next()).await {
                Ok(Some(d)) => batch.push(d),
                _ => return batch,
            }
        }
        take_ready(&mut batch, s, most);
        batch
    }
}

/// `first` and what `s` already received, `most` in all.
fn batch_of(first: Delivery, s: Option<&mut Subscription>, most: usize) -> Vec<Delivery> {
    let mut batch = vec![first];
    if let Some(s) = s {
        take_ready(&mut batch, s, most);
    }
    batch
}

/// Adds what `s` already received to `batch`, up to `most` in all.
fn take_ready(batch: &mut Vec<Delivery>, s: &mut Subscription, most: usize) {
    while batch.len() < most {
        match futures::FutureExt::now_or_never(s.next()) {
            Some(Some(d)) => batch.push(d),
            _ => break,
        }
    }
}

/// The next delivery of `s`, or never when it is not subscribed.
pub(super) async fn next(s: &mut Option<Subscription>) -> Option<Delivery> {
    match s {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

impl Agent {
    /// Subscribes whatever is not subscribed yet; what fails is retried on
    /// the next tick.
    pub(super) async fn ensure_subs(&self, subs: &mut Subs) {
        self.ensure_ha_subs(&mut subs.ha).await;
        let bus = &self.bus;
        let agent = &self.cfg.agent;
        if subs.leading && subs.events.is_none() {
            let spec = QueueSpec::durable(&agent.events_queue, vec![routing::ALL_EVENTS.into()]);
            match bus.consume(&spec, ConsumeOptions { prefetch: 256 }).await {
                Ok(s) => subs.events = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot consume node events yet; retrying"),
            }
        }
        if subs.leading && subs.admin.is_none() {
            let spec = QueueSpec::durable(&agent.admin_queue, vec![agent.admin_key.clone()]);
            match bus.consume(&spec, ConsumeOptions { prefetch: 16 }).await {
                Ok(s) => subs.admin = Some(s),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot consume operator requests yet; retrying")
                }
            }
        }
        if subs.reports.is_none() {
            match self.subscribe_reports().await {
                Ok(s) => subs.reports = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to reports yet; retrying"),
            }
        }
        if subs.pings.is_none() {
            match bus.subscribe(routing::PING).await {
                Ok(s) => subs.pings = Some(s),
                Err(e) => tracing::warn!(error = %e, "cannot subscribe to pings yet; retrying"),
            }
        }
    }

    /// Reports through a queue of our own bounded to `report_backlog` (the
    /// oldest are dropped when the agent falls behind; on ActiveMQ a topic
    /// subscription with that pending limit), acknowledged once applied; or
    /// a plain subscription when the bound is off or the bus refuses it.
    async fn subscribe_reports(&self) -> Result<Subscription, BusError> {
        let backlog = self.cfg.agent.report_backlog;
        if backlog > 0 {
            let spec = QueueSpec::transient(
                format!(
                    "gearshift.broker.reports.{}",
                    &uuid::Uuid::new_v4().simple().to_string()[..12]
                ),
                vec![routing::ALL_REPORTS.into()],
            )
            .with_max_length(backlog);
            let opts = ConsumeOptions {
                prefetch: REPORT_PREFETCH,
            };
            match self.bus.consume(&spec, opts).await {
                // A bus that cannot bound a queue of its own keeps the
                // plain subscription.
                Err(BusError::Invalid(why)) => {
                    tracing::warn!(
                        reason = %why,
                        "reports are read without a backlog bound on this bus"
                    );
                }
                other => return other,
            }
        }
        self.bus.subscribe(routing::ALL_REPORTS).await
    }

    /// Serves `placement.request` with the agent's fleet snapshot, restarted
    /// a second after it stops, until `token` is cancelled.
    pub(super) fn spawn_placement(&mut self, parent: CancellationToken) {
        let token = parent.child_token();
        self.placement_stop = Some(token.clone());
        let fleet = self.fleet.clone();
        let cordons = self.fleet.clone();
        let opts = gearshift_placement::service::ServeOptions {
            queue: QueueSpec::durable(
                self.cfg.agent.placement_queue.clone(),
                vec![self.cfg.agent.placement_key.clone()],
            ),
            fleet: Some(Arc::new(move || {
                fleet.nodes.read().map(|n| n.clone()).unwrap_or_default()
            })),
            cordoned: Some(Arc::new(move || {
                cordons
                    .cordoned
                    .read()
                    .map(|c| c.clone())
                    .unwrap_or_default()
            })),
            ..Default::default()
        };
        let bus = self.bus.clone();
        let engine = self.engine.clone();
        let signer = self.signer.clone();
        let keyring = self.keyring.clone();
        let name = self.cfg.agent.name.clone();
        self.tracker.spawn(async move {
            loop {
                let r = gearshift_placement::service::serve_with(
                    bus.clone(),
                    engine.clone(),
                    signer.clone(),
                    keyring.clone(),
                    name.clone(),
                    token.clone(),
                    opts.clone(),
                )
                .await;
                if token.is_cancelled() {
                    break;
                }
                if let Err(e) = r {
                    tracing::warn!(error = %e, "placement service stopped; restarting");
                }
                tokio::select! {
                    _ = token.cancelled() => break,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        });
    }
}
