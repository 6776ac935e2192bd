//! The task that moves one lapin consumer's deliveries into its
//! subscription, acknowledging them for `subscribe`, and dropping those over
//! [`MAX_PAYLOAD`] (handed on as [`TooLarge`] deliveries); and the handle that
//! acknowledges a `consume` delivery.
//!
//! lapin assembles a message's body frames before it hands the delivery
//! over and offers no way to refuse earlier, so an oversized message is
//! dropped after it was received; what can be held at once is bounded by
//! the consumer's prefetch (every consumer has one) times the message size
//! the broker accepts. RabbitMQ's `max_message_size` refuses large messages
//! at publish time, before anyone holds them.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use lapin::message::Delivery as LapinDelivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::{BasicProperties, Consumer};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Shared;
use super::link::{Link, map_error};
use super::topology::MAX_PAYLOAD;
use crate::api::{AckHandle, AckPosition, Delivery, TooLarge};
use crate::error::BusError;

/// Moves deliveries of one lapin consumer into a subscription's channel until
/// the consumer ends (connection lost, cancelled) or the subscription is dropped.
/// Ids of consumers (see [`AckPosition::consumer`]).
static NEXT_CONSUMER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

pub(super) struct Forwarder {
    pub shared: Weak<Shared>,
    pub link: Arc<Link>,
    pub tx: mpsc::Sender<Delivery>,
    pub dropped: CancellationToken,
    /// Cancelled when this task ends.
    pub ended: CancellationToken,
    /// The application acknowledges (`consume`); otherwise this task does,
    /// once the subscription took the delivery (`subscribe`).
    pub manual_ack: bool,
    pub op_timeout: Duration,
}

