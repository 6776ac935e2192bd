//! The broker agent with real node agents (sim gear runtime) on a real bus:
//! scale-up into the right district, a full scale-down saga, the abort path
//! the drain-cancel path and the operator commands, each over the in-process
//! bus and RabbitMQ (AMQP and STOMP); `activemq_agents` runs them on
//! ActiveMQ.

use std::sync::Arc;
use std::time::Duration;

use gearshift_broker::Agent;
use gearshift_broker::cli::{self, OperatorKeys};
use gearshift_broker::config::BrokerConfig;
use gearshift_broker::status::Status;
use gearshift_bus::SharedBus;
use gearshift_proto::msg::{AdminReply, AdminRequest, DecisionKind};
use gearshift_sim::fleet::{Keys, NodeSpec, SimCloud, SimFleet};
use gearshift_tests::broker_harness::{
    DecisionWatch, TestBed, eventually, fast_config, instant_cloud,
};
use gearshift_tests::{activemq_url, amqp_url, connect, stomp_url};
use tokio_util::sync::CancellationToken;

pub(crate) struct Ctx {
    pub(crate) bed: TestBed,
    pub(crate) _watch_bus: SharedBus,
    pub(crate) broker_bus: SharedBus,
    pub(crate) keys: Keys,
    pub(crate) fleet: Arc<SimFleet>,
    pub(crate) cloud: Arc<SimCloud>,
    pub(crate) cfg: BrokerConfig,
    pub(crate) watch: DecisionWatch,
    pub(crate) tag: String,
}

pub(crate) fn url_for(transport: &str, tag: &str) -> String {
    match transport {
        "memory" => format!("memory://{tag}"),
        "amqp" => amqp_url(),
        "stomp" => stomp_url(),
        "activemq" => activemq_url(),
        other => panic!("unknown transport {other}"),
    }
}

pub(crate) async fn setup(transport: &str) -> Ctx {
    let bed = TestBed::new("b", |tag| url_for(transport, tag)).await;
    let broker_bus = bed.connect("broker").await;
    let watch_bus = bed.connect("watch").await;
    let watch = DecisionWatch::new(&watch_bus, &bed.keys.broker).await;
    let cloud = instant_cloud(bed.fleet.clone(), &bed.tag, 100);
    let cfg = fast_config(&bed.url, &bed.path("broker"), "sim", &bed.tag);
    Ctx {
        _watch_bus: watch_bus,
        broker_bus,
        keys: bed.keys.clone(),
        fleet: bed.fleet.clone(),
        cloud,
        cfg,
        watch,
        tag: bed.tag.clone(),
        bed,
    }
}

fn start_broker(c: &Ctx) -> (CancellationToken, tokio::task::JoinHandle<()>) {
    let agent = Agent::builder(c.cfg.clone(), c.broker_bus.clone())
        .signer(c.keys.broker.clone())
        .keyring(c.keys.broker_keyring().expect("broker keyring"))
        .handler("sim", c.cloud.clone())
        .build()
        .expect("broker agent");
    let token = CancellationToken::new();
    let t = token.clone();
    let task = tokio::spawn(async move {
        agent.run(t).await.expect("broker agent run");
    });
    (token, task)
}

pub(crate) async fn stop(c: &Ctx, token: CancellationToken, task: tokio::task::JoinHandle<()>) {
    token.cancel();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("broker agent stops within its grace")
        .expect("broker task");
    c.fleet.stop_all().await;
    let _ = &c.bed.nodes_bus;
}

impl Ctx {
    /// Starts node agents `<tag>-<suffix>` in `district` (100 active gears
    /// each) with their started gears; returns their names.
    pub(crate) fn nodes<const N: usize>(
        &self,
        district: &str,
        nodes: [(&str, u32); N],
    ) -> [String; N] {
        nodes.map(|(suffix, gears)| {
            let name = format!("{}-{suffix}", self.tag);
            let spec = NodeSpec::new(&name, district, "small", 100).with_gears(gears);
            self.fleet.start_node(&spec).expect("node agent starts");
            name
        })
    }
}

// --------------------------------------------------------------- scale-up

