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

#[test]
fn shipped_files_show_every_compiled_default() {
    use gearshift_service::config::Documented;
    let conf = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf");
    let read = |f: &str| std::fs::read_to_string(conf.join(f)).unwrap();
    // `[push_stats]` is shown in its own file; `[[groups]]` by a
    // commented-out example.
    let broker = Documented {
        not_shown: &["push_stats", "groups"],
        ..Documented::default()
    };
    let problems = broker.check(&read("broker.toml"), &BrokerConfig::defaults());
    assert!(
        problems.is_empty(),
        "conf/broker.toml:\n{}",
        problems.join("\n")
    );
    // The broker's pull-mode example: what it sets is an example or the
    // default (conf/pushstats-node.toml shows every key).
    let mut with_targets = BrokerConfig::defaults();
    with_targets.push_stats.cloudwatch = Some(Default::default());
    with_targets.push_stats.gnocchi = Some(Default::default());
    let push = Documented {
        under: Some("push_stats"),
        not_shown: &["push_stats"],
        examples: &[
            "push_stats.enabled",
            "push_stats.metrics",
            "push_stats.group_dimensions",
            "push_stats.cloudwatch.endpoint",
            "push_stats.cloudwatch.credential_file",
            "push_stats.gnocchi.cloud",
            "push_stats.gnocchi.archive_policy",
        ],
    };
    let problems = push.check(&read("pushstats-broker.toml"), &with_targets);
    assert!(
        problems.is_empty(),
        "conf/pushstats-broker.toml:\n{}",
        problems.join("\n")
    );
}

#[test]
fn round_trips_through_toml() {
    // The simulator and the tests write configurations with `to_toml`.
    let mut c = BrokerConfig::defaults();
    c.bus.reconnect_max = Duration::from_secs(5);
    c.keys.trust = vec![TrustEntry {
        role: gearshift_proto::Role::Client,
        path: "/etc/gearshift/c.pub".into(),
    }];
    let text = c.to_toml().unwrap();
    let back = load_str(&text).unwrap();
    assert_eq!(back.bus, c.bus, "{text}");
    assert_eq!(back.keys, c.keys, "{text}");
}
