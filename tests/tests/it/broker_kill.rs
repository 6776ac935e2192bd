//! The real `gearshift-broker` binary killed with SIGKILL at random points
//! of a scale-down saga and a scale-up, and restarted each time, over
//! RabbitMQ (AMQP) with real node agents: the saga finishes, no gear is lost,
//! and no operation asks the cloud for a node twice.
//!
//! The cloud is the `exec` handler of the seeds' contract: its script appends
//! every request to a file; the test reads the file and boots (or stops) node
//! agents accordingly.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::perkey::PerKey;
use gearshift_proto::msg::{Decision, DecisionKind};
use gearshift_sim::fleet::{NodeSpec, SimFleet};
use gearshift_sim::harness::requests::{CloudRequest, RequestLog, write_recording_handler};
use gearshift_tests::amqp_url;
use gearshift_tests::broker_harness::{DecisionWatch, TestBed, WAIT, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, write_config};
use rand::Rng;

/// Acts on the handler's requests: boots a node for each new create-node
/// operation, stops and removes the node of each remove-node.
struct Cloud {
    fleet: Arc<SimFleet>,
    tag: String,
    log: RequestLog,
    booted: usize,
    lost: Vec<String>,
}

impl Cloud {
    async fn poll(&mut self) {
        for r in self.log.poll().expect("handler lines") {
            match r {
                CloudRequest::Create {
                    op,
                    district,
                    first: true,
                } => {
                    self.booted += 1;
                    let name = format!("{}-new-{}", self.tag, self.booted);
                    let spec = NodeSpec::new(&name, &district, "small", 100).booted_for(Some(op));
                    self.fleet.start_node(&spec).expect("node agent starts");
                }
                CloudRequest::Create { .. } => {}
                CloudRequest::Remove { node, .. } => {
                    let left = self.fleet.delete_node(&node).await;
                    self.lost.extend(left.into_iter().map(|g| g.id));
                }
            }
        }
    }
}

/// The broker configuration of this test, written to `broker.toml` and
/// checked by the binary: the recording exec handler, keys on disk as an
/// operator installs them.
fn write_kill_config(bed: &TestBed, log: &RequestLog, d2: &str) -> PathBuf {
    let handler_dir = bed.path("handler");
    write_recording_handler(&handler_dir, log.path()).expect("handler script");
    let mut cfg = fast_config(&bed.url, &bed.path("state"), "cloud", &bed.tag);
    bed.keys.configure_broker(&mut cfg);
    cfg.handlers.insert(
        "cloud".into(),
        serde_json::from_value(serde_json::json!({
            "type": "exec",
            "dir": handler_dir,
            "timeout": "10s",
        }))
        .expect("exec handler config"),
    );
    cfg.group_defaults.min_nodes = 2;
    // fast_config's start-up grace (1.5 s) stays: it must outlast the nodes'
    // 1 s report interval, or a restarted agent may decide on a part of the
    // fleet (a scale-up for min_nodes because only one node of d1 reported).
    // d2 only scales up (its new node must not be compacted right away).
    cfg.policy.compact_threshold = PerKey::parse(&format!("50, {d2}: none")).unwrap();
    cfg.saga.evacuation_parallelism = 2;
    cfg.saga.command_timeout = Duration::from_secs(3);
    cfg.saga.evacuation_attempts = 10;
    cfg.saga.command_attempts = 20;
    let config_path = bed.path("broker.toml");
    write_config(&cfg, &config_path);
    config_path
}

