//! The [`Pusher`]: samples in from an agent without ever blocking it,
//! pushed out to each target on an interval and soon after a change, with a
//! bounded queue, retries with backoff, and every failure counted.
//!
//! ## How samples flow
//! - [`PushHandle::update`] replaces the agent's *current figures* (a
//!   `watch` channel: the latest value wins, the call never waits). Each
//!   target pushes them every `interval`, stamped with the time of the
//!   push (an alarm wants one datapoint per period), and `debounce` after
//!   they change, so that a burst of changes makes one push.
//! - [`PushHandle::send`] queues a one-off batch (a heartbeat that fires an
//!   alarm). It goes through a `broadcast` channel: sending never waits;
//!   a target that falls behind loses the oldest batches, counted.
//!
//! Each target has its own task and its own bounded queue, so a dead
//! Gnocchi never delays CloudWatch, and neither delays the agent. A batch
//! that fails with a retryable error ([`PushError::is_retryable`]) is tried
//! again after an exponential backoff with jitter, up to `max_attempts`;
//! one that fails for good is dropped at once. The queue keeps at most
//! `queue_capacity` batches: when full, the oldest is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use chrono::Utc;
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::PushError;
use crate::metrics::{DropReason, FailureKind, PushMetrics};
use crate::sample::{Sample, same_figures};

/// A push target.
#[async_trait]
pub trait Sink: Send + Sync {
    /// The target's name in metrics and logs (`cloudwatch`, `gnocchi`).
    fn target(&self) -> &str;
    /// Pushes one batch (timestamps already set).
    async fn push(&self, samples: &[Sample]) -> Result<(), PushError>;
}

#[async_trait]
impl Sink for crate::cloudwatch::CloudWatchClient {
    fn target(&self) -> &str {
        "cloudwatch"
    }
    async fn push(&self, samples: &[Sample]) -> Result<(), PushError> {
        self.put_metric_data(samples).await
    }
}

#[async_trait]
impl Sink for crate::gnocchi::GnocchiClient {
    fn target(&self) -> &str {
        "gnocchi"
    }
    async fn push(&self, samples: &[Sample]) -> Result<(), PushError> {
        crate::gnocchi::GnocchiClient::push(self, samples).await
    }
}

/// Timing and bounds of a [`Pusher`].
#[derive(Debug, Clone)]
pub struct PusherOptions {
    /// Push the current figures this often.
    pub interval: Duration,
    /// Push soon after the figures change.
    pub on_change: bool,
    /// How long after a change to push.
    pub debounce: Duration,
    /// Batches kept per target; the oldest goes when full.
    pub queue_capacity: usize,
    /// Attempts per batch, the first included.
    pub max_attempts: u32,
    /// First retry delay.
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Longest one attempt may take (on top of the clients' own timeouts).
    pub attempt_timeout: Duration,
}

impl Default for PusherOptions {
    fn default() -> Self {
        PusherOptions {
            interval: Duration::from_secs(60),
            on_change: true,
            debounce: Duration::from_secs(5),
            queue_capacity: 64,
            max_attempts: 5,
            retry_min: Duration::from_secs(1),
            retry_max: Duration::from_secs(60),
            attempt_timeout: Duration::from_secs(30),
        }
    }
}

type Figures = Option<Arc<Vec<Sample>>>;

/// The agent's side of a [`Pusher`]: cheap to clone, never blocks.
#[derive(Debug, Clone)]
pub struct PushHandle {
    figures: Arc<watch::Sender<Figures>>,
    events: broadcast::Sender<Arc<Vec<Sample>>>,
    metrics: PushMetrics,
}

impl PushHandle {
    /// Replaces the current figures. Returns at once.
    pub fn update(&self, samples: Vec<Sample>) {
        self.figures.send_replace(Some(Arc::new(samples)));
    }

    /// Queues a one-off batch (a heartbeat). Returns at once; fails only
    /// when no target is running any more.
    pub fn send(&self, samples: Vec<Sample>) -> Result<(), PushError> {
        self.events
            .send(Arc::new(samples))
            .map(|_| ())
            .map_err(|_| PushError::Stopped)
    }

