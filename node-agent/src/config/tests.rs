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
