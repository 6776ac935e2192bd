//! ActiveMQ Classic beyond the conformance suite, against the private broker
//! of `scripts/setup-activemq` (`GEARSHIFT_TEST_ACTIVEMQ_URL`, default: the
//! URL in `target/activemq/url`; the user without rights from
//! `GEARSHIFT_TEST_ACTIVEMQ_OUTSIDER_URL` or `target/activemq/url.outsider`):
//! flavor detection, heart-beats over an idle half minute, a refused
//! subscription that backs off, a late reply to a gone temporary queue. A missing broker is a failure naming the
//! script, never a skip.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use gearshift_bus::stomp::StompBus;
use gearshift_bus::{
    BusError, BusUrl, ConnectOptions, ConsumeOptions, OutMessage, QueueSpec, SharedBus, StompFlavor,
};

use crate::rabbit::uniq;

const SETUP: &str = "run scripts/setup-activemq (it installs and starts a private ActiveMQ \
                     and writes target/activemq/url)";

fn url_from(var: &str, file: &str) -> String {
    if let Ok(u) = std::env::var(var) {
        return u;
    }
    let path = format!("{}/../target/activemq/{file}", env!("CARGO_MANIFEST_DIR"));
    match std::fs::read_to_string(&path) {
        Ok(u) => u.trim().to_string(),
        Err(e) => {
            panic!("no ActiveMQ URL: {var} is not set and {path} cannot be read ({e}); {SETUP}")
        }
    }
}

/// The URL of the test broker's `gearshift` user.
pub fn url() -> String {
    url_from("GEARSHIFT_TEST_ACTIVEMQ_URL", "url")
}

/// The URL of a user without rights on gearshift's destinations.
pub fn outsider_url() -> String {
    url_from("GEARSHIFT_TEST_ACTIVEMQ_OUTSIDER_URL", "url.outsider")
}

/// The STOMP address of `url`.
pub fn stomp_addr(url: &str) -> SocketAddr {
    let u = url::Url::parse(url).expect("ActiveMQ test URL");
    let host = u.host_str().unwrap_or("127.0.0.1").to_string();
    let port = u.port().unwrap_or(61613);
    std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
        .expect("resolve the ActiveMQ test broker")
        .next()
        .expect("an address")
}

/// `url` with another host and port.
pub fn url_via(url: &str, addr: SocketAddr) -> String {
    let mut u = url::Url::parse(url).expect("ActiveMQ test URL");
    u.set_host(Some(&addr.ip().to_string())).expect("host");
    u.set_port(Some(addr.port())).expect("port");
    u.to_string()
}

/// `url` without its `?flavor=`.
fn unnamed(url: &str) -> String {
    let mut u = url::Url::parse(url).expect("ActiveMQ test URL");
    u.set_query(None);
    u.to_string()
}

/// Connects, or fails the test saying how to start the broker.
pub async fn connect(url: &str, opts: ConnectOptions) -> SharedBus {
    match gearshift_bus::connect(url, opts).await {
        Ok(b) => b,
        Err(e) => panic!(
            "cannot reach the ActiveMQ test broker at {} ({e}); {SETUP}",
            gearshift_bus::url::redact(url)
        ),
    }
}

