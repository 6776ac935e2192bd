//! A Pusher whose target is dead never delays the agent, and counts what
//! it could not deliver: one target refuses connections, one accepts them
//! and never answers (the worse case: each attempt lasts a whole timeout).

use std::time::Duration;

use gearshift_pushstats::metrics::DropReason;
use gearshift_pushstats::{PushMetrics, PushStatsConfig, Sample, Unit};
use gearshift_tests::pushstats::free_port;
use tokio_util::sync::CancellationToken;

fn config(endpoint: &str) -> PushStatsConfig {
    PushStatsConfig::from_agent_toml(&format!(
        r#"
[push_stats]
enabled = true
interval = "1s"
debounce = "10ms"
queue_capacity = 8
max_attempts = 3
retry_min = "20ms"
retry_max = "100ms"
timeout = "2s"

[push_stats.cloudwatch]
endpoint = "{endpoint}"
access_key_id = "AKID"
secret_access_key = "secret"
"#
    ))
    .unwrap()
}

async fn wait_for(what: &str, secs: u64, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not within {secs} s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn refused_connections_are_retried_counted_and_dropped() {
    gearshift_tests::init_logging();
    // Nothing listens on this port.
    let cfg = config(&format!("http://127.0.0.1:{}/", free_port()));
    let metrics = PushMetrics::new();
    let pusher = cfg
        .start(None, metrics.clone(), CancellationToken::new())
        .unwrap()
        .unwrap();
    let h = pusher.handle();
    for i in 0..500 {
        h.update(vec![Sample::new("ActiveGears", i as f64, Unit::COUNT)]);
        h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    }
    wait_for("retries exhausted on a dead endpoint", 20, || {
        metrics.dropped_total("cloudwatch", DropReason::RetriesExhausted) >= 2
    })
    .await;
    assert!(
        metrics.failures_total("cloudwatch") >= 6,
        "3 attempts per batch"
    );
    assert!(metrics.retries_total("cloudwatch") >= 4);
    assert_eq!(metrics.pushes_total("cloudwatch"), 0);
    // 500 one-off batches into a queue of 8: the rest were dropped and counted.
    assert!(metrics.dropped_total("cloudwatch", DropReason::QueueFull) >= 480);
    pusher.shutdown().await;
}

#[tokio::test]
async fn a_target_that_never_answers_does_not_hold_up_the_caller() {
    gearshift_tests::init_logging();
    // Accepts connections and reads nothing: every request waits for the 2 s timeout.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let cfg = config(&format!("http://{addr}/"));
    let metrics = PushMetrics::new();
    let pusher = cfg
        .start(None, metrics.clone(), CancellationToken::new())
        .unwrap()
        .unwrap();
    let h = pusher.handle();
    h.update(vec![Sample::new("ActiveGears", 0.0, Unit::COUNT)]);
    // Let the first push start and hang on the silent target.
    tokio::time::sleep(Duration::from_millis(100)).await;
    for i in 0..2000 {
        h.update(vec![Sample::new("ActiveGears", i as f64, Unit::COUNT)]);
        h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    }
    // Every call above returned while the first attempt was still waiting
    // for its answer: no attempt has finished yet, not even as a failure.
    assert_eq!(
        metrics.failures_total("cloudwatch"),
        0,
        "the caller was held until a push attempt ended"
    );
    wait_for("the hung attempt times out and is counted", 10, || {
        metrics.failures_total("cloudwatch") >= 1
    })
    .await;
    assert_eq!(metrics.pushes_total("cloudwatch"), 0);
    pusher.shutdown().await;
    held.abort();
}
