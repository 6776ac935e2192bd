//! The high-availability campaign (`gearshift-sim chaos --brokers 3`):
//! three broker agents elect a leader through RabbitMQ; every round starts a
//! drain or a scale-up and, at random points of it, SIGKILLs the leader
//! (restarted at once: it comes back as a standby) twice, or kills it once
//! and closes the next leader's connection (`rabbitmqctl close_connection`,
//! a partition). After each fault: a new leader within 10 s (the failover
//! time is recorded) and, after a partition, the cut-off leader stood down.
//! After each round: exactly one leader, the saga ended before its
//! deadline, no gear lost or duplicated, no node requested twice, no
//! command of a deposed leader accepted by a node (`fencing`).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use gearshift_broker::status::Status;
use rand::Rng;
use rand::rngs::StdRng;

use super::fencing::FenceWatch;
use super::outage::rabbitmqctl;
use super::rounds::{inventory_checks, saga_ended_check, start_saga};
use super::world::World;
use super::{ChaosArgs, ChaosReport, Fault};
use crate::harness::metrics;

/// A failover slower than this fails its check (the bound).
const FAILOVER_BOUND: Duration = Duration::from_secs(10);

/// A fault of the HA campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HaFault {
    /// SIGKILL of the leader, restarted at once.
    KillLeader,
    /// The leader's bus connection closed by RabbitMQ.
    PartitionLeader,
}

/// Whether each broker agent says it leads (its `gearshift_broker_leader`
/// gauge); an agent that does not answer does not lead.
async fn leading(w: &World) -> Vec<bool> {
    let mut out = vec![];
    for b in &w.brokers {
        let port = b.cfg.metrics.listen.map(|a| a.port()).unwrap_or(0);
        let lead = match metrics::scrape(port).await {
            Ok(m) => m.sum("gearshift_broker_leader") >= 1.0,
            Err(_) => false,
        };
        out.push(lead);
    }
    out
}

/// The one leader's index, once exactly one agent leads (within `within`).
async fn one_leader(w: &mut World, within: Duration) -> anyhow::Result<Option<usize>> {
    let deadline = Instant::now() + within;
    loop {
        let l = leading(w).await;
        if l.iter().filter(|x| **x).count() == 1 {
            return Ok(l.iter().position(|x| *x));
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        w.poll_cloud()?;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits for an agent other than `old` to lead; the time since `t0`.
async fn next_leader(
    w: &mut World,
    old: usize,
    t0: Instant,
) -> anyhow::Result<Option<(usize, Duration)>> {
    let deadline = t0 + FAILOVER_BOUND * 3;
    while Instant::now() < deadline {
        let l = leading(w).await;
        if let Some(i) = l.iter().enumerate().position(|(i, x)| *x && i != old) {
            return Ok(Some((i, t0.elapsed())));
        }
        w.poll_cloud()?;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(None)
}

/// The RabbitMQ connection of broker agent `name` (its pid).
fn connection_of(ctl: &str, name: &str) -> anyhow::Result<String> {
    let out = std::process::Command::new(ctl)
        .args(["-q", "list_connections", "pid", "client_properties"])
        .output()
        .with_context(|| format!("cannot run {ctl}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let want = format!("gearshift-broker {name}\"");
    let want_bin = format!("<<\"gearshift-broker {name}\">>");
    text.lines()
        .find(|l| l.contains(&want) || l.contains(&want_bin))
        .and_then(|l| l.split_whitespace().next())
        .map(str::to_string)
        .with_context(|| format!("no connection of {name} in list_connections"))
}

/// Plays every round.
pub(super) async fn campaign(
    args: &ChaosArgs,
    w: &mut World,
    rng: &mut StdRng,
    report: &mut ChaosReport,
) -> anyhow::Result<()> {
    if one_leader(w, Duration::from_secs(30)).await?.is_none() {
        bail!("no single leader among the broker agents within 30 s");
    }
    let mut fence = FenceWatch::start(&args.bus).await?;
    for round in 1..=args.rounds {
        report.rounds = round;
        let saga = if round % 2 == 0 {
            Fault::KillBrokerScaleUp
        } else {
            Fault::KillBrokerDrain
        };
        let faults = if round % 3 == 0 {
            [HaFault::KillLeader, HaFault::PartitionLeader]
        } else {
            [HaFault::KillLeader, HaFault::KillLeader]
        };
        eprintln!("chaos: round {round}: {saga:?} with {faults:?}");
        let ops_before: BTreeSet<String> = w
            .status()
            .await
            .map(|s| s.ops.iter().map(|o| o.id.clone()).collect())
            .unwrap_or_default();
        start_saga(w, saga).await?;
        for f in faults {
            let delay = Duration::from_millis(rng.random_range(200..2000));
            w.run_cloud_for(delay, Duration::from_millis(30)).await?;
            inject(args, w, f, round, report).await?;
        }
        saga_ended_check(w, round, report, &ops_before, Duration::from_secs(120)).await?;
        let quiet = |s: &Status| {
            s.ops.iter().all(|o| o.done) && s.nodes.iter().all(|n| n.fresh || !n.active)
        };
        let _ = w.until(Duration::from_secs(30), quiet).await?;
        w.poll_cloud()?;
        inventory_checks(w, round, report);
        fence.check(round, report).await;
        let l = leading(w).await;
        let n = l.iter().filter(|x| **x).count();
        report.check(
            round,
            "exactly_one_leader",
            n == 1,
            format!("{n} of {} agents lead", l.len()),
        );
    }
    Ok(())
}

/// Injects one fault on the current leader and checks the failover.
async fn inject(
    args: &ChaosArgs,
    w: &mut World,
    f: HaFault,
    round: usize,
    report: &mut ChaosReport,
) -> anyhow::Result<()> {
    let Some(old) = one_leader(w, FAILOVER_BOUND).await? else {
        report.check(round, "one_leader_before_fault", false, "none".into());
        return Ok(());
    };
    let name = w.brokers[old].cfg.agent.name.clone();
    let t0 = Instant::now();
    match f {
        HaFault::KillLeader => {
            w.brokers[old].proc.kill();
            w.brokers[old].proc.start()?;
        }
        HaFault::PartitionLeader => {
            let pid = connection_of(&args.rabbitmqctl, &name)?;
            rabbitmqctl(
                &args.rabbitmqctl,
                &["close_connection", &pid, "gearshift chaos partition"],
            )?;
        }
    }
    *report.faults.entry(format!("{f:?}")).or_default() += 1;
    report.faults_injected += 1;
    let next = next_leader(w, old, t0).await?;
    let detail = match next {
        Some((i, dt)) => {
            report.failover_ms.push(dt.as_millis() as u64);
            format!(
                "{name} -> {} in {} ms",
                w.brokers[i].cfg.agent.name,
                dt.as_millis()
            )
        }
        None => format!("{name}: no other leader within {:?}", FAILOVER_BOUND * 3),
    };
    let ok = next.is_some_and(|(_, dt)| dt <= FAILOVER_BOUND);
    report.check(round, "failover_within_10s", ok, detail);
    if f == HaFault::PartitionLeader {
        // The cut-off leader stood down (it reconnected as a standby).
        let l = leading(w).await;
        report.check(
            round,
            "partitioned_leader_stood_down",
            !l[old],
            format!("{name} leads: {}", l[old]),
        );
    }
    Ok(())
}
