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
//! ## ActiveMQ (Classic and Artemis)
//!
//! | operation | frame and destination |
//! | --- | --- |
//! | publish key `K` | `SEND /topic/gearshift.K` |
//! | publish a command `cmd.<node>` | `SEND /queue/gearshift.node.<node>` (see below) |
//! | subscribe to pattern `P` | `SUBSCRIBE /topic/gearshift.P'`, where `P'` is `P` with `#` written `>` (`*` stays `*`); `#` must be the last word |
//! | queue `Q` | `/queue/Q` (created by the broker on first use) |
//! | reply to queue `Q` | `SEND /queue/Q`, reply address `reply-to:/queue/Q` |
//!
//! ActiveMQ cannot bind a queue to topic keys without broker configuration,
//! so commands, the one durable per-node flow, bypass the topic: the key
//! `cmd.<node>` is sent straight to the node's queue `gearshift.node.<node>`.
//! A queue declaration whose bindings are anything other than the node's own
//! `cmd.<node>` is refused as invalid on ActiveMQ. Prefetch is sent both as
//! `prefetch-count` and as ActiveMQ's `activemq.prefetchSize`.

use crate::api::{Durability, QueueSpec};
use crate::error::BusError;
use crate::url::StompFlavor;

/// The topic exchange (RabbitMQ) or topic prefix (ActiveMQ).
pub const EXCHANGE: &str = gearshift_proto::routing::EXCHANGE;
/// Longest routing key or queue name (AMQP's short string).
pub const MAX_NAME: usize = 255;

const NODE_QUEUE_PREFIX: &str = "gearshift.node.";
const CMD_PREFIX: &str = "cmd.";

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

/// Validates a routing key, pattern or queue name for STOMP.
pub fn validate(what: &str, name: &str) -> Result<(), BusError> {
    check_name(what, name)
}

/// The node of a command key `cmd.<node>` (one segment).
fn command_node(key: &str) -> Option<&str> {
    key.strip_prefix(CMD_PREFIX)
        .filter(|n| !n.is_empty() && !n.contains(['.', '*', '#']))
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
        StompFlavor::ActiveMq => match command_node(key) {
            Some(node) => format!("/queue/{NODE_QUEUE_PREFIX}{node}"),
            None => format!("/topic/{EXCHANGE}.{key}"),
        },
    })
}

/// Where `subscribe(pattern)` subscribes.
pub fn subscribe(flavor: StompFlavor, pattern: &str) -> Result<String, BusError> {
    check_name("pattern", pattern)?;
    Ok(match flavor {
        StompFlavor::RabbitMq => format!("/exchange/{EXCHANGE}/{pattern}"),
        StompFlavor::ActiveMq => format!("/topic/{EXCHANGE}.{}", activemq_pattern(pattern)?),
    })
}

