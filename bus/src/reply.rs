//! Request/reply on top of any [`Bus`]: one transient reply queue per bus,
//! created on first use, and a table of waiters by correlation id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OnceCell, mpsc};

use crate::api::{Bus, ConsumeOptions, Delivery, OutMessage, QueueSpec};
use crate::error::BusError;

type Waiters = Arc<Mutex<HashMap<String, mpsc::UnboundedSender<Delivery>>>>;

struct Inbox {
    queue: String,
    waiters: Waiters,
    _task: AbortOnDrop,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The request side of request/reply, shared by all transports.
#[derive(Default)]
pub struct ReplyRouter {
    inbox: OnceCell<Inbox>,
}

impl std::fmt::Debug for ReplyRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplyRouter")
            .field("queue", &self.inbox.get().map(|i| i.queue.as_str()))
            .finish()
    }
}

/// Prefix of reply queue names.
pub const REPLY_QUEUE_PREFIX: &str = "gearshift.reply.";

impl ReplyRouter {
    /// A router whose reply queue does not exist yet.
    pub fn new() -> Self {
        Self::default()
    }

    async fn inbox(&self, bus: &dyn Bus) -> Result<&Inbox, BusError> {
        self.inbox
            .get_or_try_init(|| async {
                let queue = format!("{REPLY_QUEUE_PREFIX}{}", uuid::Uuid::new_v4().simple());
                let spec = QueueSpec::transient(queue.clone(), vec![]);
                let mut sub = bus
                    .consume(&spec, ConsumeOptions { prefetch: 1024 })
                    .await?;
                let waiters: Waiters = Arc::default();
                let w = waiters.clone();
                let task = tokio::spawn(async move {
                    while let Some(mut d) = sub.next().await {
                        let corr = d.correlation_id.clone().unwrap_or_default();
                        let tx = w.lock().ok().and_then(|m| m.get(&corr).cloned());
                        if let Some(a) = d.acker.take() {
                            let _ = a.ack().await;
                        }
                        match tx {
                            Some(tx) => {
                                let _ = tx.send(d);
                            }
                            None => tracing::debug!(corr, "reply for no pending request dropped"),
                        }
                    }
                });
                Ok(Inbox {
                    queue,
                    waiters,
                    _task: AbortOnDrop(task),
                })
            })
            .await
    }

    async fn start(
        &self,
        bus: &dyn Bus,
        mut msg: OutMessage,
    ) -> Result<(String, mpsc::UnboundedReceiver<Delivery>, &Inbox), BusError> {
        let inbox = self.inbox(bus).await?;
        let corr = uuid::Uuid::new_v4().simple().to_string();
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut m) = inbox.waiters.lock() {
            m.insert(corr.clone(), tx);
        }
        msg.reply_to = Some(inbox.queue.clone());
        msg.correlation_id = Some(corr.clone());
        msg.persistent = false;
        if let Err(e) = bus.publish(msg).await {
            forget(inbox, &corr);
            return Err(e);
        }
        Ok((corr, rx, inbox))
    }

    /// Publishes `msg` with a reply address and waits for the first reply.
    pub async fn request(
        &self,
        bus: &dyn Bus,
        msg: OutMessage,
        timeout: Duration,
    ) -> Result<Delivery, BusError> {
        let (corr, mut rx, inbox) = self.start(bus, msg).await?;
        let r = tokio::time::timeout(timeout, rx.recv()).await;
        forget(inbox, &corr);
        match r {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err(BusError::Closed),
            Err(_) => Err(BusError::Timeout {
                what: "waiting for a reply".into(),
                after: timeout,
            }),
        }
    }

    /// Publishes `msg` with a reply address and gathers replies for `window`.
    pub async fn request_all(
        &self,
        bus: &dyn Bus,
        msg: OutMessage,
        window: Duration,
    ) -> Result<Vec<Delivery>, BusError> {
        let (corr, mut rx, inbox) = self.start(bus, msg).await?;
        let deadline = tokio::time::Instant::now() + window;
        let mut out = Vec::new();
        while let Ok(Some(d)) = tokio::time::timeout_at(deadline, rx.recv()).await {
            out.push(d);
            if out.len() >= 1_000_000 {
                break;
            }
        }
        forget(inbox, &corr);
        Ok(out)
    }
}

fn forget(inbox: &Inbox, corr: &str) {
    if let Ok(mut m) = inbox.waiters.lock() {
        m.remove(corr);
    }
}
