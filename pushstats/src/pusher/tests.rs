use super::*;
use crate::sample::Unit;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

/// Records batches; fails the first `fail` attempts with `error`.
struct FakeSink {
    got: Mutex<Vec<Vec<Sample>>>,
    fail: AtomicU32,
    error: PushError,
    hang: bool,
}

impl FakeSink {
    fn new(fail: u32, error: PushError) -> Arc<Self> {
        Arc::new(FakeSink {
            got: Mutex::new(Vec::new()),
            fail: AtomicU32::new(fail),
            error,
            hang: false,
        })
    }
    fn batches(&self) -> Vec<Vec<Sample>> {
        self.got.lock().unwrap().clone()
    }
}

#[async_trait]
impl Sink for FakeSink {
    fn target(&self) -> &str {
        "fake"
    }
    async fn push(&self, samples: &[Sample]) -> Result<(), PushError> {
        if self.hang {
            std::future::pending::<()>().await;
        }
        if self
            .fail
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| f.checked_sub(1))
            .is_ok()
        {
            return Err(self.error.clone());
        }
        self.got.lock().unwrap().push(samples.to_vec());
        Ok(())
    }
}

fn retryable() -> PushError {
    PushError::Transport {
        target: "fake",
        message: "refused".into(),
    }
}

fn opts() -> PusherOptions {
    PusherOptions {
        interval: Duration::from_secs(60),
        on_change: true,
        debounce: Duration::from_secs(5),
        queue_capacity: 4,
        max_attempts: 3,
        retry_min: Duration::from_secs(1),
        retry_max: Duration::from_secs(10),
        attempt_timeout: Duration::from_secs(30),
    }
}

fn figures(v: f64) -> Vec<Sample> {
    vec![Sample::new("ActiveGears", v, Unit::COUNT)]
}

