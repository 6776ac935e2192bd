//! STOMP destinations for the logical bus, per broker ([`StompFlavor`]).
//!
//! ## RabbitMQ (STOMP plugin)
//!
//! | operation | frame and destination | headers |
//! | --- | --- | --- |
//! | publish key `K` | `SEND /exchange/gearshift/K` | `persistent:true` (unless transient), `reply-to`, `correlation-id`, `receipt` |
//! | subscribe to pattern `P` | `SUBSCRIBE /exchange/gearshift/P` | `ack:client-individual`, `prefetch-count`; RabbitMQ creates an auto-delete queue bound with `P`, deleted on UNSUBSCRIBE |
//! | durable queue `Q` bound to `B` | `SUBSCRIBE /exchange/gearshift/B` | `x-queue-name:Q`, `durable:true`, `auto-delete:false`: declares `Q` (durable, not exclusive) and binds it with `B`; the queue outlives UNSUBSCRIBE and the connection and keeps messages while nobody consumes |
//! | transient queue `Q` bound to `B` | `SUBSCRIBE /exchange/gearshift/B` | `x-queue-name:Q`, `durable:false`, `exclusive:true`, `auto-delete:false`: deleted when the connection ends |
//! | queue `Q` without bindings (reply queues `gearshift.reply.<uuid>`) | `SUBSCRIBE /queue/Q` | same `durable`/`exclusive`/`auto-delete` headers |
//! | consume `Q` | the SUBSCRIBE that declares it (first binding, or `/queue/Q`), one more per further binding | `ack:client-individual`, `prefetch-count:N`; `ACK`/`NACK` with `id:<ack header>`; `NACK requeue:false` drops |
//! | reply to queue `Q` | `SEND /amq/queue/Q` | the default exchange with key `Q`, so an AMQP requester's reply queue receives it too |
//! | reply address | `reply-to:Q` (the bare queue name, as AMQP clients expect) | RabbitMQ shows it to STOMP receivers as `/reply-queue/Q` |
//!
//! A declaration without a consumer is a SUBSCRIBE immediately followed by an
//! UNSUBSCRIBE (`prefetch-count:1`). RabbitMQ refuses to settle a delivery of
//! a cancelled subscription (ERROR "Subscription not found", which ends the
//! session), so a message that slips into that brief consumer, like the
//! unsettled deliveries of any cancelled subscription, stays unacknowledged
//! until the transport recycles its connection once the cancellations are
//! confirmed; it then comes back marked redelivered.
//!
//! The `gearshift` topic exchange must exist: RabbitMQ's STOMP adapter does
//! not create exchanges (a SEND or SUBSCRIBE to a missing one is an ERROR
//! `not_found` that closes the connection). `connect` checks for it and fails
//! with a message saying so; `scripts/setup-rabbitmq` and the AMQP transport
//! declare it (topic, durable).
//!
//! In `MESSAGE` frames RabbitMQ writes the routing key percent-encoded
//! (`%` as `%25`, `/` as `%2F`, bytes outside printable ASCII as `%XX`):
//! `/exchange/gearshift/cmd.node-1%252Eexample%252Ecom` carries the key
//! `cmd.node-1%2Eexample%2Ecom`. Deliveries of a queue fed by `/amq/queue/Q`
//! carry `/queue/Q`. In SEND and SUBSCRIBE destinations RabbitMQ decodes only
//! `%2F`, so keys are written as they are, and a key containing `/` or the
//! text `%2F` cannot be expressed: it is refused as invalid.
//!
//! ## ActiveMQ Classic (virtual topics, its default configuration)
//!
//! | operation | frame and destination | headers |
//! | --- | --- | --- |
//! | publish key `K` | `SEND /topic/VirtualTopic.gearshift.K` | as on RabbitMQ |
//! | publish a command `cmd.<node>` | one `SEND /queue/gearshift.node.<node>,/topic/VirtualTopic.gearshift.cmd.<node>` (a composite destination) | as on RabbitMQ |
//! | subscribe to pattern `P` | `SUBSCRIBE /topic/VirtualTopic.gearshift.P'`, `P'` being `P` with `#` written `>` (`*` stays); `#` must be the last word | `ack:client-individual`, `activemq.prefetchSize` |
//! | durable queue `Q` bound to `B` | `SUBSCRIBE /queue/Consumer.<segment(Q)>.VirtualTopic.gearshift.B'` (one consumer queue per binding; `segment` is the routing-word encoding, so `gearshift.broker.events` is `gearshift%2Ebroker%2Eevents`) | declared by a SUBSCRIBE with `activemq.prefetchSize:0` (nothing is dispatched to it) and an UNSUBSCRIBE: the broker keeps the queue, and everything published afterwards, from then on |
//! | a node's queue `gearshift.node.<node>` bound to `cmd.<node>` | `SUBSCRIBE /queue/gearshift.node.<node>` | a plain queue: commands are sent to it directly |
//! | transient queue `Q` bound to `B` | `SUBSCRIBE /topic/VirtualTopic.gearshift.B'` | a topic subscription: it keeps nothing once cancelled, like an exclusive queue gone with its connection; [`QueueSpec::max_length`] is `activemq.maximumPendingMessageLimit` ([`PENDING_LIMIT`]: the broker drops the oldest beyond the prefetch and that many) |
//! | transient queue `Q` without bindings (reply queues) | `SUBSCRIBE /temp-queue/Q` | a temporary queue, deleted with the connection |
//! | reply address of such a queue | `reply-to:/temp-queue/Q` | responders see `/remote-temp-queue/ID:…` and send there verbatim |
//! | reply to `R` | `SEND R` when `R` starts with `/` (what ActiveMQ wrote in `reply-to`), else `SEND /queue/R` | |
//! | routing key of a MESSAGE | `original-destination` when it is one `/topic/VirtualTopic.gearshift.K`, else from `destination` | |
//!
//! Why: a virtual topic is ActiveMQ's only way, without broker
//! configuration, to keep RabbitMQ's model of one topic feeding durable
//! named queues bound with patterns and shared by competing consumers;
//! durable topic subscriptions allow one connection per `client-id` and no
//! competing consumers. The consumer queue exists from its first SUBSCRIBE:
//! messages published before that are lost, hence the declaration. Commands
//! keep a plain queue so that they wait even for a node that never started,
//! and the composite SEND keeps them visible on the topic for watchers.
//! ActiveMQ has no auto-delete queues, hence temporary queues for replies.
//!
//! What differs from RabbitMQ: a NACK never requeues on ActiveMQ (a
//! persistent message goes to `ActiveMQ.DLQ`, another is dropped), so the
//! session requeues by unsubscribing and subscribing again, which gives back
//! every unsettled delivery of that subscription; queues cannot be bounded
//! from the client ([`QueueSpec::max_length`] is refused) except a
//! transient queue with bindings, a topic subscription whose pending limit
//! the broker applies when its policy allows ([`PENDING_LIMIT`]); patterns of one
//! queue must not overlap (a wildcard consumer queue also drains the
//! plain-named queues it matches); a key cannot contain `,` (composite
//! destinations) nor `>`. Prefetch is sent both as `prefetch-count` and as
//! ActiveMQ's `activemq.prefetchSize` (the one it reads).