    /// The counters.
    pub fn metrics(&self) -> &PushMetrics {
        &self.metrics
    }
}

/// Pushes samples to its targets in the background.
#[derive(Debug)]
pub struct Pusher {
    handle: PushHandle,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

impl Pusher {
    /// Starts one task per sink. They stop when `cancel` is cancelled
    /// (batches still queued are counted as dropped).
    pub fn spawn(
        opts: PusherOptions,
        sinks: Vec<Arc<dyn Sink>>,
        metrics: PushMetrics,
        cancel: CancellationToken,
    ) -> Pusher {
        Self::spawn_in(opts, sinks, metrics, cancel, &TaskTracker::new())
    }

    /// Like [`Pusher::spawn`], each task also tracked by `parent` (the
    /// agent's shutdown tree, which then waits for the pusher too).
    pub fn spawn_in(
        opts: PusherOptions,
        sinks: Vec<Arc<dyn Sink>>,
        metrics: PushMetrics,
        cancel: CancellationToken,
        parent: &TaskTracker,
    ) -> Pusher {
        let capacity = opts.queue_capacity.max(1);
        let (figures, _) = watch::channel(None);
        let (events, _) = broadcast::channel(capacity);
        let tracker = TaskTracker::new();
        for sink in sinks {
            let worker = Worker {
                figures: figures.subscribe(),
                events: events.subscribe(),
                target: sink.target().to_string(),
                sink,
                opts: opts.clone(),
                metrics: metrics.clone(),
                cancel: cancel.clone(),
                queue: VecDeque::new(),
                last_figures: None,
            };
            tracker.spawn(parent.track_future(worker.run()));
        }
        tracker.close();
        Pusher {
            handle: PushHandle {
                figures: Arc::new(figures),
                events,
                metrics,
            },
            tracker,
            cancel,
        }
    }

    /// The agent's handle.
    pub fn handle(&self) -> PushHandle {
        self.handle.clone()
    }

    /// Stops the tasks and waits for them.
    pub async fn shutdown(self) {
        self.cancel.cancel();
        self.tracker.wait().await;
    }

