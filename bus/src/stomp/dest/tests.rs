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
        reply_to_header(RabbitMq, "gearshift.reply.ab", true),
        "gearshift.reply.ab"
    );
    // What RabbitMQ writes in MESSAGE frames (observed on 3.10).
    assert_eq!(
        key_of(
            RabbitMq,
            "/exchange/gearshift/t2.report.d1.node-1%252Eex%2525am%25C3%25A9",
            None
        ),
        "t2.report.d1.node-1%2Eex%25am%C3%A9"
    );
    assert_eq!(
        key_of(RabbitMq, "/exchange/gearshift/t2.%C3%A9.%C3%BC ok", None),
        "t2.é.ü ok"
    );
    assert_eq!(
        key_of(RabbitMq, "/queue/gearshift.reply.x", None),
        "gearshift.reply.x"
    );
    assert_eq!(
        parse_reply_to(RabbitMq, "/reply-queue/gearshift.reply.x"),
        "gearshift.reply.x"
    );
    assert_eq!(
        parse_reply_to(RabbitMq, "gearshift.reply.x"),
        "gearshift.reply.x"
    );
    assert!(send_to_queue(RabbitMq, "/remote-temp-queue/ID:x").is_err());
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
        single_active_consumer: false,
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
    assert_eq!(
        declare_prefetch_headers(RabbitMq),
        vec![("prefetch-count".to_string(), "1".to_string())]
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
    // ActiveMQ: a topic subscription with a pending limit; a queue of the
    // broker's own cannot be bounded from the client.
    let subs = queue_subscribes(ActiveMq, &spec).unwrap();
    assert_eq!(
        subs,
        vec![QueueSubscribe {
            destination: "/topic/VirtualTopic.gearshift.report.>".into(),
            headers: vec![(PENDING_LIMIT.into(), "500".into())],
        }]
    );
    for refused in [
        QueueSpec::node_commands("n1").with_max_length(5),
        QueueSpec::durable("gearshift.broker.events", vec!["event.#".into()]).with_max_length(5),
        QueueSpec::transient("gearshift.reply.abc", vec![]).with_max_length(5),
    ] {
        let e = queue_subscribes(ActiveMq, &refused).unwrap_err();
        assert!(e.to_string().contains("cannot bound"), "{e}");
    }
}

#[test]
fn activemq_mapping() {
    let key = gearshift_proto::routing::report(Some("d1"), "n1.example.com");
    assert_eq!(
        publish(ActiveMq, &key).unwrap(),
        "/topic/VirtualTopic.gearshift.report.d1.n1%2Eexample%2Ecom"
    );
    // Commands go to the node's queue and, in the same SEND, to the topic.
    let cmd = gearshift_proto::routing::command("n1.example.com");
    assert_eq!(
        publish(ActiveMq, &cmd).unwrap(),
        "/queue/gearshift.node.n1%2Eexample%2Ecom,\
         /topic/VirtualTopic.gearshift.cmd.n1%2Eexample%2Ecom"
    );
    assert_eq!(
        key_of(ActiveMq, "/queue/gearshift.node.n1%2Eexample%2Ecom", None),
        cmd
    );
    // What ActiveMQ writes for a composite SEND (measured).
    assert_eq!(
        key_of(
            ActiveMq,
            "/queue/gearshift.node.n1%2Eexample%2Ecom",
            Some(
                "/queue/gearshift.node.n1%2Eexample%2Ecom,topic://VirtualTopic.gearshift.cmd.n1%2Eexample%2Ecom"
            )
        ),
        cmd
    );
    assert_eq!(
        key_of(ActiveMq, &publish(ActiveMq, &key).unwrap(), None),
        key
    );
    // A consumer queue's MESSAGE names the queue; the key is the original.
    assert_eq!(
        key_of(
            ActiveMq,
            "/queue/Consumer.gearshift%2Ebroker%2Eevents.VirtualTopic.gearshift.event.>",
            Some("/topic/VirtualTopic.gearshift.event.n1%2Eexample%2Ecom")
        ),
        "event.n1%2Eexample%2Ecom"
    );
    assert_eq!(
        subscribe(ActiveMq, "report.*.#").unwrap(),
        "/topic/VirtualTopic.gearshift.report.*.>"
    );
    assert_eq!(
        subscribe(ActiveMq, "#").unwrap(),
        "/topic/VirtualTopic.gearshift.>"
    );
    assert!(matches!(
        subscribe(ActiveMq, "report.#.x"),
        Err(BusError::Invalid(_))
    ));
    assert!(matches!(
        subscribe(ActiveMq, "a.b#"),
        Err(BusError::Invalid(_))
    ));
    for bad in ["a,b", "a.>"] {
        assert!(publish(ActiveMq, bad).is_err(), "{bad}");
        assert!(subscribe(ActiveMq, bad).is_err(), "{bad}");
    }
}

