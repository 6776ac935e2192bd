use gearshift_broker::config::BrokerConfig;

use super::workload::Workload;
use super::{ReplayOptions, replay};

fn day(nodes: u32, curve: &str) -> Workload {
    let w: Workload = toml::from_str(&format!(
        "duration = \"12h\"\n[[groups]]\ndistrict = \"d1\"\nprofile = \"small\"\nnodes = {nodes}\nmax_active_gears = 100\ncurve = {curve}\n"
    ))
    .unwrap();
    w.check().unwrap();
    w
}

#[test]
fn a_rise_boots_nodes_and_a_fall_drains_and_removes_them() {
    let w = day(
        10,
        r#"[["0h", 40], ["3h", 95], ["6h", 95], ["9h", 25], ["12h", 25]]"#,
    );
    let o = replay(
        BrokerConfig::defaults(),
        w.lines(),
        &ReplayOptions::default(),
    )
    .unwrap();
    let kinds: Vec<&str> = o.decisions.iter().map(|d| d.kind.as_str()).collect();
    // Up while the load rises (a node at a time, no storm), down once it falls.
    let last_up = kinds
        .iter()
        .rposition(|k| *k == "scale_up")
        .expect("a scale-up");
    let last_down = kinds
        .iter()
        .rposition(|k| *k == "scale_down")
        .expect("a scale-down");
    assert!(last_up < last_down, "{kinds:?}");
    let ups = o.decision_counts["scale_up"];
    assert!((2..=5).contains(&ups), "{kinds:?}");
    assert!(
        kinds.contains(&"joined") && kinds.contains(&"removed"),
        "{kinds:?}"
    );
    assert_eq!(o.booted.len(), o.decision_counts["joined"] as usize);
    assert_eq!(o.removed.len(), o.decision_counts["removed"] as usize);
    assert!(o.removed.iter().all(|n| n.district == "d1"));
    assert!(o.peak_usage_pct >= 80.0, "{}", o.peak_usage_pct);
    assert_eq!(o.reports, 721 * 10);
    // Every decision in virtual time, in order.
    assert!(o.decisions.windows(2).all(|p| p[0].at <= p[1].at));
}

#[test]
fn a_configuration_that_forbids_scaling_down_removes_nothing() {
    let w = day(
        10,
        r#"[["0h", 40], ["3h", 95], ["6h", 95], ["9h", 25], ["12h", 25]]"#,
    );
    let mut cfg = BrokerConfig::defaults();
    cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::parse("none").unwrap();
    let o = replay(cfg, w.lines(), &ReplayOptions::default()).unwrap();
    assert!(
        o.decision_counts.contains_key("scale_up"),
        "{:?}",
        o.decision_counts
    );
    assert!(
        !o.decision_counts.contains_key("scale_down"),
        "{:?}",
        o.decision_counts
    );
    assert!(o.removed.is_empty());
}

#[test]
fn a_bad_trace_line_ends_the_replay_with_its_number() {
    let text = "\n{\"at\":\"2026-11-27T00:00:00Z\"}\n";
    let r = gearshift_broker::trace::Reader::new(text.as_bytes(), 10);
    let e = replay(BrokerConfig::defaults(), r, &ReplayOptions::default()).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
    let none: Vec<Result<gearshift_broker::trace::TraceLine, String>> = vec![];
    assert!(
        replay(
            BrokerConfig::defaults(),
            none.into_iter(),
            &ReplayOptions::default()
        )
        .is_err()
    );
}
