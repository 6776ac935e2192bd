//! `placement.request` / `placement.reply` on the bus.
//!
//! The broker agent consumes the durable queue [`QUEUE`], bound to
//! [`routing::PLACEMENT`]. Each request is decoded (bounded), its signature,
//! signer role and time are checked, the engine decides (on a blocking
//! thread: scripts and commands may take their timeout), and a signed
//! `placement.reply` goes to the request's `reply_to` with its
//! `correlation_id`. The request is acknowledged only after the reply was
//! confirmed by the broker; a reply that could not be sent for a retryable
//! reason puts the request back on the queue.
//!
//! A malformed, forged, expired or wrongly signed request is answered with
//! a refusal when it has a reply address, logged, and acknowledged: sending
//! it again would not make it valid.
//!
//! Nodes an operator cordoned ([`ServeOptions::cordoned`]) are taken out of
//! every request's candidates before the filters, and listed in the reply's
//! `filtered` as `cordoned`.
//!
//! A placement has no side effect, so a request seen twice (a redelivery, a
//! replay within the time window) is simply answered twice; requests are
//! decided concurrently (up to [`ServeOptions::concurrency`]).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use gearshift_bus::{ConsumeOptions, Delivery, OutMessage, QueueSpec, SharedBus};
use gearshift_proto::msg::{
    FilteredNode, Kind, Message, NodeProperties, PlacementReply, PlacementRequest,
};
use gearshift_proto::sign::{KeyPair, Keyring, TimePolicy};
use gearshift_proto::{Envelope, Expect, Gate, Step, routing};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::engine::Engine;

/// The durable queue the broker agent consumes placement requests from.
pub const QUEUE: &str = "gearshift.broker.placement";

/// How long a reply stays valid (its `expires`).
pub const REPLY_TTL: Duration = Duration::from_secs(60);

/// The fleet as the broker agent knows it, for requests that carry no
/// candidate nodes (`gearshift-broker place` without `--node`).
pub type FleetSource = Arc<dyn Fn() -> Vec<NodeProperties> + Send + Sync>;

/// Nodes an operator cordoned: never chosen, whoever lists them.
pub type CordonSource = Arc<dyn Fn() -> BTreeSet<String> + Send + Sync>;

/// Tuning of [`serve_with`].
#[derive(Clone)]
pub struct ServeOptions {
    /// The queue consumed and its bindings. Default: the durable [`QUEUE`]
    /// bound to `placement.request` (tests use a transient queue and a key
    /// of their own).
    pub queue: QueueSpec,
    /// Requests decided at once (and unacknowledged deliveries in flight). Default 8.
    pub concurrency: u16,
    /// Accepted clock skew and expiry checks. Default: 5 minutes either way.
    pub time: TimePolicy,
    /// Candidates for requests whose `nodes` is empty. Default none: such
    /// requests are refused.
    pub fleet: Option<FleetSource>,
    /// Notified (`notify_one`) once the queue is declared, bound and
    /// consumed, so that a caller can wait for readiness. Default none.
    pub ready: Option<Arc<tokio::sync::Notify>>,
    /// Cordoned nodes, removed from every request's candidates (reported in
    /// `filtered` as `cordoned`). Default none.
    pub cordoned: Option<CordonSource>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            queue: QueueSpec::durable(QUEUE, vec![routing::PLACEMENT.to_string()]),
            concurrency: 8,
            time: TimePolicy::default(),
            fleet: None,
            ready: None,
            cordoned: None,
        }
    }
}

impl std::fmt::Debug for ServeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeOptions")
            .field("queue", &self.queue)
            .field("concurrency", &self.concurrency)
            .field("time", &self.time)
            .field("fleet", &self.fleet.is_some())
            .field("ready", &self.ready.is_some())
            .field("cordoned", &self.cordoned.is_some())
            .finish()
    }
}

