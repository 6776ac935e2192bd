//! The exec, spool and email handlers, with real processes, a real
//! directory and a real SMTP server (aiosmtpd, started by the test).

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gearshift_handlers::config::{EmailConfig, ExecConfig, HandlerConfig, SpoolConfig};
use gearshift_handlers::email::EmailHandler;
use gearshift_handlers::exec::ExecHandler;
use gearshift_handlers::spool::{SCHEMA, SpoolEvent, SpoolHandler};
use gearshift_handlers::{
    CreateRequest, GroupKey, Handler, HandlerContext, Lookup, NodeShape, RemoveRequest, build,
};

fn group() -> GroupKey {
    GroupKey {
        district: "d-7f3".into(),
        profile: "medium".into(),
    }
}

fn create(op: &str) -> CreateRequest {
    CreateRequest {
        op: op.into(),
        group: group(),
        shape: NodeShape {
            flavor: Some("m1.medium".into()),
            image: Some("node-image".into()),
            volume_gb: Some(40),
            ..NodeShape::default()
        },
        attempt: 2,
        epoch: 0,
    }
}

fn remove(op: &str) -> RemoveRequest {
    RemoveRequest {
        op: op.into(),
        group: group(),
        node: "node-4.example.com".into(),
        cloud_id: Some("srv-44".into()),
        attempt: 1,
        epoch: 0,
    }
}

fn script(dir: &Path, body: &str) {
    let p = dir.join("event");
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn exec_handler(dir: &Path, timeout: Duration) -> ExecHandler {
    let mut c: ExecConfig =
        toml::from_str(&format!("dir = {:?}\n", dir.to_str().unwrap())).unwrap();
    c.timeout = timeout;
    c.env.insert("SITE".into(), "lab".into());
    ExecHandler::new(c, &HandlerContext::standalone("broker-a"))
}

#[tokio::test]
async fn exec_runs_the_seed_contract_with_env() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("calls.log");
    script(
        dir.path(),
        &format!(
            "echo \"$@|$GEARSHIFT_EVENT|$GEARSHIFT_OP|$GEARSHIFT_DISTRICT|$GEARSHIFT_PROFILE|$GEARSHIFT_ATTEMPT|$GEARSHIFT_FLAVOR|$GEARSHIFT_NODE|$GEARSHIFT_CLOUD_ID|$SITE|$(pwd)\" >> {log:?}\n\
             echo '{{\"node\": \"node-9.example.com\", \"cloud_id\": \"srv-9\"}}'"
        ),
    );
    let h = exec_handler(dir.path(), Duration::from_secs(10));
    let out = h.create_node(&create("op-1")).await.unwrap();
    assert_eq!(out.node.as_deref(), Some("node-9.example.com"));
    assert_eq!(out.cloud_id.as_deref(), Some("srv-9"));
    h.remove_node(&remove("op-2")).await.unwrap();
    let calls = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<&str> = calls.lines().collect();
    let cwd = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(
        lines[0],
        format!(
            "create-node --profile=medium --district=d-7f3|create-node|op-1|d-7f3|medium|2|m1.medium|||lab|{}",
            cwd.display()
        )
    );
    assert_eq!(
        lines[1],
        format!(
            "remove-node --host=node-4.example.com --district=d-7f3|remove-node|op-2|d-7f3|medium|1||node-4.example.com|srv-44|lab|{}",
            cwd.display()
        )
    );
}

#[tokio::test]
async fn exec_exit_codes_map_to_error_classes() {
    let dir = tempfile::tempdir().unwrap();
    let h = exec_handler(dir.path(), Duration::from_secs(10));
    for (code, label) in [
        (3, "quota"),
        (4, "busy"),
        (75, "transient"),
        (1, "permanent"),
        (127, "permanent"),
    ] {
        script(
            dir.path(),
            &format!("echo 'nova: Quota exceeded' >&2\nexit {code}"),
        );
        let err = h.create_node(&create("op")).await.unwrap_err();
        assert_eq!(err.label(), label, "exit {code}: {err}");
        assert!(err.to_string().contains(&format!("exited {code}")), "{err}");
        assert!(
            err.to_string().contains("Quota exceeded"),
            "stderr is reported: {err}"
        );
    }
    std::fs::remove_file(dir.path().join("event")).unwrap();
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert_eq!(err.label(), "permanent", "{err}");
}

