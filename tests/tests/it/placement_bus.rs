//! Placement as a service over the real bus (RabbitMQ over AMQP 0-9-1 and
//! STOMP 1.2): an operator's Rhai script and an external command decide,
//! signed requests are answered with signed replies, and malformed, forged
//! or wrongly signed requests get a refusal instead of a crash.
//!
//! The broker is `GEARSHIFT_TEST_AMQP_URL` / `GEARSHIFT_TEST_STOMP_URL`
//! (defaults: the local RabbitMQ with guest/guest).
//! Each test serves on its own transient queue bound to a routing key of its
//! own, so that it neither steals nor answers anybody else's requests.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use chrono::Utc;
use gearshift_bus::{ConnectOptions, Durability, OutMessage, QueueSpec, SharedBus};
use gearshift_placement::cli::{PlaceError, request_placement};
use gearshift_placement::service::{ServeOptions, serve_with};
use gearshift_placement::{CommandConfig, Engine, PlacementConfig, ScriptConfig, StrategyName};
use gearshift_proto::msg::{Message, PlacementReply, PlacementRequest, Role};
use gearshift_proto::sign::{KeyPair, Keyring};
use gearshift_proto::{Envelope, Kind};
use gearshift_tests::{amqp_url, stomp_url};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(20);

#[path = "../../../placement/tests/it/fixtures.rs"]
mod fixtures;
use fixtures::node;

fn request(login: &str) -> PlacementRequest {
    let mut off = node("off", 0.0);
    off.active = false;
    let nodes = vec![node("a", 70.0), node("b", 20.0), off, node("c", 40.0)];
    fixtures::request(nodes, fixtures::app("1", "shop", "php-5.4"), login, login)
}

/// A placement service on `url` with its own queue and key, and a client.
struct Harness {
    key: String,
    client: SharedBus,
    service_bus: SharedBus,
    broker: KeyPair,
    operator: KeyPair,
    /// Trusted by the client: the broker's key.
    client_ring: Keyring,
    token: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), gearshift_bus::BusError>>,
}

