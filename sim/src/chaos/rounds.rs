//! One round of the campaign: start a saga, inject the round's fault at a
//! random point of it, wait for the saga to end, check the invariants.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use gearshift_broker::status::Status;
use gearshift_proto::msg::AdminRequest;
use rand::Rng;
use rand::rngs::StdRng;

use super::outage::{outage_round, rabbitmqctl};
use super::world::{MAX_ACTIVE, Watch, World};
use super::{ChaosArgs, ChaosReport, FAULTS, Fault};

/// Plays every round.
pub(super) async fn campaign(
    args: &ChaosArgs,
    w: &mut World,
    rng: &mut StdRng,
    report: &mut ChaosReport,
    watch: &mut Watch,
) -> anyhow::Result<()> {
    for round in 1..=args.rounds {
        let fault = FAULTS[(round - 1) % FAULTS.len()];
        report.rounds = round;
        eprintln!("chaos: round {round}: {fault:?}");
        let ops_before: BTreeSet<String> = w
            .status()
            .await
            .map(|s| s.ops.iter().map(|o| o.id.clone()).collect())
            .unwrap_or_default();
        let deadline_for = match fault {
            Fault::Outage => args.outage + Duration::from_secs(120),
            _ => Duration::from_secs(120),
        };
        let victim = start_saga(w, fault).await?;
        // The fault, at a random point.
        let delay = Duration::from_millis(rng.random_range(100..2500));
        w.run_cloud_for(delay, Duration::from_millis(30)).await?;
        *report.faults.entry(format!("{fault:?}")).or_default() += 1;
        report.faults_injected += 1;
        inject(args, w, fault, victim, rng, round, report, watch).await?;
        saga_ended_check(w, round, report, &ops_before, deadline_for).await?;
        // Quiet: nothing in flight, every node fresh.
        let quiet = |s: &Status| {
            s.ops.iter().all(|o| o.done) && s.nodes.iter().all(|n| n.fresh || !n.active)
        };
        let _ = w.until(Duration::from_secs(30), quiet).await?;
        w.poll_cloud()?;
        inventory_checks(w, round, report);
    }
    Ok(())
}

/// Starts the round's saga: a scale-up (every live node filled over the
/// threshold) or an operator evacuation of one node; returns that node.
pub(super) async fn start_saga(w: &mut World, fault: Fault) -> anyhow::Result<Option<String>> {
    if fault == Fault::KillBrokerScaleUp {
        // Fill every live node to 9 of 10 active gears: over 90 %.
        let roots: Vec<(PathBuf, usize)> = w
            .live()
            .iter()
            .map(|n| (n.root.clone(), World::gears_in(&n.root).len()))
            .collect();
        for (root, have) in roots {
            for _ in have..(MAX_ACTIVE as usize - 1) {
                w.add_gear(&root)?;
            }
        }
        return Ok(None);
    }
    let v = evacuation_victim(w).await?;
    evacuate(w, &v).await?;
    Ok(Some(v))
}