fn activemq_pattern(pattern: &str) -> Result<String, BusError> {
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
            w if w.contains(['#', '*', '>']) && w != "*" => {
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
    check_name("queue name", queue)?;
    Ok(match flavor {
        StompFlavor::RabbitMq => format!("/amq/queue/{queue}"),
        StompFlavor::ActiveMq => format!("/queue/{queue}"),
    })
}

/// The `reply-to` header for a reply queue.
pub fn reply_to_header(flavor: StompFlavor, queue: &str) -> String {
    match flavor {
        StompFlavor::RabbitMq => queue.to_string(),
        StompFlavor::ActiveMq => format!("/queue/{queue}"),
    }
}

/// The reply queue named by a received `reply-to` header.
pub fn parse_reply_to(header: &str) -> String {
    for prefix in ["/reply-queue/", "/amq/queue/", "/queue/"] {
        if let Some(q) = header.strip_prefix(prefix) {
            return percent_decode(q);
        }
    }
    header.to_string()
}

/// The logical key of a received MESSAGE's `destination`.
pub fn key_of(flavor: StompFlavor, destination: &str) -> String {
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
            if let Some(k) = destination
                .strip_prefix("/topic/")
                .and_then(|rest| rest.strip_prefix(EXCHANGE))
                .and_then(|rest| rest.strip_prefix('.'))
            {
                return k.to_string();
            }
            if let Some(q) = destination.strip_prefix("/queue/") {
                return match q.strip_prefix(NODE_QUEUE_PREFIX) {
                    Some(node) => format!("{CMD_PREFIX}{node}"),
                    None => q.to_string(),
                };
            }
            destination.to_string()
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
        StompFlavor::RabbitMq => {
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
                return Ok(vec![QueueSubscribe {
                    destination: format!("/queue/{}", spec.name),
                    headers: props(false),
                }]);
            }
            Ok(spec
                .bindings
                .iter()
                .map(|b| QueueSubscribe {
                    destination: format!("/exchange/{EXCHANGE}/{b}"),
                    headers: props(true),
                })
                .collect())
        }
        StompFlavor::ActiveMq => {
            if spec.max_length.is_some() {
                return Err(BusError::Invalid(format!(
                    "ActiveMQ cannot bound queue {:?} from the client; set a pending \
                     message limit in the broker's configuration instead",
                    spec.name
                )));
            }
            for b in &spec.bindings {
                let fits = command_node(b)
                    .is_some_and(|node| spec.name == format!("{NODE_QUEUE_PREFIX}{node}"));
                if !fits {
                    return Err(BusError::Invalid(format!(
                        "ActiveMQ cannot bind queue {:?} to {b:?} without broker \
                         configuration; only a node queue gearshift.node.<node> bound to \
                         cmd.<node> is supported",
                        spec.name
                    )));
                }
            }
            Ok(vec![QueueSubscribe {
                destination: format!("/queue/{}", spec.name),
                headers: vec![],
            }])
        }
    }
}

