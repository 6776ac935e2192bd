//! SIGHUP on the real `gearshift-broker` binary, over RabbitMQ (AMQP) with
//! simulated node agents: a reload that names a new handler, moves the
//! metrics listener and raises `min_nodes` is applied (the new handler gets
//! the scale-up, the new port answers, the old one is closed); a change to a
//! key that only applies at start is refused naming the key (log, metric,
//! status); a broken file is refused and the running configuration stays;
//! a node key removed from `nodes.d` makes that node's reports refused.

use std::path::Path;
use std::time::Duration;

use gearshift_broker::config::BrokerConfig;
use gearshift_broker::perkey::PerKey;
use gearshift_sim::fleet::NodeSpec;
use gearshift_sim::harness::metrics::{free_port, http_get, scrape};
use gearshift_sim::harness::requests::{CloudRequest, RequestLog, write_recording_handler};
use gearshift_tests::amqp_url;
use gearshift_tests::broker_harness::{TestBed, WAIT, eventually, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, write_config};

/// An `exec` handler named `name` whose script records into `log`.
fn recording_handler(bed: &TestBed, cfg: &mut BrokerConfig, name: &str, log: &RequestLog) {
    let dir = bed.path(name);
    write_recording_handler(&dir, log.path()).expect("handler script");
    let h = serde_json::json!({"type": "exec", "dir": dir, "timeout": "10s"});
    cfg.handlers.insert(
        name.into(),
        serde_json::from_value(h).expect("exec handler"),
    );
}

/// Waits until `/metrics` on `port` answers and `pred` holds of it.
async fn metrics_until(
    port: u16,
    what: &str,
    pred: impl Fn(&gearshift_sim::harness::metrics::Metrics) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(m) = scrape(port).await
            && pred(&m)
        {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The `reload` part of the dashboard's status.
async fn reload_status(port: u16) -> serde_json::Value {
    let body = http_get(port, "/api/dashboard").await.expect("dashboard");
    let v: serde_json::Value = serde_json::from_str(&body).expect("dashboard JSON");
    v["status"]["reload"].clone()
}

fn log_text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sighup_rebuilds_handlers_keys_and_listener_or_refuses_naming_the_keys() {
    let bed = TestBed::new("rl", |_| amqp_url()).await;
    let tag = bed.tag.clone();
    let district = format!("{tag}d1");
    let (log_a, mut log_b) = (
        RequestLog::new(&bed.path("a.log")),
        RequestLog::new(&bed.path("b.log")),
    );
    let (port1, port2) = (free_port().unwrap(), free_port().unwrap());
    let mut cfg = fast_config(&bed.url, &bed.path("state"), "cloud_a", &tag);
    bed.keys.configure_broker(&mut cfg);
    recording_handler(&bed, &mut cfg, "cloud_a", &log_a);
    cfg.policy.compact_threshold = PerKey::parse("none").unwrap();
    cfg.metrics.listen = Some(([127, 0, 0, 1], port1).into());
    let path = bed.path("broker.toml");
    write_config(&cfg, &path);
    for n in 1..=2 {
        let spec = NodeSpec::new(&format!("{tag}-n{n}"), &district, "small", 100).with_gears(10);
        bed.fleet.start_node(&spec).expect("node agent starts");
    }
    let broker_log = bed.path("broker.log");
    let mut proc = BrokerProcess::start(&path, &broker_log);
    metrics_until(port1, "both nodes known", |m| {
        m.get("gearshift_broker_nodes") == 2.0
    })
    .await;

    // 1. Live changes: a new handler for the group, min_nodes 3 (so a
    //    scale-up goes through it), the listener on another port.
    recording_handler(&bed, &mut cfg, "cloud_b", &log_b);
    cfg.group_defaults.handler = "cloud_b".into();
    cfg.group_defaults.min_nodes = 3;
    cfg.metrics.listen = Some(([127, 0, 0, 1], port2).into());
    write_config(&cfg, &path);
    proc.reload();
    metrics_until(port2, "the reload applied on the new port", |m| {
        m.get("gearshift_broker_config_reloads_total{result=\"applied\"}") == 1.0
    })
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let create = loop {
        let got = log_b.poll().expect("request log");
        if let Some(r) = got
            .into_iter()
            .find(|r| matches!(r, CloudRequest::Create { .. }))
        {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no create-node through cloud_b:\n{}",
            log_text(&broker_log)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        matches!(&create, CloudRequest::Create { district: d, .. } if *d == district),
        "{create:?}"
    );
    assert!(
        log_text(log_a.path()).is_empty(),
        "the old handler was called after the reload"
    );
    assert!(
        scrape(port1).await.is_err(),
        "the old metrics port still answers"
    );
    assert_eq!(reload_status(port2).await["applied"], true);

    // 2. A key that only applies at start: refused, naming it.
    let mut renamed = cfg.clone();
    renamed.agent.name = format!("{}-renamed", cfg.agent.name);
    write_config(&renamed, &path);
    proc.reload();
    metrics_until(port2, "the refused reload counted", |m| {
        m.get("gearshift_broker_config_reloads_total{result=\"refused\"}") == 1.0
            && m.get("gearshift_broker_config_reload_refused") == 1.0
    })
    .await;
    eventually("the refusal logged with the key", || {
        let l = log_text(&broker_log);
        l.contains("reload refused") && l.contains("agent.name")
    })
    .await;
    // The status document is rebuilt at its own pace: wait for it.
    let mut st = reload_status(port2).await;
    for _ in 0..60 {
        if st["applied"] == false {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        st = reload_status(port2).await;
    }
    assert_eq!(st["applied"], false, "{st}");
    assert_eq!(
        st["restart_keys"],
        serde_json::json!(["agent.name"]),
        "{st}"
    );

    // 3. A broken file: refused, the running configuration (port2) stays.
    std::fs::write(&path, "[policy]\ninterval = \"soon\"\n").unwrap();
    proc.reload();
    eventually("the broken file refused", || {
        log_text(&broker_log).contains("policy.interval")
    })
    .await;
    metrics_until(port2, "still serving after a broken file", |_| true).await;
    assert!(
        proc.exited().is_none(),
        "the agent stopped on a broken file"
    );

    // 4. The fleet-wide node key no longer trusted: the nodes' reports are
    // refused.
    let mut revoked = cfg.clone();
    revoked
        .keys
        .trust
        .retain(|t| t.role != gearshift_proto::Role::Node);
    assert!(
        revoked.keys.trust.len() < cfg.keys.trust.len(),
        "a node key trusted"
    );
    let refused_before = scrape(port2)
        .await
        .unwrap()
        .sum("gearshift_broker_refused_total");
    write_config(&revoked, &path);
    proc.reload();
    metrics_until(port2, "the second reload applied", |m| {
        m.get("gearshift_broker_config_reloads_total{result=\"applied\"}") == 2.0
    })
    .await;
    metrics_until(port2, "reports refused under the new keys", |m| {
        m.sum("gearshift_broker_refused_total") >= refused_before + 2.0
    })
    .await;
    assert!(proc.exited().is_none());
    let status = proc.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status:?}");
}