/// The live node with the fewest gears that the others can absorb
/// (booting an empty node first when they cannot).
async fn evacuation_victim(w: &mut World) -> anyhow::Result<String> {
    let mut cands: Vec<(usize, String)> = w
        .live()
        .iter()
        .map(|n| (World::gears_in(&n.root).len(), n.name.clone()))
        .collect();
    // Prefer a node with gears: the fault then hits the moves.
    cands.sort_by_key(|(g, n)| (*g == 0, *g, n.clone()));
    let room: usize = cands
        .iter()
        .skip(1)
        .map(|(g, _)| (MAX_ACTIVE as usize).saturating_sub(*g))
        .sum();
    let Some((gears, v)) = cands.first().cloned() else {
        bail!("no live node left");
    };
    if w.live().len() < 3 || room < gears {
        // Make room first: a new, empty node.
        w.boot(0, None)?;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    Ok(v)
}

/// Asks the broker agent to evacuate `v`. It may see less room than the
/// directories say (a node not fresh yet): then one more empty node, once.
async fn evacuate(w: &mut World, v: &str) -> anyhow::Result<()> {
    let mut attempt = 0;
    loop {
        let r = w
            .broker()
            .admin(
                AdminRequest::Evacuate {
                    node: v.to_string(),
                },
                Duration::from_secs(10),
            )
            .await?;
        if r.ok {
            return Ok(());
        }
        attempt += 1;
        if attempt > 1 {
            bail!("evacuation of {v} refused: {}", r.message);
        }
        eprintln!(
            "chaos: evacuation of {v} refused ({}); adding a node",
            r.message
        );
        let new = w.boot(0, None)?;
        let _ = w
            .until(Duration::from_secs(15), |s| {
                s.nodes.iter().any(|n| n.node == new && n.fresh)
            })
            .await?;
    }
}

/// Injects `fault` now.
#[allow(clippy::too_many_arguments)]
async fn inject(
    args: &ChaosArgs,
    w: &mut World,
    fault: Fault,
    victim: Option<String>,
    rng: &mut StdRng,
    round: usize,
    report: &mut ChaosReport,
    watch: &mut Watch,
) -> anyhow::Result<()> {
    match fault {
        Fault::KillBrokerDrain | Fault::KillBrokerScaleUp => {
            w.brokers[0].proc.kill();
            w.brokers[0].proc.start()?;
        }
        Fault::KillNode => {
            let v = victim.unwrap_or_default();
            // A node the cloud already removed stays removed.
            if let Some(n) = w.node(&v)
                && !n.removed
            {
                n.proc.kill();
                tokio::time::sleep(Duration::from_millis(rng.random_range(200..1500))).await;
                n.proc.start()?;
            }
        }
        Fault::CloseConnections => {
            rabbitmqctl(
                &args.rabbitmqctl,
                &["close_all_connections", "gearshift chaos"],
            )?;
        }
        Fault::Outage => {
            outage_round(args, w, round, report, watch).await?;
        }
    }
    Ok(())
}

/// The saga the round started ends (done or aborted) before its deadline.
pub(super) async fn saga_ended_check(
    w: &mut World,
    round: usize,
    report: &mut ChaosReport,
    ops_before: &BTreeSet<String>,
    deadline_for: Duration,
) -> anyhow::Result<()> {
    let ended = w
        .until(deadline_for, |s| {
            let new: Vec<_> = s
                .ops
                .iter()
                .filter(|o| !ops_before.contains(&o.id))
                .collect();
            !new.is_empty() && new.iter().all(|o| o.done)
        })
        .await?;
    let (ops_desc, states) = match w.status().await {
        Some(s) => {
            let new: Vec<String> = s
                .ops
                .iter()
                .filter(|o| !ops_before.contains(&o.id))
                .map(|o| {
                    format!(
                        "{} {} {}",
                        o.kind,
                        o.state,
                        o.node.clone().unwrap_or_default()
                    )
                })
                .collect();
            (new.join(", "), new.len())
        }
        None => ("no status".into(), 0),
    };
    report.check(
        round,
        "saga_ended_before_deadline",
        ended,
        format!(
            "{states} new operation(s) within {}: {ops_desc}",
            humantime::format_duration(deadline_for)
        ),
    );
    Ok(())
}

/// Every gear exists exactly once on a live node; no operation asked the
/// cloud twice.
pub(super) fn inventory_checks(w: &World, round: usize, report: &mut ChaosReport) {
    let mut at: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut lost_on_removed = vec![];
    for n in &w.nodes {
        for g in World::gears_in(&n.root) {
            if n.removed {
                lost_on_removed.push(format!("{g}@{}", n.name));
            } else {
                at.entry(g).or_default().push(n.name.clone());
            }
        }
    }
    let found: BTreeSet<String> = at.keys().cloned().collect();
    let missing: Vec<&String> = w.expected_gears.difference(&found).collect();
    let unexpected: Vec<&String> = found.difference(&w.expected_gears).collect();
    let dup: Vec<String> = at
        .iter()
        .filter(|(_, v)| v.len() > 1)
        .map(|(g, v)| format!("{g}@{}", v.join("+")))
        .collect();
    report.check(
        round,
        "no_gear_lost",
        missing.is_empty() && lost_on_removed.is_empty() && unexpected.is_empty(),
        format!(
            "{} gears expected, {} on live nodes; missing {missing:?}, on removed nodes {lost_on_removed:?}, unknown {unexpected:?}",
            w.expected_gears.len(),
            found.len()
        ),
    );
    report.check(
        round,
        "no_gear_duplicated",
        dup.is_empty(),
        format!("duplicated: {dup:?}"),
    );
    let twice = w.requests.repeated();
    report.check(
        round,
        "no_duplicate_node_request",
        twice.is_empty(),
        format!(
            "{} create-node and {} remove-node requests; repeated: {twice:?}",
            w.requests.creates.values().sum::<usize>(),
            w.requests.removes.values().sum::<usize>()
        ),
    );
}
