//! `gearshift-sim replay` on the real binary: the demo (`gearshift-sim
//! demo --record-trace`) records the reports its broker agent received and
//! its configuration; replaying that trace with that configuration takes the
//! demo's decisions (a scale-up, then a scale-down, of the demo's group);
//! a synthetic workload replays too; bad input is refused with exit status 2
//! and the line or key named.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Stdio};

use gearshift_tests::bins::sim_binary;

/// Runs `gearshift-sim <args>`: (exit code, stdout, stderr).
fn sim(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(sim_binary())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run gearshift-sim");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json(stdout: &str) -> serde_json::Value {
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}):\n{stdout}"))
}

/// The (kind, district, profile) of the scale-up and scale-down decisions.
fn scaling(decisions: &serde_json::Value) -> BTreeSet<(String, String, String)> {
    decisions
        .as_array()
        .expect("decisions")
        .iter()
        .filter(|d| d["kind"] == "scale_up" || d["kind"] == "scale_down")
        .map(|d| {
            let s = |k: &str| d[k].as_str().unwrap_or_default().to_string();
            (s("kind"), s("district"), s("profile"))
        })
        .collect()
}

#[test]
fn replaying_the_demos_trace_takes_the_demos_decisions() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("demo-trace.jsonl");
    let t = trace.to_str().unwrap();
    let (code, out, err) = sim(&[
        "demo",
        "--json",
        "--seed",
        "7",
        "--timeout",
        "5m",
        "--record-trace",
        t,
    ]);
    assert_eq!(code, Some(0), "the demo failed:\n{out}\n{err}");
    let demo = json(&out);
    let lines = std::fs::read_to_string(&trace).expect("the trace was written");
    assert!(lines.lines().count() > 20, "a short trace:\n{lines}");
    let first: serde_json::Value = serde_json::from_str(lines.lines().next().unwrap()).unwrap();
    assert!(
        first["at"].is_string() && first["report"]["node"].is_string(),
        "{first}"
    );
    let district = first["report"]["district"]["uuid"]
        .as_str()
        .unwrap()
        .to_string();
    let profile = first["report"]["profile"].as_str().unwrap().to_string();

    let config = format!("{t}.broker.toml");
    let (code, out, err) = sim(&[
        "replay",
        "--config",
        &config,
        "--trace",
        t,
        "--boot-delay",
        "1s",
        "--settle",
        "2m",
        "--json",
    ]);
    assert_eq!(code, Some(0), "replay failed:\n{out}\n{err}");
    let replay = json(&out);
    let want: BTreeSet<_> = ["scale_up", "scale_down"]
        .iter()
        .filter(|k| demo["decisions_by_kind"][**k].as_u64().unwrap_or(0) > 0)
        .map(|k| (k.to_string(), district.clone(), profile.clone()))
        .collect();
    assert_eq!(want.len(), 2, "the demo scaled up and down: {demo}");
    assert_eq!(scaling(&replay["decisions"]), want, "replay: {replay}");
    assert!(!replay["booted"].as_array().unwrap().is_empty(), "{replay}");
    assert!(
        !replay["removed"].as_array().unwrap().is_empty(),
        "{replay}"
    );
    assert!(
        replay["peak_usage_pct"].as_f64().unwrap() >= 80.0,
        "{replay}"
    );
    assert!(replay["reports"].as_u64().unwrap() as usize <= lines.lines().count());

    // Human output names the same things.
    let (code, text, _) = sim(&[
        "replay",
        "--config",
        &config,
        "--trace",
        t,
        "--boot-delay",
        "1s",
    ]);
    assert_eq!(code, Some(0));
    for s in [
        "DECISIONS",
        "scale_up",
        "scale_down",
        "NODES BOOTED",
        "NODES REMOVED",
        "PEAK USAGE",
        "reports/s",
    ] {
        assert!(text.contains(s), "{s} missing:\n{text}");
    }
}

fn write(p: &Path, text: &str) -> String {
    std::fs::write(p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn a_synthetic_workload_replays_and_bad_input_is_refused_naming_the_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = write(
        &dir.path().join("broker.toml"),
        "[policy]\ninterval = \"1m\"\n",
    );
    let workload = write(
        &dir.path().join("day.toml"),
        r#"duration = "12h"
[[groups]]
district = "d1"
profile = "small"
nodes = 10
max_active_gears = 100
curve = [["0h", 40], ["4h", 95], ["8h", 20], ["12h", 20]]
"#,
    );
    let (code, out, err) = sim(&[
        "replay",
        "--config",
        &config,
        "--workload",
        &workload,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{out}\n{err}");
    let r = json(&out);
    let kinds = scaling(&r["decisions"]);
    assert!(
        kinds.contains(&("scale_up".into(), "d1".into(), "small".into())),
        "{r}"
    );
    assert!(
        kinds.contains(&("scale_down".into(), "d1".into(), "small".into())),
        "{r}"
    );
    assert_eq!(r["reports"], 721 * 10, "{r}");

    let trace = write(
        &dir.path().join("bad.jsonl"),
        "{\"at\":\"2026-11-27T00:00:00Z\",\"report\":{}}\n",
    );
    let (code, _, err) = sim(&["replay", "--config", &config, "--trace", &trace]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 1"), "{err}");
    let bad_cfg = write(
        &dir.path().join("bad.toml"),
        "[policy]\ninterval = \"soon\"\n",
    );
    let (code, _, err) = sim(&["replay", "--config", &bad_cfg, "--workload", &workload]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("policy.interval"), "{err}");
}
