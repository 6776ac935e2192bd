//! The heat-via-node handler over the real RabbitMQ (AMQP and STOMP): it
//! publishes a signed `cmd.heat_signal` to a node and waits for that node's
//! `event.done` / `event.failed`; test nodes answer as a node agent would.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gearshift_bus::{OutMessage, SharedBus};
use gearshift_handlers::config::HeatViaNodeConfig;
use gearshift_handlers::heat_via_node::HeatViaNodeHandler;
use gearshift_handlers::{
    CreateRequest, FleetView, GroupKey, Handler, HandlerContext, NodeShape, RemoveRequest,
};
use gearshift_proto::msg::{CommandResult, Done, Failed, HeatAction};
use gearshift_proto::sign::{TimePolicy, authenticate};
use gearshift_proto::{Envelope, KeyPair, Keyring, Message, Role, routing};

/// (node, action, corr, leader epoch) of every command the test nodes received.
type Seen = Arc<Mutex<Vec<(String, HeatAction, Option<String>, u64)>>>;

/// The broker agent's leader epoch in the requests: the handler stamps it
/// on the commands it sends (nodes refuse older ones).
const EPOCH: u64 = 7;

/// How a test node answers.
#[derive(Clone, Copy, PartialEq)]
enum Behaviour {
    Done,
    Silent,
    FailBusy,
    FailQuota,
    /// Answers `done`, signed with a key the broker does not trust.
    Forged,
}

struct Fleet(Vec<String>);
impl FleetView for Fleet {
    fn active_nodes(&self, _g: &GroupKey) -> Vec<String> {
        self.0.clone()
    }
}

/// A test node: verifies each command with the broker's key and answers.
async fn spawn_node(
    bus: SharedBus,
    name: String,
    broker_key: Arc<KeyPair>,
    node_key: Arc<KeyPair>,
    how: Behaviour,
    seen: Seen,
) -> tokio::task::JoinHandle<()> {
    let mut sub = bus
        .subscribe(&routing::command(&name))
        .await
        .expect("subscribe cmd");
    tokio::spawn(async move {
        let mut trusted = Keyring::new();
        trusted.add(broker_key.public(), Role::Broker, "broker");
        while let Some(d) = sub.next().await {
            let dec = Envelope::decode(&d.payload).expect("decodable command");
            authenticate(&trusted, &TimePolicy::default(), &dec, chrono::Utc::now())
                .expect("command signed by the broker");
            assert!(dec.envelope.expires.is_some(), "commands expire");
            let Message::HeatSignal(sig) = &dec.envelope.msg else {
                panic!("not a heat signal")
            };
            assert!(sig.reason.contains("gearshift"), "{}", sig.reason);
            seen.lock().unwrap().push((
                name.clone(),
                sig.action,
                dec.envelope.corr.clone(),
                sig.epoch,
            ));
            let cmd = dec.envelope.id;
            let body: Message = match how {
                Behaviour::Silent => continue,
                Behaviour::Done | Behaviour::Forged => Done {
                    cmd,
                    command: "cmd.heat_signal".into(),
                    result: CommandResult::HeatSignalled { action: sig.action, status: 200, detail: "accepted".into() },
                }
                .into(),
                Behaviour::FailBusy => Failed {
                    cmd,
                    command: "cmd.heat_signal".into(),
                    error: "Heat answered 409: Stack paas already has an action (UPDATE) in progress.".into(),
                    retryable: true,
                    http_status: Some(409),
                }
                .into(),
                Behaviour::FailQuota => Failed {
                    cmd,
                    command: "cmd.heat_signal".into(),
                    error: "scaling failed: Quota exceeded for instances: Requested 1, but already used 10 of 10 instances".into(),
                    retryable: false,
                    http_status: Some(400),
                }
                .into(),
            };
            let env = Envelope::new(name.clone(), body)
                .with_corr(dec.envelope.corr.clone().unwrap_or_default());
            let signer = if how == Behaviour::Forged {
                KeyPair::generate().unwrap()
            } else {
                (*node_key).clone()
            };
            bus.publish(OutMessage::new(routing::event(&name), signer.seal(env)).transient())
                .await
                .expect("publish event");
        }
    })
}

