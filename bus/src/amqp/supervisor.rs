//! The supervisor: the first connection, reconnects with the bus's
//! [`Backoff`], restoring the topology (queues, bindings, consumers) on each
//! new connection, and the repair of consumers that ended on a live one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, timeout, timeout_at};

use super::link::{Endpoint, Link};
use super::topology::{self, Source, Start, Topology};
use super::{CLOSE_WAIT, Shared, State};
use crate::ConnectOptions;
use crate::api::{BusEvent, Durability, QueueSpec};
use crate::backoff::Backoff;
use crate::error::BusError;

/// The first connection, retried within `connect_timeout` while the broker is unreachable.
pub(super) async fn first_link(
    endpoint: &Endpoint,
    opts: &ConnectOptions,
) -> Result<Arc<Link>, BusError> {
    let deadline = Instant::now() + opts.connect_timeout;
    let mut delays = Backoff::reconnect(opts).delays();
    let mut last: Option<BusError> = None;
    loop {
        let err = match timeout_at(deadline, Link::open(endpoint, 0)).await {
            Ok(Ok(link)) => return Ok(link),
            Ok(Err(e)) if !e.is_retryable() => return Err(e),
            Ok(Err(e)) => e,
            Err(_) => {
                let why = last
                    .map(|e| format!(": last error: {e}"))
                    .unwrap_or_default();
                return Err(BusError::Connect {
                    endpoint: endpoint.display.clone(),
                    reason: format!("no connection within {:?}{why}", opts.connect_timeout),
                });
            }
        };
        let delay = delays.next_delay();
        if Instant::now() + delay >= deadline {
            return Err(err);
        }
        tracing::debug!(endpoint = %endpoint.display, error = %err, "AMQP connect failed; retrying");
        last = Some(err);
        tokio::time::sleep(delay).await;
    }
}

/// (Re)starts every wanted consumer that does not run on `link`; returns how many failed.
async fn restore_consumers(
    shared: &Arc<Shared>,
    link: &Arc<Link>,
    topo: &mut Topology,
) -> Result<usize, BusError> {
    let Topology { queues, slots, .. } = topo;
    let mut failed = 0;
    for slot in slots.values_mut() {
        if slot.dropped.is_cancelled() {
            // Being removed by its guard.
            continue;
        }
        if slot
            .running
            .as_ref()
            .is_some_and(|r| r.runs_on(link.generation))
        {
            continue;
        }
        if let Some(old) = slot.running.take()
            && old.channel.status().connected()
        {
            // The broker cancelled this consumer on a live channel: release the channel.
            tokio::spawn(async move {
                let _ = old.channel.close(200, "consumer restarted".into()).await;
            });
        }
        let spec = match &slot.source {
            Source::Queue(name) => queues.get(name),
            Source::Pattern(_) => None,
        };
        let start = Start {
            source: &slot.source,
            spec,
            prefetch: slot.prefetch,
            manual_ack: slot.manual_ack,
            tx: slot.tx.clone(),
            dropped: slot.dropped.clone(),
        };
        match timeout(shared.opts.op_timeout, topology::start(shared, link, start)).await {
            Ok(Ok(r)) => {
                shared.note_success(&slot.source.label());
                slot.running = Some(r);
            }
            Ok(Err(e)) => {
                if link.check_lost() {
                    return Err(e);
                }
                shared.note_failure(&slot.source.label(), &e);
                tracing::error!(source = ?slot.source, error = %e, "cannot restart a consumer; will retry");
                failed += 1;
            }
            Err(_) => {
                link.mark_lost("restoring a consumer timed out");
                return Err(BusError::Timeout {
                    what: format!("restarting the consumer of {:?}", slot.source),
                    after: shared.opts.op_timeout,
                });
            }
        }
    }
    Ok(failed)
}

/// A transient queue whose consumers were all dropped (their guards are
/// about to forget it): it went with them and must not come back.
fn transient_being_dropped(topo: &Topology, q: &QueueSpec) -> bool {
    if q.durability != Durability::Transient {
        return false;
    }
    let mut users = topo
        .slots
        .values()
        .filter(|s| matches!(&s.source, Source::Queue(n) if *n == q.name))
        .peekable();
    users.peek().is_some() && users.all(|s| s.dropped.is_cancelled())
}