    /// Waits until every task has stopped (after the token is cancelled).
    pub async fn stopped(&self) {
        self.tracker.wait().await;
    }
}

struct Pending {
    samples: Vec<Sample>,
    attempts: u32,
    not_before: Instant,
}

struct Worker {
    figures: watch::Receiver<Figures>,
    events: broadcast::Receiver<Arc<Vec<Sample>>>,
    target: String,
    sink: Arc<dyn Sink>,
    opts: PusherOptions,
    metrics: PushMetrics,
    cancel: CancellationToken,
    queue: VecDeque<Pending>,
    last_figures: Figures,
}

/// The delay before attempt `attempts + 1` (after `attempts` failed):
/// the bus's reconnect backoff, exponential from `min` to `max` with
/// jitter (which spreads the retries of many nodes after an outage).
fn retry_delay(attempts: u32, min: Duration, max: Duration) -> Duration {
    gearshift_bus::backoff(attempts.saturating_sub(1), min, max)
}

fn stamp(samples: &[Sample]) -> Vec<Sample> {
    let now = Utc::now();
    samples
        .iter()
        .map(|s| Sample {
            timestamp: Some(s.timestamp.unwrap_or(now)),
            ..s.clone()
        })
        .collect()
}

impl Worker {
    async fn run(mut self) {
        let mut next_tick = Instant::now() + self.opts.interval;
        let mut debounce: Option<Instant> = None;
        let mut figures_open = true;
        let mut events_open = true;
        loop {
            let retry_at = self.queue.front().map(|p| p.not_before);
            tokio::select! {
                biased;
                _ = self.cancel.cancelled() => break,
                r = self.figures.changed(), if figures_open => match r {
                    Ok(()) => {
                        let current = self.figures.borrow_and_update().clone();
                        let changed = match (&current, &self.last_figures) {
                            (Some(c), Some(l)) => !same_figures(c, l),
                            (Some(_), None) => true,
                            (None, _) => false,
                        };
                        if self.opts.on_change && changed && debounce.is_none() {
                            debounce = Some(Instant::now() + self.opts.debounce);
                        }
                    }
                    Err(_) => figures_open = false,
                },
                r = self.events.recv(), if events_open => match r {
                    Ok(batch) => self.enqueue(stamp(&batch)),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::warn!(target = %self.target, dropped = n, "push queue full: dropped the oldest one-off batches");
                        for _ in 0..n {
                            self.metrics.drop_batch(&self.target, DropReason::QueueFull);
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => events_open = false,
                },
                _ = tokio::time::sleep_until(next_tick) => {
                    self.push_figures();
                    next_tick = Instant::now() + self.opts.interval;
                }
                _ = sleep_until_opt(debounce), if debounce.is_some() => {
                    debounce = None;
                    self.push_figures();
                    next_tick = Instant::now() + self.opts.interval;
                }
                _ = sleep_until_opt(retry_at), if retry_at.is_some() => {
                    if !self.attempt().await {
                        break;
                    }
                }
            }
            if !figures_open && !events_open && self.queue.is_empty() {
                break;
            }
        }
        let left = self.queue.len();
        if left > 0 {
            tracing::info!(target = %self.target, batches = left, "pusher stopping with batches unsent");
            for _ in 0..left {
                self.metrics.drop_batch(&self.target, DropReason::Shutdown);
            }
        }
        self.metrics.set_depth(&self.target, 0);
    }

    /// Queues the current figures, if there are any.
    fn push_figures(&mut self) {
        let current = self.figures.borrow().clone();
        if let Some(c) = current {
            if !c.is_empty() {
                self.enqueue(stamp(&c));
            }
            self.last_figures = Some(c);
        }
    }

    fn enqueue(&mut self, samples: Vec<Sample>) {
        if samples.is_empty() {
            return;
        }
        while self.queue.len() >= self.opts.queue_capacity.max(1) {
            self.queue.pop_front();
            self.metrics.drop_batch(&self.target, DropReason::QueueFull);
            tracing::warn!(target = %self.target, "push queue full: dropped the oldest batch");
        }
        self.queue.push_back(Pending {
            samples,
            attempts: 0,
            not_before: Instant::now(),
        });
        self.metrics.set_depth(&self.target, self.queue.len());
    }

    /// Tries the batch at the front. Returns false when cancelled meanwhile.
    async fn attempt(&mut self) -> bool {
        let Some(p) = self.queue.front_mut() else {
            return true;
        };
        if p.attempts > 0 {
            self.metrics.retried(&self.target);
        }
        p.attempts += 1;
        let attempts = p.attempts;
        let n = p.samples.len();
        let result = tokio::select! {
            _ = self.cancel.cancelled() => return false,
            r = tokio::time::timeout(self.opts.attempt_timeout, self.sink.push(&p.samples)) => {
                r.unwrap_or_else(|_| Err(PushError::Transport {
                    target: "pusher",
                    message: format!("attempt timed out after {:?}", self.opts.attempt_timeout),
                }))
            }
        };
        match result {
            Ok(()) => {
                self.metrics.delivered(&self.target, n);
                self.queue.pop_front();
                tracing::debug!(target = %self.target, samples = n, "pushed");
            }
            Err(e) if e.is_retryable() && attempts < self.opts.max_attempts => {
                self.metrics.failed(&self.target, FailureKind::Retryable);
                let delay = retry_delay(attempts, self.opts.retry_min, self.opts.retry_max);
                tracing::warn!(target = %self.target, attempt = attempts, retry_in = ?delay, error = %e, "push failed; will retry");
                if let Some(p) = self.queue.front_mut() {
                    p.not_before = Instant::now() + delay;
                }
            }
            Err(e) => {
                let (kind, reason) = if e.is_retryable() {
                    (FailureKind::Retryable, DropReason::RetriesExhausted)
                } else {
                    (FailureKind::Fatal, DropReason::Fatal)
                };
                self.metrics.failed(&self.target, kind);
                self.metrics.drop_batch(&self.target, reason);
                self.queue.pop_front();
                tracing::error!(target = %self.target, attempt = attempts, error = %e, auth = e.is_auth(), "push failed; batch dropped");
            }
        }
        self.metrics.set_depth(&self.target, self.queue.len());
        true
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
