//! Pull mode wired into the real agent binaries: a `gearshift-node` and a
//! `gearshift-broker` process with a `[push_stats]` section push their
//! figures to an in-process Gnocchi (tokens from the fake Keystone), over
//! the real RabbitMQ, and show the pusher's counters on `/metrics`. Their
//! `push-stats` subcommands answer with the documented exit codes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use gearshift_pushstats::PushStatsConfig;
use gearshift_sim::fleet::NodeSpec;
use gearshift_tests::broker_harness::{TestBed, WAIT, eventually, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, broker_binary, write_config};
use gearshift_tests::fake_openstack::FakeOpenStack;
use gearshift_tests::node_process::{NodeProcess, node_binary, write_file};
use gearshift_tests::pushstats::free_port;
use gearshift_tests::pushstats_gnocchi::FakeGnocchi;
use gearshift_tests::{amqp_url, init_logging, unique};

async fn clouds(dir: &Path) -> (Arc<FakeOpenStack>, FakeGnocchi, String) {
    let os = Arc::new(FakeOpenStack::start().await);
    let check = os.clone();
    let gnocchi = FakeGnocchi::start(Arc::new(move |t: &str| check.token_is_valid(t))).await;
    let env_file = dir.join("auth.env");
    let lines: String = os
        .env_vars()
        .iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    std::fs::write(&env_file, lines).unwrap();
    (os, gnocchi, env_file.display().to_string())
}