use crate::api::{Durability, QueueSpec};
use crate::error::BusError;
use crate::url::StompFlavor;

/// The topic exchange (RabbitMQ) or topic prefix (ActiveMQ).
pub const EXCHANGE: &str = gearshift_proto::routing::EXCHANGE;
/// Longest routing key or queue name (AMQP's short string).
pub const MAX_NAME: usize = 255;
/// What ActiveMQ's default configuration fans out to consumer queues.
pub const VIRTUAL_TOPIC: &str = "VirtualTopic.";

const NODE_QUEUE_PREFIX: &str = "gearshift.node.";
const CMD_PREFIX: &str = "cmd.";
/// Reply addresses ActiveMQ writes, used verbatim as SEND destinations.
const ACTIVEMQ_REPLY_PREFIXES: [&str; 4] =
    ["/temp-queue/", "/remote-temp-queue/", "/queue/", "/topic/"];

fn check_name(what: &str, name: &str) -> Result<(), BusError> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(BusError::Invalid(format!(
            "{what} must be 1..={MAX_NAME} bytes, got {}",
            name.len()
        )));
    }
    if name.contains('/') || name.contains("%2F") {
        return Err(BusError::Invalid(format!(
            "{what} {name:?} contains '/' or '%2F', which STOMP destinations cannot carry"
        )));
    }
    if name.chars().any(char::is_control) {
        return Err(BusError::Invalid(format!(
            "{what} {name:?} contains a control character"
        )));
    }
    Ok(())
}

/// ActiveMQ reads `,` as a list of destinations and `>` as a wildcard.
fn check_activemq_name(what: &str, name: &str) -> Result<(), BusError> {
    if name.contains([',', '>']) {
        return Err(BusError::Invalid(format!(
            "{what} {name:?} contains ',' or '>', which ActiveMQ destinations cannot carry"
        )));
    }
    Ok(())
}

