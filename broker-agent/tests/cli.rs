//! The `gearshift-broker` binary's offline commands: `check-config` and `keygen`.

use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gearshift-broker"))
}

#[test]
fn check_config_accepts_the_shipped_file() {
    // With the key it names: check-config loads it, as `run` does.
    let dir = tempfile::tempdir().unwrap();
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/broker.toml"))
            .unwrap()
            .replace("/etc/gearshift/", &format!("{}/", dir.path().display()));
    gearshift_service::keys::write_keypair(dir.path(), "broker", false).unwrap();
    let file = dir.path().join("broker.toml");
    std::fs::write(&file, shipped).unwrap();
    let out = bin().arg("check-config").arg(&file).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn check_config_names_the_bad_key_before_any_network_access() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "[policy]\nprofile_threshold = \"80, small: lots\"\n",
            "policy.profile_threshold",
        ),
        (
            "[policy]\ncompact_threshold = 90\n",
            "policy.compact_threshold",
        ),
        (
            "[saga]\nremove_timeout = \"later\"\n",
            "saga.remove_timeout",
        ),
        ("[bus]\nurl = \"http://x\"\n", "bus.url"),
        (
            "[group_defaults]\nhandler = \"nova\"\n",
            "group_defaults.handler",
        ),
        (
            "[handlers.x]\ntype = \"exec\"\ndir = \"relative\"\n",
            "handlers.x",
        ),
        ("[polcy]\n", "polcy"),
    ];
    for (text, key) in cases {
        let p = dir.path().join("bad.toml");
        std::fs::write(&p, text).unwrap();
        // An unreachable bus in the environment proves nothing is contacted.
        let out = bin()
            .arg("check-config")
            .arg(&p)
            .env("GEARSHIFT_BROKER_AGENT__STATE_DIR", "/nonexistent")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{text} accepted");
        assert!(err.contains(key), "{text}: {err}");
    }
}

#[test]
fn environment_overrides_are_checked_too() {
    let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/broker.toml");
    let out = bin()
        .arg("check-config")
        .arg(shipped)
        .env("GEARSHIFT_BROKER_POLICY__BREAKER_STALE_PERCENT", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("policy.breaker_stale_percent"));
}

#[test]
fn keygen_writes_a_key_pair_and_refuses_to_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let run = || {
        bin()
            .args(["keygen", "--dir"])
            .arg(dir.path())
            .args(["--name", "op"])
            .output()
            .unwrap()
    };
    assert!(run().status.success());
    let key = std::fs::read_to_string(dir.path().join("op.key")).unwrap();
    assert!(gearshift_proto::KeyPair::from_pem(&key).is_ok());
    assert!(!run().status.success(), "no silent overwrite");
}

#[test]
fn history_reads_the_state_directory_without_the_bus() {
    use gearshift_broker::history::{Event, Record, SagaStep, Writer};
    let dir = tempfile::tempdir().unwrap();
    let mut w = Writer::new(dir.path(), &Default::default());
    for (op, d, hours) in [("op-old", "d1", 30), ("op-1", "d1", 1), ("op-2", "d2", 2)] {
        w.append(&Record {
            at: chrono::Utc::now() - chrono::Duration::hours(hours),
            event: Event::Saga(SagaStep {
                op: op.into(),
                kind: "scale_down".into(),
                district: d.into(),
                profile: "small".into(),
                node: Some("n1".into()),
                from: Some("evacuating".into()),
                to: "confirming_empty".into(),
            }),
        })
        .unwrap();
    }
    let run = |args: &[&str]| {
        let out = bin()
            .arg("history")
            .arg("--state-dir")
            .arg(dir.path())
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let day = run(&[]);
    assert_eq!(day.lines().count(), 2, "{day}");
    assert!(day.contains("saga op-1 scale_down d1/small node=n1: evacuating -> confirming_empty"));
    let d2 = run(&["--group", "d2/small", "--json"]);
    let v: serde_json::Value = serde_json::from_str(d2.trim()).unwrap();
    assert_eq!(
        (v["type"].as_str(), v["op"].as_str()),
        (Some("saga"), Some("op-2"))
    );
    assert_eq!(run(&["--since", "48h"]).lines().count(), 3);
}
