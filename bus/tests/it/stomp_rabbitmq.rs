//! STOMP against the real RabbitMQ STOMP plugin, beyond the conformance
//! suite: the queue properties our destinations create, keys with encoded
//! segments, refused credentials, and a virtual host without the exchange.
//! A missing broker is a failure (run scripts/setup-rabbitmq), never a skip.

use std::time::Duration;

use gearshift_bus::{BusError, ConnectOptions, ConsumeOptions, OutMessage, QueueSpec, SharedBus};

use crate::rabbit::{rabbitmqctl, stomp_url as url, uniq};

fn options() -> ConnectOptions {
    ConnectOptions {
        name: "gearshift-stomp-test".into(),
        heartbeat: Duration::from_secs(5),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(500),
        op_timeout: Duration::from_secs(20),
        connect_timeout: Duration::from_secs(10),
        ..ConnectOptions::default()
    }
}

async fn bus() -> SharedBus {
    gearshift_bus::connect(&url(), options())
        .await
        .unwrap_or_else(|e| {
            panic!("cannot reach RabbitMQ's STOMP plugin ({e}): run scripts/setup-rabbitmq")
        })
}

/// `name durable auto_delete exclusive messages consumers` of one queue.
async fn queue_row(name: &str) -> Option<Vec<String>> {
    let out = rabbitmqctl(&[
        "-q",
        "list_queues",
        "name",
        "durable",
        "auto_delete",
        "exclusive",
        "messages",
        "consumers",
    ])
    .await;
    out.lines()
        .map(|l| l.split('\t').map(str::to_string).collect::<Vec<_>>())
        .find(|cols| cols.first().map(String::as_str) == Some(name))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_queue_survives_its_consumer_and_keeps_messages() {
    let t = uniq();
    let node = format!("{t}.example.com");
    let spec = QueueSpec::node_commands(&node);
    let a = bus().await;
    let mut sub = a.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let row = queue_row(&spec.name).await.expect("queue declared");
    assert_eq!(
        row[1..4],
        ["true", "false", "false"],
        "durable, not auto-delete, not exclusive"
    );
    assert_eq!(row[5], "1", "one consumer");
    drop(sub);
    a.close().await;

    // Nobody consumes now; a command published meanwhile waits in the queue.
    let b = bus().await;
    b.publish(OutMessage::new(
        gearshift_proto::routing::command(&node),
        "wait for me",
    ))
    .await
    .unwrap();
    let row = queue_row(&spec.name)
        .await
        .expect("queue outlived its consumer's connection");
    assert_eq!(row[4], "1", "the message waits: {row:?}");
    assert_eq!(row[5], "0", "no consumer: {row:?}");

    sub = b.consume(&spec, ConsumeOptions::default()).await.unwrap();
    let d = sub
        .next_timeout(Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&d.payload[..], b"wait for me");
    // The key of an encoded node name survives RabbitMQ's destination escaping.
    assert_eq!(d.key, gearshift_proto::routing::command(&node));
    assert!(d.key.contains("%2E"), "{}", d.key);
    d.ack().await.unwrap();
    drop(sub);
    b.close().await;
    rabbitmqctl(&["-q", "delete_queue", &spec.name]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_queue_is_exclusive_to_its_connection() {
    let t = uniq();
    let bus = bus().await;
    let reply = QueueSpec {
        name: format!("gearshift.reply.{t}"),
        bindings: vec![],
        durability: gearshift_bus::Durability::Transient,
        max_length: None,
        single_active_consumer: false,
    };
    let sub = bus
        .consume(&reply, ConsumeOptions::default())
        .await
        .unwrap();
    let row = queue_row(&reply.name).await.expect("reply queue declared");
    assert_eq!(
        row[1..4],
        ["false", "false", "true"],
        "transient: exclusive to the connection"
    );
    drop(sub);
    bus.close().await;
    // Exclusive: gone with the connection.
    for _ in 0..50 {
        if queue_row(&reply.name).await.is_none() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("transient queue {} outlived its connection", reply.name);
}

#[tokio::test]
async fn refused_credentials_are_an_auth_error() {
    let e = gearshift_bus::connect("stomp://guest:wrong-password@127.0.0.1:61613", options())
        .await
        .err()
        .expect("connect must fail");
    assert!(matches!(e, BusError::Auth { .. }), "{e}");
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn a_virtual_host_without_the_exchange_fails_clearly() {
    let vhost = format!("gearshift-test-{}", uniq());
    rabbitmqctl(&["-q", "add_vhost", &vhost]).await;
    rabbitmqctl(&[
        "-q",
        "set_permissions",
        "-p",
        &vhost,
        "guest",
        ".*",
        ".*",
        ".*",
    ])
    .await;
    let r = gearshift_bus::connect(
        &format!("stomp://guest:guest@127.0.0.1:61613/{vhost}"),
        options(),
    )
    .await;
    rabbitmqctl(&["-q", "delete_vhost", &vhost]).await;
    let e = r.err().expect("connect must fail");
    assert!(matches!(e, BusError::Server(_)), "{e}");
    let text = e.to_string();
    assert!(
        text.contains("gearshift") && text.contains("does not create exchanges"),
        "{text}"
    );
}
