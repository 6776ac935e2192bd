use super::*;
use std::path::Path;

fn load(text: &str) -> Result<NodeConfig, gearshift_service::config::ConfigError> {
    gearshift_service::config::load_str(text, Path::new("node.toml"), ENV_PREFIX, Vec::new())
}

#[test]
fn empty_file_is_valid_with_defaults() {
    let c = load("").unwrap();
    assert_eq!(c, NodeConfig::default());
    assert_eq!(c.evacuation.parallelism, 4);
    assert_eq!(c.report.interval, Duration::from_secs(10));
}

#[test]
fn shipped_file_is_valid() {
    let text = include_str!("../../../conf/node.toml");
    let c = load(text).unwrap();
    assert_eq!(c.runtime.kind, RuntimeKind::Openshift);
}

#[test]
fn bad_values_name_their_key() {
    for (text, key) in [
        ("[evacuation]\nparallelism = 0\n", "evacuation.parallelism"),
        ("[report]\ninterval = \"soon\"\n", "report.interval"),
        ("[report]\ninterval = \"1ms\"\n", "report.interval"),
        ("[bus]\nurl = \"http://x\"\n", "bus.url"),
        (
            "[runtime]\nkind = \"dir\"\n[runtime.dir]\ntarget_root = \"/x\"\n",
            "runtime.dir.target_root",
        ),
        ("[runtime]\nkinds = \"dir\"\n", "kinds"),
        (
            "[heat]\nremove_action = \"scale_down\"\n",
            "heat.remove_action",
        ),
        ("[heat]\nsignal_url = \"ftp://x\"\n", "heat.signal_url"),
        ("[node]\nname = \"a b\"\n", "node.name"),
        ("[keys]\nbroker_keys = []\n", "keys.broker_keys"),
        ("[heat]\ncredentials = \"auth_env\"\n", "heat.auth_env"),
        ("[heat]\ncredentials = \"openrc\"\n", "heat.credentials"),
    ] {
        let e = load(text).unwrap_err().to_string();
        assert!(e.contains(key), "{text:?} gave {e}");
    }
}

#[test]
fn env_overrides() {
    let c: NodeConfig = gearshift_service::config::load_str(
        "",
        Path::new("node.toml"),
        ENV_PREFIX,
        vec![
            (
                "GEARSHIFT_NODE_REPORT__INTERVAL".to_string(),
                "30s".to_string(),
            ),
            (
                "GEARSHIFT_NODE_EVACUATION__PARALLELISM".to_string(),
                "8".to_string(),
            ),
        ],
    )
    .unwrap();
    assert_eq!(c.report.interval, Duration::from_secs(30));
    assert_eq!(c.evacuation.parallelism, 8);
}

#[test]
fn shipped_files_show_every_compiled_default() {
    use gearshift_service::config::Documented;
    // `[push_stats]` is shown in its own file.
    let node = Documented {
        examples: &["node.booted_for_file", "enroll.token_file"],
        not_shown: &["push_stats"],
        ..Documented::default()
    };
    let problems = node.check(
        include_str!("../../../conf/node.toml"),
        &NodeConfig::default(),
    );
    assert!(
        problems.is_empty(),
        "conf/node.toml:\n{}",
        problems.join("\n")
    );
    let mut with_targets = NodeConfig::default();
    with_targets.push_stats.cloudwatch = Some(Default::default());
    with_targets.push_stats.gnocchi = Some(Default::default());
    let push = Documented {
        under: Some("push_stats"),
        examples: &[
            "push_stats.enabled",
            "push_stats.metrics",
            "push_stats.dimensions",
            "push_stats.cloudwatch.endpoint",
            "push_stats.gnocchi.auth_env_file",
            "push_stats.gnocchi.archive_policy",
        ],
        // The broker agent's only.
        not_shown: &["push_stats.group_resource_prefix"],
    };
    let problems = push.check(
        include_str!("../../../conf/pushstats-node.toml"),
        &with_targets,
    );
    assert!(
        problems.is_empty(),
        "conf/pushstats-node.toml:\n{}",
        problems.join("\n")
    );
}

#[test]
fn round_trips_through_toml() {
    // The simulator and the tests write configurations with `toml::to_string`.
    let mut c = NodeConfig::default();
    c.bus.prefetch = 4;
    c.bus.server_name = Some("mq".into());
    c.keys.operator_keys = vec!["/etc/gearshift/op.pub".into()];
    c.heat.stack_name = Some("s".into());
    let text = toml::to_string(&c).unwrap();
    assert_eq!(load(&text).unwrap(), c, "{text}");
}