fn options(name: &str) -> ConnectOptions {
    crate::conformance::harness::test_options(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flavor_is_detected_from_the_server_header() {
    let url = unnamed(&url());
    let bus = match StompBus::connect_with(
        BusUrl::parse(&url).unwrap(),
        options("detect"),
        Default::default(),
    )
    .await
    {
        Ok(b) => b,
        Err(e) => panic!("cannot reach the ActiveMQ test broker ({e}); {SETUP}"),
    };
    assert_eq!(bus.flavor(), StompFlavor::ActiveMq);
    // And it speaks ActiveMQ's destinations: a durable queue bound to a pattern.
    let t = uniq();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.#")]);
    use gearshift_bus::Bus;
    bus.declare_queue(&spec).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.x.y"), "detected"))
        .await
        .unwrap();
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let d = sub
        .next_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (d.key.as_str(), &d.payload[..]),
        (format!("{t}.x.y").as_str(), &b"detected"[..])
    );
    d.ack().await.unwrap();
    drop(sub);
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_flavor_the_server_contradicts_is_refused_at_connect() {
    let wrong = format!("{}?flavor=rabbitmq", unnamed(&url()));
    let e = gearshift_bus::connect(&wrong, options("wrong"))
        .await
        .err()
        .expect("connect must fail");
    assert!(matches!(e, BusError::Url { .. }), "{e}");
    assert!(e.to_string().contains("ActiveMQ/"), "{e}");
    assert!(!e.is_retryable());
    // And the other way round, against RabbitMQ's STOMP plugin: with
    // flavor=activemq, CONNECT's `host` is the URL's host, which RabbitMQ
    // refuses as a virtual host before it says who it is.
    let rabbit = format!("{}?flavor=activemq", crate::rabbit::stomp_url());
    let e = gearshift_bus::connect(&rabbit, options("wrong"))
        .await
        .err()
        .expect("connect must fail");
    assert!(!e.is_retryable(), "{e}");
    assert!(e.to_string().contains("flavor=activemq"), "{e}");
}

/// ActiveMQ beats at exactly the negotiated period, its first beat two
/// periods after CONNECTED: 30 idle seconds at 1 s must not drop the
/// connection (the old two-period rule did, at random).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_with_heart_beats_stays_up_for_thirty_seconds() {
    let opts = ConnectOptions {
        heartbeat: Duration::from_secs(1),
        ..options("idle")
    };
    let bus = connect(&url(), opts).await;
    let mut events = bus.events();
    let t = uniq();
    let mut sub = bus.subscribe(&format!("{t}.idle")).await.unwrap();
    match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
        Err(_) => {}
        Ok(ev) => panic!("the idle connection changed state: {ev:?}"),
    }
    assert!(bus.health().connected);
    bus.publish(OutMessage::new(format!("{t}.idle"), "still here"))
        .await
        .unwrap();
    let d = sub
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"still here");
    bus.close().await;
}

/// A user without rights: every SUBSCRIBE is refused (ActiveMQ keeps the
/// connection). A caller retrying at once reaches the broker once per
/// backoff step, and the bus health says what is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_backs_off() {
    let opts = ConnectOptions {
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        ..options("outsider")
    };
    let bus = connect(&outsider_url(), opts).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable("gearshift.broker.events", vec!["event.#".into()]);
    let window = Duration::from_secs(5);
    let started = Instant::now();
    let mut attempts: u64 = 0;
    while started.elapsed() < window {
        attempts += 1;
        match bus.consume(&spec, ConsumeOptions::default()).await {
            Err(BusError::Server(reason)) => {
                assert!(reason.contains("not authorized"), "{reason}")
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    // 50, 100, 200, 400 ms, then 500 ms (plus up to 20 % jitter): about a
    // dozen in 5 s. Without the backoff: thousands.
    assert!(
        (5..=20).contains(&attempts),
        "{attempts} attempts in {window:?}"
    );
    let h = bus.health();
    assert!(h.connected, "ActiveMQ keeps the connection");
    assert!(h.is_degraded());
    assert!(h.refused_total >= attempts, "{h:?}");
    assert_eq!(h.refusing.len(), 1, "{h:?}");
    assert!(
        h.refusing[0]
            .destination
            .contains("Consumer.gearshift%2Ebroker%2Eevents"),
        "{h:?}"
    );
    assert!(
        events.try_recv().is_err(),
        "no reconnect: the refusal concerns one frame"
    );
    // The session goes on: what the user may do still works.
    bus.send_to_queue(
        "outsider.check",
        OutMessage::new("outsider.check", "ok").transient(),
    )
    .await
    .unwrap();
    bus.close().await;
}

/// A reply to a requester that is gone (its temporary queue went with its
/// connection) is refused by ActiveMQ with an ERROR for that SEND only: the
/// responder's call fails, its session goes on, and nothing is held back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_reply_to_a_gone_requester_is_refused_without_harm() {
    let t = uniq();
    let responder = connect(&url(), options("responder")).await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.svc")]);
    let mut requests = responder
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let requester = connect(&url(), options("requester")).await;
    let e = requester
        .request(
            OutMessage::new(format!("{t}.svc"), "late"),
            Duration::from_millis(200),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    requester.close().await;
    let d = requests
        .next_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    let to = d.reply_to.clone().expect("a reply address");
    assert!(to.starts_with("/remote-temp-queue/"), "{to}");
    let mut reply = OutMessage::new(to.clone(), "too late").transient();
    reply.correlation_id = d.correlation_id.clone();
    let e = responder.send_to_queue(&to, reply).await.unwrap_err();
    assert!(matches!(e, BusError::Server(_)), "{e}");
    d.ack().await.unwrap();
    let h = responder.health();
    assert!(h.connected && h.refusing.is_empty(), "{h:?}");
    responder
        .publish(OutMessage::new(format!("{t}.svc"), "after"))
        .await
        .unwrap();
    let d = requests
        .next_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"after");
    d.ack().await.unwrap();
    drop(requests);
    responder.close().await;
}
