//! Capacity reports: scan the runtime, report periodically and at once on
//! every change (state, gear counts, facts, operation progress).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::OutMessage;
use gearshift_proto::msg::{GearResult, NodeReport, OperationStatus};
use gearshift_proto::routing;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{Inner, lock};
use crate::evacuate::Sink;
use crate::evacuate::plan::Plan;
use crate::metrics::Metrics;
use crate::runtime::Inventory;
use crate::state::{NodeState, StateError};
use crate::status::Snapshot;

/// Receives an evacuation's progress: publishes `event.progress`, updates
/// the operation shown in reports and the metrics.
pub(super) struct EvacSink {
    pub(super) inner: Arc<Inner>,
}

impl Sink for EvacSink {
    fn progress(&self, plan: &Plan, results: Vec<GearResult>) {
        for r in &results {
            let outcome = match r.outcome {
                gearshift_proto::msg::GearOutcome::Moved => "moved",
                gearshift_proto::msg::GearOutcome::AlreadyMoved => "already_moved",
                gearshift_proto::msg::GearOutcome::Missing => "missing",
                gearshift_proto::msg::GearOutcome::Failed => "failed",
            };
            self.inner
                .metrics
                .gear_moves
                .get_or_create(&crate::metrics::StateLabels {
                    state: outcome.to_string(),
                })
                .inc();
        }
        self.inner
            .emit(plan.progress(results), plan.event_corr.as_deref(), true);
        self.inner.set_operation(Some(plan));
    }

    fn checkpoint_failed(&self, err: &StateError) {
        self.inner.metrics.checkpoint_errors.inc();
        tracing::error!(error = %err, "cannot write the evacuation checkpoint (moves go on; they are idempotent)");
    }
}

/// What makes two reports different, apart from `seq`, time and memory.
#[derive(Debug, Clone, PartialEq)]
struct ReportKey {
    inventory: (
        String,
        u32,
        Option<String>,
        Option<bool>,
        gearshift_proto::msg::GearCounts,
        u32,
    ),
    active: bool,
    operation: Option<OperationStatus>,
}

impl Inner {
    /// Updates the persisted node state under the write lock, durably.
    pub(super) async fn update_state(
        &self,
        f: impl FnOnce(&mut NodeState),
    ) -> Result<NodeState, StateError> {
        let _g = self.state_write.lock().await;
        let mut st = lock(&self.node_state).clone();
        f(&mut st);
        let s = self.state.clone();
        let st2 = st.clone();
        self.blocking(move || s.save_state(&st2)).await?;
        *lock(&self.node_state) = st.clone();
        Ok(st)
    }

    /// Sets the operation shown in reports (and the evacuation gauges).
    pub(super) fn set_operation(&self, plan: Option<&Plan>) {
        let status = plan.map(Plan::status);
        let (moved, failed, remaining) = status
            .as_ref()
            .map_or((0, 0, 0), |s| (s.moved, s.failed, s.remaining));
        Metrics::set_state(&self.metrics.evacuation_gears, "moved", i64::from(moved));
        Metrics::set_state(&self.metrics.evacuation_gears, "failed", i64::from(failed));
        Metrics::set_state(
            &self.metrics.evacuation_gears,
            "remaining",
            i64::from(remaining),
        );
        *lock(&self.operation) = status;
        self.report_now.notify_one();
    }

    fn key(&self) -> Option<ReportKey> {
        let inv = lock(&self.inventory).clone()?;
        Some(ReportKey {
            inventory: (
                inv.facts.profile.clone(),
                inv.facts.max_active_gears,
                inv.facts.district.as_ref().map(|d| d.uuid.clone()),
                inv.facts.district.as_ref().map(|d| d.active),
                inv.counts(),
                inv.pinned(),
            ),
            active: lock(&self.node_state).active,
            operation: lock(&self.operation).clone(),
        })
    }

    async fn refresh_inventory(&self) {
        match self.runtime.inventory().await {
            Ok(inv) => {
                self.update_gear_gauges(&inv);
                *lock(&self.inventory) = Some(inv);
            }
            Err(e) => tracing::warn!(error = %e, "cannot scan the gear runtime"),
        }
    }

    fn update_gear_gauges(&self, inv: &Inventory) {
        let c = inv.counts();
        for (state, n) in [
            ("started", c.started),
            ("idle", c.idle),
            ("stopped", c.stopped),
            ("deploying", c.deploying),
            ("unknown", c.unknown),
        ] {
            Metrics::set_state(&self.metrics.gears, state, i64::from(n));
        }
    }

