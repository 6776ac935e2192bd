//! Prints the signed example of `docs/protocol.md` ("Verifying a signature"):
//! a fixed key pair, one signed envelope, and the exact bytes the signature covers.
//!
//! `cargo run -p gearshift-proto --example protocol_examples`

use chrono::{DateTime, Utc};
use gearshift_proto::msg::Deactivate;
use gearshift_proto::{Envelope, KeyPair};

fn main() {
    let key = KeyPair::from_seed(&[42; 32]);
    let ts: DateTime<Utc> = "2026-11-22T10:00:00.000Z".parse().expect("fixed timestamp");
    let mut env = Envelope::new_at(
        "broker.example.com",
        Deactivate {
            reason: "scale-down: least busy node in district".into(),
            epoch: 0,
        },
        ts,
    )
    .with_corr("op-3f1c9a2e")
    .with_ttl(std::time::Duration::from_secs(300));
    env.id = "6f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9"
        .parse()
        .expect("fixed id");
    println!(
        "--- public key (SubjectPublicKeyInfo PEM), key id {}\n{}",
        key.id(),
        key.public_pem()
    );
    println!(
        "--- signing bytes\n{}",
        String::from_utf8_lossy(&env.signing_bytes())
    );
    key.sign(&mut env);
    println!(
        "--- signed envelope\n{}",
        String::from_utf8_lossy(&env.encode())
    );
}
