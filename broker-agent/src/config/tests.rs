use gearshift_handlers::GroupKey;

use super::*;

#[test]
fn empty_file_gives_the_seed_defaults() {
    let c = load_str("").unwrap();
    assert_eq!(c.policy.interval, Duration::from_secs(60));
    assert_eq!(c.policy.profile_threshold.for_profile("x"), Some(80));
    assert_eq!(c.policy.district_threshold.for_profile("x"), Some(90));
    assert_eq!(c.policy.compact_threshold.for_profile("x"), Some(50));
    assert_eq!(c.policy.gear_up_size.for_profile("x"), Some(200));
    assert_eq!(
        c.policy.gear_expected_active_percent.for_profile("x"),
        Some(5)
    );
    assert_eq!(c.policy.gear_up_threshold.for_profile("x"), None);
    assert_eq!(c.policy.breaker_stale_percent, 45);
    assert_eq!(c.group_defaults.handler, "log");
}

#[test]
fn bad_keys_are_named() {
    let e = load_str("[policy]\nprofile_threshold = \"80, small: lots\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.profile_threshold") && e.contains("lots"),
        "{e}"
    );
    let e = load_str("[policy]\nintervall = \"1s\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("intervall"), "{e}");
    let e = load_str("[policy]\ncompact_threshold = 85\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("policy.compact_threshold") && e.contains("flap"),
        "{e}"
    );
    let e = load_str("[policy]\nprofile_threshold = 180\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("policy.profile_threshold"), "{e}");
    let e = load_str("[group_defaults]\nhandler = \"nova\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("group_defaults.handler") && e.contains("nova"),
        "{e}"
    );
    let e = load_str("[policy]\ninterval = \"soon\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("policy.interval"), "{e}");
    let e = load_str("[agent]\nplacement_queue = \"a/b\"\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("agent.placement_queue"), "{e}");
    let c = load_str("[agent]\nplacement_queue = \"q.demo\"\nplacement_key = \"demo.placement\"\n")
        .unwrap();
    assert_eq!(c.agent.placement_queue, "q.demo");
}

#[test]
fn group_settings_fall_back_to_defaults() {
    let c = load_str(
        "[group_defaults]\nmax_nodes = 7\n[[groups]]\ndistrict = \"d1\"\nprofile = \"small\"\nmin_nodes = 2\n",
    )
    .unwrap();
    let g = c.group(&GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    });
    assert_eq!(
        (g.min_nodes, g.max_nodes, g.handler.as_str()),
        (2, 7, "log")
    );
    let other = c.group(&GroupKey {
        district: "d2".into(),
        profile: "small".into(),
    });
    assert_eq!(other.min_nodes, 0);
}

#[test]
fn shipped_config_is_valid() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/broker.toml");
    let c = gearshift_service::config::load_str::<BrokerConfig>(
        &std::fs::read_to_string(&path).unwrap(),
        &path,
        ENV_PREFIX,
        std::iter::empty(),
    )
    .unwrap();
    let d = BrokerConfig::defaults();
    // The shipped file states the defaults: keep both in step.
    assert_eq!(c.policy.interval, d.policy.interval);
    assert_eq!(c.policy.profile_threshold, d.policy.profile_threshold);
    assert_eq!(c.saga.remove_timeout, d.saga.remove_timeout);
    assert_eq!(c.policy.provision_timeout, d.policy.provision_timeout);
}
