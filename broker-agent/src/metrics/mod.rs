//! Prometheus metrics of the broker agent.
//!
//! Capacity gauges (per node group, and per profile with district `_all`):
//! `usage_ratio`, `available_active_gears`, `effective_available_gears`,
//! `group_nodes{state}`, `missing_nodes`, `breaker_open`, `paused`. They are
//! set from each evaluation's explanations, which already carry every
//! group's figures: no extra pass over the fleet. `docs/prometheus/` has
//! alert rules written on them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use gearshift_handlers::GroupKey;
use gearshift_proto::msg::GroupStats;
use gearshift_proto::routing::ALL;

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
    superseded: Counter,
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
    reloads: Family<Labels, Counter>,
    reload_refused: Gauge,
    enrollments: Family<Labels, Counter>,
    stale_epoch: Counter,
    capacity: Capacity,
    leader: Family<Labels, Gauge>,
    epoch: Gauge,
    takeovers: Counter,
}

/// The capacity gauges, and the label sets last set (to drop vanished groups).
#[derive(Clone, Default)]
struct Capacity {
    usage: Family<Labels, Gauge<f64, AtomicU64>>,
    available: Family<Labels, Gauge>,
    effective: Family<Labels, Gauge>,
    nodes: Family<Labels, Gauge>,
    missing: Family<Labels, Gauge>,
    breaker: Family<Labels, Gauge>,
    paused: Family<Labels, Gauge>,
    seen: Arc<Mutex<BTreeSet<(String, String)>>>,
    /// What each group's gauges were last set to: an evaluation sets only
    /// the groups whose figures changed (thousands of label look-ups
    /// otherwise, at every evaluation).
    last: Arc<Mutex<HashMap<(String, String), Figures>>>,
}

/// The figures behind one group's gauges.
type Figures = [u64; 8];