/// Validates a routing key, pattern or queue name for STOMP.
pub fn validate(what: &str, name: &str) -> Result<(), BusError> {
    check_name(what, name)
}

/// Validates a reply address given to `publish` (`reply_to`): a queue name,
/// or on ActiveMQ one of the destinations it writes in `reply-to` headers.
pub fn validate_reply_to(flavor: StompFlavor, reply_to: &str) -> Result<(), BusError> {
    if flavor == StompFlavor::ActiveMq && is_activemq_address(reply_to) {
        return Ok(());
    }
    check_name("reply-to queue", reply_to)
}

fn is_activemq_address(s: &str) -> bool {
    ACTIVEMQ_REPLY_PREFIXES
        .iter()
        .any(|p| s.len() > p.len() && s.starts_with(p))
        && s.len() <= 2 * MAX_NAME
        && !s.contains(',')
        && !s.chars().any(char::is_control)
}

/// A temporary queue's destination (ours or another connection's): it goes
/// away with its connection, so a refusal of it says nothing about the bus.
pub fn is_temporary(destination: &str) -> bool {
    destination.starts_with("/temp-queue/") || destination.starts_with("/remote-temp-queue/")
}

/// The node of a command key `cmd.<node>` (one segment).
fn command_node(key: &str) -> Option<&str> {
    key.strip_prefix(CMD_PREFIX)
        .filter(|n| !n.is_empty() && !n.contains(['.', '*', '#']))
}

/// `/topic/VirtualTopic.gearshift.<rest>`.
fn virtual_topic(rest: &str) -> String {
    format!("/topic/{VIRTUAL_TOPIC}{EXCHANGE}.{rest}")
}

/// Where `publish(key)` sends.
pub fn publish(flavor: StompFlavor, key: &str) -> Result<String, BusError> {
    check_name("routing key", key)?;
    if key.contains(['*', '#']) {
        return Err(BusError::Invalid(format!(
            "routing key {key:?} contains a wildcard"
        )));
    }
    Ok(match flavor {
        StompFlavor::RabbitMq => format!("/exchange/{EXCHANGE}/{key}"),
        StompFlavor::ActiveMq => {
            check_activemq_name("routing key", key)?;
            match command_node(key) {
                Some(node) => format!("/queue/{NODE_QUEUE_PREFIX}{node},{}", virtual_topic(key)),
                None => virtual_topic(key),
            }
        }
    })
}

/// Where `subscribe(pattern)` subscribes.
pub fn subscribe(flavor: StompFlavor, pattern: &str) -> Result<String, BusError> {
    check_name("pattern", pattern)?;
    Ok(match flavor {
        StompFlavor::RabbitMq => format!("/exchange/{EXCHANGE}/{pattern}"),
        StompFlavor::ActiveMq => virtual_topic(&activemq_pattern(pattern)?),
    })
}

fn activemq_pattern(pattern: &str) -> Result<String, BusError> {
    check_activemq_name("pattern", pattern)?;
    let words: Vec<&str> = pattern.split('.').collect();
    let mut out = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        match *w {
            "#" if i + 1 == words.len() => out.push(">"),
            "#" => {
                return Err(BusError::Invalid(format!(
                    "pattern {pattern:?}: ActiveMQ supports '#' ('>') only as the last word"
                )));
            }
            w if w.contains(['#', '*']) && w != "*" => {
                return Err(BusError::Invalid(format!(
                    "pattern {pattern:?}: a wildcard must be a whole word"
                )));
            }
            w => out.push(w),
        }
    }
    Ok(out.join("."))
}

/// Where `send_to_queue(queue)` sends.
pub fn send_to_queue(flavor: StompFlavor, queue: &str) -> Result<String, BusError> {
    match flavor {
        StompFlavor::RabbitMq => {
            check_name("queue name", queue)?;
            Ok(format!("/amq/queue/{queue}"))
        }
        StompFlavor::ActiveMq if is_activemq_address(queue) => Ok(queue.to_string()),
        StompFlavor::ActiveMq => {
            check_name("queue name", queue)?;
            check_activemq_name("queue name", queue)?;
            Ok(format!("/queue/{queue}"))
        }
    }
}

/// The `reply-to` header for a reply address: `temporary` when it names a
/// transient queue of this connection without bindings (on ActiveMQ, a
/// temporary queue).
pub fn reply_to_header(flavor: StompFlavor, queue: &str, temporary: bool) -> String {
    match flavor {
        StompFlavor::RabbitMq => queue.to_string(),
        StompFlavor::ActiveMq if is_activemq_address(queue) => queue.to_string(),
        StompFlavor::ActiveMq if temporary => format!("/temp-queue/{queue}"),
        StompFlavor::ActiveMq => format!("/queue/{queue}"),
    }
}

