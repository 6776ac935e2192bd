//! Every refusal reason a node's command queue can produce, from the
//! protocol's verifying steps (section 3) and the transport's size limit
//! (section 5): each answered with `event.refused` carrying the reason (and
//! the command's id where it could be read) and counted in `refused_total`;
//! after an oversized message, a good command is acted upon and the node's
//! memory stayed bounded.

use chrono::Utc;
use gearshift_proto::msg::{Activate, Deactivate, Message};
use gearshift_proto::{Envelope, routing};
use serde_json::{Value, json};
use uuid::Uuid;

use super::{HostileNode, WAIT, eventually};

/// An envelope as JSON, for a client that edits it by hand.
fn json_of(env: &Envelope) -> Value {
    serde_json::from_slice(&env.encode()).unwrap()
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// `(reason, bytes, the id the node can read)` for every reason of the
/// verifying steps, built as a docs-only client would.
fn cases(n: &HostileNode) -> Vec<(&'static str, Vec<u8>, Option<Uuid>)> {
    let keys = &n.ctl.keys;
    let cmd = || n.ctl.command(Deactivate::default(), None);
    let mut out = Vec::new();
    out.push(("malformed", b"{\"v\":1,".to_vec(), None));
    let mut add = |reason, edit: &dyn Fn(&mut Value), sign: Option<&gearshift_proto::KeyPair>| {
        let env = cmd();
        let mut v = json_of(&env);
        edit(&mut v);
        let b = match sign {
            Some(k) => k.seal_value(&v),
            None => bytes(&v),
        };
        out.push((reason, b, Some(env.id)));
    };
    add("version", &|v| v["v"] = json!(2), None);
    add(
        "unknown_kind",
        &|v| v["kind"] = json!("cmd.self_destruct"),
        None,
    );
    add("bad_field", &|v| v["from"] = json!(""), None);
    add("unexpected_kind", &|v| v["kind"] = json!("report"), None);
    add("unsigned", &|_| {}, None);
    add(
        "malformed_signature",
        &|v| v["sig"] = json!("ed25519:nokey"),
        None,
    );
    add("unknown_key", &|_| {}, Some(&keys.rogue));
    add("wrong_role", &|_| {}, Some(&keys.client));
    add(
        "bad_body",
        &|v| v["body"] = json!(["reason"]),
        Some(&keys.broker),
    );
    // Altered after signing.
    let env = cmd();
    let mut v: Value = serde_json::from_slice(&keys.broker.seal(env.clone())).unwrap();
    v["from"] = json!("someone-else");
    out.push(("bad_signature", bytes(&v), Some(env.id)));
    let old = Utc::now() - chrono::Duration::minutes(30);
    let stale = Envelope::new_at("broker-agent", Deactivate::default(), old);
    out.push(("stale", keys.broker.seal(stale.clone()), Some(stale.id)));
    let mut expired = Envelope::new("broker-agent", Deactivate::default());
    expired.expires = Some(Utc::now() - chrono::Duration::seconds(1));
    out.push((
        "expired",
        keys.broker.seal(expired.clone()),
        Some(expired.id),
    ));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_every_refusal_reason_is_answered_and_counted() {
    let mut n = HostileNode::new("2s", true).await;
    let mut events = n.ctl.events(&n.name, &n.node_key).await;
    let mut reports = n.ctl.reports(&n.name, &n.node_key).await;
    n.proc.start();
    reports.next(WAIT).await;

    for (reason, b, id) in cases(&n) {
        n.ctl.send_raw(&n.name, b).await;
        let e = events
            .until(
                WAIT,
                &format!("event.refused {reason}"),
                |e| matches!(&e.msg, Message::Refused(r) if r.reason == reason),
            )
            .await;
        let Message::Refused(r) = e.msg else {
            unreachable!()
        };
        assert_eq!(r.cmd, id, "{reason}: {}", r.detail);
        println!("{reason:<20} {}", r.detail);
    }

    // Replayed: a command done and acknowledged, sent again as it was.
    let env = n.ctl.command(Activate::default(), None);
    let id = env.id;
    let act = n.ctl.seal(env);
    n.ctl.send_raw(&n.name, act.clone()).await;
    let done = events.outcome(id, WAIT).await;
    assert!(matches!(done.msg, Message::Done(_)), "{:?}", done.msg);
    n.ctl.send_raw(&n.name, act).await;
    let again = events.outcome(id, WAIT).await;
    assert!(
        matches!(&again.msg, Message::Refused(r) if r.reason == "replayed"),
        "{:?}",
        again.msg
    );

    for reason in [
        "malformed",
        "version",
        "unknown_kind",
        "bad_field",
        "unexpected_kind",
        "unsigned",
        "malformed_signature",
        "unknown_key",
        "wrong_role",
        "bad_body",
        "bad_signature",
        "stale",
        "expired",
        "replayed",
    ] {
        eventually(WAIT, &format!("refused_total {reason}"), || {
            n.refused(reason) >= 1.0
        })
        .await;
    }
    assert_eq!(
        n.metric("gearshift_node_active "),
        1.0,
        "no refused command acted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_oversized_messages_are_refused_then_a_good_command_is_acted_upon() {
    let mut n = HostileNode::new("2s", true).await;
    let mut events = n.ctl.events(&n.name, &n.node_key).await;
    let mut reports = n.ctl.reports(&n.name, &n.node_key).await;
    n.proc.start();
    reports.next(WAIT).await;
    let before = n.rss_kib();

    // Over the transport's 16 MiB limit (RabbitMQ takes up to its own
    // max_message_size, 128 MiB by default). gearshift's own bus refuses to
    // send them: a client of its own (pika) does.
    let big = 20 * 1024 * 1024;
    let count = 4;
    publish_with_pika(&routing::command(&n.name), big, count);
    let e = events
        .until(
            WAIT,
            "event.refused too_large",
            |e| matches!(&e.msg, Message::Refused(r) if r.reason == "too_large"),
        )
        .await;
    if let Message::Refused(r) = &e.msg {
        assert_eq!(r.cmd, None, "nothing of the envelope was read");
    }
    eventually(WAIT, "every oversized message counted", || {
        n.refused("too_large") >= count as f64
    })
    .await;
    let after = n.rss_kib();
    println!(
        "{count} messages of {} MiB: node RSS {} -> {} MiB",
        big >> 20,
        before / 1024,
        after / 1024
    );

    // The queue goes on: a good command right after is acted upon.
    let id = n.ctl.send(&n.name, Deactivate::default(), None).await;
    let done = events.outcome(id, WAIT).await;
    assert!(
        matches!(done.msg, Message::Done(_)),
        "{:?}\n{}",
        done.msg,
        n.log_tail()
    );
    // Held at most one at a time: never all of them.
    let growth_kib = after.saturating_sub(before);
    assert!(
        growth_kib < (count * big / 1024) as u64,
        "RSS grew by {growth_kib} KiB for {count} dropped messages"
    );
}

/// Publishes `count` messages of `size` bytes on `key` of the `gearshift`
/// exchange with pika, as a client that only read the protocol would.
fn publish_with_pika(key: &str, size: usize, count: usize) {
    let script = "import pika, sys\n\
        url, key, size, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])\n\
        c = pika.BlockingConnection(pika.URLParameters(url))\n\
        ch = c.channel()\n\
        for _ in range(count):\n    ch.basic_publish('gearshift', key, b' ' * size)\n\
        c.close()\n";
    let out = std::process::Command::new(gearshift_tests::python())
        .args(["-c", script, &gearshift_tests::amqp_url(), key])
        .args([size.to_string(), count.to_string()])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "pika publish failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
