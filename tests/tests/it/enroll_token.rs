//! Enrollment without a human, on the real binaries over RabbitMQ: a token
//! minted by `gearshift-broker enroll-token` with the operator's key; a real
//! `gearshift-node` holding only that token (no key of its own) makes its
//! key, enrolls it, and its reports are then taken (the node appears in the
//! broker's status; its key is `nodes.d/<host>.pub`). A second host reusing
//! the one-use token is refused (`token_used_up`), an expired token too
//! (`token_expired`), a token signed by an untrusted key (`bad_token`); each
//! is counted in `gearshift_broker_enrollments_total{result}`.

use std::process::Command;
use std::time::Duration;

use gearshift_broker::cli::{self, OperatorKeys};
use gearshift_bus::OutMessage;
use gearshift_proto::enroll::mint_token;
use gearshift_proto::msg::{EnrollReply, EnrollRequest, EnrollToken, Kind, Message};
use gearshift_proto::{Envelope, Expect, Gate, KeyPair, TimePolicy};
use gearshift_sim::harness::metrics::{free_port, scrape};
use gearshift_tests::amqp_url;
use gearshift_tests::broker_harness::{TestBed, WAIT, fast_config};
use gearshift_tests::broker_process::{BrokerProcess, broker_binary, write_config};
use gearshift_tests::node_process::{NodeProcess, write_file};