struct Setup {
    handler: HeatViaNodeHandler,
    ctx: HandlerContext,
    seen: Seen,
    _tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn setup(url: &str, nodes: &[(&str, Behaviour)], timeout_ms: u64) -> (Setup, Vec<String>) {
    let broker_bus = gearshift_tests::connect(url, "hvn-broker").await;
    let node_bus = gearshift_tests::connect(url, "hvn-nodes").await;
    let broker_key = Arc::new(KeyPair::generate().unwrap());
    let node_key = Arc::new(KeyPair::generate().unwrap());
    let mut keyring = Keyring::new();
    keyring.add(node_key.public(), Role::Node, "nodes");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut names = Vec::new();
    let mut tasks = Vec::new();
    for (prefix, how) in nodes {
        let name = format!("{}.example.com", gearshift_tests::unique(prefix));
        tasks.push(
            spawn_node(
                node_bus.clone(),
                name.clone(),
                broker_key.clone(),
                node_key.clone(),
                *how,
                seen.clone(),
            )
            .await,
        );
        names.push(name);
    }
    let ctx = HandlerContext {
        bus: Some(broker_bus),
        signer: Some(broker_key),
        keyring: Some(Arc::new(keyring)),
        agent: "broker".into(),
        bus_url: url.into(),
        fleet: Arc::new(Fleet(names.clone())),
    };
    let mut cfg: HeatViaNodeConfig = toml::from_str("").unwrap();
    cfg.node_timeout = Duration::from_millis(timeout_ms);
    let handler = HeatViaNodeHandler::new(cfg, &ctx).unwrap();
    (
        Setup {
            handler,
            ctx,
            seen,
            _tasks: tasks,
        },
        names,
    )
}

fn group() -> GroupKey {
    GroupKey {
        district: "d1".into(),
        profile: "small".into(),
    }
}

fn create(op: &str) -> CreateRequest {
    CreateRequest {
        op: op.into(),
        group: group(),
        shape: NodeShape::default(),
        attempt: 1,
        epoch: EPOCH,
    }
}

#[tokio::test]
async fn scale_up_skips_a_silent_node_and_uses_the_next() {
    gearshift_tests::init_logging();
    for (transport, url) in gearshift_tests::real_bus_urls() {
        let (s, names) = setup(
            &url,
            &[("dead-", Behaviour::Silent), ("live-", Behaviour::Done)],
            1500,
        )
        .await;
        let out = tokio::time::timeout(
            Duration::from_secs(20),
            s.handler.create_node(&create("op-up")),
        )
        .await
        .expect("bounded")
        .unwrap_or_else(|e| panic!("{transport}: {e}"));
        assert!(
            out.detail.contains(&names[1]),
            "{transport}: {}",
            out.detail
        );
        let seen = s.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2, "{transport}: both nodes were asked");
        assert_eq!(
            (seen[0].0.as_str(), seen[0].1),
            (names[0].as_str(), HeatAction::ScaleUp)
        );
        assert_eq!(
            (seen[1].0.as_str(), seen[1].1),
            (names[1].as_str(), HeatAction::ScaleUp)
        );
        assert_eq!(seen[1].2.as_deref(), Some("op-up/scale_up"));
        assert!(seen.iter().all(|x| x.3 == EPOCH), "{transport}: {seen:?}");
    }
}

/// The victim marks its own member and has Heat remove exactly it; no
/// scale-down follows (after a mark, Heat 27 would remove one more node).
/// Without `mark_unhealthy_first`, the scale-down signal alone.
#[tokio::test]
async fn removal_asks_the_victim_to_mark_itself_and_nothing_more() {
    for (transport, url) in gearshift_tests::real_bus_urls() {
        let (s, names) = setup(
            &url,
            &[("victim-", Behaviour::Done), ("other-", Behaviour::Done)],
            5000,
        )
        .await;
        let req = RemoveRequest {
            op: "op-rm".into(),
            group: group(),
            node: names[0].clone(),
            cloud_id: None,
            attempt: 1,
            epoch: EPOCH,
        };
        tokio::time::timeout(Duration::from_secs(20), s.handler.remove_node(&req))
            .await
            .expect("bounded")
            .unwrap_or_else(|e| panic!("{transport}: {e}"));
        let seen = s.seen.lock().unwrap().clone();
        assert!(seen.iter().all(|x| x.3 == EPOCH), "{transport}: {seen:?}");
        let got: Vec<(String, HeatAction)> = seen.into_iter().map(|(n, a, ..)| (n, a)).collect();
        assert_eq!(
            got,
            vec![(names[0].clone(), HeatAction::MarkUnhealthy)],
            "{transport}"
        );
    }
    let url = gearshift_tests::amqp_url();
    let (mut s, names) = setup(&url, &[("plain-", Behaviour::Done)], 5000).await;
    let mut cfg: HeatViaNodeConfig = toml::from_str("mark_unhealthy_first = false").unwrap();
    cfg.node_timeout = Duration::from_millis(5000);
    s.handler = HeatViaNodeHandler::new(cfg, &s.ctx).unwrap();
    let req = RemoveRequest {
        op: "op-plain".into(),
        group: group(),
        node: names[0].clone(),
        cloud_id: None,
        attempt: 1,
        epoch: 0,
    };
    s.handler.remove_node(&req).await.unwrap();
    let got: Vec<HeatAction> = s.seen.lock().unwrap().iter().map(|x| x.1).collect();
    assert_eq!(got, vec![HeatAction::ScaleDown]);
}

#[tokio::test]
async fn node_failures_map_to_busy_and_quota() {
    let url = gearshift_tests::amqp_url();
    let (s, _) = setup(&url, &[("busy-", Behaviour::FailBusy)], 5000).await;
    let err = s.handler.create_node(&create("op-b")).await.unwrap_err();
    assert_eq!(err.label(), "busy", "{err}");
    let (s, _) = setup(&url, &[("quota-", Behaviour::FailQuota)], 5000).await;
    let err = s.handler.create_node(&create("op-q")).await.unwrap_err();
    assert!(err.is_quota(), "{err}");
}

#[tokio::test]
async fn a_forged_answer_is_ignored_and_no_active_node_is_transient() {
    let url = gearshift_tests::amqp_url();
    let (s, _) = setup(&url, &[("forged-", Behaviour::Forged)], 1500).await;
    let err = s.handler.create_node(&create("op-f")).await.unwrap_err();
    assert_eq!(err.label(), "transient", "{err}");
    assert!(err.to_string().contains("no node answered"), "{err}");
    let (s, _) = setup(&url, &[], 500).await;
    let err = s.handler.create_node(&create("op-n")).await.unwrap_err();
    assert_eq!(err.label(), "transient");
    assert!(err.to_string().contains("no active node"), "{err}");
}
