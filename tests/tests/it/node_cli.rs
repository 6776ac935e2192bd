//! The `gearshift-node` command line: check-config, keygen, status, and the
//! service behaviour of `run` (state-directory lock, /metrics, SIGHUP reload,
//! SIGTERM). Uses the in-process bus and the sim runtime, so only the binary
//! itself is under test here.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use gearshift_tests::node_harness::temp_dir;
use gearshift_tests::node_process::{NodeProcess, node_binary, write_file};

fn bin(args: &[&str]) -> std::process::Output {
    Command::new(node_binary())
        .args(args)
        .output()
        .expect("run gearshift-node")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_config_accepts_the_shipped_file_and_names_bad_keys() {
    let dir = temp_dir();
    let shipped = gearshift_tests::bins::shipped_config_with_keys("node", dir.path());
    let out = bin(&["check-config", shipped.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(": ok"));

    for (body, key, why) in [
        (
            "[evacuation]\nparallelism = 0\n",
            "evacuation.parallelism",
            "1..=256",
        ),
        (
            "[report]\ninterval = \"often\"\n",
            "report.interval",
            "not a duration",
        ),
        ("[bus]\nurl = \"http://mq\"\n", "bus.url", "invalid bus URL"),
        (
            "[runtime]\nkind = \"dir\"\n[runtime.dir]\ntarget_root = \"/srv\"\n",
            "runtime.dir.target_root",
            "{target}",
        ),
        (
            "[heat]\nremove_action = \"signal\"\n",
            "heat.remove_action",
            "signal_url",
        ),
        (
            "[keys]\ntime_windw = \"5m\"\n",
            "time_windw",
            "unknown field",
        ),
        ("[node\n", "", "not valid TOML"),
    ] {
        let f = write_file(dir.path(), "bad.toml", body);
        let out = bin(&["check-config", f.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{body:?}");
        let err = text(&out.stderr);
        assert!(err.contains(key) && err.contains(why), "{body:?}: {err}");
    }
}

#[test]
fn keygen_writes_a_key_pair_once() {
    use std::os::unix::fs::PermissionsExt;
    let dir = temp_dir();
    let d = dir.path().to_str().unwrap();
    let out = bin(&["keygen", "--dir", d]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let key = dir.path().join("node.key");
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let pair = gearshift_service::keys::load_keypair(&key).unwrap();
    assert!(text(&out.stdout).contains(pair.id()));
    let public = std::fs::read_to_string(dir.path().join("node.pub")).unwrap();
    assert_eq!(public, pair.public_pem());
    let again = bin(&["keygen", "--dir", d]);
    assert_eq!(again.status.code(), Some(1), "no silent overwrite");
    assert!(bin(&["keygen", "--dir", d, "--force"]).status.success());
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn wait_for(within: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn config(dir: &Path, port: u16, interval: &str) -> String {
    format!(
        r#"
[node]
name = "cli-node.example.com"
booted_for = "scale-up-42"
[bus]
url = "memory://cli-test"
[keys]
signing_key = "{d}/node.key"
broker_keys = ["{d}/broker.pub"]
[state]
dir = "{d}/state"
[report]
interval = "{interval}"
scan_interval = "100ms"
[runtime]
kind = "sim"
[runtime.sim]
gears = 5
idle_percent = 40
[metrics]
listen = "127.0.0.1:{port}"
[service]
shutdown_grace = "2s"
"#,
        d = dir.display()
    )
}

#[test]
fn run_status_metrics_reload_and_stop() {
    let dir = temp_dir();
    let d = dir.path();
    assert!(
        bin(&["keygen", "--dir", d.to_str().unwrap()])
            .status
            .success()
    );
    let broker = gearshift_proto::KeyPair::generate().unwrap();
    write_file(d, "broker.pub", &broker.public_pem());
    let port = free_port();
    let cfg = write_file(d, "node.toml", &config(d, port, "500ms"));
    let mut node = NodeProcess::new(cfg.clone(), d.join("node.log"));
    node.start();
    check_status(&cfg);
    // A second agent on the same state directory is refused.
    let mut second = NodeProcess::new(cfg.clone(), d.join("second.log"));
    second.start();
    wait_for(Duration::from_secs(30), "the second agent to exit", || {
        second.exited().is_some()
    });
    assert_eq!(second.exited(), Some(Some(1)));
    assert!(
        second.log_tail().contains("in use by another agent"),
        "{}",
        second.log_tail()
    );
    drop(second);

    // Metrics.
    wait_for(Duration::from_secs(30), "reports to be counted", || {
        http_get(port, "/metrics")
            .lines()
            .any(|l| l.starts_with("gearshift_node_reports_sent_total") && !l.ends_with(" 0"))
    });
    let m = http_get(port, "/metrics");
    assert!(m.contains("gearshift_node_active 1"), "{m}");
    check_reloads(&mut node, d, &cfg, port);

    // A figure, not an assertion (MCollective's node daemon idles at about 28 MB).
    let rss = std::fs::read_to_string(format!("/proc/{}/status", node_pid(d)))
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .map(str::to_string)
        });
    println!(
        "gearshift-node resident memory while idle: {}",
        rss.unwrap_or_default()
    );
    assert_eq!(node.terminate(Duration::from_secs(20)), Some(0));
    let out = bin(&[
        "status",
        "--json",
        "--state-dir",
        d.join("state").to_str().unwrap(),
    ]);
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(st["agent_running"], false);
}

/// `status --json` and `status` of the running agent.
fn check_status(cfg: &Path) {
    let cfg_s = cfg.to_str().unwrap().to_string();
    let status_json = || {
        let out = bin(&["status", "--json", "--config", &cfg_s]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()
    };
    wait_for(Duration::from_secs(30), "a status snapshot", || {
        status_json().is_some_and(|s| s["snapshot"]["gears"].is_object())
    });
    let st = status_json().unwrap();
    assert_eq!(st["agent_running"], true);
    assert_eq!(st["active"], true);
    assert_eq!(st["snapshot"]["node"], "cli-node.example.com");
    assert_eq!(st["snapshot"]["runtime"], "sim");
    let g = &st["snapshot"]["gears"];
    assert_eq!(
        g["started"].as_u64().unwrap() + g["idle"].as_u64().unwrap(),
        5
    );
    let human = text(&bin(&["status", "--config", &cfg_s]).stdout);
    assert!(
        human.contains("cli-node.example.com") && human.contains("state:       active"),
        "{human}"
    );
    assert!(human.contains("5 total"), "{human}");
}

/// SIGHUP: a valid change applies; a broken file is refused and the agent
/// keeps running.
fn check_reloads(node: &mut NodeProcess, d: &Path, cfg: &Path, port: u16) {
    let hup = || {
        Command::new("kill")
            .args(["-HUP", &node_pid(d)])
            .status()
            .unwrap()
    };
    std::fs::write(cfg, config(d, port, "2s")).unwrap();
    hup();
    wait_for(Duration::from_secs(10), "the reload", || {
        node.log_tail().contains("configuration reloaded")
    });
    std::fs::write(cfg, "[evacuation]\nparallelism = 0\n").unwrap();
    hup();
    wait_for(Duration::from_secs(10), "the refused reload", || {
        node.log_tail().contains("reload refused")
    });
    assert!(node.exited().is_none(), "still running after a bad reload");
}

fn node_pid(d: &Path) -> String {
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(d.join("state/status.json")).unwrap()).unwrap();
    s["pid"].to_string()
}
