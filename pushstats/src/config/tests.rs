use std::collections::BTreeMap;
use std::time::Duration;

use gearshift_proto::msg::GroupStats;
use gearshift_service::config::Invalid;

use super::*;
use gearshift_service::config::{Validate, load_str};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Agent {
    push_stats: PushStatsConfig,
}

impl Validate for Agent {
    fn validate(&self) -> Result<(), Invalid> {
        self.push_stats.validate()
    }
}

fn load(text: &str, env: &[(&str, &str)]) -> Result<Agent, gearshift_service::config::ConfigError> {
    load_str(
        text,
        Path::new("node.toml"),
        "GEARSHIFT_NODE",
        env.iter().map(|(k, v)| (k.to_string(), v.to_string())),
    )
}

const FULL: &str = r#"
[push_stats]
enabled = true
interval = "30s"
debounce = "2s"
metrics = ["NodeUtilization", "ActiveGears"]
instance_id = "i-0001"

[push_stats.dimensions]
AutoScalingGroupName = "openshift-nodes"

[push_stats.cloudwatch]
endpoint = "http://heat.example.com:8003/v1"
alarm_names = ["NodeAlarmHigh", "NodeAlarmLow"]
access_key_id = "AKID"
secret_access_key = "sek"

[push_stats.gnocchi]
endpoint = "http://gnocchi:8041"
resource_id = "0f6c5e3a-1111-2222-3333-444455556666"
archive_policy = "low"
"#;

#[test]
fn defaults_are_disabled_and_valid() {
    let a = load("", &[]).unwrap();
    assert_eq!(a.push_stats, PushStatsConfig::default());
    assert!(!a.push_stats.enabled);
    assert!(
        a.push_stats
            .start(None, PushMetrics::new(), CancellationToken::new())
            .unwrap()
            .is_none()
    );
}

#[test]
fn full_section_loads_with_case_kept_in_dimension_names() {
    let a = load(FULL, &[("GEARSHIFT_NODE_PUSH_STATS__INTERVAL", "45s")]).unwrap();
    let c = a.push_stats;
    assert_eq!(c.interval, Duration::from_secs(45));
    assert_eq!(
        c.dimensions.get("AutoScalingGroupName").map(String::as_str),
        Some("openshift-nodes")
    );
    let cw = c.cloudwatch.as_ref().unwrap();
    assert_eq!(cw.namespace, "system/linux");
    assert_eq!(cw.alarm_names.len(), 2);
    assert!(!format!("{cw:?}").contains("sek"));
    assert_eq!(
        c.gnocchi.as_ref().unwrap().archive_policy.as_deref(),
        Some("low")
    );
    let toml_cfg = PushStatsConfig::from_agent_toml(FULL).unwrap();
    assert_eq!(toml_cfg.interval, Duration::from_secs(30));
}

#[test]
fn errors_name_the_key() {
    let e = load("[push_stats]\nenabled = true\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("push_stats.enabled"), "{e}");
    let e = load("[push_stats]\nintervall = \"1s\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("intervall"), "{e}");
    let e = load(
        "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"heat:8003\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("push_stats.cloudwatch.endpoint"), "{e}");
    let e = load(
        "[push_stats]\nenabled = true\nmetrics = [\"Bogus\"]\n[push_stats.gnocchi]\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("push_stats.metrics") && e.contains("Bogus"),
        "{e}"
    );
    let e = load(
        "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"http://h/\"\naccess_key_id = \"a\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("push_stats.cloudwatch"), "{e}");
    let e = load("[push_stats]\nevent_unit = \"Parsecs\"\n", &[])
        .unwrap_err()
        .to_string();
    assert!(e.contains("push_stats.event_unit"), "{e}");
    let e = load(
        "[push_stats]\nenabled = true\n[push_stats.gnocchi]\n[push_stats.group_dimensions.small]\nA = \"b\"\n",
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("push_stats.group_dimensions.small"), "{e}");
}

#[test]
fn node_samples_are_filtered_and_decorated() {
    let c = PushStatsConfig::from_agent_toml(FULL).unwrap();
    let r = crate::sets::tests::report();
    let s = c.node_samples(&r);
    assert_eq!(s.len(), 2);
    for x in &s {
        assert_eq!(
            x.dimensions.get("AutoScalingGroupName").map(String::as_str),
            Some("openshift-nodes")
        );
        assert_eq!(
            x.dimensions.get("InstanceId").map(String::as_str),
            Some("i-0001")
        );
    }
    let hb = c.heartbeat();
    assert_eq!(hb[0].name, "Heartbeat");
    assert_eq!(hb[0].unit, Unit::COUNTER);
}

#[test]
fn fleet_samples_get_group_dimensions() {
    let c = PushStatsConfig::from_agent_toml(
        "[push_stats]\n[push_stats.group_dimensions.\"profile:small\"]\nAutoScalingGroupName = \"asg-small\"\n",
    )
    .unwrap();
    let profiles = BTreeMap::from([
        ("small".to_string(), GroupStats::default()),
        ("large".to_string(), GroupStats::default()),
    ]);
    let s = c.fleet_samples(&profiles, &BTreeMap::new());
    let small = s
        .iter()
        .find(|x| x.dimensions.get("Profile").map(String::as_str) == Some("small"))
        .unwrap();
    assert_eq!(
        small
            .dimensions
            .get("AutoScalingGroupName")
            .map(String::as_str),
        Some("asg-small")
    );
    let large = s
        .iter()
        .find(|x| x.dimensions.get("Profile").map(String::as_str) == Some("large"))
        .unwrap();
    assert!(!large.dimensions.contains_key("AutoScalingGroupName"));
}

#[test]
fn build_sinks_reads_the_credentials_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("cfn-credentials");
    std::fs::write(&f, "AWSAccessKeyId=AK\nAWSSecretKey=SK\n").unwrap();
    let text = format!(
        "[push_stats]\nenabled = true\n[push_stats.cloudwatch]\nendpoint = \"http://127.0.0.1:9/\"\ncredential_file = \"{}\"\n",
        f.display()
    );
    let c = PushStatsConfig::from_agent_toml(&text).unwrap();
    let sinks = c.build_sinks(None).unwrap();
    assert_eq!(sinks.len(), 1);
    assert_eq!(sinks[0].target(), "cloudwatch");
    std::fs::remove_file(&f).unwrap();
    let e = c.build_sinks(None).err().unwrap();
    assert!(e.to_string().contains("cfn-credentials"), "{e}");
}
