//! End to end: the real broker agent, real node agents (sim gear runtime)
//! on the real RabbitMQ (AMQP), and the nova and heat handlers built from
//! the broker's configuration against the fake OpenStack. A bridge plays
//! the data centre: a server that appears in the fake Nova (booted by the
//! nova handler, or made by Heat for a new group member) starts a node
//! agent with the server's name and operation id; a server that disappears
//! stops it. Each handler drives one scale-up and one targeted scale-down.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gearshift_broker::Agent;
use gearshift_broker::config::BrokerConfig;
use gearshift_bus::SharedBus;
use gearshift_handlers::NodeShape;
use gearshift_handlers::config::{HandlerConfig, HeatConfig, NovaConfig};
use gearshift_proto::msg::DecisionKind;
use gearshift_sim::fleet::{Keys, NodeSpec, SimFleet};
use gearshift_tests::amqp_url;
use gearshift_tests::broker_harness::{DecisionWatch, TestBed, eventually, fast_config};
use gearshift_tests::fake_openstack::{FakeOpenStack, FakeStack};
use tokio_util::sync::CancellationToken;

const DOMAIN: &str = "example.com";

/// What the data centre did.
#[derive(Default)]
struct Log {
    /// Node agents started for new servers: (node, booted_for).
    booted: Vec<(String, Option<String>)>,
    /// Node agents stopped because their server was deleted.
    removed: Vec<String>,
    /// Gears left on a node when its server went away (must stay empty).
    lost: Vec<String>,
}

