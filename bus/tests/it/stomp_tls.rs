//! `stomp+ssl://` end to end against an in-process STOMP broker behind
//! tokio-rustls, with a private CA and a server certificate made here.

use crate::stomp_support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use gearshift_bus::{BusError, ConnectOptions, OutMessage, TlsOptions};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use stomp_support::FakeBroker;

struct Pki {
    dir: PathBuf,
    ca_file: PathBuf,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ca() -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "gearshift test CA");
    CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
}

/// A CA, a server certificate for `broker.test` signed by it, the CA's PEM
/// file, and a TLS acceptor presenting the server certificate.
fn pki() -> Pki {
    let ca = ca();
    let server_key = KeyPair::generate().unwrap();
    let server_cert = CertificateParams::new(vec!["broker.test".to_string()])
        .unwrap()
        .signed_by(&server_key, &ca)
        .unwrap();
    let dir = std::env::temp_dir().join(format!("gs-stomp-tls-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let chain = vec![
        server_cert.der().clone(),
        CertificateDer::from(ca.der().to_vec()),
    ];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    Pki {
        dir,
        ca_file,
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    }
}

fn options(tls: TlsOptions) -> ConnectOptions {
    ConnectOptions {
        name: "tls-test".into(),
        tls,
        heartbeat: Duration::from_secs(5),
        op_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        ..ConnectOptions::default()
    }
}

#[tokio::test]
async fn publish_and_subscribe_over_tls_with_a_private_ca() {
    let pki = pki();
    let broker = FakeBroker::start("0,0", Some(pki.acceptor.clone())).await;
    let tls = TlsOptions {
        ca_file: Some(pki.ca_file.clone()),
        // The URL names 127.0.0.1; the certificate names broker.test.
        server_name: Some("broker.test".into()),
        ..TlsOptions::default()
    };
    let bus = gearshift_bus::connect(&broker.url("stomp+ssl"), options(tls))
        .await
        .expect("TLS connection with the private CA");
    let mut sub = bus.subscribe("tls.report.x").await.unwrap();
    bus.publish(OutMessage::new("tls.report.x", "over tls"))
        .await
        .unwrap();
    let d = sub
        .next_timeout(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("delivery");
    assert_eq!(&d.payload[..], b"over tls");
    assert_eq!(d.key, "tls.report.x");
    bus.close().await;
    // The broker saw our frames in the clear only inside TLS: it decoded them.
    let frames = broker.state.frames.lock().unwrap();
    assert!(frames.iter().any(|(_, f)| f.get("destination")
        == Some("/exchange/gearshift/tls.report.x")
        && f.command == gearshift_bus::stomp::frame::Command::Send));
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let pki = pki();
    let broker = FakeBroker::start("0,0", Some(pki.acceptor.clone())).await;
    let other = ca();
    let other_file = pki.dir.join("other-ca.pem");
    std::fs::write(&other_file, other.pem()).unwrap();
    let tls = TlsOptions {
        ca_file: Some(other_file),
        server_name: Some("broker.test".into()),
        ..TlsOptions::default()
    };
    let e = gearshift_bus::connect(&broker.url("stomp+ssl"), options(tls))
        .await
        .err()
        .expect("connect must fail");
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    assert!(!e.is_retryable());

    // The right CA but the wrong name.
    let tls = TlsOptions {
        ca_file: Some(pki.ca_file.clone()),
        server_name: Some("other.test".into()),
        ..TlsOptions::default()
    };
    let e = gearshift_bus::connect(&broker.url("stomp+ssl"), options(tls))
        .await
        .err()
        .expect("connect must fail");
    assert!(matches!(e, BusError::Tls(_)), "{e}");
}

#[tokio::test]
async fn a_missing_ca_file_fails_before_any_connection() {
    // Nothing listens on port 1: a connection attempt would be a Connect error.
    let tls = TlsOptions {
        ca_file: Some(PathBuf::from("/nonexistent/gearshift-ca.pem")),
        ..TlsOptions::default()
    };
    let e = gearshift_bus::connect("stomp+ssl://guest:guest@127.0.0.1:1", options(tls))
        .await
        .err()
        .expect("connect must fail");
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    assert!(
        e.to_string().contains("/nonexistent/gearshift-ca.pem"),
        "{e}"
    );
}