/// Declares the whole topology on a new connection and restarts consumers.
async fn restore(shared: &Arc<Shared>, link: &Arc<Link>) -> Result<(), BusError> {
    let mut topo = shared.topo.lock().await;
    let specs: Vec<QueueSpec> = topo
        .queues
        .values()
        .filter(|q| !transient_being_dropped(&topo, q))
        .cloned()
        .collect();
    for spec in &specs {
        match timeout(shared.opts.op_timeout, topology::declare(link, spec)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                if link.check_lost() {
                    return Err(e);
                }
                tracing::error!(queue = %spec.name, error = %e, "cannot declare a queue again after reconnecting");
            }
            Err(_) => {
                link.mark_lost("restoring the topology timed out");
                return Err(BusError::Timeout {
                    what: format!("declaring queue {:?}", spec.name),
                    after: shared.opts.op_timeout,
                });
            }
        }
    }
    let failed = restore_consumers(shared, link, &mut topo).await?;
    if failed > 0 {
        shared.request_repair(link.generation);
    }
    Ok(())
}

/// Runs the repairs that consumer tasks ask for, one at a time.
pub(super) async fn repairer(
    shared: std::sync::Weak<Shared>,
    mut rx: mpsc::UnboundedReceiver<u64>,
) {
    while let Some(generation) = rx.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        if shared.closed.is_cancelled() {
            return;
        }
        repair(shared, generation).await;
    }
}

/// Restarts consumers that ended while their connection lives on, with backoff,
/// until they run or that connection is gone (the supervisor takes over then).
async fn repair(shared: Arc<Shared>, generation: u64) {
    // Slower than reconnects: the broker is there, the queue may be gone for a while.
    let policy = Backoff::new(
        shared.opts.reconnect_min.max(Duration::from_millis(100)),
        shared.opts.reconnect_max.max(Duration::from_secs(1)),
    );
    let mut attempt: u32 = 0;
    loop {
        let delay = policy.delay(attempt.min(8));
        attempt += 1;
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shared.closed.cancelled() => return,
        }
        let link = match &*shared.state.borrow() {
            State::Up(l) if l.generation == generation && !l.lost.is_cancelled() => l.clone(),
            _ => return,
        };
        let mut topo = shared.topo.lock().await;
        match restore_consumers(&shared, &link, &mut topo).await {
            Ok(0) => return,
            Ok(_) => {}
            Err(_) => return,
        }
    }
}

/// Owns the connection: waits for it to be lost, reconnects, restores.
pub(super) async fn supervise(shared: Arc<Shared>, mut link: Arc<Link>) {
    let endpoint = shared.endpoint.display.clone();
    'outer: loop {
        tokio::select! {
            _ = link.lost.cancelled() => {}
            _ = shared.closed.cancelled() => break 'outer,
        }
        if shared.closed.is_cancelled() {
            break;
        }
        let reason = link.reason();
        tracing::warn!(%endpoint, %reason, "AMQP connection lost; reconnecting");
        shared.state.send_replace(State::Down(reason.clone()));
        let _ = shared.events.send(BusEvent::Disconnected { reason });
        // A connection lost to missed heart-beats may still be half open.
        let old = link.clone();
        tokio::spawn(async move { old.close(Duration::from_secs(1)).await });

        let mut delays = Backoff::reconnect(&shared.opts).delays();
        link = loop {
            let delay = delays.next_delay();
            let attempt = delays.taken();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = shared.closed.cancelled() => break 'outer,
            }
            let generation = shared.generations.fetch_add(1, Ordering::SeqCst) + 1;
            let attempt_result = tokio::select! {
                r = timeout(shared.opts.connect_timeout, Link::open(&shared.endpoint, generation)) => r,
                _ = shared.closed.cancelled() => break 'outer,
            };
            let new = match attempt_result {
                Ok(Ok(l)) => l,
                Ok(Err(e)) => {
                    tracing::warn!(%endpoint, attempt, error = %e, "AMQP reconnect failed");
                    continue;
                }
                Err(_) => {
                    tracing::warn!(%endpoint, attempt, "AMQP reconnect timed out");
                    continue;
                }
            };
            match restore(&shared, &new).await {
                Ok(()) => break new,
                Err(e) => {
                    tracing::warn!(%endpoint, error = %e, "restoring the topology failed; reconnecting");
                    new.close(Duration::from_secs(1)).await;
                }
            }
        };
        if shared.closed.is_cancelled() {
            break;
        }
        let n = shared.reconnects.fetch_add(1, Ordering::SeqCst) + 1;
        shared.state.send_replace(State::Up(link.clone()));
        tracing::info!(%endpoint, reconnects = n, "AMQP connection restored");
        let _ = shared.events.send(BusEvent::Connected { reconnects: n });
    }
    shared.state.send_replace(State::Closed);
    link.close(CLOSE_WAIT).await;
    shared.end_subscriptions().await;
}
