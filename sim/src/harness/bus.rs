//! Bus connections of a scenario, and the removal of the durable queues a
//! run declared on a shared RabbitMQ.

use std::time::Duration;

use gearshift_bus::{BusUrl, ConnectOptions, SharedBus, StompFlavor};
use lapin::options::QueueDeleteOptions;
use thiserror::Error;

/// The bus could not be reached.
#[derive(Debug, Error)]
#[error("cannot connect to {url}: {reason}")]
pub struct ConnectError {
    /// The URL, without its password.
    pub url: String,
    /// Why.
    pub reason: String,
}

/// Connects to `url` as `name`, with the bus's default bounded waits
/// (10 s to connect, 30 s per operation, 10 s heartbeats).
pub async fn connect(url: &str, name: &str) -> Result<SharedBus, ConnectError> {
    let opts = ConnectOptions {
        name: name.to_string(),
        ..ConnectOptions::default()
    };
    gearshift_bus::connect(url, opts)
        .await
        .map_err(|e| ConnectError {
            url: gearshift_bus::url::redact(url),
            reason: e.to_string(),
        })
}

/// `n` connections (at least one), named `<name> <i>`.
pub async fn connect_many(url: &str, n: usize, name: &str) -> Result<Vec<SharedBus>, ConnectError> {
    let mut v = vec![];
    for i in 0..n.max(1) {
        v.push(connect(url, &format!("{name} {i}")).await?);
    }
    Ok(v)
}

/// Deletes `queues` from RabbitMQ over AMQP (also when the run used STOMP:
/// RabbitMQ's STOMP plugin declares ordinary queues); returns how many were
/// deleted.
pub async fn delete_queues(url: &str, queues: &[String]) -> Result<usize, String> {
    let amqp = amqp_url_of(url)?;
    let conn = lapin::Connection::connect(&amqp, lapin::ConnectionProperties::default())
        .await
        .map_err(|e| e.to_string())?;
    let ch = conn.create_channel().await.map_err(|e| e.to_string())?;
    let mut n = 0;
    for q in queues {
        match ch
            .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
            .await
        {
            Ok(_) => n += 1,
            Err(e) => tracing::debug!(queue = %q, error = %e, "queue not deleted"),
        }
    }
    let _ = ch.close(200, "done".into()).await;
    let _ = conn.close(200, "done".into()).await;
    Ok(n)
}

/// [`delete_queues`] within 10 s, logging instead of failing: for the end
/// of a run, which must not fail because its cleanup did.
pub async fn cleanup_queues(url: &str, queues: &[String]) -> usize {
    match tokio::time::timeout(Duration::from_secs(10), delete_queues(url, queues)).await {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, queues = ?queues, "cannot delete the run's durable queues");
            0
        }
        Err(_) => {
            tracing::warn!(queues = ?queues, "deleting the run's durable queues took over 10 s");
            0
        }
    }
}

/// The AMQP URL of the RabbitMQ behind `url`.
fn amqp_url_of(url: &str) -> Result<String, String> {
    match BusUrl::parse(url).map_err(|e| e.to_string())? {
        BusUrl::Amqp { url, .. } => Ok(url),
        BusUrl::Stomp {
            host,
            login,
            passcode,
            vhost,
            tls: false,
            flavor: StompFlavor::RabbitMq,
            ..
        } => Ok(format!(
            "amqp://{}:{}@{host}:5672/{}",
            enc(&login),
            enc(&passcode),
            enc(&vhost)
        )),
        BusUrl::Stomp {
            flavor: StompFlavor::ActiveMq,
            ..
        } => Err(
            "ActiveMQ cannot delete a queue over STOMP (only over JMX or OpenWire): \
                  the run's queues stay on the broker, empty of its own messages"
                .into(),
        ),
        _ => Err("not a RabbitMQ broker reachable over plain AMQP".into()),
    }
}

fn enc(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}
