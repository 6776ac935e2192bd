//! End to end on the real RabbitMQ, over AMQP and over STOMP: the broker
//! agent with `[paas] kind = "openshift"` on the OpenShift broker-host
//! stand-ins (`tests/standins/openshift`).
//!
//! - A scale-up through the Heat signal path (a scaling policy's
//!   `alarm_url` on the fake Heat: no operation id reaches the new node): the
//!   data centre boots the new member's node undistricted, as the seed's
//!   images are; its first report claims the open scale-up, the broker agent
//!   runs `add-node`, the stand-in writes the node's `district.info` (read by
//!   the simulated node as the `openshift` runtime reads it), and the
//!   operation joins once the node's report shows the district.
//! - The `log` handler: decisions published and marked `dry_run`, and no
//!   node receives a command.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::Agent;
use gearshift_broker::config::BrokerConfig;
use gearshift_handlers::config::{HandlerConfig, HeatConfig};
use gearshift_node::runtime::NodeFacts;
use gearshift_proto::msg::{DecisionKind, DistrictInfo};
use gearshift_sim::fleet::{NodeSpec, SimFleet};
use gearshift_tests::broker_harness::{DecisionWatch, TestBed, fast_config};
use gearshift_tests::fake_openstack::{FakeOpenStack, FakeStack};
use gearshift_tests::oo_standin::OoStandin;
use gearshift_tests::{amqp_url, stomp_url};
use tokio_util::sync::CancellationToken;

const DOMAIN: &str = "example.com";

/// Starts the broker agent with `cfg` on its own connection.
async fn start_broker(
    bed: &TestBed,
    cfg: BrokerConfig,
    token: &CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let bus = bed.connect("broker").await;
    let agent = Agent::builder(cfg, bus)
        .signer(bed.keys.broker.clone())
        .keyring(bed.keys.broker_keyring().expect("broker keyring"))
        .state_dir(bed.path("broker"))
        .build()
        .expect("broker agent");
    let t = token.clone();
    tokio::spawn(async move {
        agent.run(t).await.expect("broker agent run");
    })
}