    /// Scans the runtime every `scan_interval`; reports every `interval`
    /// and, after a change, as soon as `min_gap` allows.
    pub(super) async fn report_loop(self: Arc<Self>, stop: CancellationToken) {
        let mut last_key: Option<ReportKey> = None;
        let mut dirty = true;
        let mut last_sent: Option<Instant> = None;
        let mut next_periodic = Instant::now();
        let mut next_scan = Instant::now();
        loop {
            self.heartbeat
                .store(Utc::now().timestamp(), Ordering::Relaxed);
            let r = self.settings().report;
            let due = if dirty {
                last_sent.map_or(Instant::now(), |t| (t + r.min_gap).max(Instant::now()))
            } else {
                next_periodic
            };
            tokio::select! {
                _ = tokio::time::sleep_until(next_scan) => {
                    self.refresh_inventory().await;
                    next_scan = Instant::now() + r.scan_interval;
                    let key = self.key();
                    if key.is_some() && key != last_key {
                        dirty = true;
                    }
                }
                _ = self.report_now.notified() => {
                    dirty = true;
                }
                _ = tokio::time::sleep_until(due) => {
                    if lock(&self.inventory).is_none() {
                        // Never report before the first successful scan: an
                        // empty report would tell the broker the node is empty.
                        next_periodic = Instant::now() + r.scan_interval;
                        dirty = false;
                        continue;
                    }
                    let key = self.key();
                    if self.send_report(false).await {
                        last_key = key;
                        dirty = false;
                        last_sent = Some(Instant::now());
                        next_periodic = Instant::now() + r.interval;
                    } else {
                        // Retry soon (the seq reservation could not be written).
                        next_periodic = Instant::now() + Duration::from_secs(1).min(r.interval);
                        dirty = false;
                    }
                }
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Builds, signs and queues a report; returns false if it could not.
    pub(super) async fn send_report(&self, last: bool) -> bool {
        let Some(inv) = lock(&self.inventory).clone() else {
            return false;
        };
        let s = self.settings();
        let mem = self.runtime.memory().await.unwrap_or_default();
        let now = Utc::now();
        let seq = {
            let now_us = now.timestamp_micros().max(0) as u64;
            let (seq, reserve, previous) = {
                let mut a = lock(&self.seq);
                let previous = a.reserved();
                let (seq, reserve) = a.next(now_us);
                (seq, reserve, previous)
            };
            if let Some(r) = reserve
                && let Err(e) = self.update_state(|st| st.seq_reserved = r).await
            {
                lock(&self.seq).reservation_failed(previous);
                tracing::error!(error = %e, "cannot reserve report sequence numbers; report not sent");
                self.metrics.report_errors.inc();
                return false;
            }
            seq
        };
        let active = lock(&self.node_state).active;
        let report = NodeReport {
            node: self.name.clone(),
            seq,
            profile: inv.facts.profile.clone(),
            district: inv.facts.district.clone(),
            max_active_gears: inv.facts.max_active_gears,
            gears: inv.counts(),
            active,
            region: s.region.clone(),
            zone: s.zone.clone(),
            mem_free_mb: mem.free_mb,
            mem_total_mb: mem.total_mb,
            started_at: self.started_at,
            booted_at: self.runtime.booted_at().await,
            booted_for: s.booted_for.clone(),
            do_not_disrupt: s.do_not_disrupt,
            pinned_gears: inv.pinned(),
            operation: lock(&self.operation).clone(),
            interval_secs: s.report.interval.as_secs_f64().ceil().max(1.0) as u32,
            agent_version: env!("CARGO_PKG_VERSION").into(),
        };
        self.reports.send_replace(Some(report.clone()));
        let key = routing::report(report.district_uuid(), &self.name);
        let payload = self.seal(self.envelope(report, None));
        let _published = self
            .outbox
            .report(OutMessage::new(key, payload).transient());
        *lock(&self.last_report) = Some((seq, now));
        if self.write_status_file {
            let mut at = lock(&self.snapshot_at);
            if last || at.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
                *at = Some(std::time::Instant::now());
                drop(at);
                self.write_snapshot(&inv, seq, now);
            }
        }
        if last {
            tracing::debug!(seq, "final report queued");
        }
        true
    }

    fn write_snapshot(&self, inv: &Inventory, seq: u64, at: chrono::DateTime<Utc>) {
        let snap = Snapshot {
            node: self.name.clone(),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            started_at: self.started_at,
            updated_at: Utc::now(),
            runtime: self.runtime.kind().into(),
            profile: Some(inv.facts.profile.clone()),
            district: inv.facts.district.as_ref().map(|d| d.uuid.clone()),
            max_active_gears: Some(inv.facts.max_active_gears),
            gears: Some(inv.counts()),
            pinned_gears: inv.pinned(),
            bus_connected: self.bus_connected.load(Ordering::SeqCst),
            last_report_seq: Some(seq),
            last_report_at: Some(at),
        };
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            if let Err(e) = state.save_status(&snap) {
                tracing::debug!(error = %e, "cannot write status.json");
            }
        });
    }
}
