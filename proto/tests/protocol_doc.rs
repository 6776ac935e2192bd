//! `docs/protocol.md` is the contract third parties implement: every JSON
//! example in it must be accepted by the reference decoder, and its worked
//! signature example must verify.

use gearshift_proto::msg::{Kind, Message, Role};
use gearshift_proto::sign::{Keyring, public_from_pem};
use gearshift_proto::{Envelope, KeyPair};
use serde_json::Value;

fn doc() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/protocol.md");
    std::fs::read_to_string(path).expect("docs/protocol.md exists")
}

fn blocks(doc: &str, lang: &str) -> Vec<String> {
    let fence = format!("```{lang}\n");
    let mut out = vec![];
    let mut rest = doc;
    while let Some(start) = rest.find(&fence) {
        let after = &rest[start + fence.len()..];
        let end = after.find("```").expect("closed fence");
        out.push(after[..end].to_string());
        rest = &after[end + 3..];
    }
    out
}

/// Examples elide ids, times and signatures with "…"; fill them in.
fn complete(mut v: Value) -> Value {
    let m = v.as_object_mut().expect("envelope is an object");
    if m.get("id")
        .and_then(Value::as_str)
        .is_some_and(|s| s.contains('…'))
    {
        m.insert("id".into(), Value::from(uuid::Uuid::new_v4().to_string()));
    }
    for f in ["ts", "expires"] {
        if m.get(f)
            .and_then(Value::as_str)
            .is_some_and(|s| s.contains('…'))
        {
            m.insert(f.into(), Value::from("2026-11-22T10:00:00.000Z"));
        }
    }
    m.remove("sig");
    v
}

#[test]
fn every_envelope_example_decodes() {
    let doc = doc();
    let mut kinds_seen = std::collections::BTreeSet::new();
    for block in blocks(&doc, "json") {
        let v: Value = serde_json::from_str(&block)
            .unwrap_or_else(|e| panic!("example is not JSON ({e}):\n{block}"));
        if v.get("kind").is_none() {
            continue;
        }
        let v = complete(v);
        let bytes = serde_json::to_vec(&v).unwrap();
        let d = Envelope::decode(&bytes).unwrap_or_else(|e| panic!("{e}:\n{block}"));
        kinds_seen.insert(d.envelope.kind().as_str());
    }
    for k in [
        "report",
        "cmd.deactivate",
        "event.progress",
        "decision",
        "explain",
        "placement.request",
        "placement.reply",
    ] {
        assert!(
            kinds_seen.contains(k),
            "docs/protocol.md lacks a full example of {k}"
        );
    }
}

#[test]
fn every_kind_is_documented_with_its_roles() {
    let doc = doc();
    for kind in Kind::ALL {
        assert!(
            doc.contains(&format!("`{}`", kind.as_str())),
            "{} is not documented",
            kind.as_str()
        );
    }
    // The role table must agree with the code.
    assert_eq!(Kind::Report.allowed_roles(), &[Role::Node]);
    assert!(Kind::Deactivate.allowed_roles().contains(&Role::Broker));
}

#[test]
fn inline_body_examples_decode() {
    // Bodies given inline in the tables.
    let cases = [
        (
            Kind::Evacuate,
            r#"{"moves":[{"gear":"g","target":"node-4.example.com"}],"parallelism":4,"deadline":"2026-11-22T10:30:00.000Z"}"#,
        ),
        (
            Kind::HeatSignal,
            r#"{"action":"mark_unhealthy","reason":"r"}"#,
        ),
        (
            Kind::Ack,
            r#"{"cmd":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","command":"cmd.evacuate"}"#,
        ),
        (
            Kind::Done,
            r#"{"cmd":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","command":"cmd.evacuate","result":{"type":"evacuated","moved":42,"failed":0,"results":[],"gears_left":0}}"#,
        ),
        (
            Kind::Failed,
            r#"{"cmd":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","command":"cmd.remove","error":"Heat answered 409","retryable":true,"http_status":409}"#,
        ),
        (
            Kind::Refused,
            r#"{"reason":"bad_signature","detail":"bad signature (forged or altered message)"}"#,
        ),
        (
            Kind::Pong,
            r#"{"agent":"node-3.example.com","role":"node","version":"0.1.0","started_at":"2026-11-22T10:00:00.000Z","received_at":"2026-11-22T10:00:00.000Z","ping":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","active":true}"#,
        ),
        (
            Kind::AdminRequest,
            r#"{"command":"evacuate","node":"node-3.example.com"}"#,
        ),
        (
            Kind::AdminRequest,
            r#"{"command":"do_not_disrupt","node":"n","on":true}"#,
        ),
        (Kind::AdminReply, r#"{"ok":true,"message":"m","data":{}}"#),
        (
            Kind::Done,
            r#"{"cmd":"6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9","command":"cmd.deactivate","result":{"type":"deactivated","gears":[{"id":"52a1","app":"myapp","state":"started","uid":1042,"bytes":1048576,"do_not_disrupt":false}]}}"#,
        ),
    ];
    for (kind, body) in cases {
        let v: Value = serde_json::from_str(body).unwrap();
        Message::from_parts(kind, v).unwrap_or_else(|e| panic!("{kind}: {e}"));
    }
}

#[test]
fn worked_signature_example_verifies() {
    let doc = doc();
    let text = blocks(&doc, "text")
        .into_iter()
        .find(|b| b.contains("signed envelope:"))
        .expect("worked example");
    let pem_start = text.find("-----BEGIN PUBLIC KEY-----").unwrap();
    let pem_end = text.find("-----END PUBLIC KEY-----").unwrap() + "-----END PUBLIC KEY-----".len();
    let public = public_from_pem(&text[pem_start..pem_end]).unwrap();
    let envelope_line = text
        .lines()
        .skip_while(|l| !l.starts_with("signed envelope:"))
        .nth(1)
        .unwrap();
    let signing_line = text
        .lines()
        .skip_while(|l| !l.starts_with("signing bytes:"))
        .nth(1)
        .unwrap();

    // The documented key is the one the example program derives from seed [42; 32].
    assert_eq!(KeyPair::from_seed(&[42; 32]).public(), public);
    let mut ring = Keyring::new();
    ring.add(public, Role::Broker, "doc");
    let d = Envelope::decode(envelope_line.as_bytes()).unwrap();
    assert_eq!(String::from_utf8(d.signed.clone()).unwrap(), signing_line);
    assert_eq!(ring.verify_signature(&d), Ok(Role::Broker));
    // The envelope is in canonical form: re-encoding gives the same bytes.
    assert_eq!(
        String::from_utf8(d.envelope.encode()).unwrap(),
        envelope_line
    );
}
