//! What the benchmark measures with besides the broker agent's own
//! metrics: a bare lapin consumer of the same reports (what the bus itself
//! delivers), a sampler of a process's resident memory, and a wait for a
//! metric to settle.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use gearshift_proto::routing;
use tokio_util::sync::CancellationToken;

use crate::harness::{metrics, process};

/// A bare lapin consumer of every report on its own thread and runtime.
pub(super) struct RawConsumer {
    count: Arc<AtomicU64>,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
}

impl RawConsumer {
    /// Counts the reports whose routing key starts with `prefix` (this run's
    /// fleet: other publishers may share the bus).
    pub(super) async fn start(url: &str, prefix: String) -> anyhow::Result<RawConsumer> {
        let count = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (c, s, u) = (count.clone(), stop.clone(), url.to_string());
        let thread = std::thread::Builder::new()
            .name("raw-consumer".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(raw_consume(u, prefix, c, s, ready_tx))
            })?;
        ready_rx
            .await
            .context("the raw consumer did not start")?
            .map_err(|e| anyhow::anyhow!("raw consumer: {e}"))?;
        Ok(RawConsumer {
            count,
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub(super) fn stop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

async fn raw_consume(
    url: String,
    prefix: String,
    count: Arc<AtomicU64>,
    stop: CancellationToken,
    ready: tokio::sync::oneshot::Sender<Result<(), String>>,
) -> anyhow::Result<()> {
    use lapin::options::{BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;
    let setup = async {
        let conn = lapin::Connection::connect(
            &url,
            lapin::ConnectionProperties::default()
                .with_connection_name("gearshift-sim bench raw consumer".into()),
        )
        .await?;
        let ch = conn.create_channel().await?;
        let q = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        ch.queue_bind(
            q.name().clone(),
            routing::EXCHANGE.into(),
            routing::ALL_REPORTS.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;
        let consumer = ch
            .basic_consume(
                q.name().clone(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        Ok::<_, lapin::Error>((conn, consumer))
    };
    let (conn, mut consumer) = match setup.await {
        Ok(x) => {
            let _ = ready.send(Ok(()));
            x
        }
        Err(e) => {
            let _ = ready.send(Err(e.to_string()));
            return Ok(());
        }
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            d = consumer.next() => match d {
                Some(Ok(d)) => {
                    if d.routing_key.as_str().starts_with(&prefix) {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                }
                _ => break,
            },
        }
    }
    let _ = conn.close(200, "done".into()).await;
    Ok(())
}

/// Samples a process's resident memory; the largest sample wins.
pub(super) struct RssSampler {
    peak_kb: Arc<AtomicU64>,
    stop: CancellationToken,
}

impl RssSampler {
    pub(super) fn start(pid: u32, every: Duration) -> RssSampler {
        let peak_kb = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let (p, s) = (peak_kb.clone(), stop.clone());
        tokio::spawn(async move {
            let mut t = tokio::time::interval(every);
            loop {
                tokio::select! {
                    _ = s.cancelled() => break,
                    _ = t.tick() => {
                        if let Some(mb) = process::rss_mb(pid) {
                            p.fetch_max((mb * 1024.0) as u64, Ordering::Relaxed);
                        }
                    }
                }
            }
        });
        RssSampler { peak_kb, stop }
    }

    pub(super) fn peak_mb(&self) -> f64 {
        self.peak_kb.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub(super) enum Settled {
    Reached,
    /// The figure stopped growing (for 3 s) at this value.
    Stalled(f64),
}

/// Polls metric `name` until it reaches `at_least`, or returns once it has
/// not grown for 3 s; fails after `within`.
pub(super) async fn wait_settled(
    port: u16,
    name: &str,
    at_least: f64,
    within: Duration,
) -> anyhow::Result<Settled> {
    let deadline = Instant::now() + within;
    let (mut last, mut since) = (-1.0, Instant::now());
    loop {
        let v = metrics::scrape(port)
            .await
            .map(|m| m.get(name))
            .unwrap_or(0.0);
        if v >= at_least {
            return Ok(Settled::Reached);
        }
        if v > last {
            (last, since) = (v, Instant::now());
        } else if since.elapsed() >= Duration::from_secs(3) {
            return Ok(Settled::Stalled(v));
        }
        if Instant::now() >= deadline {
            bail!("{name} reached {v}, not {at_least}, within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