async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn interval_and_debounced_change() {
    let sink = FakeSink::new(0, retryable());
    let cancel = CancellationToken::new();
    let p = Pusher::spawn(
        opts(),
        vec![sink.clone()],
        PushMetrics::new(),
        cancel.clone(),
    );
    let h = p.handle();
    settle().await;
    h.update(figures(1.0));
    h.update(figures(2.0));
    h.update(figures(3.0));
    settle().await;
    tokio::time::advance(Duration::from_secs(4)).await;
    settle().await;
    assert!(
        sink.batches().is_empty(),
        "pushed before the debounce ended"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    let b = sink.batches();
    assert_eq!(b.len(), 1, "one push for a burst of changes");
    assert_eq!(b[0][0].value, 3.0);
    assert!(b[0][0].timestamp.is_some());
    // The same figures again: no extra push before the interval.
    h.update(figures(3.0));
    tokio::time::advance(Duration::from_secs(30)).await;
    settle().await;
    assert_eq!(sink.batches().len(), 1);
    // The interval pushes the current figures even when unchanged.
    tokio::time::advance(Duration::from_secs(31)).await;
    settle().await;
    assert_eq!(sink.batches().len(), 2);
    tokio::time::advance(Duration::from_secs(60)).await;
    settle().await;
    assert_eq!(sink.batches().len(), 3);
    assert_eq!(h.metrics().pushes_total("fake"), 3);
    p.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn retries_with_backoff_then_delivers() {
    let sink = FakeSink::new(2, retryable());
    let cancel = CancellationToken::new();
    let p = Pusher::spawn(
        opts(),
        vec![sink.clone()],
        PushMetrics::new(),
        cancel.clone(),
    );
    let h = p.handle();
    settle().await;
    h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    settle().await;
    assert_eq!(h.metrics().failures_total("fake"), 1);
    assert!(sink.batches().is_empty());
    // The bus's backoff from retry_min (1 s): the first retry within
    // 1..2 s, the second 2..4 s after it (jitter below a factor of two).
    tokio::time::advance(Duration::from_secs(2)).await;
    settle().await;
    assert_eq!(h.metrics().failures_total("fake"), 2);
    tokio::time::advance(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(sink.batches().len(), 1);
    assert_eq!(sink.batches()[0][0].name, "Heartbeat");
    assert_eq!(h.metrics().retries_total("fake"), 2);
    assert_eq!(h.metrics().pushes_total("fake"), 1);
    p.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn gives_up_after_max_attempts_and_on_fatal_errors() {
    let sink = FakeSink::new(100, retryable());
    let cancel = CancellationToken::new();
    let p = Pusher::spawn(
        opts(),
        vec![sink.clone()],
        PushMetrics::new(),
        cancel.clone(),
    );
    let h = p.handle();
    settle().await;
    h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    for _ in 0..10 {
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
    }
    assert_eq!(h.metrics().failures_total("fake"), 3);
    assert_eq!(
        h.metrics()
            .dropped_total("fake", DropReason::RetriesExhausted),
        1
    );
    p.shutdown().await;

    let fatal = PushError::Api {
        target: "fake",
        status: 403,
        code: Some("SignatureDoesNotMatch".into()),
        message: "no".into(),
        retryable: false,
        auth: true,
    };
    let sink = FakeSink::new(100, fatal);
    let p = Pusher::spawn(
        opts(),
        vec![sink.clone()],
        PushMetrics::new(),
        CancellationToken::new(),
    );
    let h = p.handle();
    settle().await;
    h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    for _ in 0..5 {
        tokio::time::advance(Duration::from_secs(5)).await;
        settle().await;
    }
    assert_eq!(
        h.metrics().failures_total("fake"),
        1,
        "a fatal error is not retried"
    );
    assert_eq!(h.metrics().dropped_total("fake", DropReason::Fatal), 1);
    p.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_target_never_blocks_the_caller_and_the_queue_is_bounded() {
    let sink = Arc::new(FakeSink {
        got: Mutex::new(Vec::new()),
        fail: AtomicU32::new(0),
        error: retryable(),
        hang: true,
    });
    let cancel = CancellationToken::new();
    let p = Pusher::spawn(
        opts(),
        vec![sink.clone()],
        PushMetrics::new(),
        cancel.clone(),
    );
    let h = p.handle();
    settle().await;
    let wall = std::time::Instant::now();
    for i in 0..1000 {
        h.update(figures(i as f64));
        h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    }
    assert!(wall.elapsed() < Duration::from_secs(1));
    for _ in 0..6 {
        tokio::time::advance(Duration::from_secs(30)).await;
        settle().await;
    }
    let m = h.metrics();
    // 1000 one-off batches into a queue of 4: most were dropped, counted.
    assert!(
        m.dropped_total("fake", DropReason::QueueFull) >= 990,
        "{}",
        m.dropped_total("fake", DropReason::QueueFull)
    );
    assert!(m.failures_total("fake") >= 1, "timeouts count as failures");
    p.shutdown().await;
    assert!(m.dropped_total("fake", DropReason::Shutdown) >= 1);
}

#[tokio::test(start_paused = true)]
async fn targets_are_independent() {
    let dead = Arc::new(FakeSink {
        got: Mutex::new(Vec::new()),
        fail: AtomicU32::new(0),
        error: retryable(),
        hang: true,
    });
    struct Named(Arc<FakeSink>);
    #[async_trait]
    impl Sink for Named {
        fn target(&self) -> &str {
            "alive"
        }
        async fn push(&self, s: &[Sample]) -> Result<(), PushError> {
            self.0.push(s).await
        }
    }
    let alive = FakeSink::new(0, retryable());
    let p = Pusher::spawn(
        opts(),
        vec![dead.clone(), Arc::new(Named(alive.clone()))],
        PushMetrics::new(),
        CancellationToken::new(),
    );
    let h = p.handle();
    settle().await;
    h.send(vec![Sample::heartbeat(Unit::COUNTER)]).unwrap();
    settle().await;
    assert_eq!(alive.batches().len(), 1);
    p.shutdown().await;
}

#[test]
fn backoff_grows_and_is_capped() {
    // The bus's backoff; its jitter stays within a factor of two.
    let min = Duration::from_secs(1);
    let max = Duration::from_secs(60);
    for _ in 0..50 {
        let d1 = retry_delay(1, min, max);
        assert!(d1 >= Duration::from_millis(500) && d1 <= min * 2, "{d1:?}");
        let d3 = retry_delay(3, min, max);
        assert!(
            d3 >= Duration::from_secs(2) && d3 <= Duration::from_secs(8),
            "{d3:?}"
        );
        let d30 = retry_delay(30, min, max);
        assert!(d30 >= Duration::from_secs(30) && d30 <= max, "{d30:?}");
    }
}
