//! AMQP-specific behaviour against the real RabbitMQ on this machine
//! (`GEARSHIFT_TEST_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! connection errors, waiting through an outage, close, dropped
//! subscriptions, reconnecting while publishing, client properties and
//! heart-beat, and `amqps://` through an in-process TLS proxy with a private CA.
//!
//! Outages are made by an in-process TCP proxy between the bus and RabbitMQ,
//! so that only this test's connections are cut. Tests whose name contains
//! `disruptive` make the broker drop every connection.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

use gearshift_bus::{
    BusError, BusEvent, ConnectOptions, ConsumeOptions, Durability, OutMessage, QueueSpec,
    SharedBus, Subscription, TlsOptions,
};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{broadcast, watch};

const WAIT: Duration = Duration::from_secs(10);

fn broker_url() -> String {
    std::env::var("GEARSHIFT_TEST_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into())
}

fn broker_addr() -> SocketAddr {
    let u = url::Url::parse(&broker_url()).expect("test AMQP URL");
    let host = u.host_str().unwrap_or("127.0.0.1");
    let port = u.port().unwrap_or(5672);
    std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .expect("resolve the test broker")
        .next()
        .expect("the test broker has an address")
}

/// The test broker's URL with another host and port (and scheme).
fn url_via(scheme: &str, addr: SocketAddr) -> String {
    let mut u = url::Url::parse(&broker_url()).expect("test AMQP URL");
    u.set_scheme(scheme).expect("scheme");
    u.set_host(Some(&addr.ip().to_string())).expect("host");
    u.set_port(Some(addr.port())).expect("port");
    u.to_string()
}

fn uniq() -> String {
    format!("t{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

fn options(name: &str) -> ConnectOptions {
    ConnectOptions {
        name: format!("gearshift-test-{name}"),
        heartbeat: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(300),
        op_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

async fn connect(url: &str, opts: ConnectOptions) -> SharedBus {
    match gearshift_bus::connect(url, opts).await {
        Ok(b) => b,
        Err(e) => panic!(
            "cannot reach the test broker ({e}); run scripts/setup-rabbitmq. URL: {}",
            gearshift_bus::url::redact(url)
        ),
    }
}

/// Connects where connecting must fail; the error.
async fn connect_err(url: &str, opts: ConnectOptions) -> BusError {
    match gearshift_bus::connect(url, opts).await {
        Ok(_) => panic!(
            "connecting to {} should fail",
            gearshift_bus::url::redact(url)
        ),
        Err(e) => e,
    }
}

async fn recv(sub: &mut Subscription) -> gearshift_bus::Delivery {
    match sub.next_timeout(WAIT).await {
        Ok(Some(d)) => d,
        Ok(None) => panic!("subscription ended"),
        Err(e) => panic!("{e}"),
    }
}

fn text(d: &gearshift_bus::Delivery) -> String {
    String::from_utf8_lossy(&d.payload).into_owned()
}

async fn wait_event(
    events: &mut broadcast::Receiver<BusEvent>,
    want: impl Fn(&BusEvent) -> bool,
) -> BusEvent {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Ok(Ok(ev)) if want(&ev) => return ev,
            Ok(Ok(_)) | Ok(Err(broadcast::error::RecvError::Lagged(_))) => {}
            Ok(Err(e)) => panic!("event channel closed: {e}"),
            Err(_) => panic!("expected bus event did not come"),
        }
    }
}

async fn rabbitmqctl(args: &[&str]) -> String {
    let out = tokio::process::Command::new("rabbitmqctl")
        .args(args)
        .output()
        .await
        .expect("run rabbitmqctl (is RabbitMQ installed on this machine?)");
    assert!(
        out.status.success(),
        "rabbitmqctl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn queue_names() -> BTreeSet<String> {
    let out = rabbitmqctl(&["list_queues", "-q", "name", "--formatter", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).expect("rabbitmqctl JSON");
    v.as_array()
        .expect("array of queues")
        .iter()
        .filter_map(|q| q["name"].as_str().map(String::from))
        .collect()
}

const UP: u8 = 0;
const CUT: u8 = 1;
const FROZEN: u8 = 2;

/// A TCP proxy to RabbitMQ that can cut every connection and refuse new ones,
/// optionally terminating TLS on its side.
struct Proxy {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    epoch: watch::Sender<u64>,
    accepted: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(UP));
        let (epoch, _) = watch::channel(0u64);
        let accepted = Arc::new(AtomicUsize::new(0));
        let target = broker_addr();
        let (m, e, a) = (mode.clone(), epoch.clone(), accepted.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    return;
                };
                a.fetch_add(1, Ordering::SeqCst);
                let mut cut = e.subscribe();
                match m.load(Ordering::SeqCst) {
                    CUT => {
                        drop(inbound);
                        continue;
                    }
                    FROZEN => {
                        // Accept, then never answer.
                        tokio::spawn(async move {
                            let _ = cut.changed().await;
                            drop(inbound);
                        });
                        continue;
                    }
                    _ => {}
                }
                let tls = tls.clone();
                let m = m.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let copy = async {
                        match tls {
                            Some(cfg) => {
                                let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
                                if let Ok(mut s) = acceptor.accept(inbound).await {
                                    let _ =
                                        tokio::io::copy_bidirectional(&mut s, &mut outbound).await;
                                }
                            }
                            None => {
                                let mut inbound = inbound;
                                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound)
                                    .await;
                            }
                        }
                    };
                    let mut copy = std::pin::pin!(copy);
                    tokio::select! {
                        _ = &mut copy => return,
                        _ = cut.changed() => {}
                    }
                    if m.load(Ordering::SeqCst) == FROZEN {
                        // Keep both sockets open but move no byte until restored.
                        let _ = cut.changed().await;
                    }
                });
            }
        });
        Proxy {
            addr,
            mode,
            epoch,
            accepted,
            task,
        }
    }

    /// Drops every proxied connection and refuses new ones until [`Proxy::restore`].
    fn cut(&self) {
        self.mode.store(CUT, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Keeps every connection open but silent (a hung broker or a dead
    /// network path), until [`Proxy::restore`].
    fn freeze(&self) {
        self.mode.store(FROZEN, Ordering::SeqCst);
        self.epoch.send_modify(|e| *e += 1);
    }

    fn restore(&self) {
        // Release the frozen sockets first, so that no new connection sees this change.
        self.epoch.send_modify(|e| *e += 1);
        self.mode.store(UP, Ordering::SeqCst);
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.epoch.send_modify(|e| *e += 1);
        self.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_is_a_clear_connect_error_within_the_timeout() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(800),
        ..options("unreachable")
    };
    let started = std::time::Instant::now();
    let e = connect_err(&format!("amqp://guest:guest@127.0.0.1:{port}/%2f"), opts).await;
    assert!(matches!(e, BusError::Connect { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(
        e.to_string().contains(&format!("127.0.0.1:{port}")),
        "the error names the endpoint: {e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // A peer that accepts but never speaks AMQP: bounded by connect_timeout too.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(800),
        ..options("silent")
    };
    let started = std::time::Instant::now();
    let e = connect_err(&format!("amqp://guest:guest@{addr}/%2f"), opts).await;
    assert!(matches!(e, BusError::Connect { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_and_unknown_vhost_are_auth_errors() {
    let mut u = url::Url::parse(&broker_url()).unwrap();
    u.set_password(Some("certainly-not-the-password")).unwrap();
    let started = std::time::Instant::now();
    let e = connect_err(u.as_str(), options("badpass")).await;
    assert!(matches!(e, BusError::Auth { .. }), "{e}");
    assert!(!e.is_retryable());
    assert!(!e.to_string().contains("certainly-not-the-password"), "{e}");
    // Refused at once, not retried until connect_timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    let mut u = url::Url::parse(&broker_url()).unwrap();
    u.set_path(&format!("/{}", uniq()));
    let e = connect_err(u.as_str(), options("badvhost")).await;
    assert!(matches!(e, BusError::Auth { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_wait_for_the_reconnect_and_consumers_resume() {
    let t = uniq();
    let proxy = Proxy::start(None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("outage")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let mut topic = bus.subscribe(&format!("{t}.topic.#")).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "before"))
        .await
        .unwrap();
    recv(&mut sub).await.ack().await.unwrap();

    proxy.cut();
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    assert!(matches!(ev, BusEvent::Disconnected { .. }));

    // Issued while the broker is unreachable: waits instead of failing.
    let b = bus.clone();
    let key = format!("{t}.cmd");
    let pending = tokio::spawn(async move { b.publish(OutMessage::new(key, "during")).await });
    let b = bus.clone();
    let key = format!("{t}.topic.x");
    let pending_topic =
        tokio::spawn(async move { b.publish(OutMessage::new(key, "topic").transient()).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        !pending.is_finished(),
        "publish must wait for the reconnect"
    );
    proxy.restore();

    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    assert_eq!(ev, BusEvent::Connected { reconnects: 1 });
    tokio::time::timeout(WAIT, pending)
        .await
        .expect("publish finishes after the reconnect")
        .unwrap()
        .expect("publish confirmed after the reconnect");
    tokio::time::timeout(WAIT, pending_topic)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let mut d = recv(&mut sub).await;
    if text(&d) == "before" {
        // Its ack was written just before the cut and may never have reached
        // the broker: then it comes again, marked redelivered.
        assert!(d.redelivered);
        d.ack().await.unwrap();
        d = recv(&mut sub).await;
    }
    assert_eq!(text(&d), "during");
    d.ack().await.unwrap();
    let d = recv(&mut topic).await;
    assert_eq!(text(&d), "topic");
    drop(sub);
    drop(topic);
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_fail_after_op_timeout_while_the_broker_stays_away() {
    let proxy = Proxy::start(None).await;
    let opts = ConnectOptions {
        op_timeout: Duration::from_millis(600),
        ..options("away")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let mut events = bus.events();
    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    let started = std::time::Instant::now();
    let e = bus
        .publish(OutMessage::new(format!("{}.x", uniq()), "lost"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(started.elapsed() < Duration::from_secs(5));
    let e = bus
        .declare_queue(&QueueSpec::durable(
            format!("gearshift.test.{}", uniq()),
            vec![],
        ))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    let e = bus.subscribe("whatever.#").await.unwrap_err();
    assert!(matches!(e, BusError::Timeout { .. }), "{e}");
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_fails_pending_operations_ends_subscriptions_and_never_reconnects() {
    let t = uniq();
    let proxy = Proxy::start(None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("close")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let mut topic = bus.subscribe(&format!("{t}.#")).await.unwrap();

    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    let b = bus.clone();
    let key = format!("{t}.cmd");
    let pending = tokio::spawn(async move { b.publish(OutMessage::new(key, "never")).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    bus.close().await;
    let r = tokio::time::timeout(WAIT, pending).await.unwrap().unwrap();
    assert!(matches!(r, Err(BusError::Closed)), "{r:?}");
    assert!(matches!(sub.next_timeout(WAIT).await, Ok(None)));
    assert!(matches!(topic.next_timeout(WAIT).await, Ok(None)));
    let e = bus
        .publish(OutMessage::new(format!("{t}.cmd"), "after"))
        .await
        .unwrap_err();
    assert!(matches!(e, BusError::Closed), "{e}");
    assert!(!e.is_retryable());
    let e = bus.subscribe(&format!("{t}.#")).await.unwrap_err();
    assert!(matches!(e, BusError::Closed), "{e}");

    // The broker comes back: a closed bus stays closed.
    let before = proxy.accepted();
    proxy.restore();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(proxy.accepted(), before, "a closed bus must not reconnect");

    // Clean up the durable test queue.
    let direct = connect(&broker_url(), options("close-cleanup")).await;
    drain(&*direct, &spec).await;
    direct.close().await;
}

async fn drain(bus: &dyn gearshift_bus::Bus, spec: &QueueSpec) -> Vec<String> {
    let mut out = vec![];
    if let Ok(mut sub) = bus.consume(spec, ConsumeOptions { prefetch: 500 }).await {
        while let Ok(Some(d)) = sub.next_timeout(Duration::from_millis(500)).await {
            out.push(text(&d));
            let _ = d.ack().await;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_subscriptions_are_not_restored_after_a_reconnect() {
    let t = uniq();
    let proxy = Proxy::start(None).await;
    let bus = connect(&url_via("amqp", proxy.addr), options("dropped")).await;
    let mut events = bus.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let transient = QueueSpec {
        name: format!("gearshift.test.{t}.transient"),
        bindings: vec![format!("{t}.watch")],
        durability: Durability::Transient,
        max_length: None,
    };
    let durable_sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let transient_sub = bus
        .consume(&transient, ConsumeOptions::default())
        .await
        .unwrap();
    assert!(queue_names().await.contains(&transient.name));
    drop(durable_sub);
    drop(transient_sub);
    // Let the cancellation reach the broker.
    tokio::time::sleep(Duration::from_millis(300)).await;

    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    proxy.restore();
    wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;

    // Had the dropped consumer come back, it would take about half of these
    // and hold them unacknowledged: another consumer must get every one.
    for i in 0..6 {
        bus.publish(OutMessage::new(format!("{t}.cmd"), format!("{i}")))
            .await
            .unwrap();
    }
    let other = connect(&broker_url(), options("dropped-other")).await;
    let mut sub = other
        .consume(&spec, ConsumeOptions::default())
        .await
        .unwrap();
    let mut got = BTreeSet::new();
    for _ in 0..6 {
        let d = recv(&mut sub).await;
        assert!(!d.redelivered, "nobody else held {}", text(&d));
        got.insert(text(&d));
        d.ack().await.unwrap();
    }
    assert_eq!(got.len(), 6);
    // The transient queue went with its consumer and was not declared again.
    assert!(!queue_names().await.contains(&transient.name));
    drop(sub);
    other.close().await;
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_while_publishing_loses_no_confirmed_message() {
    let t = uniq();
    let proxy = Proxy::start(None).await;
    let opts = ConnectOptions {
        op_timeout: Duration::from_secs(10),
        ..options("publisher")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let direct = connect(&broker_url(), options("publisher-check")).await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.#")]);
    direct.declare_queue(&spec).await.unwrap();

    let tasks = 8;
    let per_task = 150;
    let not_confirmed = Arc::new(AtomicUsize::new(0));
    let mut handles = vec![];
    for w in 0..tasks {
        let bus = bus.clone();
        let t = t.clone();
        let nc = not_confirmed.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let id = format!("{w}-{i}");
                let mut tries = 0;
                loop {
                    match bus
                        .publish(OutMessage::new(format!("{t}.m.{w}"), id.clone()))
                        .await
                    {
                        Ok(()) => break,
                        Err(e) if e.is_retryable() && tries < 20 => {
                            tries += 1;
                            nc.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("publish {id}: {e}"),
                    }
                }
            }
        }));
    }
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        proxy.cut();
        tokio::time::sleep(Duration::from_millis(200)).await;
        proxy.restore();
    }
    for h in handles {
        tokio::time::timeout(Duration::from_secs(60), h)
            .await
            .expect("publishers finish")
            .unwrap();
    }
    let got: BTreeSet<String> = drain(&*direct, &spec).await.into_iter().collect();
    let want: BTreeSet<String> = (0..tasks)
        .flat_map(|w| (0..per_task).map(move |i| format!("{w}-{i}")))
        .collect();
    let missing: Vec<_> = want.difference(&got).take(10).collect();
    assert!(
        missing.is_empty(),
        "confirmed but never delivered: {missing:?}"
    );
    println!(
        "{} confirmed publishes across 2 outages; {} attempts needed a retry",
        want.len(),
        not_confirmed.load(Ordering::SeqCst)
    );
    bus.close().await;
    direct.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_name_and_heartbeat_reach_the_broker() {
    let name = format!("gearshift-test-props-{}", uniq());
    let opts = ConnectOptions {
        name: name.clone(),
        heartbeat: Duration::from_secs(7),
        ..options("props")
    };
    let bus = connect(&broker_url(), opts).await;
    let mut found = None;
    for _ in 0..20 {
        let out = rabbitmqctl(&[
            "list_connections",
            "-q",
            "timeout",
            "client_properties",
            "--formatter",
            "json",
        ])
        .await;
        let v: serde_json::Value = serde_json::from_str(&out).expect("rabbitmqctl JSON");
        found = v.as_array().and_then(|conns| {
            conns
                .iter()
                .find(|c| c["client_properties"].to_string().contains(&name))
                .cloned()
        });
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let conn = found.expect("the broker lists our connection under its name");
    assert_eq!(conn["timeout"], 7, "{conn}");
    bus.close().await;
}

/// A private CA, a server certificate for `rabbit.test` and a client certificate.
struct Pki {
    dir: PathBuf,
    server: Arc<rustls::ServerConfig>,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    other_ca_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("gearshift-amqps-{}", uniq()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = |cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, cn.to_string());
            let cert = p.self_signed(&key).unwrap();
            (cert, rcgen::Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("gearshift test CA");
        let (other_ca, _) = ca("someone else's CA");
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server_cert = rcgen::CertificateParams::new(vec!["rabbit.test".into()])
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let client_key = rcgen::KeyPair::generate().unwrap();
        let client_cert = rcgen::CertificateParams::new(vec!["node-1.test".into()])
            .unwrap()
            .signed_by(&client_key, &issuer)
            .unwrap();
        let write = |name: &str, data: String| {
            let p = dir.join(name);
            std::fs::write(&p, data).unwrap();
            p
        };
        let ca_file = write("ca.pem", ca_cert.pem());
        let other_ca_file = write("other-ca.pem", other_ca.pem());
        let cert_file = write("client.pem", client_cert.pem());
        let key_file = write("client.key", client_key.serialize_pem());

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server_cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
            )
            .unwrap();
        Pki {
            dir,
            server: Arc::new(server),
            ca_file,
            cert_file,
            key_file,
            other_ca_file,
        }
    }

    fn client(&self) -> TlsOptions {
        TlsOptions {
            ca_file: Some(self.ca_file.clone()),
            cert_file: Some(self.cert_file.clone()),
            key_file: Some(self.key_file.clone()),
            server_name: Some("rabbit.test".into()),
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_a_client_certificate_and_a_server_name() {
    let pki = Pki::new();
    let proxy = Proxy::start(Some(pki.server.clone())).await;
    let url = url_via("amqps", proxy.addr);
    let opts = ConnectOptions {
        tls: pki.client(),
        ..options("amqps")
    };
    let bus = connect(&url, opts.clone()).await;
    let t = uniq();
    let mut sub = bus.subscribe(&format!("{t}.#")).await.unwrap();
    // The subscription is bound once subscribe returns; the publish is confirmed.
    bus.publish(OutMessage::new(format!("{t}.tls"), "over TLS").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut sub).await), "over TLS");

    // And it reconnects over TLS too.
    let mut events = bus.events();
    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    proxy.restore();
    wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    bus.publish(OutMessage::new(format!("{t}.tls"), "again").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut sub).await), "again");
    drop(sub);
    bus.close().await;

    // A server certificate from another CA, or for another name, is refused.
    let quick = |tls: TlsOptions| ConnectOptions {
        tls,
        connect_timeout: Duration::from_secs(2),
        ..options("amqps-bad")
    };
    let e = connect_err(
        &url,
        quick(TlsOptions {
            ca_file: Some(pki.other_ca_file.clone()),
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    let e = connect_err(
        &url,
        quick(TlsOptions {
            server_name: None,
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    // Unusable TLS settings are refused before any network access.
    let e = connect_err(
        &url,
        quick(TlsOptions {
            ca_file: Some(pki.dir.join("missing.pem")),
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disruptive_subscriptions_survive_repeated_connection_drops() {
    let t = uniq();
    let bus = connect(&broker_url(), options("repeated")).await;
    let server = connect(&broker_url(), options("repeated-server")).await;
    let mut events = bus.events();
    let mut server_events = server.events();
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    // A responder on a topic subscription; requests use the bus's reply queue.
    let mut requests = server.subscribe(&format!("{t}.svc")).await.unwrap();
    let srv = server.clone();
    let responder = tokio::spawn(async move {
        while let Some(d) = requests.next().await {
            let Some(to) = d.reply_to.clone() else {
                continue;
            };
            let mut reply = OutMessage::new(to.clone(), format!("re:{}", text(&d))).transient();
            reply.correlation_id = d.correlation_id.clone();
            let _ = srv.send_to_queue(&to, reply).await;
        }
    });
    let r = bus
        .request(OutMessage::new(format!("{t}.svc"), "r0"), WAIT)
        .await
        .unwrap();
    assert_eq!(text(&r), "re:r0");
    for round in 1..=3u64 {
        rabbitmqctl(&["close_all_connections", "gearshift amqp test"]).await;
        let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
        assert_eq!(ev, BusEvent::Connected { reconnects: round });
        wait_event(&mut server_events, |e| {
            matches!(e, BusEvent::Connected { .. })
        })
        .await;
        bus.publish(OutMessage::new(format!("{t}.cmd"), format!("r{round}")))
            .await
            .unwrap();
        let d = recv(&mut sub).await;
        assert_eq!(text(&d), format!("r{round}"));
        d.ack().await.unwrap();
        // The reply queue (same name, exclusive) and the responder's
        // subscription were restored.
        let r = bus
            .request(
                OutMessage::new(format!("{t}.svc"), format!("r{round}")),
                WAIT,
            )
            .await
            .unwrap();
        assert_eq!(text(&r), format!("re:r{round}"));
    }
    responder.abort();
    drop(sub);
    bus.close().await;
    server.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_broker_is_detected_by_heartbeats() {
    let t = uniq();
    let proxy = Proxy::start(None).await;
    let opts = ConnectOptions {
        heartbeat: Duration::from_secs(1),
        ..options("heartbeat")
    };
    let bus = connect(&url_via("amqp", proxy.addr), opts).await;
    let mut events = bus.events();
    let mut topic = bus.subscribe(&format!("{t}.#")).await.unwrap();
    proxy.freeze();
    let frozen = std::time::Instant::now();
    // lapin gives up after two heart-beat intervals without a frame.
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    println!(
        "silent broker detected after {:?}: {ev:?}",
        frozen.elapsed()
    );
    proxy.restore();
    let ev = wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    assert_eq!(ev, BusEvent::Connected { reconnects: 1 });
    bus.publish(OutMessage::new(format!("{t}.after"), "after").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut topic).await), "after");
    drop(topic);
    bus.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumers_come_back_when_an_operator_deletes_their_queue() {
    let t = uniq();
    let bus = connect(&broker_url(), options("deleted")).await;
    let spec = QueueSpec::durable(format!("gearshift.test.{t}"), vec![format!("{t}.cmd")]);
    let mut sub = bus.consume(&spec, ConsumeOptions::default()).await.unwrap();
    bus.publish(OutMessage::new(format!("{t}.cmd"), "first"))
        .await
        .unwrap();
    recv(&mut sub).await.ack().await.unwrap();

    // The broker cancels our consumer when its queue goes.
    rabbitmqctl(&["delete_queue", &spec.name]).await;
    // The queue and its binding are declared again and the consumer restarted.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if queue_names().await.contains(&spec.name) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the deleted queue was not declared again"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bus.publish(OutMessage::new(format!("{t}.cmd"), "second"))
        .await
        .unwrap();
    let d = recv(&mut sub).await;
    assert_eq!(text(&d), "second");
    d.ack().await.unwrap();
    drop(sub);
    bus.close().await;
}
