//! The example configurations in `conf/` and the TOML blocks of
//! `docs/pull-mode.md` load and validate with `PushStatsConfig`, so the
//! documentation cannot drift from the code unnoticed.

use std::path::PathBuf;

use gearshift_pushstats::PushStatsConfig;
use gearshift_pushstats::sets::{FLEET_METRICS, NODE_METRICS};

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

fn load(path: &str) -> PushStatsConfig {
    PushStatsConfig::from_agent_file(&repo(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn node_example_loads() {
    let c = load("conf/pushstats-node.toml");
    assert!(c.enabled);
    assert!(c.metrics.iter().all(|m| NODE_METRICS.contains(&m.as_str())));
    assert_eq!(c.dimensions["AutoScalingGroupName"], "paas-NodeGroup-x1");
    let cw = c.cloudwatch.as_ref().unwrap();
    assert_eq!(cw.namespace, "system/linux");
    let g = c.gnocchi.as_ref().unwrap();
    assert_eq!(g.archive_policy.as_deref(), Some("low"));
    // Every key shown with a default in the example equals the code's default.
    let d = PushStatsConfig::default();
    assert_eq!(
        (c.interval, c.debounce, c.queue_capacity),
        (d.interval, d.debounce, d.queue_capacity)
    );
    assert_eq!(
        (c.max_attempts, c.retry_min, c.retry_max, c.timeout),
        (d.max_attempts, d.retry_min, d.retry_max, d.timeout)
    );
    assert_eq!(c.event_unit, d.event_unit);
    let dcw = gearshift_pushstats::config::CloudWatchConfig::default();
    assert_eq!(
        (
            &cw.region,
            cw.max_per_request,
            &cw.service,
            &cw.credential_file
        ),
        (
            &dcw.region,
            dcw.max_per_request,
            &dcw.service,
            &dcw.credential_file
        )
    );
    let dg = gearshift_pushstats::config::GnocchiConfig::default();
    assert_eq!(
        (&g.resource_type, g.create_missing, &g.metric_prefix),
        (&dg.resource_type, dg.create_missing, &dg.metric_prefix)
    );
}

#[test]
fn broker_example_loads() {
    let c = load("conf/pushstats-broker.toml");
    assert!(
        c.metrics
            .iter()
            .all(|m| FLEET_METRICS.contains(&m.as_str()))
    );
    assert_eq!(
        c.group_dimensions["profile:small"]["AutoScalingGroupName"],
        "paas-SmallNodes-x1"
    );
}

#[test]
fn every_toml_block_of_the_doc_loads() {
    let text = std::fs::read_to_string(repo("docs/pull-mode.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        match (&mut current, line.trim()) {
            (None, "```toml") => current = Some(String::new()),
            (Some(b), "```") => {
                blocks.push(std::mem::take(b));
                current = None;
            }
            (Some(b), _) => {
                b.push_str(line);
                b.push('\n');
            }
            _ => {}
        }
    }
    assert_eq!(blocks.len(), 2, "the doc's examples");
    for b in &blocks {
        let c = PushStatsConfig::from_agent_toml(b).unwrap_or_else(|e| panic!("{e}\n{b}"));
        assert!(c.enabled);
    }
}