#[tokio::test]
async fn exec_timeout_kills_the_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("survived");
    // The script's child would write the marker after 2 s if not killed with the group.
    script(
        dir.path(),
        &format!("(sleep 2; touch {marker:?}) &\nsleep 30"),
    );
    let h = exec_handler(dir.path(), Duration::from_millis(300));
    let started = std::time::Instant::now();
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert_eq!(err.label(), "transient", "{err}");
    assert!(err.to_string().contains("timed out"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(!marker.exists(), "the script's child outlived the timeout");
}

#[tokio::test]
async fn exec_output_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    script(
        dir.path(),
        "head -c 3000000 /dev/zero | tr '\\0' x >&2\nexit 1",
    );
    let mut c: ExecConfig = toml::from_str(&format!(
        "dir = {:?}\nmax_output = 4096\n",
        dir.path().to_str().unwrap()
    ))
    .unwrap();
    c.timeout = Duration::from_secs(20);
    let h = ExecHandler::new(c, &HandlerContext::standalone("b"));
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert!(err.to_string().len() < 2000, "error text is bounded");
    assert!(err.to_string().contains("more bytes not kept"), "{err}");
}

#[tokio::test]
async fn spool_writes_one_atomic_file_per_operation() {
    let dir = tempfile::tempdir().unwrap();
    let spool = dir.path().join("spool");
    let cfg = HandlerConfig::Spool(SpoolConfig { dir: spool.clone() });
    let h = build("spool", &cfg, &HandlerContext::standalone("broker-a")).unwrap();
    assert_eq!(h.kind(), "spool");
    assert_eq!(h.lookup("op-1", &group()).await.unwrap(), Lookup::NotFound);
    let out = h.create_node(&create("op-1")).await.unwrap();
    assert!(out.detail.starts_with("spooled"), "{}", out.detail);
    let file = spool.join("create-node-op-1.json");
    let ev: SpoolEvent = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    assert_eq!(ev.schema, SCHEMA);
    assert_eq!(
        (
            ev.event.as_str(),
            ev.op.as_str(),
            ev.district.as_str(),
            ev.profile.as_str()
        ),
        ("create-node", "op-1", "d-7f3", "medium")
    );
    assert_eq!(ev.shape.as_ref().unwrap().volume_gb, Some(40));
    assert_eq!((ev.attempt, ev.requested_by.as_str()), (2, "broker-a"));
    chrono::DateTime::parse_from_rfc3339(&ev.requested_at).unwrap();
    let before = std::fs::read(&file).unwrap();
    // Idempotent: a retry of the same operation leaves the file as it was.
    let again = h
        .create_node(&CreateRequest {
            attempt: 3,
            ..create("op-1")
        })
        .await
        .unwrap();
    assert!(
        again.detail.starts_with("already spooled"),
        "{}",
        again.detail
    );
    assert_eq!(std::fs::read(&file).unwrap(), before);
    assert!(matches!(
        h.lookup("op-1", &group()).await.unwrap(),
        Lookup::Found(_)
    ));
    h.remove_node(&remove("op-2")).await.unwrap();
    let rm: serde_json::Value =
        serde_json::from_slice(&std::fs::read(spool.join("remove-node-op-2.json")).unwrap())
            .unwrap();
    assert_eq!(rm["node"], "node-4.example.com");
    assert_eq!(rm["cloud_id"], "srv-44");
    assert_eq!(rm["shape"], serde_json::Value::Null);
    let names: Vec<String> = std::fs::read_dir(&spool)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "no temporary files left: {names:?}");
    // A hostile operation id cannot escape the directory.
    h.create_node(&create("../../x")).await.unwrap();
    assert!(spool.join("create-node-_.._x.json").exists());
}

#[tokio::test]
async fn spool_into_an_unwritable_place_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let h = SpoolHandler::new(
        SpoolConfig {
            dir: file.join("spool"),
        },
        &HandlerContext::standalone("b"),
    );
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert!(!err.is_quota(), "{err}");
    assert!(err.to_string().contains("spool"), "{err}");
}