/// Serves placement requests until `token` is cancelled, then finishes the
/// requests in flight and returns. Fails only when the queue cannot be
/// consumed at all.
pub async fn serve(
    bus: SharedBus,
    engine: Engine,
    signer: Arc<KeyPair>,
    keyring: Arc<Keyring>,
    agent_name: impl Into<String>,
    token: CancellationToken,
) -> Result<(), gearshift_bus::BusError> {
    serve_with(
        bus,
        engine,
        signer,
        keyring,
        agent_name,
        token,
        ServeOptions::default(),
    )
    .await
}

struct Ctx {
    bus: SharedBus,
    engine: Engine,
    signer: Arc<KeyPair>,
    keyring: Arc<Keyring>,
    agent: String,
    opts: ServeOptions,
}

/// [`serve`] with explicit options.
pub async fn serve_with(
    bus: SharedBus,
    engine: Engine,
    signer: Arc<KeyPair>,
    keyring: Arc<Keyring>,
    agent_name: impl Into<String>,
    token: CancellationToken,
    opts: ServeOptions,
) -> Result<(), gearshift_bus::BusError> {
    let concurrency = opts.concurrency.max(1);
    let mut sub = bus
        .consume(
            &opts.queue,
            ConsumeOptions {
                prefetch: concurrency,
            },
        )
        .await?;
    let ctx = Arc::new(Ctx {
        bus,
        engine,
        signer,
        keyring,
        agent: agent_name.into(),
        opts,
    });
    tracing::info!(queue = %ctx.opts.queue.name, strategy = %ctx.engine.config().strategy, "placement service ready");
    if let Some(ready) = &ctx.opts.ready {
        ready.notify_one();
    }
    let slots = Arc::new(Semaphore::new(usize::from(concurrency)));
    let tracker = TaskTracker::new();
    loop {
        let d = tokio::select! {
            biased;
            _ = token.cancelled() => break,
            d = sub.next() => d,
        };
        let Some(d) = d else {
            tracing::warn!("placement queue consumer ended (bus closed)");
            break;
        };
        let Ok(permit) = slots.clone().acquire_owned().await else {
            break;
        };
        let ctx = ctx.clone();
        tracker.spawn(async move {
            handle(&ctx, d).await;
            drop(permit);
        });
    }
    tracker.close();
    tracker.wait().await;
    drop(sub);
    tracing::info!("placement service stopped");
    Ok(())
}

/// Takes the cordoned nodes out of `req`'s candidates; returns their names.
fn without_cordoned(req: &mut PlacementRequest, cordoned: Option<&CordonSource>) -> Vec<String> {
    let Some(source) = cordoned else {
        return vec![];
    };
    let set = source();
    if set.is_empty() {
        return vec![];
    }
    let mut out = vec![];
    req.nodes.retain(|n| {
        let keep = !set.contains(&n.name);
        if !keep {
            out.push(n.name.clone());
        }
        keep
    });
    out
}

/// A request that cannot be served, and why.
fn refuse(reason: String) -> PlacementReply {
    PlacementReply {
        node: None,
        refused: Some(reason),
        strategy: String::new(),
        candidates: 0,
        filtered: vec![],
    }
}

