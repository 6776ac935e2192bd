//! The Gnocchi path of pull mode: a token from the fake Keystone
//! (gearshift-cloud's Session), measures to an in-process Gnocchi that
//! checks the documented request shape and that the `X-Auth-Token` is one
//! Keystone issued and still honours.

use std::sync::Arc;
use std::time::Duration;

use gearshift_proto::msg::{GearCounts, NodeReport};
use gearshift_pushstats::gnocchi::{GnocchiClient, GnocchiOptions};
use gearshift_pushstats::metrics::DropReason;
use gearshift_pushstats::{PushMetrics, PushStatsArgs, PushStatsConfig, Sample, Unit};
use gearshift_tests::fake_openstack::{self as fake, FakeOpenStack};
use gearshift_tests::pushstats_gnocchi::FakeGnocchi;
use tokio_util::sync::CancellationToken;

async fn clouds() -> (Arc<FakeOpenStack>, FakeGnocchi) {
    gearshift_tests::init_logging();
    let os = Arc::new(FakeOpenStack::start().await);
    let check = os.clone();
    let gnocchi = FakeGnocchi::start(Arc::new(move |t: &str| check.token_is_valid(t))).await;
    (os, gnocchi)
}

fn opts(gnocchi: &FakeGnocchi, create: bool, policy: Option<&str>) -> GnocchiOptions {
    GnocchiOptions {
        endpoint: Some(gnocchi.url()),
        default_resource: Some("7b1c3c2e-5d2a-4a38-9d55-0c3f0b6f2a11".into()),
        resource_type: "generic".into(),
        archive_policy: policy.map(str::to_string),
        create_missing: create,
        metric_prefix: "gearshift.".into(),
        timeout: Duration::from_secs(10),
    }
}

const SERVER: &str = "7b1c3c2e-5d2a-4a38-9d55-0c3f0b6f2a11";

fn report() -> NodeReport {
    NodeReport {
        node: "node-3.example.com".into(),
        seq: 9,
        profile: "small".into(),
        district: None,
        max_active_gears: 20,
        gears: GearCounts {
            started: 8,
            idle: 2,
            stopped: 0,
            deploying: 0,
            unknown: 0,
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 0,
        mem_total_mb: 0,
        started_at: chrono::Utc::now(),
        booted_at: None,
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 60,
        agent_version: "test".into(),
    }
}

#[tokio::test]
async fn measures_carry_a_keystone_token_and_the_documented_body() {
    let (os, gnocchi) = clouds().await;
    // The Nova server's resource exists (Ceilometer made it) with one of our metrics.
    gnocchi.add_resource(SERVER, "instance", &["gearshift.node_utilization"]);
    let client = GnocchiClient::new(os.session(), opts(&gnocchi, true, Some("low"))).unwrap();
    let samples = PushStatsConfig::default().node_samples(&report());
    client.push(&samples).await.expect("push to Gnocchi");

    gnocchi.assert_no_violations();
    os.assert_no_violations();
    // 10 gears, 2 idle: 8 active of 20 -> 40 %
    let m = gnocchi.measures(SERVER, "gearshift.node_utilization");
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].1, 40.0);
    assert_eq!(gnocchi.measures(SERVER, "gearshift.active_gears")[0].1, 8.0);
    assert_eq!(gnocchi.measures(SERVER, "gearshift.gears_idle")[0].1, 2.0);
    let r = gnocchi.resource(SERVER).unwrap();
    // 11 figures (memory unknown): 1 existed, 10 appended with our policy and unit.
    assert_eq!(r.metrics.len(), 11);
    assert_eq!(r.metrics["gearshift.active_gears"].archive_policy, "low");
    assert_eq!(
        r.metrics["gearshift.active_gears"].unit.as_deref(),
        Some("Count")
    );
    assert_eq!(
        r.metrics["gearshift.node_utilization"].unit, None,
        "existing metric left alone"
    );
    let reqs = gnocchi.requests();
    assert!(reqs.iter().all(|q| q.token.is_some() && q.status != 401));
    assert!(
        reqs.iter()
            .all(|q| q.content_type.as_deref() == Some("application/json"))
    );
    let appends: Vec<_> = reqs
        .iter()
        .filter(|q| q.path == format!("/v1/resource/generic/{SERVER}/metric"))
        .collect();
    assert_eq!(appends.len(), 10);
    assert_eq!(
        appends[0].body.as_ref().unwrap(),
        &serde_json::json!({"gearshift.active_gears": {"archive_policy_name": "low", "unit": "Count"}})
    );
    assert_eq!(os.tokens_issued(), 1, "one token for every call");

    // A second push: metrics exist now, one call per metric, no creation.
    let before = gnocchi.requests().len();
    client.push(&samples).await.unwrap();
    assert_eq!(gnocchi.requests().len() - before, 11);
    assert_eq!(
        gnocchi.measures(SERVER, "gearshift.node_utilization").len(),
        2
    );
}