/// A real SMTP server (aiosmtpd's Debugging handler prints each message).
struct Smtp {
    child: std::process::Child,
    port: u16,
    out: Arc<Mutex<String>>,
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Smtp {
    fn start(extra: &[&str]) -> Smtp {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = std::process::Command::new(gearshift_tests::python())
            .args([
                "-u",
                "-m",
                "aiosmtpd",
                "-n",
                "-l",
                &format!("127.0.0.1:{port}"),
            ])
            .args(extra)
            .stdout(std::process::Stdio::piped())
            // The untrusted-certificate case makes aiosmtpd log a traceback.
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start aiosmtpd (run scripts/test-deps)");
        let stdout = child.stdout.take().unwrap();
        let out = Arc::new(Mutex::new(String::new()));
        let o = out.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let mut g = o.lock().unwrap();
                g.push_str(&line);
                g.push('\n');
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "aiosmtpd did not start listening"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Smtp { child, port, out }
    }

    async fn wait_messages(&self, n: usize) -> String {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.out.lock().unwrap().clone();
            if s.matches("END MESSAGE").count() >= n {
                // Unfold headers and undo quoted-printable soft breaks.
                return s.replace("\n ", " ").replace("=\n", "").replace("=3D", "=");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "aiosmtpd printed only:\n{s}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn email_config(port: u16) -> EmailConfig {
    toml::from_str(&format!(
        "smtp_host = \"127.0.0.1\"\nsmtp_port = {port}\nfrom = \"gearshift <gearshift@paas.example.com>\"\nto = [\"ops@example.com\", \"oncall@example.com\"]\ntimeout = \"10s\"\n"
    ))
    .unwrap()
}

#[tokio::test]
async fn email_sends_a_readable_message_per_event() {
    let smtp = Smtp::start(&[]);
    let h = EmailHandler::new(
        email_config(smtp.port),
        &HandlerContext::standalone("broker-a"),
    )
    .unwrap();
    h.create_node(&create("op-mail-1")).await.unwrap();
    h.remove_node(&remove("op-mail-2")).await.unwrap();
    let out = smtp.wait_messages(2).await;
    assert!(out.contains("Subject: [gearshift] create-node: one more medium node for district d-7f3 (op op-mail-1)"), "{out}");
    assert!(
        out.contains("To: ops@example.com, oncall@example.com"),
        "{out}"
    );
    assert!(
        out.contains("create-node --profile=medium --district=d-7f3"),
        "{out}"
    );
    assert!(out.contains("flavor:             m1.medium"), "{out}");
    assert!(out.contains("volume:             40 GiB"), "{out}");
    assert!(
        out.contains(
            "Subject: [gearshift] remove-node: node-4.example.com (district d-7f3, op op-mail-2)"
        ),
        "{out}"
    );
    assert!(
        out.contains("remove-node --host=node-4.example.com --district=d-7f3"),
        "{out}"
    );
}

#[tokio::test]
async fn email_with_starttls_against_a_server_with_our_ca() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    // A self-signed certificate for 127.0.0.1, made with the venv's cryptography.
    let make_cert = format!(
        r#"
import datetime, ipaddress
from cryptography import x509
from cryptography.x509.oid import NameOID
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
k = ec.generate_private_key(ec.SECP256R1())
n = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
now = datetime.datetime.now(datetime.timezone.utc)
c = (x509.CertificateBuilder().subject_name(n).issuer_name(n).public_key(k.public_key())
     .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
     .not_valid_after(now + datetime.timedelta(days=1))
     .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
     .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
     .sign(k, hashes.SHA256()))
open({cert:?}, "wb").write(c.public_bytes(serialization.Encoding.PEM))
open({key:?}, "wb").write(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
"#,
        cert = cert.to_str().unwrap(),
        key = key.to_str().unwrap()
    );
    let st = std::process::Command::new(gearshift_tests::python())
        .args(["-c", &make_cert])
        .status()
        .unwrap();
    assert!(st.success(), "certificate generation failed");
    let smtp = Smtp::start(&[
        "--tlscert",
        cert.to_str().unwrap(),
        "--tlskey",
        key.to_str().unwrap(),
    ]);
    let mut cfg = email_config(smtp.port);
    cfg.security = gearshift_handlers::config::SmtpSecurity::Starttls;
    cfg.ca_file = Some(cert.clone());
    let h = EmailHandler::new(cfg.clone(), &HandlerContext::standalone("broker-a")).unwrap();
    h.create_node(&create("op-tls")).await.unwrap();
    let out = smtp.wait_messages(1).await;
    assert!(out.contains("op-tls"), "{out}");

    // Without our CA the server's certificate is not trusted: no message, a permanent or transient error.
    cfg.ca_file = None;
    let h = EmailHandler::new(cfg, &HandlerContext::standalone("broker-a")).unwrap();
    let err = h.create_node(&create("op-untrusted")).await.unwrap_err();
    assert!(!err.is_quota(), "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!smtp.out.lock().unwrap().contains("op-untrusted"));
}

#[tokio::test]
async fn email_to_a_closed_port_is_transient() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let h = EmailHandler::new(email_config(port), &HandlerContext::standalone("b")).unwrap();
    let err = h.create_node(&create("op")).await.unwrap_err();
    assert_eq!(err.label(), "transient", "{err}");
}