async fn scrape(addr: &str) -> String {
    gearshift_cloud::http::install_tls_provider();
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(r) = reqwest::get(format!("http://{addr}/metrics")).await
            && let Ok(t) = r.text().await
        {
            return t;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no /metrics on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Scrapes until the sample `name` is at least `min`: the pusher counts a
/// push once the server has answered it, which can be just after the server
/// recorded it. Returns the last scrape.
async fn scrape_until(addr: &str, name: &str, min: f64) -> String {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let m = scrape(addr).await;
        if sample(&m, name).is_some_and(|v| v >= min) {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} did not reach {min} within {WAIT:?}:\n{m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the first sample line starting with `prefix`.
fn sample(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn gear(root: &Path, id: &str, state: &str) {
    let g = root.join(id);
    std::fs::create_dir_all(g.join("app-root/data")).unwrap();
    std::fs::write(g.join(".state"), state).unwrap();
}

/// The node's `node.toml` in `base`: the `dir` runtime on `gears`, fast
/// reports, metrics on `listen`, pushes to Gnocchi; checked by the binary.
fn write_node_config(
    base: &Path,
    node: &str,
    gears: &Path,
    listen: &str,
    gnocchi: &str,
    env_file: &str,
) -> PathBuf {
    let config = write_file(
        base,
        "node.toml",
        &format!(
            r#"
[node]
name = "{node}"
[bus]
url = "{url}"
[keys]
signing_key = "{base}/node.key"
broker_keys = ["{base}/broker.pub"]
[state]
dir = "{base}/state"
[report]
interval = "2s"
scan_interval = "200ms"
min_gap = "50ms"
[runtime]
kind = "dir"
[runtime.facts]
profile = "small"
max_active_gears = 10
[runtime.dir]
root = "{gears}"
target_root = "{base}/elsewhere/{{target}}"
[metrics]
listen = "{listen}"

[push_stats]
enabled = true
interval = "2s"
debounce = "100ms"
metrics = ["NodeUtilization", "ActiveGears", "GearsIdle"]

[push_stats.gnocchi]
endpoint = "{gnocchi}"
auth_env_file = "{env_file}"
archive_policy = "low"
"#,
            url = amqp_url(),
            base = base.display(),
            gears = gears.display(),
        ),
    );
    let check = Command::new(node_binary())
        .arg("check-config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    config
}

/// Waits until Gnocchi holds `value` for `metric` of resource `res`.
async fn gnocchi_shows(gnocchi: &FakeGnocchi, what: &str, res: &str, metric: &str, value: f64) {
    eventually(what, || {
        gnocchi
            .measures(res, metric)
            .iter()
            .any(|(_, v)| *v == value)
    })
    .await;
}

#[tokio::test]
async fn node_binary_pushes_each_report_and_each_change() {
    init_logging();
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let (os, gnocchi, env_file) = clouds(base).await;
    let node = unique("n-push-");
    let gears = base.join("gears");
    std::fs::create_dir_all(&gears).unwrap();
    for (i, state) in ["started", "started", "started", "idle"].iter().enumerate() {
        gear(&gears, &format!("{:024x}", 0xabc000 + i), state);
    }
    gearshift_service::keys::write_keypair(base, "node", false).unwrap();
    gearshift_service::keys::write_keypair(base, "broker", false).unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let config = write_node_config(base, &node, &gears, &listen, &gnocchi.url(), &env_file);
    let mut proc = NodeProcess::new(config, base.join("node.log"));
    proc.start();

    // 3 started, 1 idle, of 10: 30 %.
    let utilization = "gearshift.node_utilization";
    gnocchi_shows(
        &gnocchi,
        "the node's figures in Gnocchi",
        &node,
        utilization,
        30.0,
    )
    .await;
    assert_eq!(gnocchi.measures(&node, "gearshift.active_gears")[0].1, 3.0);
    assert_eq!(gnocchi.measures(&node, "gearshift.gears_idle")[0].1, 1.0);
    assert!(
        gnocchi.measures(&node, "gearshift.free_memory").is_empty(),
        "filtered out by `metrics`"
    );
    // The idle gear starts: the change reaches Gnocchi.
    std::fs::write(
        gears.join(format!("{:024x}", 0xabc003)).join(".state"),
        "started",
    )
    .unwrap();
    gnocchi_shows(&gnocchi, "the change in Gnocchi", &node, utilization, 40.0).await;
    let m = scrape_until(
        &listen,
        "gearshift_node_pushstats_pushes_total{target=\"gnocchi\"}",
        2.0,
    )
    .await;
    assert!(
        m.contains("gearshift_node_reports_sent_total"),
        "the agent's own metrics stay"
    );
    gnocchi.assert_no_violations();
    os.assert_no_violations();
    assert_eq!(
        proc.terminate(Duration::from_secs(20)),
        Some(0),
        "{}",
        proc.log_tail()
    );
}

/// The broker's `broker.toml` for `bed` with a `[push_stats]` section to
/// `gnocchi` and metrics on `listen`, checked by the binary's
/// `check-config` (which accepts the section as part of broker.toml).
fn write_push_config(bed: &TestBed, gnocchi: &str, env_file: &str, listen: &str) -> PathBuf {
    let mut cfg = fast_config(&bed.url, &bed.path("state"), "log", &bed.tag);
    bed.keys.configure_broker(&mut cfg);
    cfg.metrics.listen = Some(listen.parse().unwrap());
    cfg.push_stats = PushStatsConfig::from_agent_toml(&format!(
        r#"
[push_stats]
enabled = true
interval = "1s"
debounce = "100ms"

[push_stats.gnocchi]
endpoint = "{gnocchi}"
auth_env_file = "{env_file}"
archive_policy = "low"
"#
    ))
    .unwrap();
    let config_path = bed.path("broker.toml");
    write_config(&cfg, &config_path);
    config_path
}

#[tokio::test]
async fn broker_binary_pushes_fleet_figures_per_profile_and_district() {
    let bed = TestBed::new("ps", |_| amqp_url()).await;
    let (os, gnocchi, env_file) = clouds(bed.dir.path()).await;
    let d1 = format!("{}d1", bed.tag);
    let listen = format!("127.0.0.1:{}", free_port());
    let config_path = write_push_config(&bed, &gnocchi.url(), &env_file, &listen);
    let fleet = &bed.fleet;
    for (n, gears) in [("n1", 8), ("n2", 4)] {
        let spec = NodeSpec::new(&format!("{}-{n}", bed.tag), &d1, "small", 10).with_gears(gears);
        fleet.start_node(&spec).expect("node agent starts");
    }
    let proc = BrokerProcess::start(&config_path, &bed.path("broker.log"));

    // 12 active, 8 available: oo-stats usage 60 %.
    let (profile, utilization) = ("gearshift-profile-small", "gearshift.capacity_utilization");
    gnocchi_shows(
        &gnocchi,
        "the profile's figures in Gnocchi",
        profile,
        utilization,
        60.0,
    )
    .await;
    let district = format!("gearshift-district-{d1}");
    let active = "gearshift.nodes_active";
    gnocchi_shows(
        &gnocchi,
        "the district's figures in Gnocchi",
        &district,
        active,
        2.0,
    )
    .await;
    assert!(
        gnocchi
            .measures(&district, "gearshift.available_active_gears")
            .iter()
            .any(|(_, v)| *v == 8.0)
    );
    let r = gnocchi.resource("gearshift-profile-small").unwrap();
    assert_eq!(r.resource_type, "generic");
    assert_eq!(
        r.metrics["gearshift.capacity_utilization"].archive_policy,
        "low"
    );
    scrape_until(
        &listen,
        "gearshift_broker_pushstats_pushes_total{target=\"gnocchi\"}",
        1.0,
    )
    .await;
    gnocchi.assert_no_violations();
    os.assert_no_violations();
    assert!(proc.terminate().success());
    fleet.stop_all().await;
}

#[tokio::test]
async fn push_stats_subcommands_print_and_exit_as_documented() {
    init_logging();
    for bin in [node_binary(), broker_binary()] {
        let out = Command::new(&bin)
            .args([
                "push-stats",
                "--url",
                "http://heat.example.com:8003/v1",
                "--heartbeat",
                "--watch",
                "paas-NodeScaleUp-x1",
                "--dry-run",
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            stdout.starts_with("cloudwatch POST http://heat.example.com:8003/v1 Action=PutMetricData&Version=2010-08-01&Namespace=system%2Flinux&MetricData.member.1.MetricName=Heartbeat&MetricData.member.1.Value=1&MetricData.member.1.Unit=Counter"),
            "{stdout}"
        );
        assert!(stdout.contains("Dimensions.member.1.Value=paas-NodeScaleUp-x1"));
        // No target: a usage error.
        let out = Command::new(&bin)
            .args(["push-stats", "--heartbeat"])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("no target"));
        // A target that refuses connections: a runtime failure, after the attempts.
        let out = Command::new(&bin)
            .args([
                "push-stats",
                "--url",
                &format!("http://127.0.0.1:{}/", free_port()),
                "--credential-file",
                "/dev/null",
                "--heartbeat",
            ])
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "an empty credentials file is a usage error"
        );
        let creds = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(creds.path(), "AWSAccessKeyId=a\nAWSSecretKey=b\n").unwrap();
        let out = Command::new(&bin)
            .args([
                "push-stats",
                "--url",
                &format!("http://127.0.0.1:{}/", free_port()),
                "--heartbeat",
                "--attempts",
                "2",
            ])
            .arg("--credential-file")
            .arg(creds.path())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("connection failed"));
    }
}