/// The reply address named by a received `reply-to` header, as
/// [`send_to_queue`] takes it.
pub fn parse_reply_to(flavor: StompFlavor, header: &str) -> String {
    if flavor == StompFlavor::ActiveMq {
        // `/remote-temp-queue/ID:…` and the like are sent to as they are.
        return match header.strip_prefix("/queue/") {
            Some(q) => q.to_string(),
            None => header.to_string(),
        };
    }
    for prefix in ["/reply-queue/", "/amq/queue/", "/queue/"] {
        if let Some(q) = header.strip_prefix(prefix) {
            return percent_decode(q);
        }
    }
    header.to_string()
}

/// The logical key of a received MESSAGE, from its `destination` and (on
/// ActiveMQ) its `original-destination`.
pub fn key_of(flavor: StompFlavor, destination: &str, original: Option<&str>) -> String {
    match flavor {
        StompFlavor::RabbitMq => {
            if let Some(k) = destination
                .strip_prefix("/exchange/")
                .and_then(|rest| rest.strip_prefix(EXCHANGE))
                .and_then(|rest| rest.strip_prefix('/'))
            {
                return percent_decode(k);
            }
            for prefix in ["/queue/", "/amq/queue/", "/topic/"] {
                if let Some(q) = destination.strip_prefix(prefix) {
                    return percent_decode(q);
                }
            }
            destination.to_string()
        }
        StompFlavor::ActiveMq => {
            let topic_key = |d: &str| -> Option<String> {
                d.strip_prefix("/topic/")?
                    .strip_prefix(VIRTUAL_TOPIC)?
                    .strip_prefix(EXCHANGE)?
                    .strip_prefix('.')
                    .map(str::to_string)
            };
            // A consumer queue's own name holds the pattern, not the key;
            // a composite SEND lists several destinations.
            if let Some(k) = original.filter(|o| !o.contains(',')).and_then(topic_key) {
                return k;
            }
            if let Some(k) = topic_key(destination) {
                return k;
            }
            if let Some(q) = destination.strip_prefix("/queue/") {
                return match q.strip_prefix(NODE_QUEUE_PREFIX) {
                    Some(node) => format!("{CMD_PREFIX}{node}"),
                    None => q.to_string(),
                };
            }
            match destination.strip_prefix("/temp-queue/") {
                Some(q) => q.to_string(),
                None => destination.to_string(),
            }
        }
    }
}

