//! The bus outage: RabbitMQ's app stopped and started with `rabbitmqctl`,
//! then the reconnection and stale-decision checks.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use gearshift_bus::Subscription;
use gearshift_proto::Envelope;
use gearshift_proto::msg::{DecisionKind, Message};

use super::world::{Watch, World};
use super::{ChaosArgs, ChaosReport};

/// `rabbitmqctl stop_app` undone by `start_app` when dropped (also on panic).
struct AppGuard {
    ctl: String,
    stopped: bool,
}

impl AppGuard {
    fn stop(ctl: &str) -> anyhow::Result<AppGuard> {
        let mut g = AppGuard {
            ctl: ctl.to_string(),
            stopped: true,
        };
        if let Err(e) = rabbitmqctl(ctl, &["stop_app"]) {
            g.stopped = false;
            let _ = rabbitmqctl(ctl, &["start_app"]);
            return Err(e);
        }
        Ok(g)
    }

    fn start(&mut self) -> anyhow::Result<()> {
        rabbitmqctl(&self.ctl, &["start_app"])?;
        self.stopped = false;
        rabbitmqctl(&self.ctl, &["await_startup"])?;
        Ok(())
    }
}

impl Drop for AppGuard {
    fn drop(&mut self) {
        if self.stopped {
            let _ = rabbitmqctl(&self.ctl, &["start_app"]);
        }
    }
}

/// Runs `ctl args`, failing with its stderr.
pub(super) fn rabbitmqctl(ctl: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new(ctl)
        .args(args)
        .output()
        .with_context(|| format!("cannot run {ctl}"))?;
    if !out.status.success() {
        bail!(
            "{ctl} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// The outage: stop RabbitMQ's app, wait, start it; then the reconnection
/// and stale-decision checks.
pub(super) async fn outage_round(
    args: &ChaosArgs,
    w: &mut World,
    round: usize,
    report: &mut ChaosReport,
    watch: &mut Watch,
) -> anyhow::Result<()> {
    // Reports received before the outage say nothing about reconnection.
    while let Ok(Some(_)) = watch.reports.next_timeout(Duration::from_millis(10)).await {}
    let down_at = Utc::now();
    let mut guard = AppGuard::stop(&args.rabbitmqctl)?;
    let t = Instant::now();
    // The cloud keeps working from the handler's file.
    w.run_cloud_for(args.outage, Duration::from_millis(200))
        .await?;
    guard.start()?;
    let back = Instant::now();
    let back_at = Utc::now();
    drop(guard);
    eprintln!("chaos: bus back after {:.1} s", t.elapsed().as_secs_f64());
    reconnection_checks(w, round, report, &mut watch.reports, back).await;
    // No scaling decision taken on the outage's stale figures.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stale_decision_check(round, report, &mut watch.decisions, down_at, back_at).await;
    Ok(())
}

/// The broker agent answers, and every live node reports, within 5 s of
/// the bus's return.
async fn reconnection_checks(
    w: &World,
    round: usize,
    report: &mut ChaosReport,
    reports: &mut Subscription,
    back: Instant,
) {
    let mut broker_back = None;
    let mut nodes_back: BTreeMap<String, f64> = BTreeMap::new();
    let live: BTreeSet<String> = w.live().iter().map(|n| n.name.clone()).collect();
    let limit = Duration::from_secs(15);
    while back.elapsed() < limit && (broker_back.is_none() || nodes_back.len() < live.len()) {
        if broker_back.is_none() && w.status().await.is_some() {
            broker_back = Some(back.elapsed().as_secs_f64());
        }
        while let Ok(Some(d)) = reports.next_timeout(Duration::from_millis(50)).await {
            // Who reported is all that counts here: no signature needed.
            if let Ok(x) = Envelope::decode(&d.payload)
                && live.contains(&x.envelope.from)
            {
                nodes_back
                    .entry(x.envelope.from.clone())
                    .or_insert_with(|| back.elapsed().as_secs_f64());
            }
        }
    }
    let slow: Vec<String> = live
        .iter()
        .filter(|n| nodes_back.get(*n).is_none_or(|s| *s > 5.0))
        .map(|n| format!("{n} {:?}", nodes_back.get(n)))
        .collect();
    report.check(
        round,
        "broker_reconnected_within_5s",
        broker_back.is_some_and(|s| s <= 5.0),
        format!("answered {broker_back:?} s after the bus returned"),
    );
    report.check(
        round,
        "nodes_reconnected_within_5s",
        slow.is_empty(),
        format!("first reports after the bus returned (s): {nodes_back:?}"),
    );
}

/// No scale-up or scale-down dated within the outage, none with missing
/// nodes in its figures.
async fn stale_decision_check(
    round: usize,
    report: &mut ChaosReport,
    decisions: &mut Subscription,
    down_at: DateTime<Utc>,
    back_at: DateTime<Utc>,
) {
    let mut bad = vec![];
    let mut seen = 0;
    while let Ok(Some(d)) = decisions.next_timeout(Duration::from_millis(50)).await {
        let Ok(x) = Envelope::decode(&d.payload) else {
            continue;
        };
        let Message::Decision(dec) = &x.envelope.msg else {
            continue;
        };
        if x.envelope.ts < down_at {
            continue;
        }
        seen += 1;
        let scaling = matches!(
            dec.decision,
            DecisionKind::ScaleUp | DecisionKind::ScaleDown
        );
        let during = x.envelope.ts <= back_at;
        let missing = dec.stats.as_ref().is_some_and(|s| s.nodes_missing > 0);
        if scaling && (during || missing) {
            bad.push(format!(
                "{} at {} ({} missing)",
                dec.decision.as_str(),
                x.envelope.ts,
                dec.stats.as_ref().map_or(0, |s| s.nodes_missing)
            ));
        }
    }
    report.check(
        round,
        "no_decision_on_stale_data",
        bad.is_empty(),
        format!("{seen} decisions since the outage began; on stale data: {bad:?}"),
    );
}