/// The states of `group_nodes`.
const NODE_STATES: [&str; 3] = ["active", "inactive", "missing"];

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
            superseded: Counter::default(),
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
            reloads: Family::default(),
            reload_refused: Gauge::default(),
            enrollments: Family::default(),
            stale_epoch: Counter::default(),
            capacity: Capacity::default(),
            leader: Family::default(),
            epoch: Gauge::default(),
            takeovers: Counter::default(),
        };
        m.capacity.register(&mut r);
        r.register("reports", "Node reports accepted", m.reports.clone());
        r.register(
            "reports_superseded",
            "Node reports dropped unverified because a newer one of the same node came in the same batch",
            m.superseded.clone(),
        );
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
        r.register(
            "config_reloads",
            "Configuration reloads (SIGHUP), by result (applied, refused)",
            m.reloads.clone(),
        );
        r.register(
            "config_reload_refused",
            "1 while the last reload was refused: the file on disk is not what runs",
            m.reload_refused.clone(),
        );
        r.register(
            "enrollments",
            "Node enrollment requests, by result (enrolled, already_enrolled, or the refusal reason)",
            m.enrollments.clone(),
        );
        r.register(
            "stale_epoch",
            "Commands nodes refused as older than the newest leader epoch they have seen (this agent was deposed or is behind)",
            m.stale_epoch.clone(),
        );
        r.register(
            "leader",
            "1 while this agent leads its cluster, 0 while it stands by",
            m.leader.clone(),
        );
        r.register(
            "epoch",
            "The epoch this agent leads with (0 while it stands by)",
            m.epoch.clone(),
        );
        r.register(
            "takeovers",
            "Times this agent took over the lead",
            m.takeovers.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(r)),
            ..m
        }
    }

    /// The agent's role: leading with `epoch`, or standing by (`None`).
    pub fn lead(&self, agent: &str, epoch: Option<u64>) {
        self.leader
            .get_or_create(&l(&[("agent", agent)]))
            .set(i64::from(epoch.is_some()));
        self.epoch
            .set(i64::try_from(epoch.unwrap_or(0)).unwrap_or(i64::MAX));
    }

    /// The agent took over the lead.
    pub fn takeover(&self) {
        self.takeovers.inc();
    }

    /// A report was accepted.
    pub fn report(&self) {
        self.reports.inc();
    }

    /// Reports superseded in a batch.
    pub fn superseded(&self, n: u64) {
        self.superseded.inc_by(n);
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

    /// A reload was applied (`true`) or refused.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&l(&[("result", result)])).inc();
        self.reload_refused.set(i64::from(!applied));
    }

    /// An enrollment request was answered with `result`.
    pub fn enrollment(&self, result: &str) {
        self.enrollments
            .get_or_create(&l(&[("result", result)]))
            .inc();
    }

    /// A node refused a command of ours with `stale_epoch`.
    pub fn stale_epoch(&self) {
        self.stale_epoch.inc();
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

    /// Sets the capacity gauges from one evaluation's explanations (one per
    /// group evaluated); after an evaluation of every group (`full`), groups
    /// no longer evaluated lose their series.
    pub fn capacity(
        &self,
        core: &Core,
        acts: &[crate::core::Action],
        now: DateTime<Utc>,
        full: bool,
    ) {
        let breaker = core.meta().breaker_open;
        let mut profiles: BTreeMap<String, (GroupStats, bool)> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        for a in acts {
            let crate::core::Action::Explain(x) = a else {
                continue;
            };
            let key = GroupKey {
                district: x.district.clone(),
                profile: x.profile.clone(),
            };
            let paused = core.pause_of(&key, now).is_some();
            self.capacity
                .set(&x.district, &x.profile, &x.stats, breaker, paused);
            let p = profiles.entry(x.profile.clone()).or_default();
            crate::fleet::add_stats(&mut p.0, &x.stats);
            p.1 |= paused;
            seen.insert((x.district.clone(), x.profile.clone()));
        }
        for (profile, (mut stats, paused)) in profiles {
            stats.usage_pct = crate::fleet::usage(stats.gears_active, stats.available_active_gears);
            self.capacity.set(ALL, &profile, &stats, breaker, paused);
            seen.insert((ALL.to_string(), profile));
        }
        // Only an evaluation of every group knows which groups are gone.
        if full {
            self.capacity.forget_others(seen);
        }
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

impl Capacity {
    fn register(&self, r: &mut Registry) {
        r.register(
            "usage_ratio",
            "Active usage of the group (district _all: the profile), 0..1: active / (available + active)",
            self.usage.clone(),
        );
        r.register(
            "available_active_gears",
            "Free active slots on the group's active, uncordoned nodes",
            self.available.clone(),
        );
        r.register(
            "effective_available_gears",
            "Available active gears bounded by the district's free UIDs",
            self.effective.clone(),
        );
        r.register(
            "group_nodes",
            "Nodes of the group by state (active, inactive, missing)",
            self.nodes.clone(),
        );
        r.register(
            "missing_nodes",
            "Nodes of the group whose reports stopped",
            self.missing.clone(),
        );
        r.register(
            "breaker_open",
            "1 while the stale-node breaker stops all scaling (the same for every group)",
            self.breaker.clone(),
        );
        r.register(
            "paused",
            "1 while an operator paused the group or the fleet",
            self.paused.clone(),
        );
    }

    fn set(&self, district: &str, profile: &str, s: &GroupStats, breaker: bool, paused: bool) {
        let figures: Figures = [
            s.usage_pct.to_bits(),
            u64::from(s.available_active_gears),
            u64::from(s.effective_available_gears),
            u64::from(s.nodes_missing),
            u64::from(s.nodes_active),
            u64::from(s.nodes_inactive),
            u64::from(breaker),
            u64::from(paused),
        ];
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let key = (district.to_string(), profile.to_string());
            if last.get(&key) == Some(&figures) {
                return;
            }
            last.insert(key, figures);
        }
        let g = l(&[("district", district), ("profile", profile)]);
        self.usage.get_or_create(&g).set(s.usage_pct / 100.0);
        self.available
            .get_or_create(&g)
            .set(i64::from(s.available_active_gears));
        self.effective
            .get_or_create(&g)
            .set(i64::from(s.effective_available_gears));
        self.missing
            .get_or_create(&g)
            .set(i64::from(s.nodes_missing));
        self.breaker.get_or_create(&g).set(i64::from(breaker));
        self.paused.get_or_create(&g).set(i64::from(paused));
        for (state, n) in
            NODE_STATES
                .iter()
                .zip([s.nodes_active, s.nodes_inactive, s.nodes_missing])
        {
            let mut labels = g.clone();
            labels.push(("state".into(), (*state).into()));
            self.nodes.get_or_create(&labels).set(i64::from(n));
        }
    }

    /// Drops the series of groups not in `now_seen`.
    fn forget_others(&self, now_seen: BTreeSet<(String, String)>) {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        for (d, p) in seen.difference(&now_seen) {
            last.remove(&(d.clone(), p.clone()));
            let g = l(&[("district", d), ("profile", p)]);
            self.usage.remove(&g);
            self.available.remove(&g);
            self.effective.remove(&g);
            self.missing.remove(&g);
            self.breaker.remove(&g);
            self.paused.remove(&g);
            for state in NODE_STATES {
                let mut labels = g.clone();
                labels.push(("state".into(), state.into()));
                self.nodes.remove(&labels);
            }
        }
        *seen = now_seen;
    }
}

#[cfg(test)]
mod tests;