pub(crate) async fn scale_up_lands_in_the_right_district(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::off();
    let d1 = format!("{}d1", c.tag);
    let d2 = format!("{}d2", c.tag);
    // d1: two nodes at 89/100 (178 UIDs used); d2: one node at 70/100 (more free UIDs).
    // The profile is at 248 / 300 = 82.7 % >= 80.
    c.nodes(&d1, [("a1", 89), ("a2", 89)]);
    c.nodes(&d2, [("b1", 70)]);
    let (token, task) = start_broker(&c);
    let up = c
        .watch
        .until("scale_up decision", |d| d.decision == DecisionKind::ScaleUp)
        .await;
    assert_eq!(
        up.district, d2,
        "the district with the most free capacity: {up:?}"
    );
    assert!(up.reason.contains("PROFILE_THRESHOLD"), "{}", up.reason);
    let op = up.op.clone().expect("operation id");
    let joined = c
        .watch
        .until("joined decision", |d| d.decision == DecisionKind::Joined)
        .await;
    assert_eq!(joined.op.as_deref(), Some(op.as_str()));
    assert_eq!(joined.district, d2);
    assert_eq!(
        joined.node.as_deref(),
        Some(format!("{}-new-1", c.tag).as_str())
    );
    // The joined node brings the profile to 248 / 400: nothing more is asked for.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(c.cloud.create_requests(), 1, "exactly one node requested");
    stop(&c, token, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_scale_up_lands_in_the_right_district_memory() {
    scale_up_lands_in_the_right_district("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_scale_up_lands_in_the_right_district_amqp() {
    scale_up_lands_in_the_right_district("amqp").await;
}

// ------------------------------------------------------------- scale-down

pub(crate) async fn full_scale_down_saga(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.group_defaults.min_nodes = 2;
    let d = format!("{}d1", c.tag);
    let [n1, n2, n3] = c.nodes(&d, [("n1", 30), ("n2", 20), ("n3", 5)]);
    let before = c.fleet.gear_locations();
    assert_eq!(before.len(), 55);
    let (token, task) = start_broker(&c);
    let down = c
        .watch
        .until("scale_down decision", |x| {
            x.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(
        down.node.as_deref(),
        Some(n3.as_str()),
        "the least busy node: {down:?}"
    );
    assert!(down.reason.contains("COMPACT_THRESHOLD"), "{}", down.reason);
    let removed = c
        .watch
        .until("removed decision", |x| x.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.node.as_deref(), Some(n3.as_str()));
    assert_eq!(removed.op, down.op);
    // Removed exactly this host, once, and only once it was empty.
    assert_eq!(c.cloud.remove_requests(), vec![n3.clone()]);
    assert!(
        c.cloud.lost().is_empty(),
        "gears lost: {:?}",
        c.cloud.lost()
    );
    let after = c.fleet.gear_locations();
    assert_eq!(after.len(), 55, "no gear lost");
    for (g, at) in &after {
        assert_eq!(at.len(), 1, "{g} is on {at:?}");
        assert!(at[0] == n1 || at[0] == n2, "{g} on {at:?}");
    }
    assert!(!c.fleet.world().nodes().contains(&n3));
    stop(&c, token, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_full_scale_down_saga_memory() {
    full_scale_down_saga("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_full_scale_down_saga_amqp() {
    full_scale_down_saga("amqp").await;
}

// ------------------------------------------------------------------ abort

pub(crate) async fn abort_reactivates_the_node(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.group_defaults.min_nodes = 2;
    c.cfg.saga.evacuation_attempts = 1;
    let d = format!("{}d1", c.tag);
    let [_, _, n3] = c.nodes(&d, [("n1", 30), ("n2", 20), ("n3", 3)]);
    // One gear of n3 can never be moved.
    let stuck = c.fleet.world().gears_of(&n3)[0].id.clone();
    c.fleet.world().fail_next_moves(&stuck, 1_000_000);
    let (token, task) = start_broker(&c);
    let down = c
        .watch
        .until("scale_down decision", |x| {
            x.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(down.node.as_deref(), Some(n3.as_str()));
    let aborted = c
        .watch
        .until("aborted decision", |x| x.decision == DecisionKind::Aborted)
        .await;
    assert_eq!(aborted.op, down.op);
    assert!(
        aborted.reason.contains("active again"),
        "{}",
        aborted.reason
    );
    eventually("n3 active again", || {
        c.fleet.world().is_active(&n3) == Some(true)
    })
    .await;
    assert!(c.cloud.remove_requests().is_empty(), "nothing removed");
    let at = c.fleet.gear_locations();
    assert_eq!(at.len(), 53, "no gear lost");
    assert_eq!(
        at[&stuck],
        vec![n3.clone()],
        "the stuck gear stays on its node"
    );
    stop(&c, token, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_abort_reactivates_the_node_memory() {
    abort_reactivates_the_node("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_abort_reactivates_the_node_amqp() {
    abort_reactivates_the_node("amqp").await;
}

// ------------------------------------------------------------ drain cancel

pub(crate) async fn drain_cancel(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.group_defaults.min_nodes = 2;
    c.cfg.saga.evacuation_parallelism = 1;
    let d = format!("{}d1", c.tag);
    let [n1, n2, n3] = c.nodes(&d, [("n1", 40), ("n2", 40), ("n3", 20)]);
    // Slow moves: the drain of n3 takes about 20 x 400 ms.
    c.fleet.world().set_move_time(Duration::from_millis(400));
    let (token, task) = start_broker(&c);
    let down = c
        .watch
        .until("scale_down decision", |x| {
            x.decision == DecisionKind::ScaleDown
        })
        .await;
    assert_eq!(down.node.as_deref(), Some(n3.as_str()));
    eventually("n3 deactivated", || {
        c.fleet.world().is_active(&n3) == Some(false)
    })
    .await;
    // Load returns on the other nodes: 95 + 90 of 100, n3 inactive.
    c.fleet.add_gears(&n1, 55, "rush");
    c.fleet.add_gears(&n2, 50, "rush");
    let cancelled = c
        .watch
        .until("drain_cancelled decision", |x| {
            x.decision == DecisionKind::DrainCancelled
        })
        .await;
    assert_eq!(cancelled.op, down.op);
    eventually("n3 active again", || {
        c.fleet.world().is_active(&n3) == Some(true)
    })
    .await;
    assert!(c.cloud.remove_requests().is_empty(), "n3 was not removed");
    assert!(
        !c.watch.kinds().contains(&DecisionKind::ScaleUp),
        "the draining node was re-activated instead of booting a new one: {:?}",
        c.watch.kinds()
    );
    assert_eq!(c.cloud.create_requests(), 0);
    stop(&c, token, task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_drain_cancel_memory() {
    drain_cancel("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_drain_cancel_amqp() {
    drain_cancel("amqp").await;
}

// ------------------------------------------------------- operator commands

/// An operator on the bus: signs admin requests for the broker agent.
struct Operator {
    bus: SharedBus,
    keys: OperatorKeys,
    admin_key: String,
}

impl Operator {
    async fn ask(&self, req: AdminRequest) -> AdminReply {
        cli::admin_on(
            &self.bus,
            &self.keys,
            "alice",
            &self.admin_key,
            req,
            Duration::from_secs(10),
        )
        .await
        .unwrap()
    }

    /// The broker agent's status once it knows `nodes` nodes. Its admin
    /// queue may not exist yet: a request published before it is declared
    /// is lost, so ask again.
    async fn status_with(&self, nodes: usize) -> Status {
        for _ in 0..100 {
            let r = match cli::admin_on(
                &self.bus,
                &self.keys,
                "alice",
                &self.admin_key,
                AdminRequest::Status,
                Duration::from_secs(2),
            )
            .await
            {
                Ok(r) => r,
                Err(cli::CliError::Bus(gearshift_bus::BusError::Timeout { .. })) => continue,
                Err(e) => panic!("status: {e}"),
            };
            assert!(r.ok, "{}", r.message);
            let s: Status = serde_json::from_value(r.data).unwrap();
            if s.nodes.len() == nodes {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("status shows {nodes} nodes");
    }
}

pub(crate) async fn operator_commands(transport: &str) {
    let mut c = setup(transport).await;
    c.cfg.policy.compact_threshold = gearshift_broker::perkey::PerKey::off();
    let d = format!("{}d1", c.tag);
    let [n1, n2] = c.nodes(&d, [("n1", 40), ("n2", 10)]);
    let (token, task) = start_broker(&c);
    let op = Operator {
        bus: connect(&url_for(transport, &c.tag), &format!("{}-op", c.tag)).await,
        keys: c.keys.operator_keys(),
        admin_key: c.cfg.agent.admin_key.clone(),
    };
    // status: both nodes, with the oo-stats figures.
    let s = op.status_with(2).await;
    let g = s
        .groups
        .iter()
        .find(|g| g.district == d)
        .expect("the group");
    assert_eq!(g.stats.gears_active, 50);
    assert_eq!(g.stats.available_active_gears, 150);
    assert_eq!(g.stats.usage_pct, 25.0);
    assert!(s.render().contains(&d));
    evacuate_while_watching(&mut c, &op, &d, &n2).await;
    // do-not-disrupt, then an evacuation of that node is refused.
    let dnd = AdminRequest::DoNotDisrupt {
        node: n1.clone(),
        on: true,
    };
    let r = op.ask(dnd).await;
    assert!(r.ok, "{}", r.message);
    let r = op.ask(AdminRequest::Evacuate { node: n1.clone() }).await;
    assert!(
        !r.ok && r.message.contains("do-not-disrupt"),
        "{}",
        r.message
    );
    untrusted_and_ping(&c, &op).await;
    stop(&c, token, task).await;
}

/// `evacuate n2`: a saga that ends with n2 removed, which `watch` follows
/// live (decisions, explanations, progress).
async fn evacuate_while_watching(c: &mut Ctx, op: &Operator, d: &str, n2: &str) {
    let lines = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop_watch = CancellationToken::new();
    let watcher = {
        let bus = op.bus.clone();
        let lines = lines.clone();
        let stop = stop_watch.clone();
        let trust = op.keys.brokers.clone();
        tokio::spawn(async move {
            cli::watch(&bus, &trust, true, |l| lines.lock().unwrap().push(l), stop)
                .await
                .expect("watch");
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = op
        .ask(AdminRequest::Evacuate {
            node: n2.to_string(),
        })
        .await;
    assert!(r.ok, "{}", r.message);
    let op_id = r.data["op"].as_str().expect("op id").to_string();
    let removed = c
        .watch
        .until("removed decision", |x| x.decision == DecisionKind::Removed)
        .await;
    assert_eq!(removed.op.as_deref(), Some(op_id.as_str()));
    assert_eq!(removed.node.as_deref(), Some(n2));
    eventually("watch shows the removal", || {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("DECISION removed") && l.contains(&op_id))
    })
    .await;
    stop_watch.cancel();
    watcher.await.unwrap();
    let l = lines.lock().unwrap();
    assert!(
        l.iter().any(|l| l.contains("DECISION scale_down")),
        "{l:#?}"
    );
    assert!(
        l.iter().any(|l| l.contains(" progress ") && l.contains(n2)),
        "{l:#?}"
    );
    assert!(
        l.iter().any(|l| l.contains(" explain ") && l.contains(d)),
        "{l:#?}"
    );
    assert!(
        // Only this test's district: other tests' brokers (other keys)
        // publish on the same exchange while this one runs.
        l.iter()
            .filter(|l| l.contains("DECISION") && l.contains(d))
            .all(|l| !l.contains("UNVERIFIED")),
        "decisions are signed by the broker: {l:#?}"
    );
}

/// A request signed by an untrusted key is refused; a ping is answered by
/// the broker agent, with its round trip.
async fn untrusted_and_ping(c: &Ctx, op: &Operator) {
    let t = Duration::from_secs(10);
    let rogue = OperatorKeys {
        signer: gearshift_proto::KeyPair::generate().unwrap(),
        brokers: op.keys.brokers.clone(),
    };
    let r = cli::admin_on(
        &op.bus,
        &rogue,
        "mallory",
        &op.admin_key,
        AdminRequest::Status,
        t,
    )
    .await
    .unwrap();
    assert!(
        !r.ok && r.message.contains("unknown signing key"),
        "{}",
        r.message
    );
    let answers = cli::ping(
        &op.bus,
        &c.keys.operator,
        "alice",
        Duration::from_secs(2),
        None,
    )
    .await
    .unwrap();
    let me = answers
        .iter()
        .find(|a| a.agent == c.cfg.agent.name)
        .unwrap_or_else(|| panic!("the broker agent answers ping: {answers:?}"));
    assert_eq!(me.role, "broker");
    assert!(me.rtt < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_operator_commands_memory() {
    operator_commands("memory").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_operator_commands_amqp() {
    operator_commands("amqp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_scale_up_lands_in_the_right_district_stomp() {
    scale_up_lands_in_the_right_district("stomp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_full_scale_down_saga_stomp() {
    full_scale_down_saga("stomp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_abort_reactivates_the_node_stomp() {
    abort_reactivates_the_node("stomp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_drain_cancel_stomp() {
    drain_cancel("stomp").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn broker_operator_commands_stomp() {
    operator_commands("stomp").await;
}