/// `gearshift-broker enroll-token` with the operator key: the token it prints.
fn cli_token(key: &std::path::Path, uses: &str) -> String {
    let out = Command::new(broker_binary())
        .args(["enroll-token", "--district", "d1", "--profile", "small"])
        .args(["--uses", uses, "--ttl", "1h", "--from", "alice", "--key"])
        .arg(key)
        .output()
        .expect("run gearshift-broker enroll-token");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A `gearshift-node` configuration with a token and no key file.
fn node_config(base: &std::path::Path, host: &str, token: &str, admin_key: &str, broker_pub: &str) {
    std::fs::create_dir_all(base.join("gears")).unwrap();
    write_file(
        base,
        "node.toml",
        &format!(
            r#"
[node]
name = "{host}"
[bus]
url = "{url}"
[keys]
signing_key = "{base}/keys/node.key"
broker_keys = ["{broker_pub}"]
[state]
dir = "{base}/state"
[report]
interval = "1s"
scan_interval = "200ms"
min_gap = "50ms"
[runtime]
kind = "dir"
[runtime.facts]
profile = "small"
max_active_gears = 10
district_uuid = "d1"
district_first_uid = 1000
district_max_uid = 6999
[runtime.dir]
root = "{base}/gears"
target_root = "{base}/elsewhere/{{target}}"
[enroll]
token = "{token}"
request_key = "{admin_key}"
retry_max = "2s"
"#,
            url = amqp_url(),
            base = base.display(),
        ),
    );
}

/// Sends one `enroll.request` for `host` with a fresh key; the checked reply.
async fn ask(bed: &TestBed, admin_key: &str, host: &str, token: &str) -> EnrollReply {
    let bus = bed.connect(host).await;
    let key = KeyPair::generate().unwrap();
    let body = EnrollRequest {
        public_key: key.public_pem(),
        token: token.into(),
        district: Some("d1".into()),
        profile: Some("small".into()),
    };
    let env = Envelope::new(host, body).with_ttl(Duration::from_secs(30));
    let msg = OutMessage::new(admin_key, key.seal(env)).transient();
    let d = bus
        .request(msg, Duration::from_secs(10))
        .await
        .expect("an answer");
    let a = Gate::new(&bed.keys.broker_only(), TimePolicy::default())
        .admit(
            &d.payload,
            Expect::kinds(|k| k == Kind::EnrollReply),
            chrono::Utc::now(),
        )
        .expect("signed by the broker agent");
    let _ = bus.close().await;
    match a.envelope.msg {
        Message::EnrollReply(r) => r,
        other => panic!("{}", other.kind()),
    }
}

#[tokio::test]
async fn a_node_with_only_a_token_enrolls_and_tokens_are_bounded() {
    let bed = TestBed::new("enroll", |_| amqp_url()).await;
    let port = free_port().unwrap();
    let mut cfg = fast_config(&bed.url, &bed.path("state"), "log", &bed.tag);
    bed.keys.configure_broker(&mut cfg);
    cfg.metrics.listen = Some(([127, 0, 0, 1], port).into());
    let admin_key = cfg.agent.admin_key.clone();
    let config = bed.path("broker.toml");
    write_config(&cfg, &config);
    let broker = BrokerProcess::start(&config, &bed.path("broker.log"));

    let token = cli_token(&bed.keys.path("operator.key"), "1");
    let host = format!("{}-a.example.com", bed.tag);
    let base = bed.path("node-a");
    let broker_pub = bed.keys.path("broker.pub");
    node_config(
        &base,
        &host,
        &token,
        &admin_key,
        &broker_pub.display().to_string(),
    );
    assert!(!base.join("keys/node.key").exists());
    let mut node = NodeProcess::new(base.join("node.toml"), bed.path("node-a.log"));
    node.start();

    // The node made its key, enrolled it, and its reports are taken.
    let op = OperatorKeys {
        signer: bed.keys.operator.clone(),
        brokers: bed.keys.broker_only(),
    };
    let op_bus = bed.connect("operator").await;
    let deadline = tokio::time::Instant::now() + WAIT * 2;
    loop {
        let s = cli::status(&op_bus, &op, "op", &admin_key, Duration::from_secs(5)).await;
        if s.as_ref()
            .is_ok_and(|s| s.nodes.iter().any(|n| n.node == host))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{host} never appeared in the status\nnode:\n{}\nbroker:\n{}",
            node.log_tail(),
            std::fs::read_to_string(bed.path("broker.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    use std::os::unix::fs::PermissionsExt;
    let key_file = base.join("keys/node.key");
    let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let made = gearshift_service::keys::load_keypair(&key_file).unwrap();
    let enrolled =
        std::fs::read_to_string(bed.keys.nodes_dir().join(format!("{host}.pub"))).unwrap();
    assert_eq!(
        enrolled,
        made.public_pem(),
        "nodes.d/<host>.pub holds the node's new key"
    );
    assert!(base.join("state/enrolled.json").exists());

    // A second host with the same one-use token: refused.
    let r = ask(
        &bed,
        &admin_key,
        &format!("{}-b.example.com", bed.tag),
        &token,
    )
    .await;
    assert_eq!((r.ok, r.reason.as_str()), (false, "token_used_up"), "{r:?}");
    // An expired token.
    let now = chrono::Utc::now();
    let grant = EnrollToken {
        district: "d1".into(),
        profile: "small".into(),
        max_uses: 5,
        host: None,
    };
    let hour = chrono::Duration::hours(1);
    let expired = mint_token(
        &bed.keys.operator,
        "alice",
        grant.clone(),
        now - hour * 2,
        hour,
    );
    let r = ask(
        &bed,
        &admin_key,
        &format!("{}-c.example.com", bed.tag),
        &expired,
    )
    .await;
    assert_eq!((r.ok, r.reason.as_str()), (false, "token_expired"), "{r:?}");
    // A token minted by a key the broker does not trust.
    let rogue = mint_token(&KeyPair::generate().unwrap(), "mallory", grant, now, hour);
    let r = ask(
        &bed,
        &admin_key,
        &format!("{}-d.example.com", bed.tag),
        &rogue,
    )
    .await;
    assert_eq!((r.ok, r.reason.as_str()), (false, "bad_token"), "{r:?}");
    assert!(
        !bed.keys
            .nodes_dir()
            .join(format!("{}-b.example.com.pub", bed.tag))
            .exists()
    );

    let m = scrape(port).await.unwrap();
    let count = |r: &str| {
        m.get(&format!(
            "gearshift_broker_enrollments_total{{result=\"{r}\"}}"
        ))
    };
    assert_eq!(count("enrolled"), 1.0, "{:?}", m.samples);
    assert_eq!(count("token_used_up"), 1.0);
    assert_eq!(count("token_expired"), 1.0);
    assert_eq!(count("bad_token"), 1.0);

    // A restart of the node does not enroll again (its marker names its key).
    node.terminate(Duration::from_secs(10));
    node.start();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = std::fs::read_to_string(bed.path("node-a.log")).unwrap();
    // One enrollment (the broker's answer logged once), none after the
    // restart: the marker names the key.
    assert_eq!(
        log.matches("reports signed by this key are taken").count(),
        1,
        "{log}"
    );
    assert!(log.contains("key already enrolled"), "{log}");
    node.terminate(Duration::from_secs(10));
    broker.terminate();
    let _ = op_bus.close().await;
}
