//! Identity-bound node trust on the real `gearshift-broker` binary over
//! RabbitMQ: node A's key (enrolled as `nodes.d/A.pub`) forging node B's
//! report, progress and done events is refused (`identity`) and counted;
//! each node's own messages are taken; removing `A.pub` and a SIGHUP refuses
//! A's key from then on (`unknown_key`) while B keeps reporting.

use std::time::Duration;

use gearshift_bus::{OutMessage, SharedBus};
use gearshift_proto::msg::{CommandResult, DistrictInfo, Done, GearCounts, NodeReport, Progress};
use gearshift_proto::{Envelope, KeyPair, routing};
use gearshift_sim::harness::metrics::{Metrics, free_port, scrape};
use gearshift_tests::amqp_url;
use gearshift_tests::broker_harness::{TestBed, WAIT, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, write_config};

const DISTRICT: &str = "d1";

fn report(node: &str, seq: u64) -> NodeReport {
    NodeReport {
        node: node.into(),
        seq,
        profile: "small".into(),
        district: Some(DistrictInfo {
            uuid: DISTRICT.into(),
            active: true,
            first_uid: Some(1000),
            max_uid: Some(6999),
        }),
        max_active_gears: 100,
        gears: GearCounts {
            started: 10,
            ..Default::default()
        },
        active: true,
        region: None,
        zone: None,
        mem_free_mb: 1024,
        mem_total_mb: 4096,
        started_at: chrono::Utc::now(),
        booted_at: None,
        booted_for: None,
        do_not_disrupt: false,
        pinned_gears: 0,
        operation: None,
        interval_secs: 1,
        agent_version: "test".into(),
    }
}

/// Publishes `node`'s report signed by `key`, with a fresh `seq`.
async fn send_report(bus: &SharedBus, key: &KeyPair, node: &str) {
    let seq = chrono::Utc::now().timestamp_micros() as u64;
    let env = Envelope::new(node, report(node, seq));
    let m = OutMessage::new(routing::report(Some(DISTRICT), node), key.seal(env)).transient();
    bus.publish(m).await.expect("publish report");
}

/// Publishes events as `node`, signed by `key`: progress, then a done
/// saying the node is empty (what would make the broker remove it).
async fn send_events(bus: &SharedBus, key: &KeyPair, node: &str) {
    let cmd = uuid::Uuid::new_v4();
    let progress = Progress {
        cmd,
        moved: 3,
        failed: 0,
        remaining: 0,
        total: 3,
        results: vec![],
    };
    let done = Done {
        cmd,
        command: "cmd.evacuate".into(),
        result: CommandResult::Evacuated {
            moved: 3,
            failed: 0,
            results: vec![],
            gears_left: 0,
        },
    };
    for env in [Envelope::new(node, progress), Envelope::new(node, done)] {
        let m = OutMessage::new(routing::event(node), key.seal(env));
        bus.publish(m).await.expect("publish event");
    }
}

/// Scrapes the broker's metrics until `ok` holds, sending `poke` meanwhile.
async fn until<F, P>(port: u16, what: &str, mut ok: F, mut poke: P) -> Metrics
where
    F: FnMut(&Metrics) -> bool,
    P: AsyncFnMut(),
{
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if let Ok(m) = scrape(port).await
            && ok(&m)
        {
            return m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {what} within {WAIT:?}"
        );
        poke().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn refused(m: &Metrics, reason: &str) -> f64 {
    m.get(&format!(
        "gearshift_broker_refused_total{{reason=\"{reason}\"}}"
    ))
}

fn accepted(m: &Metrics) -> f64 {
    m.get("gearshift_broker_reports_total")
}

#[tokio::test]
async fn a_node_key_speaks_only_for_its_node_and_is_revoked_by_a_reload() {
    let bed = TestBed::new("trust", |_| amqp_url()).await;
    let (a, b) = (format!("{}-a", bed.tag), format!("{}-b", bed.tag));
    let (ka, kb) = (KeyPair::generate().unwrap(), KeyPair::generate().unwrap());
    bed.keys.trust_node(&a, &ka).unwrap();
    bed.keys.trust_node(&b, &kb).unwrap();
    let port = free_port().unwrap();
    let mut cfg = fast_config(&bed.url, &bed.path("state"), "log", &bed.tag);
    bed.keys.configure_broker(&mut cfg);
    cfg.metrics.listen = Some(([127, 0, 0, 1], port).into());
    let config = bed.path("broker.toml");
    write_config(&cfg, &config);
    let broker = BrokerProcess::start(&config, &bed.path("broker.log"));
    let bus = bed.connect("forger").await;

    // A's own report is taken (once the broker's report queue exists).
    let m = until(
        port,
        "accepted report from A",
        |m| accepted(m) >= 1.0,
        async || send_report(&bus, &ka, &a).await,
    )
    .await;
    assert_eq!(refused(&m, "identity"), 0.0);

    // A's key forging B: the report and both events are refused and counted.
    send_report(&bus, &ka, &b).await;
    send_events(&bus, &ka, &b).await;
    let m = until(
        port,
        "3 identity refusals",
        |m| refused(m, "identity") >= 3.0,
        async || {},
    )
    .await;
    assert_eq!(refused(&m, "identity"), 3.0, "{:?}", m.samples);
    // B's own key speaks for B.
    let before = accepted(&m);
    until(
        port,
        "accepted report from B",
        |m| accepted(m) > before,
        async || send_report(&bus, &kb, &b).await,
    )
    .await;

    // Revocation: the file goes, SIGHUP, and A's key is unknown at once.
    std::fs::remove_file(bed.keys.nodes_dir().join(format!("{a}.pub"))).unwrap();
    broker.reload();
    let m = until(
        port,
        "A refused after the reload",
        |m| refused(m, "unknown_key") >= 1.0,
        async || send_report(&bus, &ka, &a).await,
    )
    .await;
    let before = accepted(&m);
    until(
        port,
        "B still accepted after the reload",
        |m| accepted(m) > before,
        async || send_report(&bus, &kb, &b).await,
    )
    .await;
    let log = std::fs::read_to_string(bed.path("broker.log")).unwrap();
    assert!(
        log.contains("new handlers, placement, keys and listener in place"),
        "{log}"
    );
    broker.terminate();
    let _ = bus.close().await;
}
