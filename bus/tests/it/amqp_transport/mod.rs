//! AMQP-specific behaviour against the real RabbitMQ on this machine
//! (`GEARSHIFT_TEST_AMQP_URL`, default `amqp://guest:guest@127.0.0.1:5672/%2f`):
//! connection errors, waiting through an outage, close, dropped
//! subscriptions, reconnecting while publishing, client properties and
//! heart-beat, and `amqps://` through an in-process TLS proxy with a private CA.
//!
//! Outages are made by an in-process TCP proxy between the bus and RabbitMQ
//! (`crate::proxy`), so that only this test's connections are cut. Tests whose name contains
//! `disruptive` make the broker drop every connection.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gearshift_bus::{
    BusError, BusEvent, ConnectOptions, ConsumeOptions, Durability, OutMessage, QueueSpec,
    SharedBus, Subscription, TlsOptions,
};
use tokio::net::TcpListener;
use tokio::sync::broadcast;

mod connection;
mod outage;

use crate::proxy::Proxy;
use crate::rabbit::{amqp_url as broker_url, rabbitmqctl, uniq};

const WAIT: Duration = Duration::from_secs(10);

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

async fn queue_names() -> BTreeSet<String> {
    let out = rabbitmqctl(&["list_queues", "-q", "name", "--formatter", "json"]).await;
    let v: serde_json::Value = serde_json::from_str(&out).expect("rabbitmqctl JSON");
    v.as_array()
        .expect("array of queues")
        .iter()
        .filter_map(|q| q["name"].as_str().map(String::from))
        .collect()
}