#[test]
fn activemq_replies_use_temporary_queues_and_verbatim_addresses() {
    assert_eq!(send_to_queue(ActiveMq, "q1").unwrap(), "/queue/q1");
    assert_eq!(reply_to_header(ActiveMq, "q1", false), "/queue/q1");
    assert_eq!(
        reply_to_header(ActiveMq, "gearshift.reply.ab", true),
        "/temp-queue/gearshift.reply.ab"
    );
    assert_eq!(parse_reply_to(ActiveMq, "/queue/q1"), "q1");
    // What a responder sees for a requester's temporary queue (measured).
    let remote = "/remote-temp-queue/ID:vm-33005-1795613052951-3:63:1";
    assert_eq!(parse_reply_to(ActiveMq, remote), remote);
    assert_eq!(send_to_queue(ActiveMq, remote).unwrap(), remote);
    assert_eq!(reply_to_header(ActiveMq, remote, false), remote);
    assert!(validate_reply_to(ActiveMq, remote).is_ok());
    assert!(validate_reply_to(RabbitMq, remote).is_err());
    assert!(send_to_queue(ActiveMq, "/temp-queue/").is_err());
    assert!(is_temporary(remote) && is_temporary("/temp-queue/x"));
    assert!(!is_temporary("/queue/x"));
    assert!(send_to_queue(ActiveMq, "/queue/a,/queue/b").is_err());
    assert_eq!(
        key_of(ActiveMq, "/temp-queue/gearshift.reply.ab", None),
        "gearshift.reply.ab"
    );
}

#[test]
fn activemq_queue_declarations() {
    let plain = |d: &str| QueueSubscribe {
        destination: d.into(),
        headers: vec![],
    };
    let spec = QueueSpec::node_commands("n1");
    assert_eq!(
        queue_subscribes(ActiveMq, &spec).unwrap(),
        vec![plain("/queue/gearshift.node.n1")]
    );
    // The broker agent's queues: one consumer queue per binding.
    let events = QueueSpec::durable("gearshift.broker.events", vec!["event.#".into()]);
    assert_eq!(
        queue_subscribes(ActiveMq, &events).unwrap(),
        vec![plain(
            "/queue/Consumer.gearshift%2Ebroker%2Eevents.VirtualTopic.gearshift.event.>"
        )]
    );
    let two = QueueSpec::durable(
        "gearshift.node.n1",
        vec!["cmd.n1".into(), "report.*.n1".into(), "cmd.n1".into()],
    );
    assert_eq!(
        queue_subscribes(ActiveMq, &two).unwrap(),
        vec![
            plain("/queue/gearshift.node.n1"),
            plain("/queue/Consumer.gearshift%2Enode%2En1.VirtualTopic.gearshift.report.*.n1"),
        ]
    );
    // Another node's commands are an ordinary binding.
    let other = QueueSpec::durable("gearshift.node.n1", vec!["cmd.n2".into()]);
    assert_eq!(
        queue_subscribes(ActiveMq, &other).unwrap(),
        vec![plain(
            "/queue/Consumer.gearshift%2Enode%2En1.VirtualTopic.gearshift.cmd.n2"
        )]
    );
    let transient = QueueSpec::transient("gearshift.broker.reports.x", vec!["report.#".into()]);
    assert_eq!(
        queue_subscribes(ActiveMq, &transient).unwrap(),
        vec![plain("/topic/VirtualTopic.gearshift.report.>")]
    );
    let reply = QueueSpec::transient("gearshift.reply.ab", vec![]);
    assert_eq!(
        queue_subscribes(ActiveMq, &reply).unwrap(),
        vec![plain("/temp-queue/gearshift.reply.ab")]
    );
    let bad = QueueSpec::durable("q", vec!["a.#.b".into()]);
    assert!(matches!(
        queue_subscribes(ActiveMq, &bad),
        Err(BusError::Invalid(_))
    ));
    assert_eq!(
        prefetch_headers(ActiveMq, 0),
        vec![
            ("prefetch-count".to_string(), "1".to_string()),
            ("activemq.prefetchSize".to_string(), "1".to_string())
        ]
    );
    assert_eq!(
        declare_prefetch_headers(ActiveMq),
        vec![("activemq.prefetchSize".to_string(), "0".to_string())]
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