async fn handle(ctx: &Ctx, d: Delivery) {
    let reply_to = d.reply_to.clone();
    let correlation_id = d.correlation_id.clone();
    let (reply, corr) = match check(ctx, &d) {
        Err(reason) => {
            tracing::warn!(
                reply_to = ?reply_to,
                bytes = d.payload.len(),
                %reason,
                "placement request refused before deciding"
            );
            (refuse(reason), None)
        }
        Ok((env, mut req)) => {
            if req.nodes.is_empty()
                && let Some(fleet) = &ctx.opts.fleet
            {
                req.nodes = fleet();
            }
            let cordoned = without_cordoned(&mut req, ctx.opts.cordoned.as_ref());
            let engine = ctx.engine.clone();
            let app = req.app.name.clone();
            let mut reply = tokio::task::spawn_blocking(move || engine.place(&req))
                .await
                .unwrap_or_else(|e| refuse(format!("placement failed internally: {e}")));
            reply
                .filtered
                .extend(cordoned.into_iter().map(|node| FilteredNode {
                    node,
                    filter: "cordoned".into(),
                }));
            tracing::info!(
                from = %env.from,
                id = %env.id,
                %app,
                strategy = %reply.strategy,
                node = ?reply.node,
                refused = ?reply.refused,
                "placement request answered"
            );
            (reply, Some(env.corr.unwrap_or_else(|| env.id.to_string())))
        }
    };
    let Some(queue) = reply_to else {
        tracing::warn!("placement request without reply_to: nobody to answer");
        if let Err(e) = d.ack().await {
            tracing::warn!(error = %e, "acknowledging a placement request failed");
        }
        return;
    };
    let mut env = Envelope::new(ctx.agent.clone(), reply).with_ttl(REPLY_TTL);
    env.corr = corr;
    let payload = ctx.signer.seal(env);
    let msg = OutMessage {
        key: queue.clone(),
        payload: payload.into(),
        reply_to: None,
        correlation_id,
        persistent: false,
    };
    match ctx.bus.send_to_queue(&queue, msg).await {
        Ok(()) => {
            if let Err(e) = d.ack().await {
                tracing::warn!(error = %e, "acknowledging a placement request failed");
            }
        }
        Err(e) if e.is_retryable() => {
            tracing::warn!(error = %e, %queue, "placement reply not sent; request requeued");
            if let Err(e) = d.nack(true).await {
                tracing::warn!(error = %e, "requeueing a placement request failed");
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, %queue, "placement reply cannot be sent; request dropped");
            if let Err(e) = d.ack().await {
                tracing::warn!(error = %e, "acknowledging a placement request failed");
            }
        }
    }
}

fn check(ctx: &Ctx, d: &Delivery) -> Result<(Header, PlacementRequest), String> {
    const REQUESTS: Expect = Expect::kinds(|k| k == Kind::PlacementRequest);
    let admitted = Gate::new(&ctx.keyring, ctx.opts.time)
        .admit(&d.payload, REQUESTS, Utc::now())
        .map_err(|r| match r.step {
            Step::Decode => format!("malformed request: {}", r.detail),
            Step::Kind => format!("expected a placement.request, got {}", r.kind_label()),
            Step::Auth | Step::Time => format!("not authenticated: {}", r.detail),
        })?;
    let Envelope {
        id,
        from,
        corr,
        msg,
        ..
    } = admitted.envelope;
    match msg {
        Message::PlacementRequest(req) => Ok((Header { id, from, corr }, req)),
        other => Err(format!(
            "expected a placement.request, got {}",
            other.kind()
        )),
    }
}

/// Who asked, for logs and the reply's `corr`.
struct Header {
    id: uuid::Uuid,
    from: String,
    corr: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cordoned_nodes_leave_the_candidates() {
        let mut req: PlacementRequest = serde_json::from_value(serde_json::json!({
            "nodes": [{"name": "a", "node_consumed_capacity": 1.0, "active": true},
                      {"name": "b", "node_consumed_capacity": 1.0, "active": true}],
            "app": {"id": "x", "name": "x", "scalable": false, "ha": false},
            "current_gears": [], "components": [],
            "user": {"id": "u", "login": "u", "consumed_gears": 0, "capabilities": {}, "plan_id": null},
            "request_time": "2026-11-22T10:00:00Z"
        }))
        .unwrap();
        assert!(without_cordoned(&mut req, None).is_empty());
        let src: CordonSource = Arc::new(|| BTreeSet::from(["b".to_string()]));
        assert_eq!(
            without_cordoned(&mut req, Some(&src)),
            vec!["b".to_string()]
        );
        assert_eq!(req.nodes.len(), 1);
        assert_eq!(req.nodes[0].name, "a");
    }
}
