//! The bus loops: the node's durable command queue and the broadcast `ping`
//! key. Each delivery goes through the [`Gate`] (decode, kind, signature and
//! role) and on to the core task, which checks time and replay and decides.
//! A bus watcher counts reconnections.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use chrono::Utc;
use std::future::Future;

use gearshift_bus::{BusError, BusEvent, ConsumeOptions, Delivery, QueueSpec, Subscription};
use gearshift_proto::msg::Kind;
use gearshift_proto::{Envelope, Expect, Gate, Refusal, TimePolicy, routing};
use gearshift_service::refusals::{RefusalLog, admit_delivery};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::driver::ToCore;
use super::shared::Shared;
use crate::core::Reply;

/// Commands on the node's queue. No time check here: a journaled
/// redelivery is answered whatever its age; the core checks the time of
/// new commands.
const COMMANDS: Expect = Expect::kinds(Kind::is_command).any_age();

fn is_ping(k: Kind) -> bool {
    k == Kind::Ping
}

/// Broadcast pings (time and replay are checked by the core, with the
/// guard directed pings share).
const PINGS: Expect = Expect::kinds(is_ping).any_age();

/// The refusal logs of the node: commands addressed to it, and broadcasts.
pub(crate) struct Refusals {
    commands: RefusalLog,
    broadcasts: RefusalLog,
}

impl Default for Refusals {
    fn default() -> Self {
        Refusals {
            commands: RefusalLog::new("command"),
            broadcasts: RefusalLog::new("broadcast message"),
        }
    }
}

/// Logs (rate-limited) and counts a refusal.
pub(crate) fn count_refusal(sh: &Shared, r: &Refusal, broadcast: bool) {
    if broadcast {
        sh.metrics.broadcast_refused(r.reason);
        sh.refusals.broadcasts.log(r);
    } else {
        sh.metrics.refused(r.reason);
        sh.refusals.commands.log(r);
    }
}

/// Runs the gate on a delivery (one dropped for its size is `too_large`).
fn admit(sh: &Shared, d: &Delivery, expect: Expect) -> Result<Envelope, Refusal> {
    let s = sh.settings();
    let policy = TimePolicy { window: s.window() };
    admit_delivery(&Gate::new(&s.keyring, policy), d, expect, Utc::now()).map(|a| a.envelope)
}

/// Consumes the node's durable command queue until `stop`; re-subscribes
/// with backoff whenever the subscription fails or ends.
pub(crate) async fn command_loop(
    sh: Arc<Shared>,
    tx: mpsc::Sender<ToCore>,
    stop: CancellationToken,
) {
    let spec = QueueSpec::node_commands(&sh.name);
    let opts = ConsumeOptions {
        prefetch: sh.limits.prefetch,
    };
    let subscribe = || sh.bus.consume(&spec, opts);
    let ready = || {
        if !sh.commands_ready.swap(true, Ordering::SeqCst) {
            sh.report_now.notify_one();
        }
    };
    forward(&sh, &tx, &stop, "commands", subscribe, ready, |d| {
        let admitted = admit(&sh, &d, COMMANDS);
        ToCore::Command(d, admitted)
    })
    .await
}

/// Takes broadcast pings until `stop`.
pub(crate) async fn ping_loop(sh: Arc<Shared>, tx: mpsc::Sender<ToCore>, stop: CancellationToken) {
    let subscribe = || sh.bus.subscribe(routing::PING);
    forward(
        &sh,
        &tx,
        &stop,
        "pings",
        subscribe,
        || {},
        |d| {
            let admitted = admit(&sh, &d, PINGS);
            let reply = Reply {
                queue: d.reply_to.clone(),
                correlation_id: d.correlation_id.clone(),
            };
            ToCore::Ping(reply, admitted)
        },
    )
    .await
}

/// Subscribes with `subscribe` (calling `subscribed` after each success)
/// and hands every delivery, as `to_core` makes it, to the core task until
/// `stop`; subscribes again with backoff whenever the subscription fails or
/// ends.
async fn forward<S>(
    sh: &Shared,
    tx: &mpsc::Sender<ToCore>,
    stop: &CancellationToken,
    what: &str,
    subscribe: impl Fn() -> S,
    subscribed: impl Fn(),
    to_core: impl Fn(Delivery) -> ToCore,
) where
    S: Future<Output = Result<Subscription, BusError>>,
{
    let mut attempt = 0u32;
    loop {
        let sub = tokio::select! {
            r = subscribe() => r,
            _ = stop.cancelled() => return,
        };
        match sub {
            Ok(mut sub) => {
                attempt = 0;
                sh.bus_connected.store(true, Ordering::SeqCst);
                subscribed();
                tracing::info!(what, "subscribed");
                loop {
                    let d = tokio::select! {
                        d = sub.next() => match d {
                            Some(d) => d,
                            None => break,
                        },
                        _ = stop.cancelled() => return,
                    };
                    if tx.send(to_core(d)).await.is_err() {
                        return;
                    }
                }
                tracing::warn!(what, "subscription ended; subscribing again");
            }
            Err(e) => tracing::warn!(what, error = %e, "cannot subscribe; retrying"),
        }
        let delay = gearshift_bus::backoff(attempt, sh.limits.retry_min, sh.limits.retry_max);
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Follows the bus connection: counts reconnections, reports after each.
pub(crate) async fn watch_bus(sh: Arc<Shared>, stop: CancellationToken) {
    let mut events = sh.bus.events();
    loop {
        tokio::select! {
            e = events.recv() => match e {
                Ok(BusEvent::Connected { reconnects }) => {
                    let was = sh.bus_connected.swap(true, Ordering::SeqCst);
                    if reconnects > 0 || was {
                        sh.metrics.bus_reconnects.inc();
                    }
                    tracing::info!(reconnects, "bus connected");
                    sh.report_now.notify_one();
                }
                Ok(BusEvent::Disconnected { reason }) => {
                    sh.bus_connected.store(false, Ordering::SeqCst);
                    tracing::warn!(%reason, "bus disconnected; local work continues");
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                    // Transports without events (memory) are always connected.
                    sh.bus_connected.store(true, Ordering::SeqCst);
                    stop.cancelled().await;
                    return;
                }
            },
            _ = stop.cancelled() => return,
        }
    }
}
