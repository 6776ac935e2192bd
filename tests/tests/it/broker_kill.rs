//! The real `gearshift-broker` binary killed with SIGKILL at random points
//! of a scale-down saga and a scale-up, and restarted each time, over
//! RabbitMQ (AMQP) with real node agents: the saga finishes, no gear is lost,
//! and no operation asks the cloud for a node twice.
//!
//! The cloud is the `exec` handler of the seeds' contract: its script appends
//! every request to a file; the test reads the file and boots (or stops) node
//! agents accordingly.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::perkey::PerKey;
use gearshift_proto::msg::DecisionKind;
use gearshift_tests::broker_fleet::{BrokerKeys, DecisionWatch, SimFleet, WAIT, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, write_config, write_recording_handler};
use gearshift_tests::{amqp_url, connect, init_logging, unique};
use rand::Rng;

/// Acts on the handler's requests: boots a node for each new create-node
/// operation, stops and removes the node of each remove-node.
struct Cloud {
    fleet: Arc<SimFleet>,
    tag: String,
    seen_lines: usize,
    creates: BTreeMap<String, u32>,
    removes: Vec<String>,
    lost: Vec<String>,
}

impl Cloud {
    async fn poll(&mut self, log: &std::path::Path) {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        for line in lines.iter().skip(self.seen_lines) {
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["create-node", op, _node, district] => {
                    let n = self.creates.entry(op.to_string()).or_default();
                    *n += 1;
                    if *n == 1 {
                        let name = format!("{}-new-{}", self.tag, self.creates.len());
                        self.fleet.start_node(
                            &name,
                            district,
                            "small",
                            100,
                            0,
                            Some(op.to_string()),
                        );
                    }
                }
                ["remove-node", _op, node, _district] => {
                    self.removes.push(node.to_string());
                    self.fleet.stop_node(node).await;
                    let left = self.fleet.world.remove_node(node);
                    self.lost.extend(left.into_iter().map(|g| g.id));
                }
                _ => panic!("unexpected handler line {line:?}"),
            }
        }
        self.seen_lines = lines.len();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_sigkill_at_random_points_finishes_the_saga_without_loss_or_duplicate_requests() {
    init_logging();
    let tag = unique("k");
    let url = amqp_url();
    let dir = tempfile::tempdir().unwrap();
    let keys = BrokerKeys::new();

    // Keys on disk, as an operator installs them.
    let key_dir = dir.path().join("keys");
    std::fs::create_dir_all(key_dir.join("nodes.d")).unwrap();
    std::fs::create_dir_all(key_dir.join("operators.d")).unwrap();
    std::fs::write(key_dir.join("broker.key"), keys.broker.to_pem()).unwrap();
    std::fs::write(key_dir.join("nodes.d/nodes.pub"), keys.node.public_pem()).unwrap();

    // The exec handler that records every request.
    let requests = dir.path().join("requests.log");
    let handler_dir = dir.path().join("handler");
    write_recording_handler(&handler_dir, &requests);

    let d1 = format!("{tag}d1");
    let d2 = format!("{tag}d2");
    let mut cfg = fast_config(&url, &dir.path().join("state"), "cloud", &tag);
    cfg.keys.signing_key = key_dir.join("broker.key");
    cfg.keys.node_keys_dir = key_dir.join("nodes.d");
    cfg.keys.operator_keys_dir = key_dir.join("operators.d");
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
    let config_path = dir.path().join("broker.toml");
    write_config(&cfg, &config_path);

    // The fleet: d1 underused (n3 will be drained), d2 over DISTRICT_THRESHOLD.
    let nodes_bus = connect(&url, &format!("{tag}-nodes")).await;
    let watch_bus = connect(&url, &format!("{tag}-watch")).await;
    let mut watch = DecisionWatch::new(&watch_bus, &keys.broker).await;
    let fleet = SimFleet::new(nodes_bus.clone(), keys.clone(), &dir.path().join("nodes"));
    let (n1, n2, n3) = (
        format!("{tag}-n1"),
        format!("{tag}-n2"),
        format!("{tag}-n3"),
    );
    fleet.start_node(&n1, &d1, "small", 100, 30, None);
    fleet.start_node(&n2, &d1, "small", 100, 20, None);
    fleet.start_node(&n3, &d1, "small", 100, 16, None);
    fleet.start_node(&format!("{tag}-m1"), &d2, "small", 100, 95, None);
    fleet.world.set_move_time(Duration::from_millis(150));
    let gears_before: BTreeSet<String> = fleet.gear_locations().keys().cloned().collect();
    assert_eq!(gears_before.len(), 161);

    let mut cloud = Cloud {
        fleet: fleet.clone(),
        tag: tag.clone(),
        seen_lines: 0,
        creates: BTreeMap::new(),
        removes: vec![],
        lost: vec![],
    };
    let broker_log = dir.path().join("broker.log");
    let mut rng = rand::rng();
    let deadline = tokio::time::Instant::now() + WAIT * 3;
    let mut kills = 0;
    let mut proc = Some(BrokerProcess::start(&config_path, &broker_log));
    // Kill at random points until the saga ended, at most 8 times.
    loop {
        let run_for = Duration::from_millis(rng.random_range(300..2500));
        let until = tokio::time::Instant::now() + run_for;
        while tokio::time::Instant::now() < until {
            cloud.poll(&requests).await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        let done = watch_done(&mut watch).await;
        if done || kills >= 8 {
            break;
        }
        proc.take().unwrap().kill();
        kills += 1;
        cloud.poll(&requests).await;
        proc = Some(BrokerProcess::start(&config_path, &broker_log));
        assert!(tokio::time::Instant::now() < deadline, "test took too long");
    }
    // Let the last incarnation finish the work.
    let removed = loop {
        cloud.poll(&requests).await;
        if let Some(d) = watch
            .seen
            .iter()
            .find(|d| d.decision == DecisionKind::Removed)
        {
            break d.clone();
        }
        let _ = watch_done(&mut watch).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "saga did not finish after {kills} kills; decisions {:?}; broker log:\n{}",
            watch.kinds(),
            std::fs::read_to_string(&broker_log).unwrap_or_default()
        );
    };
    let joined = loop {
        cloud.poll(&requests).await;
        if let Some(d) = watch
            .seen
            .iter()
            .find(|d| d.decision == DecisionKind::Joined)
        {
            break d.clone();
        }
        let _ = watch_done(&mut watch).await;
        assert!(
            tokio::time::Instant::now() < deadline,
            "no join; decisions {:?}",
            watch.kinds()
        );
    };
    let status = proc.take().unwrap().terminate();
    assert!(status.success(), "SIGTERM exits cleanly: {status:?}");
    cloud.poll(&requests).await;

    assert!(kills >= 1, "the broker agent was killed at least once");
    assert_eq!(removed.node.as_deref(), Some(n3.as_str()));
    assert_eq!(joined.district, d2);
    // No operation asked the cloud for a node twice.
    for (op, n) in &cloud.creates {
        assert_eq!(*n, 1, "operation {op} requested {n} nodes");
    }
    assert!(
        cloud.removes.iter().all(|n| *n == n3),
        "only n3 removed: {:?}",
        cloud.removes
    );
    // No gear lost: every gear that existed is on exactly one live node.
    assert!(
        cloud.lost.is_empty(),
        "gears on the removed node: {:?}",
        cloud.lost
    );
    let after = fleet.gear_locations();
    let gears_after: BTreeSet<String> = after.keys().cloned().collect();
    assert_eq!(gears_after, gears_before, "the same gears exist");
    for (g, at) in &after {
        assert_eq!(at.len(), 1, "{g} on {at:?}");
        assert_ne!(at[0], n3);
    }
    eprintln!(
        "killed {kills} times; decisions: {:?}; requests: {:?}",
        watch.kinds(),
        std::fs::read_to_string(&requests).unwrap_or_default()
    );
    fleet.stop_all().await;
    drop(nodes_bus);
}

/// Gathers decisions for a moment; true once both the removal and the join were seen.
async fn watch_done(watch: &mut DecisionWatch) -> bool {
    let _ = tokio::time::timeout(Duration::from_millis(100), watch.until("any", |_| false)).await;
    let k = watch.kinds();
    k.contains(&DecisionKind::Removed) && k.contains(&DecisionKind::Joined)
}