/// Prefetch headers for a consumer.
pub fn prefetch_headers(flavor: StompFlavor, prefetch: u16) -> Vec<(String, String)> {
    let n = prefetch.max(1).to_string();
    let mut h = vec![("prefetch-count".to_string(), n.clone())];
    if flavor == StompFlavor::ActiveMq {
        h.push(("activemq.prefetchSize".to_string(), n));
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use StompFlavor::{ActiveMq, RabbitMq};

    #[test]
    fn rabbitmq_mapping() {
        let key = gearshift_proto::routing::command("node-1.example.com");
        assert_eq!(
            publish(RabbitMq, &key).unwrap(),
            "/exchange/gearshift/cmd.node-1%2Eexample%2Ecom"
        );
        assert_eq!(
            subscribe(RabbitMq, "report.*.#").unwrap(),
            "/exchange/gearshift/report.*.#"
        );
        assert_eq!(
            send_to_queue(RabbitMq, "gearshift.reply.ab").unwrap(),
            "/amq/queue/gearshift.reply.ab"
        );
        assert_eq!(
            reply_to_header(RabbitMq, "gearshift.reply.ab"),
            "gearshift.reply.ab"
        );
        // What RabbitMQ writes in MESSAGE frames (observed on 3.10).
        assert_eq!(
            key_of(
                RabbitMq,
                "/exchange/gearshift/t2.report.d1.node-1%252Eex%2525am%25C3%25A9"
            ),
            "t2.report.d1.node-1%2Eex%25am%C3%A9"
        );
        assert_eq!(
            key_of(RabbitMq, "/exchange/gearshift/t2.%C3%A9.%C3%BC ok"),
            "t2.é.ü ok"
        );
        assert_eq!(
            key_of(RabbitMq, "/queue/gearshift.reply.x"),
            "gearshift.reply.x"
        );
        assert_eq!(
            parse_reply_to("/reply-queue/gearshift.reply.x"),
            "gearshift.reply.x"
        );
        assert_eq!(parse_reply_to("gearshift.reply.x"), "gearshift.reply.x");
    }

    #[test]
    fn rabbitmq_queue_declarations() {
        let spec = QueueSpec::node_commands("n1.example.com");
        let subs = queue_subscribes(RabbitMq, &spec).unwrap();
        assert_eq!(subs.len(), 1);
        assert_eq!(
            subs[0].destination,
            "/exchange/gearshift/cmd.n1%2Eexample%2Ecom"
        );
        assert_eq!(
            subs[0].headers,
            [
                ("x-queue-name", "gearshift.node.n1%2Eexample%2Ecom"),
                ("durable", "true"),
                ("auto-delete", "false"),
                ("exclusive", "false"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        let reply = QueueSpec {
            name: "gearshift.reply.abc".into(),
            bindings: vec![],
            durability: Durability::Transient,
            max_length: None,
        };
        let subs = queue_subscribes(RabbitMq, &reply).unwrap();
        assert_eq!(subs[0].destination, "/queue/gearshift.reply.abc");
        assert!(
            subs[0]
                .headers
                .contains(&("exclusive".into(), "true".into()))
        );
        assert!(
            subs[0]
                .headers
                .contains(&("durable".into(), "false".into()))
        );
    }

    #[test]
    fn a_bounded_queue_carries_its_limit() {
        let spec = QueueSpec::transient("gearshift.broker.reports.abc", vec!["report.#".into()])
            .with_max_length(500);
        let subs = queue_subscribes(RabbitMq, &spec).unwrap();
        assert_eq!(subs[0].destination, "/exchange/gearshift/report.#");
        for h in [("x-max-length", "500"), ("x-overflow", "drop-head")] {
            assert!(
                subs[0].headers.contains(&(h.0.into(), h.1.into())),
                "{:?}",
                subs[0].headers
            );
        }
        let e = queue_subscribes(ActiveMq, &QueueSpec::node_commands("n1").with_max_length(5))
            .unwrap_err();
        assert!(e.to_string().contains("cannot bound"), "{e}");
    }

    #[test]
    fn activemq_mapping() {
        let key = gearshift_proto::routing::report(Some("d1"), "n1.example.com");
        assert_eq!(
            publish(ActiveMq, &key).unwrap(),
            "/topic/gearshift.report.d1.n1%2Eexample%2Ecom"
        );
        // Commands go straight to the node's queue.
        let cmd = gearshift_proto::routing::command("n1.example.com");
        assert_eq!(
            publish(ActiveMq, &cmd).unwrap(),
            "/queue/gearshift.node.n1%2Eexample%2Ecom"
        );
        assert_eq!(
            key_of(ActiveMq, "/queue/gearshift.node.n1%2Eexample%2Ecom"),
            cmd
        );
        assert_eq!(key_of(ActiveMq, &publish(ActiveMq, &key).unwrap()), key);
        assert_eq!(
            subscribe(ActiveMq, "report.*.#").unwrap(),
            "/topic/gearshift.report.*.>"
        );
        assert_eq!(subscribe(ActiveMq, "#").unwrap(), "/topic/gearshift.>");
        assert!(matches!(
            subscribe(ActiveMq, "report.#.x"),
            Err(BusError::Invalid(_))
        ));
        assert!(matches!(
            subscribe(ActiveMq, "a.b#"),
            Err(BusError::Invalid(_))
        ));
        assert_eq!(send_to_queue(ActiveMq, "q1").unwrap(), "/queue/q1");
        assert_eq!(reply_to_header(ActiveMq, "q1"), "/queue/q1");
        assert_eq!(parse_reply_to("/queue/q1"), "q1");
    }

    #[test]
    fn activemq_queue_declarations() {
        let spec = QueueSpec::node_commands("n1");
        let subs = queue_subscribes(ActiveMq, &spec).unwrap();
        assert_eq!(
            subs,
            vec![QueueSubscribe {
                destination: "/queue/gearshift.node.n1".into(),
                headers: vec![]
            }]
        );
        let other = QueueSpec::durable("gearshift.node.n1", vec!["report.#".into()]);
        assert!(matches!(
            queue_subscribes(ActiveMq, &other),
            Err(BusError::Invalid(_))
        ));
        let wrong_node = QueueSpec::durable("gearshift.node.n1", vec!["cmd.n2".into()]);
        assert!(queue_subscribes(ActiveMq, &wrong_node).is_err());
        assert_eq!(
            prefetch_headers(ActiveMq, 0),
            vec![
                ("prefetch-count".to_string(), "1".to_string()),
                ("activemq.prefetchSize".to_string(), "1".to_string())
            ]
        );
    }

    #[test]
    fn refuses_inexpressible_names() {
        for bad in ["", "a/b", "a%2Fb", "a\nb"] {
            assert!(publish(RabbitMq, bad).is_err(), "{bad:?}");
        }
        assert!(publish(RabbitMq, &"k".repeat(256)).is_err());
        assert!(publish(RabbitMq, "a.*").is_err());
    }
}
