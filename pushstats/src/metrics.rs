//! Prometheus counters of the pusher, for the agents to register next to
//! their own: `<agent prefix>_pushstats_*` on their `/metrics`
//! (`gearshift_node_pushstats_pushes_total`, `gearshift_broker_pushstats_pushes_total`).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels naming a target (`cloudwatch`, `gnocchi`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TargetLabels {
    /// The target.
    pub target: String,
}

/// Whether a failure will be retried.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum FailureKind {
    /// Transport error, 5xx, throttling: retried with backoff.
    Retryable,
    /// Refused for good (bad credentials, bad request): not retried.
    Fatal,
}

/// Labels of a failure.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailureLabels {
    /// The target.
    pub target: String,
    /// Retryable or fatal.
    pub kind: FailureKind,
}

/// Why a batch was given up.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum DropReason {
    /// The target's queue was full; the oldest batch went.
    QueueFull,
    /// Every attempt failed.
    RetriesExhausted,
    /// The target refused it for good.
    Fatal,
    /// The pusher stopped with it still queued.
    Shutdown,
}

/// Labels of a dropped batch.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DropLabels {
    /// The target.
    pub target: String,
    /// Why.
    pub reason: DropReason,
}

/// The pusher's counters. Cheap to clone: clones share the values.
#[derive(Debug, Clone, Default)]
pub struct PushMetrics {
    /// Successful pushes (one per batch).
    pub pushes: Family<TargetLabels, Counter>,
    /// Samples delivered.
    pub samples: Family<TargetLabels, Counter>,
    /// Failed attempts.
    pub failures: Family<FailureLabels, Counter>,
    /// Attempts that were retries.
    pub retries: Family<TargetLabels, Counter>,
    /// Batches given up.
    pub dropped: Family<DropLabels, Counter>,
    /// Batches waiting per target.
    pub queue_depth: Family<TargetLabels, Gauge>,
    /// Unix time of the last successful push per target.
    pub last_success: Family<TargetLabels, Gauge<f64, AtomicU64>>,
}

fn t(target: &str) -> TargetLabels {
    TargetLabels {
        target: target.to_string(),
    }
}

impl PushMetrics {
    /// New counters (not registered anywhere yet).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers the counters under `pushstats_` in `registry`; give the
    /// agent's prefixed registry (`gearshift_node`, `gearshift_broker`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("pushstats");
        r.register(
            "pushes",
            "Batches of samples delivered",
            self.pushes.clone(),
        );
        r.register("samples", "Samples delivered", self.samples.clone());
        r.register(
            "failures",
            "Failed push attempts, by whether they are retried",
            self.failures.clone(),
        );
        r.register(
            "retries",
            "Push attempts that were retries",
            self.retries.clone(),
        );
        r.register(
            "dropped",
            "Batches given up, by reason",
            self.dropped.clone(),
        );
        r.register(
            "queue_depth",
            "Batches waiting to be pushed",
            self.queue_depth.clone(),
        );
        r.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful push",
            self.last_success.clone(),
        );
    }

    /// Successful pushes to `target` so far.
    pub fn pushes_total(&self, target: &str) -> u64 {
        self.pushes.get_or_create(&t(target)).get()
    }

    /// Samples delivered to `target` so far.
    pub fn samples_total(&self, target: &str) -> u64 {
        self.samples.get_or_create(&t(target)).get()
    }

    /// Failed attempts against `target` so far (retryable and fatal).
    pub fn failures_total(&self, target: &str) -> u64 {
        [FailureKind::Retryable, FailureKind::Fatal]
            .into_iter()
            .map(|kind| {
                self.failures
                    .get_or_create(&FailureLabels {
                        target: target.to_string(),
                        kind,
                    })
                    .get()
            })
            .sum()
    }

    /// Retries against `target` so far.
    pub fn retries_total(&self, target: &str) -> u64 {
        self.retries.get_or_create(&t(target)).get()
    }

    /// Batches dropped for `target` for `reason` so far.
    pub fn dropped_total(&self, target: &str, reason: DropReason) -> u64 {
        self.dropped
            .get_or_create(&DropLabels {
                target: target.to_string(),
                reason,
            })
            .get()
    }

    pub(crate) fn failed(&self, target: &str, kind: FailureKind) {
        self.failures
            .get_or_create(&FailureLabels {
                target: target.to_string(),
                kind,
            })
            .inc();
    }

    pub(crate) fn drop_batch(&self, target: &str, reason: DropReason) {
        self.dropped
            .get_or_create(&DropLabels {
                target: target.to_string(),
                reason,
            })
            .inc();
    }

    pub(crate) fn delivered(&self, target: &str, samples: usize) {
        self.pushes.get_or_create(&t(target)).inc();
        self.samples
            .get_or_create(&t(target))
            .inc_by(samples as u64);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        self.last_success.get_or_create(&t(target)).set(now);
    }

    pub(crate) fn retried(&self, target: &str) {
        self.retries.get_or_create(&t(target)).inc();
    }

    pub(crate) fn set_depth(&self, target: &str, depth: usize) {
        self.queue_depth.get_or_create(&t(target)).set(depth as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registers_and_counts() {
        let m = PushMetrics::new();
        m.failed("cloudwatch", FailureKind::Retryable);
        m.failed("cloudwatch", FailureKind::Fatal);
        m.delivered("gnocchi", 7);
        m.drop_batch("cloudwatch", DropReason::QueueFull);
        assert_eq!(m.failures_total("cloudwatch"), 2);
        assert_eq!(m.samples_total("gnocchi"), 7);
        assert_eq!(m.dropped_total("cloudwatch", DropReason::QueueFull), 1);
        let mut reg = Registry::with_prefix("gearshift_node");
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains(
                "gearshift_node_pushstats_failures_total{target=\"cloudwatch\",kind=\"Retryable\"} 1"
            ),
            "{out}"
        );
        assert!(out.contains("gearshift_node_pushstats_samples_total{target=\"gnocchi\"} 7"));
        assert!(out.contains(
            "gearshift_node_pushstats_dropped_total{target=\"cloudwatch\",reason=\"QueueFull\"} 1"
        ));
    }
}