async fn connect(url: &str, name: &str) -> SharedBus {
    // A missing broker is a loud failure, never a skip.
    gearshift_bus::connect(
        url,
        ConnectOptions {
            name: name.into(),
            ..Default::default()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("cannot connect to {url} (run scripts/setup-rabbitmq): {e}"))
}

async fn start(url: &str, cfg: PlacementConfig) -> Harness {
    let id = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("placement.request.test{id}");
    let broker = KeyPair::generate().unwrap();
    let operator = KeyPair::generate().unwrap();
    let mut service_ring = Keyring::new();
    service_ring.add(operator.public(), Role::Operator, "operator");
    let mut client_ring = Keyring::new();
    client_ring.add(broker.public(), Role::Broker, "broker");

    let service_bus = connect(url, "placement-test-service").await;
    let client = connect(url, "placement-test-client").await;
    let engine = Engine::new(&cfg).unwrap();
    let token = CancellationToken::new();
    let ready = Arc::new(tokio::sync::Notify::new());
    let opts = ServeOptions {
        queue: QueueSpec {
            name: format!("gearshift.test.placement.{id}"),
            bindings: vec![key.clone()],
            durability: Durability::Transient,
            max_length: None,
            single_active_consumer: false,
        },
        ready: Some(ready.clone()),
        ..Default::default()
    };
    let task = tokio::spawn(serve_with(
        service_bus.clone(),
        engine,
        Arc::new(KeyPair::from_pem(&broker.to_pem()).unwrap()),
        Arc::new(service_ring),
        "broker-test",
        token.clone(),
        opts,
    ));
    let h = Harness {
        key,
        client,
        service_bus,
        broker,
        operator,
        client_ring,
        token,
        task,
    };
    tokio::time::timeout(WAIT, ready.notified())
        .await
        .unwrap_or_else(|_| panic!("placement service on {url} not ready within {WAIT:?}"));
    h
}

impl Harness {
    async fn ask(
        &self,
        req: PlacementRequest,
        wait: Duration,
    ) -> Result<PlacementReply, PlaceError> {
        request_placement(
            &self.client,
            &self.key,
            &self.operator,
            "operator-test",
            &self.client_ring,
            req,
            wait,
        )
        .await
    }

    /// Sends raw bytes as a request and returns the decoded (verified) reply.
    async fn ask_raw(&self, payload: Vec<u8>) -> PlacementReply {
        let d = self
            .client
            .request(
                OutMessage::new(self.key.clone(), Bytes::from(payload)).transient(),
                WAIT,
            )
            .await
            .expect("a refusal reply");
        let dec = Envelope::decode(&d.payload).unwrap();
        assert_eq!(dec.envelope.kind(), Kind::PlacementReply);
        self.client_ring.verify_signature(&dec).unwrap();
        match dec.envelope.msg {
            Message::PlacementReply(r) => r,
            other => panic!("unexpected {other:?}"),
        }
    }

    async fn stop(self) {
        self.token.cancel();
        tokio::time::timeout(WAIT, self.task)
            .await
            .expect("service stops when cancelled")
            .unwrap()
            .unwrap();
        self.client.close().await;
        self.service_bus.close().await;
        drop(self.broker);
    }
}

const SCRIPT: &str = r#"
fn place(input) {
    let login = input.user.login;
    if login == "mallory" { throw "mallory may not create gears"; }
    if login == "dave" { return "off"; }
    if login == input.settings.vip {
        let best = ();
        for n in input.nodes {
            if best == () || n.node_consumed_capacity < best.node_consumed_capacity { best = n; }
        }
        return best.name;
    }
    ()
}
"#;

fn script_config() -> PlacementConfig {
    let mut settings = serde_json::Map::new();
    settings.insert("vip".into(), serde_json::json!("carol"));
    PlacementConfig {
        strategy: StrategyName::Script,
        seed: Some(11),
        script: ScriptConfig {
            inline: Some(SCRIPT.into()),
            settings,
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn script_end_to_end(url: &str) {
    let h = start(url, script_config()).await;
    let r = h.ask(request("carol"), WAIT).await.unwrap();
    assert_eq!(r.node.as_deref(), Some("b"));
    assert_eq!(r.strategy, "script");
    assert_eq!(r.candidates, 3);
    assert_eq!(r.filtered.len(), 1);
    assert_eq!(r.filtered[0].node, "off");

    let r = h.ask(request("mallory"), WAIT).await.unwrap();
    assert_eq!(r.node, None);
    assert_eq!(r.refused.as_deref(), Some("mallory may not create gears"));

    let r = h.ask(request("dave"), WAIT).await.unwrap();
    assert!(r.refused.unwrap().contains("not one of the 3 candidates"));

    // () = place normally; the default never takes "a" (above average).
    let r = h.ask(request("alice"), WAIT).await.unwrap();
    assert!(matches!(r.node.as_deref(), Some("b" | "c")), "{r:?}");
    h.stop().await;
}

const PLACER: &str = r#"exec python3 -c '
import json, sys
inp = json.load(sys.stdin)
login = inp["user"]["login"]
if login == "broken":
    sys.stderr.write("placer: inventory database unreachable\n"); sys.exit(3)
if login == "mallory":
    print(json.dumps({"refused": "mallory is over quota"}))
else:
    print(max(inp["nodes"], key=lambda n: n["mem_free_mb"] - n["node_consumed_capacity"])["name"])
'"#;

fn command_config() -> PlacementConfig {
    PlacementConfig {
        strategy: StrategyName::Command,
        command: CommandConfig {
            program: Some("/bin/sh".into()),
            args: vec!["-c".into(), PLACER.into()],
            timeout: Duration::from_secs(15),
            ..Default::default()
        },
        ..Default::default()
    }
}

async fn command_end_to_end(url: &str) {
    let h = start(url, command_config()).await;
    let r = h.ask(request("alice"), WAIT).await.unwrap();
    assert_eq!(r.node.as_deref(), Some("b"));
    assert_eq!(r.strategy, "command");

    let r = h.ask(request("mallory"), WAIT).await.unwrap();
    assert_eq!(r.refused.as_deref(), Some("mallory is over quota"));

    let why = h
        .ask(request("broken"), WAIT)
        .await
        .unwrap()
        .refused
        .unwrap();
    assert!(why.contains("exited with"), "{why}");
    assert!(
        why.contains("placer: inventory database unreachable"),
        "{why}"
    );

    // Several requests at once are all answered, each with its own reply.
    let asks: Vec<_> = ["alice", "mallory", "alice", "broken"]
        .iter()
        .map(|l| h.ask(request(l), WAIT))
        .collect();
    let replies = futures::future::join_all(asks).await;
    let got: Vec<bool> = replies
        .into_iter()
        .map(|r| r.unwrap().node.is_some())
        .collect();
    assert_eq!(got, [true, false, true, false]);
    h.stop().await;
}

async fn refusals_without_a_crash(url: &str) {
    let h = start(url, script_config()).await;
    // Not JSON at all.
    let r = h.ask_raw(b"\x00garbage".to_vec()).await;
    assert!(r.refused.unwrap().starts_with("malformed request"));
    // Signed by a key the service does not know.
    let stranger = KeyPair::generate().unwrap();
    let r = h
        .ask_raw(stranger.seal(Envelope::new("stranger", request("carol"))))
        .await;
    assert!(
        r.refused.unwrap().starts_with("not authenticated"),
        "unknown key"
    );
    // Not signed at all.
    let r = h
        .ask_raw(Envelope::new("nobody", request("carol")).encode())
        .await;
    assert!(r.refused.unwrap().contains("not authenticated"), "unsigned");
    // Too old.
    let old = Envelope::new_at(
        "operator-test",
        request("carol"),
        Utc::now() - chrono::Duration::hours(1),
    );
    let r = h.ask_raw(h.operator.seal(old)).await;
    assert!(r.refused.unwrap().contains("not authenticated"), "stale");
    // Another kind on the placement key.
    let ping = Envelope::new("operator-test", gearshift_proto::msg::Ping::default());
    let r = h.ask_raw(h.operator.seal(ping)).await;
    assert!(r.refused.unwrap().contains("expected a placement.request"));
    // An invalid body (empty node name) is malformed, not a crash.
    let mut bad = request("carol");
    bad.nodes[0].name = String::new();
    let r = h
        .ask_raw(h.operator.seal(Envelope::new("operator-test", bad)))
        .await;
    assert!(r.refused.unwrap().starts_with("malformed request"));
    // The service still answers good requests afterwards.
    assert_eq!(
        h.ask(request("carol"), WAIT).await.unwrap().node.as_deref(),
        Some("b")
    );
    h.stop().await;
}

async fn wrong_role_is_refused(url: &str) {
    // The service trusts this key only as a node: nodes may not ask for placement.
    let h = start(url, script_config()).await;
    let node_key = KeyPair::generate().unwrap();
    let mut ring = Keyring::new();
    ring.add(node_key.public(), Role::Node, "node");
    // A dedicated service that trusts `node_key` as a node.
    let id = uuid::Uuid::new_v4().simple().to_string();
    let key = format!("placement.request.role{id}");
    let token = CancellationToken::new();
    let ready = Arc::new(tokio::sync::Notify::new());
    let task = tokio::spawn(serve_with(
        h.service_bus.clone(),
        Engine::new(&script_config()).unwrap(),
        Arc::new(KeyPair::from_pem(&h.broker.to_pem()).unwrap()),
        Arc::new(ring),
        "broker-test",
        token.clone(),
        ServeOptions {
            queue: QueueSpec {
                name: format!("gearshift.test.placement.{id}"),
                bindings: vec![key.clone()],
                durability: Durability::Transient,
                max_length: None,
                single_active_consumer: false,
            },
            ready: Some(ready.clone()),
            ..Default::default()
        },
    ));
    let payload = node_key.seal(Envelope::new("node-1", request("carol")));
    tokio::time::timeout(WAIT, ready.notified()).await.unwrap();
    let d = h
        .client
        .request(
            OutMessage::new(key.clone(), Bytes::from(payload)).transient(),
            WAIT,
        )
        .await
        .expect("a refusal reply");
    let dec = Envelope::decode(&d.payload).unwrap();
    h.client_ring.verify_signature(&dec).unwrap();
    let Message::PlacementReply(r) = dec.envelope.msg else {
        panic!("not a reply")
    };
    let why = r.refused.unwrap();
    assert!(
        why.contains("not authenticated") && why.contains("node"),
        "{why}"
    );
    token.cancel();
    tokio::time::timeout(WAIT, task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    h.stop().await;
}

#[tokio::test]
async fn placement_script_strategy_over_amqp() {
    script_end_to_end(&amqp_url()).await;
}

#[tokio::test]
async fn placement_script_strategy_over_stomp() {
    script_end_to_end(&stomp_url()).await;
}

#[tokio::test]
async fn placement_command_strategy_over_amqp() {
    command_end_to_end(&amqp_url()).await;
}

#[tokio::test]
async fn placement_command_strategy_over_stomp() {
    command_end_to_end(&stomp_url()).await;
}

#[tokio::test]
async fn placement_refuses_bad_requests_over_amqp() {
    refusals_without_a_crash(&amqp_url()).await;
    wrong_role_is_refused(&amqp_url()).await;
}

#[tokio::test]
async fn placement_refuses_bad_requests_over_stomp() {
    refusals_without_a_crash(&stomp_url()).await;
    wrong_role_is_refused(&stomp_url()).await;
}

#[tokio::test]
async fn placement_over_memory_bus() {
    let url = format!("memory://placement-{}", uuid::Uuid::new_v4().simple());
    script_end_to_end(&url).await;
    command_end_to_end(&url).await;
    refusals_without_a_crash(&url).await;
}
