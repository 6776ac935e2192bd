//! Prometheus metrics of the node agent (`/metrics` when `metrics.listen` is set).

use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `commands_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    /// Command kind (`cmd.evacuate`, ...).
    pub kind: String,
    /// `done`, `failed`, `refused`, `duplicate`, `accepted`.
    pub outcome: String,
}

/// Labels of `refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Stable reason label (`bad_signature`, `expired`, `replayed`, ...).
    pub reason: String,
}

/// Labels of gauges split by state.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// The state.
    pub state: String,
}

/// Every metric of the node agent.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Capacity reports published.
    pub reports_sent: Counter,
    /// Reports that could not be built or published.
    pub report_errors: Counter,
    /// Commands by kind and outcome.
    pub commands: Family<CommandLabels, Counter>,
    /// Refused messages addressed to this node, by reason.
    pub refused: Family<ReasonLabels, Counter>,
    /// Refused fleet-wide broadcasts (pings), by reason. Kept apart from
    /// `refused`: a stranger on the broadcast exchange is not a command
    /// this node was sent.
    pub broadcast_refused: Family<ReasonLabels, Counter>,
    /// Gears of the current evacuation by state (moved, failed, remaining).
    pub evacuation_gears: Family<StateLabels, Gauge>,
    /// Finished gear moves by outcome.
    pub gear_moves: Family<StateLabels, Counter>,
    /// Bus reconnections.
    pub bus_reconnects: Counter,
    /// Events waiting in the outbox.
    pub outbox_depth: Gauge,
    /// Events dropped because the outbox was full.
    pub outbox_dropped: Counter,
    /// Publish attempts that failed (and were retried).
    pub publish_errors: Counter,
    /// Checkpoint writes that failed.
    pub checkpoint_errors: Counter,
    /// 1 when the node is active, 0 when deactivated.
    pub active: Gauge,
    /// Gears on the node by state.
    pub gears: Family<StateLabels, Gauge>,
    /// Pings answered.
    pub pongs: Counter,
}

impl Metrics {
    /// Registers every metric in `registry` under the `gearshift_node` prefix.
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gearshift_node");
        r.register(
            "reports_sent",
            "Capacity reports published",
            self.reports_sent.clone(),
        );
        r.register(
            "report_errors",
            "Reports that could not be built or published",
            self.report_errors.clone(),
        );
        r.register(
            "commands",
            "Commands received, by kind and outcome",
            self.commands.clone(),
        );
        r.register(
            "refused",
            "Refused messages addressed to this node, by reason",
            self.refused.clone(),
        );
        r.register(
            "broadcast_refused",
            "Refused broadcast messages, by reason",
            self.broadcast_refused.clone(),
        );
        r.register(
            "evacuation_gears",
            "Gears of the current evacuation, by state",
            self.evacuation_gears.clone(),
        );
        r.register(
            "gear_moves",
            "Finished gear moves, by outcome",
            self.gear_moves.clone(),
        );
        r.register(
            "bus_reconnects",
            "Bus reconnections",
            self.bus_reconnects.clone(),
        );
        r.register(
            "outbox_depth",
            "Events waiting to be published",
            self.outbox_depth.clone(),
        );
        r.register(
            "outbox_dropped",
            "Events dropped because the outbox was full",
            self.outbox_dropped.clone(),
        );
        r.register(
            "publish_errors",
            "Failed publish attempts (retried)",
            self.publish_errors.clone(),
        );
        r.register(
            "checkpoint_errors",
            "Checkpoint writes that failed",
            self.checkpoint_errors.clone(),
        );
        r.register(
            "active",
            "1 when the node accepts gears, 0 when deactivated",
            self.active.clone(),
        );
        r.register("gears", "Gears on the node, by state", self.gears.clone());
        r.register("pongs", "Pings answered", self.pongs.clone());
    }

    /// A registry holding these metrics, for [`gearshift_service::http::metrics_router`].
    pub fn registry(&self) -> Arc<Mutex<Registry>> {
        let mut r = Registry::default();
        self.register(&mut r);
        Arc::new(Mutex::new(r))
    }

    /// Counts a command outcome.
    pub fn command(&self, kind: &str, outcome: &str) {
        self.commands
            .get_or_create(&CommandLabels {
                kind: kind.to_string(),
                outcome: outcome.to_string(),
            })
            .inc();
    }

    /// Counts a refused message addressed to this node.
    pub fn refused(&self, reason: &str) {
        self.refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Counts a refused broadcast message.
    pub fn broadcast_refused(&self, reason: &str) {
        self.broadcast_refused
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// Sets a gauge of a family split by state.
    pub fn set_state(family: &Family<StateLabels, Gauge>, state: &str, v: i64) {
        family
            .get_or_create(&StateLabels {
                state: state.to_string(),
            })
            .set(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_with_labels() {
        let m = Metrics::default();
        m.refused("bad_signature");
        m.broadcast_refused("unknown_key");
        m.command("cmd.deactivate", "done");
        m.reports_sent.inc();
        let reg = m.registry();
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg.lock().unwrap()).unwrap();
        assert!(
            out.contains("gearshift_node_refused_total{reason=\"bad_signature\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("gearshift_node_broadcast_refused_total{reason=\"unknown_key\"} 1"),
            "{out}"
        );
        assert!(
            out.contains(
                "gearshift_node_commands_total{kind=\"cmd.deactivate\",outcome=\"done\"} 1"
            ),
            "{out}"
        );
        assert!(out.contains("gearshift_node_reports_sent_total 1"), "{out}");
    }
}