#[tokio::test]
async fn a_missing_resource_is_created_with_its_metric() {
    let (os, gnocchi) = clouds().await;
    let client = GnocchiClient::new(os.session(), opts(&gnocchi, true, Some("medium"))).unwrap();
    let s = Sample::new("CapacityUtilization", 81.5, Unit::PERCENT)
        .with_resource("gearshift-profile-small");
    client.push(&[s]).await.unwrap();
    gnocchi.assert_no_violations();
    let r = gnocchi
        .resource("gearshift-profile-small")
        .expect("created");
    assert_eq!(r.resource_type, "generic");
    assert_eq!(r.project_id.as_deref(), Some(fake::PROJECT_ID));
    assert_eq!(r.user_id.as_deref(), Some(fake::USER_ID));
    assert_eq!(
        r.metrics["gearshift.capacity_utilization"].archive_policy,
        "medium"
    );
    assert_eq!(
        gnocchi.measures("gearshift-profile-small", "gearshift.capacity_utilization")[0].1,
        81.5
    );
    // measures 404 -> append 404 -> create 201 -> measures 202
    let statuses: Vec<(String, u16)> = gnocchi
        .requests()
        .iter()
        .map(|q| (q.path.clone(), q.status))
        .collect();
    assert_eq!(
        statuses,
        vec![
            ("/v1/resource/generic/gearshift-profile-small/metric/gearshift.capacity_utilization/measures".into(), 404),
            ("/v1/resource/generic/gearshift-profile-small/metric".into(), 404),
            ("/v1/resource/generic".into(), 201),
            ("/v1/resource/generic/gearshift-profile-small/metric/gearshift.capacity_utilization/measures".into(), 202),
        ]
    );
}

#[tokio::test]
async fn refusals_are_typed_and_not_retried() {
    let (os, gnocchi) = clouds().await;
    // Not allowed to create: the 404 comes back as a fatal error.
    let client = GnocchiClient::new(os.session(), opts(&gnocchi, false, None)).unwrap();
    let e = client
        .push(&[Sample::new("ActiveGears", 1.0, Unit::COUNT)])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(404));
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("does not exist"), "{e}");
    // No archive policy and no rule: Gnocchi's 400, fatal.
    let client = GnocchiClient::new(os.session(), opts(&gnocchi, true, None)).unwrap();
    let e = client
        .push(&[Sample::new("ActiveGears", 1.0, Unit::COUNT)])
        .await
        .unwrap_err();
    assert_eq!(e.status(), Some(400));
    assert!(!e.is_retryable());
    // With a rule, the same call works.
    gnocchi.set_default_rule(true);
    client
        .push(&[Sample::new("ActiveGears", 1.0, Unit::COUNT)])
        .await
        .unwrap();
    gnocchi.assert_no_violations();
}