impl Forwarder {
    pub async fn run(self, mut consumer: Consumer) {
        let _ended = self.ended.clone().drop_guard();
        let queue = consumer.queue().to_string();
        // One channel per consumer: its delivery tags order its deliveries.
        let consumer_id = NEXT_CONSUMER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Runs until lapin ends the stream (it does when the connection or channel
        // is lost, after the deliveries it already received).
        let ended = loop {
            let item = tokio::select! {
                _ = self.dropped.cancelled() => return,
                item = consumer.next() => item,
            };
            let d = match item {
                Some(Ok(d)) => d,
                Some(Err(e)) => break e.to_string(),
                None => break "consumer cancelled".to_string(),
            };
            if !self.forward(&queue, consumer_id, d).await {
                return;
            }
        };
        if self.dropped.is_cancelled() || self.link.check_lost() {
            return;
        }
        // The broker ended a consumer on a live connection (its queue was deleted,
        // or its channel closed): start it again, with backoff, while it is wanted.
        tracing::warn!(queue, reason = %ended, "consumer ended unexpectedly; restarting it");
        if let Some(shared) = self.shared.upgrade() {
            shared.request_repair(self.link.generation);
        }
    }

    /// Hands one delivery on; `false` once the subscription is gone.
    async fn forward(&self, queue: &str, consumer: u64, d: LapinDelivery) -> bool {
        if d.data.len() > MAX_PAYLOAD {
            return self.drop_oversized(queue, d).await;
        }
        let props = &d.properties;
        let acker: Option<Box<dyn AckHandle>> = self.manual_ack.then(|| {
            Box::new(AmqpAck {
                acker: d.acker.clone(),
                position: AckPosition {
                    consumer,
                    tag: d.delivery_tag,
                },
                op_timeout: self.op_timeout,
                endpoint: self.link.endpoint.clone(),
            }) as Box<dyn AckHandle>
        });
        let delivery = Delivery::new(
            d.routing_key.to_string(),
            Bytes::from(d.data),
            props.reply_to().as_ref().map(|s| s.to_string()),
            props.correlation_id().as_ref().map(|s| s.to_string()),
            d.redelivered,
            acker,
        );
        if !self.hand_over(delivery).await {
            return false;
        }
        if !self.manual_ack {
            // Fails only with the channel, whose loss ends this task anyway.
            let _ = d.acker.ack(BasicAckOptions::default()).await;
        }
        true
    }

    async fn hand_over(&self, delivery: Delivery) -> bool {
        tokio::select! {
            _ = self.dropped.cancelled() => false,
            r = self.tx.send(delivery) => r.is_ok(),
        }
    }

    /// Rejects an oversized message without requeue (the queue's
    /// dead-letter exchange gets it, if it has one) and hands on what is
    /// known of it.
    async fn drop_oversized(&self, queue: &str, d: LapinDelivery) -> bool {
        let size = d.data.len();
        drop(d.data);
        tracing::warn!(
            queue,
            key = %d.routing_key,
            bytes = size,
            limit = MAX_PAYLOAD,
            "message over the size limit: rejected and dropped"
        );
        let _ = d.acker.reject(BasicRejectOptions { requeue: false }).await;
        if let Some(shared) = self.shared.upgrade() {
            shared.too_large.fetch_add(1, Ordering::Relaxed);
        }
        let props = &d.properties;
        let delivery = Delivery::oversized(
            d.routing_key.to_string(),
            props.reply_to().as_ref().map(|s| s.to_string()),
            props.correlation_id().as_ref().map(|s| s.to_string()),
            d.redelivered,
            TooLarge {
                size: u64::try_from(size).unwrap_or(u64::MAX),
                limit: MAX_PAYLOAD,
                headers: property_headers(props),
            },
        );
        self.hand_over(delivery).await
    }
}

/// The AMQP properties that say who sent a message, as header pairs.
fn property_headers(p: &BasicProperties) -> Vec<(String, String)> {
    let mut h = Vec::new();
    let mut push = |name: &str, v: Option<String>| {
        if let Some(v) = v {
            h.push((name.to_string(), v));
        }
    };
    push(
        "content-type",
        p.content_type().as_ref().map(|s| s.to_string()),
    );
    push("message-id", p.message_id().as_ref().map(|s| s.to_string()));
    push("user-id", p.user_id().as_ref().map(|s| s.to_string()));
    push("app-id", p.app_id().as_ref().map(|s| s.to_string()));
    push("type", p.kind().as_ref().map(|s| s.to_string()));
    push("timestamp", p.timestamp().map(|t| t.to_string()));
    h
}

/// Acknowledges one AMQP delivery.
struct AmqpAck {
    acker: lapin::Acker,
    /// Its consumer's (channel's) id and its delivery tag.
    position: AckPosition,
    op_timeout: Duration,
    endpoint: String,
}

impl AmqpAck {
    async fn settle(
        &self,
        what: &str,
        fut: impl Future<Output = lapin::Result<bool>>,
    ) -> Result<(), BusError> {
        match tokio::time::timeout(self.op_timeout, fut).await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(BusError::Connect {
                endpoint: self.endpoint.clone(),
                reason: format!(
                    "cannot {what}: the delivery's channel or connection is gone; \
                     the broker delivers the message again"
                ),
            }),
            Ok(Err(e)) => Err(map_error(&e, &self.endpoint)),
            Err(_) => Err(BusError::Timeout {
                what: what.to_string(),
                after: self.op_timeout,
            }),
        }
    }
}

#[async_trait]
impl AckHandle for AmqpAck {
    async fn ack(&self) -> Result<(), BusError> {
        self.settle("ack", self.acker.ack(BasicAckOptions::default()))
            .await
    }

    fn position(&self) -> Option<AckPosition> {
        Some(self.position)
    }

    async fn ack_up_to(&self) -> Result<(), BusError> {
        self.settle("ack", self.acker.ack(BasicAckOptions { multiple: true }))
            .await
    }

    async fn nack(&self, requeue: bool) -> Result<(), BusError> {
        self.settle(
            "nack",
            self.acker.nack(BasicNackOptions {
                requeue,
                multiple: false,
            }),
        )
        .await
    }
}
