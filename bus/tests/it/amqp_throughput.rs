//! Rough publish throughput over AMQP against the local RabbitMQ: one task
//! publishing one confirmed message at a time (a broker round trip each)
//! against many tasks publishing at once (confirms pipelined on one channel).
//! Prints figures, asserts no timing. Ignored by default:
//!
//! ```text
//! cargo test -p gearshift-bus --release --test it amqp_throughput -- --ignored --nocapture
//! ```

use std::time::{Duration, Instant};

use gearshift_bus::{ConnectOptions, OutMessage, QueueSpec};

use crate::rabbit::amqp_url as broker_url;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints publish rates, run with --ignored --nocapture"]
async fn publish_throughput() {
    let opts = ConnectOptions {
        name: "gearshift-bench-publish".into(),
        ..ConnectOptions::default()
    };
    let bus = gearshift_bus::connect(&broker_url(), opts)
        .await
        .expect("local RabbitMQ (run scripts/setup-rabbitmq)");
    let t = format!("bench{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    // Messages are routed to a queue, so the broker confirms them only once
    // that queue took them; it is exclusive to this connection and goes at close.
    let spec = QueueSpec {
        name: format!("gearshift.bench.{t}"),
        bindings: vec![format!("{t}.#")],
        durability: gearshift_bus::Durability::Transient,
        max_length: None,
        single_active_consumer: false,
    };
    bus.declare_queue(&spec).await.unwrap();
    let payload = vec![b'x'; 512];

    let n_seq = 2_000;
    let started = Instant::now();
    for i in 0..n_seq {
        bus.publish(OutMessage::new(format!("{t}.seq.{}", i % 16), payload.clone()).transient())
            .await
            .unwrap();
    }
    let seq = started.elapsed();

    for (tasks, persistent) in [(64, false), (64, true), (256, false)] {
        let n = 20_000;
        let per = n / tasks;
        let started = Instant::now();
        let mut handles = vec![];
        for w in 0..tasks {
            let bus = bus.clone();
            let t = t.clone();
            let payload = payload.clone();
            handles.push(tokio::spawn(async move {
                for i in 0..per {
                    let mut m = OutMessage::new(format!("{t}.par.{w}.{}", i % 4), payload.clone());
                    m.persistent = persistent;
                    bus.publish(m).await.unwrap();
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let par = started.elapsed();
        println!(
            "{tasks} tasks, {} messages of 512 B ({}): {:.0} msgs/s",
            per * tasks,
            if persistent {
                "persistent"
            } else {
                "transient"
            },
            (per * tasks) as f64 / par.as_secs_f64()
        );
    }
    println!(
        "1 task, {n_seq} messages of 512 B, one confirm at a time: {:.0} msgs/s ({:?} per publish)",
        n_seq as f64 / seq.as_secs_f64(),
        seq / n_seq
    );
    tokio::time::timeout(Duration::from_secs(10), bus.close())
        .await
        .unwrap();
}
