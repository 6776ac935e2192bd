//! The capacity gauges, from a real evaluation.

use prometheus_client::encoding::text::encode;

use super::*;
use crate::core::testkit::*;

fn scrape(m: &Metrics) -> String {
    let mut out = String::new();
    let r = m.registry.lock().unwrap();
    encode(&mut out, &r).unwrap();
    out
}

#[test]
fn capacity_gauges_follow_each_evaluation() {
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 60, 100);
    h.node("b", "d1", 20, 100);
    h.node("c", "d2", 10, 100);
    let m = Metrics::new();
    let acts = h.eval();
    m.capacity(&h.core, &acts, h.now, true);
    let text = scrape(&m);
    for line in [
        r#"gearshift_broker_usage_ratio{district="d1",profile="small"} 0.4"#,
        r#"gearshift_broker_available_active_gears{district="d1",profile="small"} 120"#,
        r#"gearshift_broker_effective_available_gears{district="d2",profile="small"} 90"#,
        r#"gearshift_broker_group_nodes{district="d1",profile="small",state="active"} 2"#,
        r#"gearshift_broker_missing_nodes{district="d1",profile="small"} 0"#,
        r#"gearshift_broker_breaker_open{district="d1",profile="small"} 0"#,
        r#"gearshift_broker_paused{district="d1",profile="small"} 0"#,
        // The profile, over both districts: 90 / 300.
        r#"gearshift_broker_usage_ratio{district="_all",profile="small"} 0.3"#,
        r#"gearshift_broker_available_active_gears{district="_all",profile="small"} 210"#,
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
    // A paused group says so; a forgotten group loses its series.
    h.core.pause(
        Some(&g("d1", "small")),
        crate::ops::Pause {
            by: "alice".into(),
            reason: "r".into(),
            since: h.now,
            until: None,
        },
    );
    h.core.fleet.forget("c");
    let acts = h.eval();
    m.capacity(&h.core, &acts, h.now, true);
    let text = scrape(&m);
    assert!(text.contains(r#"gearshift_broker_paused{district="d1",profile="small"} 1"#));
    assert!(!text.contains(r#"district="d2""#), "{text}");
}

/// Every metric the shipped alert rules use exists in the registry.
#[test]
fn the_alert_rules_use_metrics_that_exist() {
    let rules = include_str!("../../../docs/prometheus/gearshift-alerts.yml");
    let mut h = H::new(cfg_with(|_| {}));
    h.node("a", "d1", 60, 100);
    let m = Metrics::new();
    let acts = h.eval();
    m.capacity(&h.core, &acts, h.now, true);
    m.decision("scale_up");
    h.core.group_mut(&g("d1", "small")).supply.exhausted = None;
    m.refresh(&h.core);
    let text = scrape(&m);
    let mut used = 0;
    for word in rules.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if word.starts_with("gearshift_broker_") {
            used += 1;
            assert!(
                text.lines().any(|l| l.starts_with(word)),
                "{word} is in the alert rules but not exported"
            );
        }
    }
    assert!(used >= 5, "the rules use the capacity gauges");
}
