//! Capacity reports: scan the runtime, report periodically and at once on
//! every change (state, gear counts, facts, operation progress). The
//! [`Reporter`] owns the sequence numbers; the agent sends the final report
//! with it once every other task stopped.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::{DateTime, Utc};
use gearshift_bus::OutMessage;
use gearshift_proto::msg::{GearCounts, NodeReport, OperationStatus};
use gearshift_proto::routing;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shared::Shared;
use crate::metrics::Metrics;
use crate::runtime::Inventory;
use crate::state::seq::SeqAllocator;
use crate::status::Snapshot;

/// What makes two reports different, apart from `seq`, time and memory.
#[derive(Debug, Clone, PartialEq)]
struct ReportKey {
    inventory: (String, u32, Option<String>, Option<bool>, GearCounts, u32),
    active: bool,
    operation: Option<OperationStatus>,
}

/// The report task's state.
pub(crate) struct Reporter {
    sh: Arc<Shared>,
    seq: SeqAllocator,
    snapshot_at: Option<std::time::Instant>,
}

impl Reporter {
    pub(crate) fn new(sh: Arc<Shared>, seq_reserved: u64) -> Reporter {
        Reporter {
            sh,
            seq: SeqAllocator::new(seq_reserved),
            snapshot_at: None,
        }
    }

    fn key(&self) -> Option<ReportKey> {
        let inv = self.sh.inventory.borrow().clone()?;
        let view = self.sh.view.borrow().clone();
        Some(ReportKey {
            inventory: (
                inv.facts.profile.clone(),
                inv.facts.max_active_gears,
                inv.facts.district.as_ref().map(|d| d.uuid.clone()),
                inv.facts.district.as_ref().map(|d| d.active),
                inv.counts(),
                inv.pinned(),
            ),
            active: view.active,
            operation: view.operation,
        })
    }

    async fn refresh_inventory(&self) {
        match self.sh.runtime.inventory().await {
            Ok(inv) => {
                update_gear_gauges(&self.sh.metrics, &inv);
                self.sh.inventory.send_replace(Some(inv));
            }
            Err(e) => tracing::warn!(error = %e, "cannot scan the gear runtime"),
        }
    }

    /// Scans the runtime every `scan_interval`; reports every `interval`
    /// and, after a change, as soon as `min_gap` allows. Returns itself
    /// when stopped, for the final report.
    pub(crate) async fn run(mut self, stop: CancellationToken) -> Reporter {
        let mut last_key: Option<ReportKey> = None;
        let mut dirty = true;
        let mut last_sent: Option<Instant> = None;
        let mut next_periodic = Instant::now();
        let mut next_scan = Instant::now();
        loop {
            self.sh
                .heartbeat
                .store(Utc::now().timestamp(), Ordering::Relaxed);
            let r = self.sh.settings().report.clone();
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
                _ = self.sh.report_now.notified() => {
                    dirty = true;
                }
                _ = tokio::time::sleep_until(due) => {
                    if self.sh.inventory.borrow().is_none() {
                        // Never report before the first successful scan: an
                        // empty report would tell the broker the node is empty.
                        next_periodic = Instant::now() + r.scan_interval;
                        dirty = false;
                        continue;
                    }
                    if !self.sh.commands_ready.load(Ordering::SeqCst) {
                        // Nor before the command queue exists and is
                        // consumed: a report invites commands (the intake
                        // asks for a report once it is ready).
                        next_periodic = Instant::now() + r.interval;
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
                _ = stop.cancelled() => return self,
            }
        }
    }

    /// The next `seq`, its reservation persisted first when one is due.
    async fn next_seq(&mut self, now: DateTime<Utc>) -> Option<u64> {
        let now_us = now.timestamp_micros().max(0) as u64;
        let previous = self.seq.reserved();
        let (seq, reserve) = self.seq.next(now_us);
        if let Some(r) = reserve {
            let sh = &self.sh;
            if let Err(e) = sh
                .state_file
                .update(&sh.tracker, |st| st.seq_reserved = r)
                .await
            {
                self.seq.reservation_failed(previous);
                tracing::error!(error = %e, "cannot reserve report sequence numbers; report not sent");
                sh.metrics.report_errors.inc();
                return None;
            }
        }
        Some(seq)
    }

    /// Builds, signs and queues a report; returns false if it could not.
    pub(crate) async fn send_report(&mut self, last: bool) -> bool {
        let Some(inv) = self.sh.inventory.borrow().clone() else {
            return false;
        };
        let sh = self.sh.clone();
        let s = sh.settings();
        let mem = sh.runtime.memory().await.unwrap_or_default();
        let now = Utc::now();
        let Some(seq) = self.next_seq(now).await else {
            return false;
        };
        let view = sh.view.borrow().clone();
        let report = NodeReport {
            node: sh.name.clone(),
            seq,
            profile: inv.facts.profile.clone(),
            district: inv.facts.district.clone(),
            max_active_gears: inv.facts.max_active_gears,
            gears: inv.counts(),
            active: view.active,
            region: s.region.clone(),
            zone: s.zone.clone(),
            mem_free_mb: mem.free_mb,
            mem_total_mb: mem.total_mb,
            started_at: sh.started_at,
            booted_at: sh.runtime.booted_at().await,
            booted_for: s.booted_for.clone(),
            do_not_disrupt: s.do_not_disrupt,
            pinned_gears: inv.pinned(),
            operation: view.operation,
            interval_secs: s.report.interval.as_secs_f64().ceil().max(1.0) as u32,
            agent_version: env!("CARGO_PKG_VERSION").into(),
        };
        sh.reports.send_replace(Some(report.clone()));
        let key = routing::report(report.district_uuid(), &sh.name);
        let payload = sh.seal(report, None);
        let _published = sh.outbox.report(OutMessage::new(key, payload).transient());
        if sh.limits.write_status_file
            && (last
                || self
                    .snapshot_at
                    .is_none_or(|t| t.elapsed() >= Duration::from_secs(1)))
        {
            self.snapshot_at = Some(std::time::Instant::now());
            write_snapshot(&sh, &inv, seq, now);
        }
        if last {
            tracing::debug!(seq, "final report queued");
        }
        true
    }
}

fn update_gear_gauges(m: &Metrics, inv: &Inventory) {
    let c = inv.counts();
    for (state, n) in [
        ("started", c.started),
        ("idle", c.idle),
        ("stopped", c.stopped),
        ("deploying", c.deploying),
        ("unknown", c.unknown),
    ] {
        Metrics::set_state(&m.gears, state, i64::from(n));
    }
}

fn write_snapshot(sh: &Shared, inv: &Inventory, seq: u64, at: DateTime<Utc>) {
    let snap = Snapshot {
        node: sh.name.clone(),
        agent_version: env!("CARGO_PKG_VERSION").into(),
        pid: std::process::id(),
        started_at: sh.started_at,
        updated_at: Utc::now(),
        runtime: sh.runtime.kind().into(),
        profile: Some(inv.facts.profile.clone()),
        district: inv.facts.district.as_ref().map(|d| d.uuid.clone()),
        max_active_gears: Some(inv.facts.max_active_gears),
        gears: Some(inv.counts()),
        pinned_gears: inv.pinned(),
        bus_connected: sh.bus_connected.load(Ordering::SeqCst),
        last_report_seq: Some(seq),
        last_report_at: Some(at),
    };
    let state = sh.state.clone();
    sh.tracker.spawn_blocking(move || {
        if let Err(e) = state.save_status(&snap) {
            tracing::debug!(error = %e, "cannot write status.json");
        }
    });
}
