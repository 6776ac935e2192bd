//! 20,000 unsigned commands on `cmd.<node>` (no key needed): all refused
//! and counted, while the node's reports keep their pace (no gap over two
//! report intervals), its memory stays put (under 10 MB of growth) and the
//! `event.refused` answers stay bounded (section 9). Named `disruptive_` to
//! run in the serial pass: it loads the CPU for everyone else. Prints the
//! figures that `docs/benchmarks.md` records.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gearshift_proto::msg::Deactivate;
use gearshift_proto::routing;

use super::{HostileNode, WAIT, eventually};

const FLOOD: usize = 20_000;
const INTERVAL: Duration = Duration::from_secs(5);

/// Arrival times of the messages of a subscription, recorded by a task.
fn record(mut sub: gearshift_bus::Subscription) -> Arc<Mutex<Vec<Instant>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    tokio::spawn(async move {
        while let Some(_d) = sub.next().await {
            s.lock().unwrap().push(Instant::now());
        }
    });
    seen
}

/// The longest gap between `from`, the arrivals within `[from, to]`, and `to`.
fn max_gap(arrivals: &[Instant], from: Instant, to: Instant) -> Duration {
    let mut points: Vec<Instant> = vec![from];
    points.extend(arrivals.iter().copied().filter(|t| *t >= from && *t <= to));
    points.push(to);
    points
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn disruptive_hostile_flood() {
    let mut n = HostileNode::new("5s", true).await;
    let reports = n
        .ctl
        .bus
        .subscribe(&format!("report.*.{}", routing::segment(&n.name)))
        .await
        .unwrap();
    let events = n.ctl.bus.subscribe(&routing::event(&n.name)).await.unwrap();
    let (reports, events) = (record(reports), record(events));
    n.proc.start();
    eventually(WAIT, "the first report", || {
        !reports.lock().unwrap().is_empty()
    })
    .await;
    let rss_before = n.rss_kib();

    // The flood: unsigned commands, as anyone on the bus can publish them.
    let start = Instant::now();
    let payloads: Vec<Vec<u8>> = (0..FLOOD)
        .map(|_| n.ctl.command(Deactivate::default(), None).encode())
        .collect();
    let ctl = &n.ctl;
    let name = n.name.as_str();
    futures::stream::iter(payloads)
        .for_each_concurrent(64, |p| async move { ctl.send_raw(name, p).await })
        .await;
    let published = start.elapsed();
    eventually(
        Duration::from_secs(300),
        "every forged command refused",
        || n.refused("unsigned") >= FLOOD as f64,
    )
    .await;
    let refused = start.elapsed();
    // Two more intervals: reports must go on after the flood too.
    tokio::time::sleep(2 * INTERVAL).await;
    let end = Instant::now();
    let rss_after = n.rss_kib();

    let gap = max_gap(&reports.lock().unwrap(), start, end);
    let answered = events
        .lock()
        .unwrap()
        .iter()
        .filter(|t| **t >= start)
        .count();
    let rate = FLOOD as f64 / published.as_secs_f64();
    let growth = rss_after as i64 - rss_before as i64;
    println!(
        "flood: {FLOOD} unsigned commands published in {:.1} s ({rate:.0}/s), all refused after {:.1} s",
        published.as_secs_f64(),
        refused.as_secs_f64()
    );
    println!(
        "report interval {INTERVAL:?}: longest gap {:.1} s; events published {answered}; node RSS {} -> {} KiB ({growth:+} KiB)",
        gap.as_secs_f64(),
        rss_before,
        rss_after
    );
    assert!(
        gap <= 2 * INTERVAL,
        "reports paused {gap:?} during the flood\n{}",
        n.log_tail()
    );
    assert!(growth < 10 * 1024, "RSS grew by {growth} KiB");
    // Ten answers per reason per 10 s, and a summary: bounded by the
    // flood's duration, not its size.
    let windows = refused.as_secs() / 10 + 2;
    assert!(
        answered as u64 <= 10 * windows + 2,
        "{answered} events for {FLOOD} forged commands in {refused:?}"
    );
}