/// The data centre: a new member of the Heat group boots a node agent,
/// undistricted and without an operation id, registered on the stand-in
/// broker host; a node the stand-in wrote a `district.info` for reports
/// that district from then on.
fn spawn_datacentre(
    os: Arc<FakeOpenStack>,
    fleet: Arc<SimFleet>,
    oo: OoStandin,
    mut known: BTreeSet<String>,
    token: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut booted: Vec<String> = vec![];
        while !token.is_cancelled() {
            for m in os.members("paas") {
                let host = format!("{}.{DOMAIN}", m.server_name);
                if known.insert(host.clone()) {
                    oo.node(&host, "small");
                    fleet
                        .start_node(&NodeSpec::new(&host, "_none", "small", 100))
                        .expect("node agent starts");
                    booted.push(host);
                }
            }
            for host in &booted {
                if let Some((uuid, active)) = oo.district_info(host) {
                    let facts = NodeFacts {
                        profile: "small".into(),
                        max_active_gears: 100,
                        district: Some(DistrictInfo {
                            uuid,
                            active,
                            first_uid: None,
                            max_uid: None,
                        }),
                    };
                    fleet.world().add_node(host, facts);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

async fn heat_signal_scale_up_is_added_to_the_district(url: String) {
    let bed = TestBed::new("oj", |_| url).await;
    let tag = bed.tag.clone();
    let watch_bus = bed.connect("watch").await;
    let mut watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    let os = Arc::new(FakeOpenStack::start().await);
    let stack = os.add_stack(FakeStack::asg("paas", &format!("{tag}-h"), 2));
    os.set_update_polls(1);
    // The broker host: the two members' nodes in one district, at 85/100.
    let oo = OoStandin::new(&bed.path("oo"));
    let hosts: Vec<String> = os
        .members("paas")
        .iter()
        .map(|m| format!("{}.{DOMAIN}", m.server_name))
        .collect();
    for h in &hosts {
        oo.node(h, "small");
    }
    let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let uuid = oo.district(&format!("{tag}d1"), "small", &refs);
    for h in &hosts {
        bed.fleet
            .start_node(&NodeSpec::new(h, &uuid, "small", 100).with_gears(85))
            .expect("node agent starts");
    }
    let mut cfg = fast_config(&bed.url, &bed.path("broker"), "heat", &tag);
    bed.keys.configure_broker(&mut cfg);
    cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::off();
    cfg.saga.handler_timeout = Duration::from_secs(20);
    cfg.paas = oo.paas_config();
    let env_file = bed.path("auth.env");
    os.write_env_file(&env_file);
    let heat: HeatConfig = toml::from_str(&format!(
        "stack = \"paas\"\ngroup_resource = \"asg\"\nscale_up_alarm_url = \"{}\"\npoll_interval = \"50ms\"\nupdate_timeout = \"15s\"\n[auth]\nenv_file = {:?}\n",
        os.alarm_url(&stack, "scale_up"),
        env_file.to_str().unwrap()
    ))
    .unwrap();
    cfg.handlers
        .insert("heat".into(), HandlerConfig::Heat(heat));
    let token = CancellationToken::new();
    let known: BTreeSet<String> = hosts.iter().cloned().collect();
    let dc = spawn_datacentre(
        os.clone(),
        bed.fleet.clone(),
        oo.clone(),
        known,
        token.clone(),
    );
    let broker = start_broker(&bed, cfg, &token).await;

    let up = watch
        .until("scale_up", |d| d.decision == DecisionKind::ScaleUp)
        .await;
    let op = up.op.clone().expect("op");
    assert_eq!(up.district, uuid);
    let joined = watch
        .until("joined", |d| d.decision == DecisionKind::Joined)
        .await;
    let new_host = format!("{tag}-h2.{DOMAIN}");
    assert_eq!(joined.op.as_deref(), Some(op.as_str()));
    assert_eq!(joined.node.as_deref(), Some(new_host.as_str()));
    assert!(
        joined.reason.contains(&format!("in district {uuid}"))
            && joined.reason.contains("first new node"),
        "{joined:?}"
    );
    // The stand-in's records: the new node is in the district, active, and
    // its district.info says so.
    let (d, server) = oo.server(&new_host).expect("the new node is districted");
    assert_eq!(d, uuid);
    assert_eq!(server["active"], true, "{server}");
    assert_eq!(oo.district_info(&new_host), Some((uuid.clone(), true)));
    // One signal, no failure, no provision timeout.
    let sig = os.signals();
    assert_eq!(sig.len(), 1, "{sig:?}");
    assert_eq!(
        (sig[0].resource.as_str(), sig[0].via),
        ("scale_up", "alarm_url")
    );
    assert!(
        !watch.kinds().iter().any(|k| matches!(
            k,
            DecisionKind::ProvisionTimeout | DecisionKind::HandlerFailed
        )),
        "{:?}",
        watch.kinds()
    );
    os.assert_no_violations();
    token.cancel();
    for t in [broker, dc] {
        tokio::time::timeout(Duration::from_secs(15), t)
            .await
            .expect("stops in time")
            .expect("task");
    }
    bed.fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heat_signal_scale_up_is_added_to_the_district_amqp() {
    heat_signal_scale_up_is_added_to_the_district(amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heat_signal_scale_up_is_added_to_the_district_stomp() {
    heat_signal_scale_up_is_added_to_the_district(stomp_url()).await;
}

async fn log_mode_sends_no_command(url: String) {
    let bed = TestBed::new("ol", |_| url).await;
    let tag = bed.tag.clone();
    let watch_bus = bed.connect("watch").await;
    let mut watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    // Every command on the exchange, whoever it is for (filtered to ours below).
    let mut commands = watch_bus.subscribe("cmd.#").await.expect("subscribe cmd.#");
    let district = format!("{tag}d1");
    let nodes: Vec<String> = (0..3).map(|i| format!("{tag}-n{i}")).collect();
    for (n, gears) in nodes.iter().zip([30, 20, 10]) {
        bed.fleet
            .start_node(&NodeSpec::new(n, &district, "small", 100).with_gears(gears))
            .expect("node agent starts");
    }
    let mut cfg = fast_config(&bed.url, &bed.path("broker"), "log", &tag);
    bed.keys.configure_broker(&mut cfg);
    let token = CancellationToken::new();
    let broker = start_broker(&bed, cfg, &token).await;
    let down = watch
        .until("dry-run scale_down", |d| {
            d.decision == DecisionKind::ScaleDown
        })
        .await;
    assert!(down.dry_run, "{down:?}");
    let victim = format!("{tag}-n2");
    assert_eq!(down.node.as_deref(), Some(victim.as_str()));
    assert!(
        down.reason.contains(&format!("would deactivate {victim}"))
            && down.reason.contains("move its 10 gears"),
        "{down:?}"
    );
    // Long enough for a real drain to have sent its deactivate many times over.
    let quiet = tokio::time::sleep(Duration::from_secs(3));
    tokio::pin!(quiet);
    loop {
        tokio::select! {
            _ = &mut quiet => break,
            d = commands.next() => {
                let d = d.expect("bus open");
                assert!(
                    !nodes.iter().any(|n| d.key == format!("cmd.{n}")),
                    "a command reached {} in log mode",
                    d.key
                );
            }
        }
    }
    // Every decision of this agent is a dry run, and the nodes are as they were.
    assert!(watch.seen.iter().all(|d| d.dry_run), "{:?}", watch.seen);
    for n in &nodes {
        assert_eq!(bed.fleet.world().is_active(n), Some(true), "{n}");
    }
    let gears: Vec<usize> = nodes
        .iter()
        .map(|n| bed.fleet.world().gears_of(n).len())
        .collect();
    assert_eq!(gears, vec![30, 20, 10], "no gear moved");
    token.cancel();
    tokio::time::timeout(Duration::from_secs(15), broker)
        .await
        .expect("stops in time")
        .expect("task");
    bed.fleet.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn log_mode_sends_no_command_amqp() {
    log_mode_sends_no_command(amqp_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn log_mode_sends_no_command_stomp() {
    log_mode_sends_no_command(stomp_url()).await;
}
