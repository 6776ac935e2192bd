//! `check-config` loads every key file as `run` does, on both binaries
//! (what `run` refuses, `check-config` refuses, exit 2, naming the key);
//! and every operator subcommand of `gearshift-broker` talks to the broker
//! agent on its configured `agent.admin_key`.

use std::path::Path;
use std::process::Command;

use gearshift_tests::bins::{broker_binary, node_binary, shipped_config_with_keys};
use gearshift_tests::node_harness::temp_dir;

fn check(bin: &Path, file: &Path, env: &[(&str, String)]) -> (Option<i32>, String) {
    let out = Command::new(bin)
        .arg("check-config")
        .arg(file)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn hostile_check_config_refuses_what_run_refuses() {
    let dir = temp_dir();
    let d = dir.path();
    let garbage = d.join("garbage.key");
    std::fs::write(
        &garbage,
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let subdir = d.join("a-directory.pub");
    std::fs::create_dir(&subdir).unwrap();
    let missing = d.join("missing.key").display().to_string();
    let (garbage, subdir) = (garbage.display().to_string(), subdir.display().to_string());

    let node = shipped_config_with_keys("node", &d.join("node"));
    let node_bin = node_binary();
    assert_eq!(
        check(&node_bin, &node, &[]).0,
        Some(0),
        "{}",
        check(&node_bin, &node, &[]).1
    );
    let signing = "GEARSHIFT_NODE_KEYS__SIGNING_KEY";
    for (what, env, key) in [
        (
            "signing key missing",
            vec![(signing, missing.clone())],
            "keys.signing_key",
        ),
        (
            "signing key garbage",
            vec![(signing, garbage.clone())],
            "keys.signing_key",
        ),
    ] {
        let (code, err) = check(&node_bin, &node, &env);
        println!("node, {what}: exit {code:?}: {}", err.trim());
        assert_eq!(code, Some(2), "node, {what}: {err}");
        assert!(err.contains(key), "node, {what}: {err}");
    }
    // A broker_keys entry that is a directory (no list in the environment:
    // a file of its own).
    let text = std::fs::read_to_string(&node)
        .unwrap()
        .replace(&format!("{}/broker.pub", d.join("node").display()), &subdir);
    let bad = d.join("node-dir-key.toml");
    std::fs::write(&bad, text).unwrap();
    let (code, err) = check(&node_bin, &bad, &[]);
    println!(
        "node, broker_keys entry a directory: exit {code:?}: {}",
        err.trim()
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("keys.broker_keys"), "{err}");

    let broker = shipped_config_with_keys("broker", &d.join("broker"));
    let broker_bin = broker_binary();
    assert_eq!(
        check(&broker_bin, &broker, &[]).0,
        Some(0),
        "{}",
        check(&broker_bin, &broker, &[]).1
    );
    let signing = "GEARSHIFT_BROKER_KEYS__SIGNING_KEY";
    let nodes_dir = "GEARSHIFT_BROKER_KEYS__NODE_KEYS_DIR";
    let garbage_dir = d.join("nodes.d");
    std::fs::create_dir(&garbage_dir).unwrap();
    std::fs::write(garbage_dir.join("n1.pub"), "not a key").unwrap();
    for (what, env) in [
        ("signing key missing", vec![(signing, missing.clone())]),
        ("signing key garbage", vec![(signing, garbage.clone())]),
        (
            "a node key that is garbage",
            vec![(nodes_dir, garbage_dir.display().to_string())],
        ),
    ] {
        let (code, err) = check(&broker_bin, &broker, &env);
        println!("broker, {what}: exit {code:?}: {}", err.trim());
        assert_eq!(code, Some(2), "broker, {what}: {err}");
    }
}

/// Runs an operator subcommand against the broker agent of `config` until
/// it answers (the agent may still be starting); returns its output.
fn operator(args: &[&str], config: &Path, log: &Path) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    loop {
        let out = Command::new(broker_binary())
            .args(args)
            .arg("-c")
            .arg(config)
            .args(["--timeout", "10s"])
            .env_remove("GEARSHIFT_ADMIN_KEY")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            return text;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            std::time::Instant::now() < deadline,
            "{args:?} failed: {err}\nbroker log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

#[test]
fn hostile_operator_commands_use_the_configured_admin_key() {
    use gearshift_tests::broker_harness::{fast_config, test_keys};
    use gearshift_tests::broker_process::{BrokerProcess, write_config};
    let dir = temp_dir();
    let d = dir.path();
    let keys = test_keys(d);
    let tag = gearshift_tests::unique("hostile-admin-");
    let mut cfg = fast_config(&gearshift_tests::amqp_url(), &d.join("state"), "log", &tag);
    keys.configure_broker(&mut cfg);
    assert_ne!(cfg.agent.admin_key, gearshift_proto::routing::ADMIN);
    let config = d.join("broker.toml");
    write_config(&cfg, &config);
    let log = d.join("broker.log");
    let _broker = BrokerProcess::start(&config, &log);

    let status = operator(&["status"], &config, &log);
    assert!(
        status.contains(&format!("broker agent {}", cfg.agent.name)),
        "another broker agent answered:\n{status}"
    );
    operator(&["pause", "--reason", "hostile test"], &config, &log);
    let paused = operator(&["status"], &config, &log);
    assert!(paused.contains("PAUSED"), "{paused}");
    operator(&["resume"], &config, &log);
    let resumed = operator(&["status"], &config, &log);
    assert!(!resumed.contains("PAUSED"), "{resumed}");
}