#[tokio::test]
async fn a_revoked_token_is_replaced_once() {
    let (os, gnocchi) = clouds().await;
    gnocchi.add_resource(SERVER, "generic", &["gearshift.heartbeat"]);
    let client = GnocchiClient::new(os.session(), opts(&gnocchi, false, None)).unwrap();
    client
        .push(&[Sample::heartbeat(Unit::COUNTER)])
        .await
        .unwrap();
    os.revoke_tokens();
    client
        .push(&[Sample::heartbeat(Unit::COUNTER)])
        .await
        .unwrap();
    assert_eq!(os.tokens_issued(), 2);
    let statuses: Vec<u16> = gnocchi.requests().iter().map(|q| q.status).collect();
    assert_eq!(statuses, vec![202, 401, 202]);
    assert_eq!(gnocchi.measures(SERVER, "gearshift.heartbeat").len(), 2);
}

#[tokio::test]
async fn the_pusher_retries_server_errors_then_delivers() {
    let (os, gnocchi) = clouds().await;
    gnocchi.set_default_rule(true);
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("auth.env");
    let lines: String = os
        .env_vars()
        .iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    std::fs::write(&env_file, lines).unwrap();
    let text = format!(
        r#"
[push_stats]
enabled = true
debounce = "50ms"
retry_min = "50ms"
retry_max = "200ms"

[push_stats.gnocchi]
endpoint = "{}"
auth_env_file = "{}"
"#,
        gnocchi.url(),
        env_file.display()
    );
    let cfg = PushStatsConfig::from_agent_toml(&text).unwrap();
    gnocchi.fail_next(503, 2);
    let metrics = PushMetrics::new();
    let pusher = cfg
        .start(
            Some("node-3.example.com"),
            metrics.clone(),
            CancellationToken::new(),
        )
        .unwrap()
        .expect("enabled");
    pusher.handle().update(cfg.node_samples(&report()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while metrics.pushes_total("gnocchi") < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "not delivered within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(metrics.failures_total("gnocchi"), 2);
    assert_eq!(metrics.retries_total("gnocchi"), 2);
    assert_eq!(
        metrics.dropped_total("gnocchi", DropReason::RetriesExhausted),
        0
    );
    assert_eq!(
        gnocchi.measures("node-3.example.com", "gearshift.node_utilization")[0].1,
        40.0
    );
    gnocchi.assert_no_violations();
    pusher.shutdown().await;
}

#[tokio::test]
async fn push_stats_cli_sends_a_saved_report_to_gnocchi() {
    let (os, gnocchi) = clouds().await;
    let dir = tempfile::tempdir().unwrap();
    let env_file = dir.path().join("auth.env");
    let lines: String = os
        .env_vars()
        .iter()
        .map(|(k, v)| format!("export {k}={v}\n"))
        .collect();
    std::fs::write(&env_file, lines).unwrap();
    let report_file = dir.path().join("report.json");
    std::fs::write(&report_file, serde_json::to_vec(&report()).unwrap()).unwrap();
    let args = PushStatsArgs::try_parse_from([
        "push-stats",
        "--gnocchi-url",
        &gnocchi.url(),
        "--os-env-file",
        env_file.to_str().unwrap(),
        "--from-report",
        report_file.to_str().unwrap(),
        "--archive-policy",
        "high",
        "--heartbeat",
    ])
    .unwrap();
    let out = gearshift_pushstats::run_push_stats(&args).await.unwrap();
    assert_eq!(out.targets[0].target, "gnocchi");
    assert_eq!(out.targets[0].samples, 12, "11 figures and the heartbeat");
    let r = gnocchi
        .resource("node-3.example.com")
        .expect("created for the report's node");
    assert_eq!(r.metrics.len(), 12);
    assert!(r.metrics.values().all(|m| m.archive_policy == "high"));
    assert_eq!(
        gnocchi.measures("node-3.example.com", "gearshift.heartbeat")[0].1,
        1.0
    );
    gnocchi.assert_no_violations();
}