/// The broker process, killed and restarted at random points until both the
/// removal and the join were seen (at most 8 kills); returns the kills.
async fn kill_at_random_points(
    cloud: &mut Cloud,
    watch: &mut DecisionWatch,
    config: &Path,
    log: &Path,
    deadline: tokio::time::Instant,
) -> (BrokerProcess, u32) {
    let mut rng = rand::rng();
    let mut kills = 0;
    let mut proc = BrokerProcess::start(config, log);
    loop {
        let run_for = Duration::from_millis(rng.random_range(300..2500));
        let until = tokio::time::Instant::now() + run_for;
        while tokio::time::Instant::now() < until {
            cloud.poll().await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let done = watch_done(watch).await;
        if done || kills >= 8 {
            return (proc, kills);
        }
        proc.kill();
        kills += 1;
        cloud.poll().await;
        proc = BrokerProcess::start(config, log);
        assert!(tokio::time::Instant::now() < deadline, "test took too long");
    }
}

/// Runs the cloud until a decision of `kind` was seen.
async fn decision_of(
    kind: DecisionKind,
    cloud: &mut Cloud,
    watch: &mut DecisionWatch,
    deadline: tokio::time::Instant,
    broker_log: &Path,
) -> Decision {
    loop {
        cloud.poll().await;
        if let Some(d) = watch.seen.iter().find(|d| d.decision == kind) {
            return d.clone();
        }
        let _ = watch_done(watch).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {kind:?}; decisions {:?}; broker log:\n{}",
            watch.kinds(),
            std::fs::read_to_string(broker_log).unwrap_or_default()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_sigkill_at_random_points_finishes_the_saga_without_loss_or_duplicate_requests() {
    let bed = TestBed::new("k", |_| amqp_url()).await;
    let tag = bed.tag.clone();
    let (d1, d2) = (format!("{tag}d1"), format!("{tag}d2"));
    let log = RequestLog::new(&bed.path("requests.log"));
    let config_path = write_kill_config(&bed, &log, &d2);

    // The fleet: d1 underused (n3 will be drained), d2 over DISTRICT_THRESHOLD.
    let watch_bus = bed.connect("watch").await;
    let mut watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    let fleet = bed.fleet.clone();
    let n3 = format!("{tag}-n3");
    for (name, district, gears) in [
        (format!("{tag}-n1"), &d1, 30),
        (format!("{tag}-n2"), &d1, 20),
        (n3.clone(), &d1, 16),
        (format!("{tag}-m1"), &d2, 95),
    ] {
        let spec = NodeSpec::new(&name, district, "small", 100).with_gears(gears);
        fleet.start_node(&spec).expect("node agent starts");
    }
    fleet.world().set_move_time(Duration::from_millis(150));
    let gears_before: BTreeSet<String> = fleet.gear_locations().keys().cloned().collect();
    assert_eq!(gears_before.len(), 161);

    let mut cloud = Cloud {
        fleet: fleet.clone(),
        tag: tag.clone(),
        log,
        booted: 0,
        lost: vec![],
    };
    let broker_log = bed.path("broker.log");
    let deadline = tokio::time::Instant::now() + WAIT * 3;
    let (proc, kills) =
        kill_at_random_points(&mut cloud, &mut watch, &config_path, &broker_log, deadline).await;
    // Let the last incarnation finish the work.
    let removed = decision_of(
        DecisionKind::Removed,
        &mut cloud,
        &mut watch,
        deadline,
        &broker_log,
    )
    .await;
    let joined = decision_of(
        DecisionKind::Joined,
        &mut cloud,
        &mut watch,
        deadline,
        &broker_log,
    )
    .await;
    let status = proc.terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status:?}");
    cloud.poll().await;

    assert!(kills >= 1, "the broker agent was killed at least once");
    assert_eq!(removed.node.as_deref(), Some(n3.as_str()));
    assert_eq!(joined.district, d2);
    assert_no_loss_or_repeat(&cloud, &n3, &gears_before);
    eprintln!(
        "killed {kills} times; decisions: {:?}; requests: {:?}",
        watch.kinds(),
        std::fs::read_to_string(cloud.log.path()).unwrap_or_default()
    );
    fleet.stop_all().await;
}

/// No operation asked the cloud for a node twice, only `n3` was removed,
/// and every gear that existed is on exactly one live node.
fn assert_no_loss_or_repeat(cloud: &Cloud, n3: &str, gears_before: &BTreeSet<String>) {
    for (op, n) in &cloud.log.creates {
        assert_eq!(*n, 1, "operation {op} requested {n} nodes");
    }
    assert!(
        cloud.log.removed_nodes.iter().all(|n| n == n3),
        "only n3 removed: {:?}",
        cloud.log.removed_nodes
    );
    assert!(
        cloud.lost.is_empty(),
        "gears on the removed node: {:?}",
        cloud.lost
    );
    let after = cloud.fleet.gear_locations();
    let gears_after: BTreeSet<String> = after.keys().cloned().collect();
    assert_eq!(&gears_after, gears_before, "the same gears exist");
    for (g, at) in &after {
        assert_eq!(at.len(), 1, "{g} on {at:?}");
        assert_ne!(at[0], n3);
    }
}

/// Gathers decisions for a moment; true once both the removal and the join were seen.
async fn watch_done(watch: &mut DecisionWatch) -> bool {
    let _ = tokio::time::timeout(Duration::from_millis(100), watch.until("any", |_| false)).await;
    let k = watch.kinds();
    k.contains(&DecisionKind::Removed) && k.contains(&DecisionKind::Joined)
}
