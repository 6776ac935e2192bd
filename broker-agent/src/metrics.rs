//! Prometheus metrics of the broker agent.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::core::Core;

type Labels = Vec<(String, String)>;

fn l(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Every metric, registered in one registry.
#[derive(Clone)]
pub struct Metrics {
    /// The registry (`/metrics`).
    pub registry: Arc<Mutex<Registry>>,
    reports: Counter,
    decisions: Family<Labels, Counter>,
    refused: Family<Labels, Counter>,
    sagas: Family<Labels, Gauge>,
    exhausted: Family<Labels, Gauge>,
    handler_calls: Family<Labels, Counter>,
    latency: Histogram,
    evaluations: Counter,
    evacuation: Family<Labels, Gauge>,
    bus_reconnects: Counter,
    bus_connected: Gauge,
    nodes: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A new registry with every metric.
    pub fn new() -> Metrics {
        let mut r = Registry::with_prefix("gearshift_broker");
        let m = Metrics {
            registry: Arc::new(Mutex::new(Registry::default())),
            reports: Counter::default(),
            decisions: Family::default(),
            refused: Family::default(),
            sagas: Family::default(),
            exhausted: Family::default(),
            handler_calls: Family::default(),
            // Fine below 100 ms, where a fleet's decision latency should be.
            latency: Histogram::new([
                0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                0.075, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0, 120.0,
            ]),
            evaluations: Counter::default(),
            evacuation: Family::default(),
            bus_reconnects: Counter::default(),
            bus_connected: Gauge::default(),
            nodes: Gauge::default(),
        };
        r.register("reports", "Node reports accepted", m.reports.clone());
        r.register(
            "decisions",
            "Decisions published, by kind",
            m.decisions.clone(),
        );
        r.register("refused", "Messages refused, by reason", m.refused.clone());
        r.register("sagas", "Operations by kind and state", m.sagas.clone());
        r.register(
            "group_exhausted",
            "1 while the cloud has no capacity for the group",
            m.exhausted.clone(),
        );
        r.register(
            "handler_calls",
            "Handler calls by call and result",
            m.handler_calls.clone(),
        );
        r.register(
            "decision_latency_seconds",
            "From the report that showed pressure to the confirmed publication of the decision",
            m.latency.clone(),
        );
        r.register("evaluations", "Policy evaluations", m.evaluations.clone());
        r.register(
            "evacuation_gears",
            "Gears of each draining node's current evacuation round, by state (moved, failed, remaining, total)",
            m.evacuation.clone(),
        );
        r.register(
            "bus_reconnects",
            "Bus connections re-established after a loss",
            m.bus_reconnects.clone(),
        );
        r.register(
            "bus_connected",
            "1 while the bus connection is up",
            m.bus_connected.clone(),
        );
        r.register(
            "nodes",
            "Nodes the agent knows from their reports (fresh or stale)",
            m.nodes.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(r)),
            ..m
        }
    }

    /// A report was accepted.
    pub fn report(&self) {
        self.reports.inc();
    }

    /// A decision was published.
    pub fn decision(&self, kind: &str) {
        self.decisions.get_or_create(&l(&[("kind", kind)])).inc();
    }

    /// A message was refused.
    pub fn refused(&self, reason: &str) {
        self.refused.get_or_create(&l(&[("reason", reason)])).inc();
    }

    /// A handler call ended.
    pub fn handler_call(&self, call: &str, result: &str) {
        self.handler_calls
            .get_or_create(&l(&[("call", call), ("result", result)]))
            .inc();
    }

    /// Decision latency, in seconds.
    pub fn latency(&self, secs: f64) {
        self.latency.observe(secs);
    }

    /// An evaluation ran.
    pub fn evaluation(&self) {
        self.evaluations.inc();
    }

    /// Counts the bus's reconnections and tracks whether it is up, until
    /// `token` is cancelled. Transports without connection events (memory)
    /// count as always connected.
    pub fn watch_bus(
        &self,
        bus: &gearshift_bus::SharedBus,
        token: tokio_util::sync::CancellationToken,
        tracker: &tokio_util::task::TaskTracker,
    ) {
        use tokio::sync::broadcast::error::RecvError;
        let m = self.clone();
        let mut events = bus.events();
        m.bus_connected.set(1);
        tracker.spawn(async move {
            loop {
                let e = tokio::select! {
                    _ = token.cancelled() => return,
                    e = events.recv() => e,
                };
                match e {
                    Ok(gearshift_bus::BusEvent::Connected { reconnects }) => {
                        if reconnects > 0 {
                            m.bus_reconnects.inc();
                        }
                        m.bus_connected.set(1);
                    }
                    Ok(gearshift_bus::BusEvent::Disconnected { .. }) => {
                        m.bus_connected.set(0);
                    }
                    Err(RecvError::Lagged(_)) => {}
                    Err(RecvError::Closed) => return,
                }
            }
        });
    }

    /// Refreshes the gauges from the core.
    pub fn refresh(&self, core: &Core) {
        self.nodes
            .set(i64::try_from(core.fleet().len()).unwrap_or(i64::MAX));
        self.sagas.clear();
        for op in core.ops() {
            self.sagas
                .get_or_create(&l(&[("kind", op.kind()), ("state", op.state())]))
                .inc();
        }
        self.evacuation.clear();
        for op in core.ops().filter(|o| !o.is_done()) {
            if let crate::ops::OpBody::ScaleDown(d) = &op.body {
                let p = d.progress;
                for (state, v) in [
                    ("moved", p.moved),
                    ("failed", p.failed),
                    ("remaining", p.remaining),
                    ("total", p.total),
                ] {
                    self.evacuation
                        .get_or_create(&l(&[("node", &d.node), ("state", state)]))
                        .set(i64::from(v));
                }
            }
        }
        self.exhausted.clear();
        for (g, s) in core.group_states() {
            self.exhausted
                .get_or_create(&l(&[("district", &g.district), ("profile", &g.profile)]))
                .set(i64::from(s.supply.exhausted.is_some()));
        }
    }
}
