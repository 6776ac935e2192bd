//! The CloudWatch path of pull mode against a real, independent
//! implementation of the API: moto's server mode, with IAM authentication
//! on, so every push must carry a SigV4 signature moto (botocore's signer)
//! agrees with. Data are read back with boto3 (ListMetrics and
//! GetMetricStatistics) and checked: names, dimensions, values, units.

use std::collections::BTreeMap;
use std::time::Duration;

use gearshift_proto::msg::{DistrictInfo, GearCounts, GroupStats, NodeReport};
use gearshift_pushstats::cli::PushStatsArgs;
use gearshift_pushstats::cloudwatch::{CloudWatchClient, CloudWatchOptions, SIGNING_SERVICE};
use gearshift_pushstats::{AwsCredentials, PushMetrics, PushStatsConfig, Sample, Unit};
use gearshift_tests::pushstats::{Moto, dims_of};
use gearshift_tests::unique;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

fn report() -> NodeReport {
    NodeReport {
        node: "node-7.example.com".into(),
        seq: 1,
        profile: "small".into(),
        district: Some(DistrictInfo {
            uuid: "0123456789abcdef0123456789abcdef".into(),
            active: true,
            first_uid: None,
            max_uid: None,
        }),
        max_active_gears: 40,
        gears: GearCounts {
            started: 20,
            idle: 5,
            stopped: 3,
            deploying: 2,
            unknown: 0,
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 3000,
        mem_total_mb: 8000,
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

fn client(moto: &Moto, namespace: &str, alarms: &[&str], secret: &str) -> CloudWatchClient {
    CloudWatchClient::new(
        CloudWatchOptions {
            endpoint: url::Url::parse(&moto.endpoint).unwrap(),
            region: "us-east-1".into(),
            service: SIGNING_SERVICE.into(),
            namespace: namespace.into(),
            alarm_names: alarms.iter().map(|s| s.to_string()).collect(),
            max_per_request: 20,
            timeout: Duration::from_secs(10),
        },
        AwsCredentials::new(&moto.access_key_id, secret).unwrap(),
    )
    .unwrap()
}

fn one(stats: &[Value]) -> &Value {
    assert_eq!(stats.len(), 1, "one datapoint expected: {stats:?}");
    &stats[0]
}

#[tokio::test]
async fn node_set_with_alarm_names_reads_back_through_boto3() {
    gearshift_tests::init_logging();
    let moto = Moto::start().await;
    let ns = unique("gearshift/test-");
    let mut cfg = PushStatsConfig::default();
    cfg.dimensions
        .insert("AutoScalingGroupName".into(), "openshift-nodes".into());
    cfg.instance_id = Some("i-0007".into());
    let samples = cfg.node_samples(&report());
    assert_eq!(samples.len(), 13);
    // 13 figures x 2 alarm names = 26 data: two signed requests of <= 20.
    let cw = client(&moto, &ns, &["NodeAlarmHigh", "NodeAlarmLow"], &moto.secret);
    assert_eq!(cw.prepare(&samples, chrono::Utc::now()).unwrap().len(), 2);
    cw.put_metric_data(&samples)
        .await
        .expect("moto accepts our signed PutMetricData");

    let high: &[(&str, &str)] = &[
        ("AlarmName", "NodeAlarmHigh"),
        ("AutoScalingGroupName", "openshift-nodes"),
        ("InstanceId", "i-0007"),
    ];
    let low: &[(&str, &str)] = &[
        ("AlarmName", "NodeAlarmLow"),
        ("AutoScalingGroupName", "openshift-nodes"),
        ("InstanceId", "i-0007"),
    ];
    let (metrics, stats) = moto
        .read(
            &ns,
            &[
                ("NodeUtilization", high),
                ("NodeUtilization", low),
                ("ActiveGears", high),
                ("FreeMemory", low),
                ("GearsIdle", high),
            ],
        )
        .await;
    // Every metric of the set, once per alarm name, with exactly our dimensions.
    assert_eq!(metrics.len(), 26, "{metrics:?}");
    for name in gearshift_pushstats::sets::NODE_METRICS {
        let found: Vec<_> = metrics
            .iter()
            .filter(|m| m["MetricName"] == *name)
            .collect();
        assert_eq!(found.len(), 2, "{name}: {found:?}");
        for m in found {
            let d = dims_of(m);
            assert_eq!(d.len(), 3, "{d:?}");
            assert_eq!(
                d[1],
                ("AutoScalingGroupName".into(), "openshift-nodes".into())
            );
            assert_eq!(d[2], ("InstanceId".into(), "i-0007".into()));
        }
    }
    // active = 30 - 5 - 3 = 22 of 40 -> 55 %
    let u = one(&stats[0]);
    assert_eq!(u["Maximum"], 55.0);
    assert_eq!(u["SampleCount"], 1.0);
    assert_eq!(u["Unit"], "Percent");
    assert_eq!(one(&stats[1])["Maximum"], 55.0);
    assert_eq!(one(&stats[2])["Sum"], 22.0);
    assert_eq!(one(&stats[2])["Unit"], "Count");
    assert_eq!(one(&stats[3])["Minimum"], 3000.0);
    assert_eq!(one(&stats[3])["Unit"], "Megabytes");
    assert_eq!(one(&stats[4])["Maximum"], 5.0);
}

#[tokio::test]
async fn heartbeat_from_the_cli_fires_like_notify_scale_up() {
    gearshift_tests::init_logging();
    let moto = Moto::start().await;
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("heat-credentials");
    std::fs::write(
        &creds,
        format!(
            "AWSAccessKeyId={}\nAWSSecretKey={}\n",
            moto.access_key_id, moto.secret
        ),
    )
    .unwrap();
    let ns = unique("gearshift/cli-");
    let args = PushStatsArgs::try_parse_from([
        "push-stats",
        "--url",
        &moto.endpoint,
        "--credential-file",
        creds.to_str().unwrap(),
        "--namespace",
        &ns,
        "--heartbeat",
        "--watch",
        "openshift-NodeScaleUp-abc",
        "--auto-scaling-group",
        "openshift-nodes",
        "--metric",
        "NodeUtilization",
        "--value",
        "90",
        "--units",
        "Percent",
    ])
    .unwrap();
    let out = gearshift_pushstats::run_push_stats(&args)
        .await
        .expect("push-stats against moto");
    assert_eq!(out.targets.len(), 1);
    assert_eq!(out.targets[0].target, "cloudwatch");
    assert_eq!(out.targets[0].samples, 2);
    assert_eq!(out.targets[0].attempts, 1);

    let dims: &[(&str, &str)] = &[
        ("AlarmName", "openshift-NodeScaleUp-abc"),
        ("AutoScalingGroupName", "openshift-nodes"),
    ];
    let (metrics, stats) = moto
        .read(&ns, &[("Heartbeat", dims), ("NodeUtilization", dims)])
        .await;
    assert_eq!(metrics.len(), 2, "{metrics:?}");
    // The alarm in the template: SampleCount of Heartbeat > 0 in the period.
    let hb = one(&stats[0]);
    assert_eq!(hb["SampleCount"], 1.0);
    assert_eq!(hb["Sum"], 1.0);
    assert_eq!(hb["Unit"], "Counter", "cfn-push-stats' unit, kept as sent");
    assert_eq!(one(&stats[1])["Maximum"], 90.0);
}

#[tokio::test]
async fn a_wrong_secret_or_key_is_refused_and_nothing_is_stored() {
    gearshift_tests::init_logging();
    let moto = Moto::start().await;
    let ns = unique("gearshift/auth-");
    let samples = vec![Sample::new("ActiveGears", 3.0, Unit::COUNT)];

    let e = client(&moto, &ns, &[], "not-the-secret")
        .put_metric_data(&samples)
        .await
        .expect_err("a wrong secret must be refused");
    assert!(e.is_auth() && !e.is_retryable(), "{e}");
    assert_eq!(e.status(), Some(403));
    assert!(e.to_string().contains("SignatureDoesNotMatch"), "{e}");

    let stranger = CloudWatchClient::new(
        client(&moto, &ns, &[], &moto.secret).options().clone(),
        AwsCredentials::new("AKIAUNKNOWNKEY000000", "whatever").unwrap(),
    )
    .unwrap();
    let e = stranger.put_metric_data(&samples).await.unwrap_err();
    assert!(e.is_auth() && !e.is_retryable(), "{e}");
    assert!(e.to_string().contains("InvalidClientTokenId"), "{e}");

    let (metrics, _) = moto.read(&ns, &[]).await;
    assert!(metrics.is_empty(), "refused data were stored: {metrics:?}");

    // The right secret, same request shape: accepted.
    client(&moto, &ns, &[], &moto.secret)
        .put_metric_data(&samples)
        .await
        .unwrap();
    let (metrics, _) = moto.read(&ns, &[]).await;
    assert_eq!(metrics.len(), 1);
}

#[tokio::test]
async fn pusher_from_a_config_section_delivers_fleet_figures_and_heartbeats() {
    gearshift_tests::init_logging();
    let moto = Moto::start().await;
    let ns = unique("gearshift/fleet-");
    let text = format!(
        r#"
[push_stats]
enabled = true
interval = "60s"
debounce = "100ms"
retry_min = "100ms"

[push_stats.group_dimensions."profile:small"]
AutoScalingGroupName = "asg-small"

[push_stats.cloudwatch]
endpoint = "{}"
namespace = "{ns}"
access_key_id = "{}"
secret_access_key = "{}"
"#,
        moto.endpoint, moto.access_key_id, moto.secret
    );
    let cfg = PushStatsConfig::from_agent_toml(&text).unwrap();
    let metrics = PushMetrics::new();
    let cancel = CancellationToken::new();
    let pusher = cfg
        .start(None, metrics.clone(), cancel.clone())
        .unwrap()
        .expect("enabled");
    let stats = GroupStats {
        nodes_active: 3,
        nodes_inactive: 1,
        nodes_missing: 0,
        gears_active: 81,
        gears_total: 100,
        available_active_gears: 19,
        effective_available_gears: 12,
        usage_pct: 81.0,
        district_free_uids: Some(12),
    };
    let profiles = BTreeMap::from([("small".to_string(), stats.clone())]);
    let districts = BTreeMap::from([("d1".to_string(), stats)]);
    let h = pusher.handle();
    h.update(cfg.fleet_samples(&profiles, &districts));
    h.send(cfg.heartbeat()).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metrics.pushes_total("cloudwatch") < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "pusher did not deliver within 30 s (failures {})",
            metrics.failures_total("cloudwatch")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(metrics.failures_total("cloudwatch"), 0);
    let profile: &[(&str, &str)] = &[("AutoScalingGroupName", "asg-small"), ("Profile", "small")];
    let district: &[(&str, &str)] = &[("District", "d1")];
    let (listed, st) = moto
        .read(
            &ns,
            &[
                ("CapacityUtilization", profile),
                ("EffectiveAvailableGears", district),
                ("Heartbeat", &[]),
            ],
        )
        .await;
    assert_eq!(one(&st[0])["Maximum"], 81.0);
    assert_eq!(one(&st[1])["Maximum"], 12.0);
    assert_eq!(one(&st[2])["SampleCount"], 1.0);
    // 8 figures per group, 2 groups, and the heartbeat.
    assert_eq!(listed.len(), 17, "{listed:?}");
    pusher.shutdown().await;
}
