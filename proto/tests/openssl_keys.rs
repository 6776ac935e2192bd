//! Keys and signatures round-tripped with the `openssl` command line, as a
//! third-party client following `docs/protocol.md` section 3 would do it:
//! a key written by gearshift is read by OpenSSL 3, a key written by
//! `openssl genpkey -algorithm ed25519` is read by gearshift, and a
//! signature made by either verifies with the other.
//!
//! OpenSSL is part of every machine this runs on (Debian's `openssl`); a
//! missing binary fails the test with a message saying so.

use std::path::Path;
use std::process::Command;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use gearshift_proto::msg::{Deactivate, Role};
use gearshift_proto::sign::{KeyPair, Keyring, key_id, public_from_pem};
use gearshift_proto::{Envelope, TimePolicy};

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("the openssl command line is needed (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn path(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

#[test]
fn gearshift_keys_and_signatures_work_with_openssl() {
    let dir = tempfile::tempdir().unwrap();
    let key = KeyPair::generate().unwrap();
    let key_file = dir.path().join("gearshift.key");
    std::fs::write(&key_file, key.to_pem()).unwrap();

    // OpenSSL reads the private key and derives the same public key.
    let public = openssl(&["pkey", "-in", path(&key_file), "-pubout"]);
    let public = public_from_pem(std::str::from_utf8(&public).unwrap()).unwrap();
    assert_eq!(key_id(&public), key.id());

    // A message signed by gearshift verifies with OpenSSL.
    let mut env = Envelope::new("broker.example.com", Deactivate::default());
    key.sign(&mut env);
    let sig = env.sig.clone().unwrap();
    let raw = B64.decode(sig.rsplit(':').next().unwrap()).unwrap();
    let (msg_file, sig_file, pub_file) = (
        dir.path().join("msg"),
        dir.path().join("sig"),
        dir.path().join("pub.pem"),
    );
    std::fs::write(&msg_file, env.signing_bytes()).unwrap();
    std::fs::write(&sig_file, raw).unwrap();
    std::fs::write(&pub_file, key.public_pem()).unwrap();
    let verified = openssl(&[
        "pkeyutl",
        "-verify",
        "-pubin",
        "-inkey",
        path(&pub_file),
        "-rawin",
        "-in",
        path(&msg_file),
        "-sigfile",
        path(&sig_file),
    ]);
    assert!(String::from_utf8_lossy(&verified).contains("Signature Verified Successfully"));
}

#[test]
fn openssl_keys_and_signatures_work_with_gearshift() {
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("openssl.key");
    openssl(&["genpkey", "-algorithm", "ed25519", "-out", path(&key_file)]);
    let pem = std::fs::read_to_string(&key_file).unwrap();
    let key = KeyPair::from_pem(&pem).expect("gearshift reads OpenSSL's key");
    // gearshift writes the key back byte for byte as OpenSSL wrote it (v1).
    assert_eq!(key.to_pem(), pem);

    // A message signed by OpenSSL verifies with gearshift's keyring.
    let env = Envelope::new("broker.example.com", Deactivate::default());
    let msg_file = dir.path().join("msg");
    std::fs::write(&msg_file, env.signing_bytes()).unwrap();
    let raw = openssl(&[
        "pkeyutl",
        "-sign",
        "-inkey",
        path(&key_file),
        "-rawin",
        "-in",
        path(&msg_file),
    ]);
    assert_eq!(raw.len(), 64);
    let mut signed = env.clone();
    signed.sig = Some(format!("ed25519:{}:{}", key.id(), B64.encode(raw)));
    let decoded = Envelope::decode(&signed.encode()).unwrap();
    let mut ring = Keyring::new();
    ring.add(key.public(), Role::Broker, "openssl");
    assert_eq!(ring.verify_signature(&decoded), Ok(Role::Broker));
    let now = chrono::Utc::now();
    assert!(TimePolicy::default().check(&decoded.envelope, now).is_ok());
}