/// Decodes `%XX` (any case); malformed sequences stay as they are.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && let Some(hex) = s.get(i + 1..i + 3)
            && let Ok(v) = u8::from_str_radix(hex, 16)
        {
            out.push(v);
            i += 3;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One SUBSCRIBE that declares (and, when kept, consumes) a named queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueSubscribe {
    /// The destination.
    pub destination: String,
    /// Extra headers (queue properties).
    pub headers: Vec<(String, String)>,
}

/// The SUBSCRIBEs that declare `spec` and bind it: one per binding (the
/// first one also serves as the consumer), or one on `/queue/<name>` when it
/// has no bindings.
pub fn queue_subscribes(
    flavor: StompFlavor,
    spec: &QueueSpec,
) -> Result<Vec<QueueSubscribe>, BusError> {
    check_name("queue name", &spec.name)?;
    for b in &spec.bindings {
        check_name("binding", b)?;
    }
    match flavor {
        // RabbitMQ's STOMP plugin ignores `x-single-active-consumer` (every
        // consumer would get deliveries): refused rather than pretended.
        StompFlavor::RabbitMq if spec.single_active_consumer => Err(BusError::Invalid(format!(
            "RabbitMQ's STOMP plugin cannot declare queue {:?} with a single active \
             consumer (it ignores x-single-active-consumer); elect over AMQP or ActiveMQ",
            spec.name
        ))),
        StompFlavor::RabbitMq => Ok(rabbitmq_subscribes(spec)),
        StompFlavor::ActiveMq => activemq_subscribes(spec),
    }
}

fn rabbitmq_subscribes(spec: &QueueSpec) -> Vec<QueueSubscribe> {
    let (durable, exclusive) = match spec.durability {
        Durability::Durable => ("true", "false"),
        Durability::Transient => ("false", "true"),
    };
    let props = |named: bool| {
        let mut h = vec![];
        if named {
            h.push(("x-queue-name".to_string(), spec.name.clone()));
        }
        h.push(("durable".to_string(), durable.to_string()));
        h.push(("auto-delete".to_string(), "false".to_string()));
        h.push(("exclusive".to_string(), exclusive.to_string()));
        if let Some(max) = spec.max_length {
            h.push(("x-max-length".to_string(), max.to_string()));
            h.push(("x-overflow".to_string(), "drop-head".to_string()));
        }
        h
    };
    if spec.bindings.is_empty() {
        return vec![QueueSubscribe {
            destination: format!("/queue/{}", spec.name),
            headers: props(false),
        }];
    }
    spec.bindings
        .iter()
        .map(|b| QueueSubscribe {
            destination: format!("/exchange/{EXCHANGE}/{b}"),
            headers: props(true),
        })
        .collect()
}

fn activemq_subscribes(spec: &QueueSpec) -> Result<Vec<QueueSubscribe>, BusError> {
    check_activemq_name("queue name", &spec.name)?;
    let topic = spec.durability == Durability::Transient && !spec.bindings.is_empty();
    let mut headers = vec![];
    match spec.max_length {
        // A topic subscription's backlog in the broker, past the prefetch.
        Some(max) if topic => headers.push((PENDING_LIMIT.to_string(), max.max(1).to_string())),
        Some(_) => {
            return Err(BusError::Invalid(format!(
                "ActiveMQ cannot bound queue {:?} from the client (only a transient \
                 queue with bindings, a topic subscription there); set a limit in the \
                 broker's configuration instead",
                spec.name
            )));
        }
        None => {}
    }
    // One consumer at a time: ActiveMQ's exclusive consumer.
    if spec.single_active_consumer {
        headers.push(("activemq.exclusive".to_string(), "true".to_string()));
    }
    let plain = |destination: String| QueueSubscribe {
        destination,
        headers: headers.clone(),
    };
    if spec.bindings.is_empty() {
        return Ok(vec![plain(match spec.durability {
            Durability::Durable => format!("/queue/{}", spec.name),
            Durability::Transient => format!("/temp-queue/{}", spec.name),
        })]);
    }
    let consumer = gearshift_proto::routing::segment(&spec.name);
    let mut out: Vec<QueueSubscribe> = Vec::with_capacity(spec.bindings.len());
    for b in &spec.bindings {
        let node_queue =
            command_node(b).is_some_and(|node| spec.name == format!("{NODE_QUEUE_PREFIX}{node}"));
        let destination = if node_queue {
            format!("/queue/{}", spec.name)
        } else {
            let pattern = activemq_pattern(b)?;
            match spec.durability {
                Durability::Transient => virtual_topic(&pattern),
                Durability::Durable => {
                    format!("/queue/Consumer.{consumer}.{VIRTUAL_TOPIC}{EXCHANGE}.{pattern}")
                }
            }
        };
        if !out.iter().any(|q| q.destination == destination) {
            out.push(plain(destination));
        }
    }
    Ok(out)
}

/// ActiveMQ's bound on what it holds for a slow topic subscriber beyond the
/// prefetch (the oldest are dropped). It counts only when the broker's
/// `policyEntry` for the topic has a `pendingMessageLimitStrategy` (the
/// smaller of the two applies; with `limit="-1"` the subscriber's alone):
/// `scripts/setup-activemq` writes one, Debian's stock configuration has
/// none, and then the backlog is unbounded as for any topic subscriber.
pub const PENDING_LIMIT: &str = "activemq.maximumPendingMessageLimit";

/// Prefetch headers for a consumer.
pub fn prefetch_headers(flavor: StompFlavor, prefetch: u16) -> Vec<(String, String)> {
    let n = prefetch.max(1).to_string();
    let mut h = vec![("prefetch-count".to_string(), n.clone())];
    if flavor == StompFlavor::ActiveMq {
        h.push(("activemq.prefetchSize".to_string(), n));
    }
    h
}

/// Prefetch headers of a declaration's brief subscription: ActiveMQ
/// dispatches nothing to a STOMP consumer with `activemq.prefetchSize:0`
/// (measured), so no message slips into it.
pub fn declare_prefetch_headers(flavor: StompFlavor) -> Vec<(String, String)> {
    match flavor {
        StompFlavor::RabbitMq => prefetch_headers(flavor, 1),
        StompFlavor::ActiveMq => vec![("activemq.prefetchSize".to_string(), "0".to_string())],
    }
}

#[cfg(test)]
mod tests;