/// Starts and stops node agents as servers come and go in the fake Nova.
fn spawn_bridge(
    os: Arc<FakeOpenStack>,
    fleet: Arc<SimFleet>,
    district: String,
    profile: String,
    mut known: BTreeMap<String, String>,
    log: Arc<Mutex<Log>>,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !token.is_cancelled() {
            let servers = os.servers();
            // Heat members carry the operation id the template was given.
            let mut heat_ops: BTreeMap<String, Option<String>> = BTreeMap::new();
            for st in ["paas"] {
                if os.stack_exists(st) {
                    for m in os.members(st) {
                        heat_ops.insert(m.server_id.clone(), m.boot_op.clone());
                    }
                }
            }
            for s in &servers {
                if known.contains_key(&s.id) {
                    continue;
                }
                let (node, op) = match s.metadata.get("gearshift_node") {
                    Some(n) => (n.clone(), s.metadata.get("gearshift_op").cloned()),
                    None => (
                        format!("{}.{DOMAIN}", s.name),
                        heat_ops.get(&s.id).cloned().flatten(),
                    ),
                };
                fleet
                    .start_node(
                        &NodeSpec::new(&node, &district, &profile, 100).booted_for(op.clone()),
                    )
                    .expect("node agent starts");
                log.lock().unwrap().booted.push((node.clone(), op));
                known.insert(s.id.clone(), node);
            }
            let gone: Vec<(String, String)> = known
                .iter()
                .filter(|(id, _)| !servers.iter().any(|s| &s.id == *id))
                .map(|(id, n)| (id.clone(), n.clone()))
                .collect();
            for (id, node) in gone {
                let left = fleet.delete_node(&node).await;
                let mut l = log.lock().unwrap();
                l.lost.extend(left.into_iter().map(|g| g.id));
                l.removed.push(node);
                known.remove(&id);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

struct World {
    os: Arc<FakeOpenStack>,
    fleet: Arc<SimFleet>,
    keys: Keys,
    cfg: BrokerConfig,
    broker_bus: SharedBus,
    _watch_bus: SharedBus,
    watch: DecisionWatch,
    log: Arc<Mutex<Log>>,
    district: String,
    tag: String,
    bed: TestBed,
}

async fn world(handler: &str) -> World {
    let bed = TestBed::new("e", |_| amqp_url()).await;
    let tag = bed.tag.clone();
    let broker_bus = bed.connect("broker").await;
    let watch_bus = bed.connect("watch").await;
    let watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    let mut cfg = fast_config(&bed.url, &bed.path("broker"), handler, &tag);
    cfg.saga.handler_timeout = Duration::from_secs(20);
    cfg.group_defaults.shape = NodeShape {
        flavor: Some("m1.small".into()),
        image: Some("openshift-node-image".into()),
        ..NodeShape::default()
    };
    let os = Arc::new(FakeOpenStack::start().await);
    // The handlers read the seeds' auth.env, as an operator would configure them.
    let env_file = bed.path("auth.env");
    os.write_env_file(&env_file);
    let auth = format!("[auth]\nenv_file = {:?}\n", env_file.to_str().unwrap());
    let nova: NovaConfig = toml::from_str(&format!(
        "base_name = \"{tag}\"\ndomain = \"{DOMAIN}\"\nmax_nodes = 20\npoll_interval = \"50ms\"\n{auth}"
    ))
    .unwrap();
    let heat: HeatConfig = toml::from_str(&format!(
        "stack = \"paas\"\nscale_up = \"count\"\nop_param = \"gearshift_op\"\nremove = \"removal-policies\"\npoll_interval = \"50ms\"\nupdate_timeout = \"15s\"\n{auth}"
    ))
    .unwrap();
    cfg.handlers
        .insert("nova".into(), HandlerConfig::Nova(nova));
    cfg.handlers
        .insert("heat".into(), HandlerConfig::Heat(heat));
    World {
        os,
        fleet: bed.fleet.clone(),
        keys: bed.keys.clone(),
        cfg,
        broker_bus,
        _watch_bus: watch_bus,
        watch,
        log: Arc::new(Mutex::new(Log::default())),
        district: format!("{tag}d1"),
        tag,
        bed,
    }
}

fn start(
    w: &World,
    known: BTreeMap<String, String>,
) -> (CancellationToken, Vec<tokio::task::JoinHandle<()>>) {
    let token = CancellationToken::new();
    let bridge = spawn_bridge(
        w.os.clone(),
        w.fleet.clone(),
        w.district.clone(),
        "small".into(),
        known,
        w.log.clone(),
        token.clone(),
    );
    let agent = Agent::builder(w.cfg.clone(), w.broker_bus.clone())
        .signer(w.keys.broker.clone())
        .keyring(w.keys.broker_keyring().expect("broker keyring"))
        .state_dir(w.bed.path("broker"))
        .build()
        .expect("broker agent with the configured handlers");
    let t = token.clone();
    let broker = tokio::spawn(async move {
        agent.run(t).await.expect("broker agent run");
    });
    (token, vec![broker, bridge])
}

async fn stop(w: &World, token: CancellationToken, tasks: Vec<tokio::task::JoinHandle<()>>) {
    token.cancel();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .expect("stops in time")
            .expect("task");
    }
    w.fleet.stop_all().await;
}

/// Nodes already there: (name suffix N, gears). Returns server id -> host.
fn seed_nova_nodes(w: &World, nodes: &[(u32, u32)]) -> BTreeMap<String, String> {
    let mut known = BTreeMap::new();
    for (n, gears) in nodes {
        let host = format!("{}-{n}.{DOMAIN}", w.tag);
        let id =
            w.os.add_server(&format!("{}_{n}", w.tag), &[("gearshift_node", &host)]);
        w.fleet
            .start_node(&NodeSpec::new(&host, &w.district, "small", 100).with_gears(*gears))
            .expect("node agent starts");
        known.insert(id, host);
    }
    known
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nova_handler_scale_up_through_the_broker() {
    let mut w = world("nova").await;
    w.cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::off();
    // Two nodes named the seeds' way at 85/100: the profile is over 80 %.
    let known = seed_nova_nodes(&w, &[(1, 85), (2, 85)]);
    let (token, tasks) = start(&w, known);
    let up = w
        .watch
        .until("scale_up", |d| d.decision == DecisionKind::ScaleUp)
        .await;
    let op = up.op.clone().expect("op");
    let joined = w
        .watch
        .until("joined", |d| d.decision == DecisionKind::Joined)
        .await;
    let new_host = format!("{}-3.{DOMAIN}", w.tag);
    assert_eq!(joined.op.as_deref(), Some(op.as_str()));
    assert_eq!(
        joined.node.as_deref(),
        Some(new_host.as_str()),
        "the first free N: {joined:?}"
    );
    let s =
        w.os.servers()
            .into_iter()
            .find(|s| s.name == format!("{}_3", w.tag))
            .expect("booted");
    assert_eq!(s.metadata["gearshift_op"], op);
    assert_eq!(s.flavor, "2", "the group's flavor m1.small");
    assert!(
        s.user_data
            .unwrap()
            .contains(&format!("\"bus_url\":\"{}\"", amqp_url()))
    );
    // The joined node brings the profile to 170/300: exactly one boot.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        w.os.requests_matching("POST", "/compute/v2.1/servers")
            .len(),
        1
    );
    assert_eq!(w.log.lock().unwrap().booted, vec![(new_host, Some(op))]);
    w.os.assert_no_violations();
    stop(&w, token, tasks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nova_handler_targeted_scale_down_through_the_broker() {
    let mut w = world("nova").await;
    w.cfg.group_defaults.min_nodes = 2;
    let known = seed_nova_nodes(&w, &[(1, 30), (2, 2), (3, 25)]);
    let victim_id = known
        .iter()
        .find(|(_, h)| h.starts_with(&format!("{}-2.", w.tag)))
        .unwrap()
        .0
        .clone();
    let (token, tasks) = start(&w, known);
    let victim = format!("{}-2.{DOMAIN}", w.tag);
    drained(&mut w, &victim).await;
    let deletes = w.os.requests_matching("DELETE", "/compute/v2.1/servers/");
    assert_eq!(deletes.len(), 1);
    assert!(
        deletes[0].path.ends_with(&victim_id),
        "deleted exactly node 2's server"
    );
    let names: Vec<String> = w.os.servers().into_iter().map(|s| s.name).collect();
    assert_eq!(names, vec![format!("{}_1", w.tag), format!("{}_3", w.tag)]);
    gone_without_loss(&w, &victim).await;
    stop(&w, token, tasks).await;
}

/// The broker agent scales down `victim` (the least busy node) and its saga
/// removes it.
async fn drained(w: &mut World, victim: &str) {
    let down = w
        .watch
        .until("scale_down", |d| d.decision == DecisionKind::ScaleDown)
        .await;
    assert_eq!(
        down.node.as_deref(),
        Some(victim),
        "the least busy node: {down:?}"
    );
    let removed = w
        .watch
        .until("removed", |d| d.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.node.as_deref(), Some(victim));
    assert_eq!(removed.op, down.op);
}

/// `victim`'s node agent stopped with its server, no gear lost, no request
/// broke the APIs' shape.
async fn gone_without_loss(w: &World, victim: &str) {
    eventually("the node agent stopped", || {
        w.log.lock().unwrap().removed.iter().any(|n| n == victim)
    })
    .await;
    assert!(
        w.log.lock().unwrap().lost.is_empty(),
        "gears lost: {:?}",
        w.log.lock().unwrap().lost
    );
    assert_eq!(w.fleet.gear_locations().len(), 57, "no gear lost");
    w.os.assert_no_violations();
}

/// A ResourceGroup stack `paas` whose members are `<tag>-h<i>`; returns server id -> host.
fn seed_heat_nodes(w: &World, gears: &[u32]) -> BTreeMap<String, String> {
    w.os.add_stack(FakeStack::resource_group(
        "paas",
        &format!("{}-h", w.tag),
        gears.len() as u32,
    ));
    let mut known = BTreeMap::new();
    for (m, g) in w.os.members("paas").into_iter().zip(gears) {
        let host = format!("{}.{DOMAIN}", m.server_name);
        w.fleet
            .start_node(&NodeSpec::new(&host, &w.district, "small", 100).with_gears(*g))
            .expect("node agent starts");
        known.insert(m.server_id, host);
    }
    known
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heat_handler_scale_up_through_the_broker() {
    let mut w = world("heat").await;
    w.cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::off();
    let known = seed_heat_nodes(&w, &[85, 85]);
    let (token, tasks) = start(&w, known);
    let up = w
        .watch
        .until("scale_up", |d| d.decision == DecisionKind::ScaleUp)
        .await;
    let op = up.op.clone().expect("op");
    let joined = w
        .watch
        .until("joined", |d| d.decision == DecisionKind::Joined)
        .await;
    let new_host = format!("{}-h2.{DOMAIN}", w.tag);
    assert_eq!(joined.op.as_deref(), Some(op.as_str()));
    assert_eq!(joined.node.as_deref(), Some(new_host.as_str()));
    // Before the PATCH, the handler asks Heat's preview whether the op id
    // would replace members (`PATCH .../preview`, same body).
    let updates = || -> Vec<_> {
        w.os.requests_matching("PATCH", "/stacks/paas/")
            .into_iter()
            .filter(|r| !r.path.ends_with("/preview"))
            .collect()
    };
    let patch = &updates()[0];
    assert_eq!(
        patch.body.as_ref().unwrap(),
        &serde_json::json!({"parameters": {"count": 3, "gearshift_op": op}})
    );
    assert_eq!(w.os.requests_matching("PATCH", "/preview").len(), 1);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(updates().len(), 1, "exactly one scale-up");
    assert_eq!(w.os.members("paas").len(), 3);
    w.os.assert_no_violations();
    stop(&w, token, tasks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heat_handler_targeted_scale_down_through_the_broker() {
    let mut w = world("heat").await;
    w.cfg.group_defaults.min_nodes = 2;
    // Member 1 (the middle one) is the least busy: a plain count - 1 would remove member 2.
    let known = seed_heat_nodes(&w, &[30, 2, 25]);
    let (token, tasks) = start(&w, known);
    let victim = format!("{}-h1.{DOMAIN}", w.tag);
    drained(&mut w, &victim).await;
    let patch = &w.os.requests_matching("PATCH", "/stacks/paas/")[0];
    assert_eq!(
        patch.body.as_ref().unwrap(),
        &serde_json::json!({"parameters": {"count": 2, "removal_policies": [{"resource_list": ["1"]}]}})
    );
    let left: Vec<String> =
        w.os.members("paas")
            .into_iter()
            .map(|m| m.server_name)
            .collect();
    assert_eq!(left, vec![format!("{}-h0", w.tag), format!("{}-h2", w.tag)]);
    gone_without_loss(&w, &victim).await;
    stop(&w, token, tasks).await;
}
