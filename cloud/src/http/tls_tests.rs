//! The HTTP client over TLS: a private CA trusted through `cacert`, the
//! certificate checked, and ring as the one crypto provider.

use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::*;

/// The PEM of a new CA, and a TLS acceptor presenting a certificate for
/// `localhost` signed by it.
fn private_ca() -> (String, tokio_rustls::TlsAcceptor) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    (ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// An HTTPS server answering every request `{"ok":true}`; its URL.
async fn serve(acceptor: tokio_rustls::TlsAcceptor) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                // A refused handshake (the client distrusts us) ends here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let body = r#"{"ok":true}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    format!("https://localhost:{port}/v3")
}

#[tokio::test]
async fn https_with_a_private_ca_and_ring_as_the_provider() {
    let (ca_pem, acceptor) = private_ca();
    let url = serve(acceptor).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();

    let trusting = HttpClient::new(&HttpOptions {
        cacert: Some(ca_file),
        ..HttpOptions::default()
    })
    .unwrap();
    let r = trusting
        .send(Service::Identity, Method::GET, &url, &[], None)
        .await
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json::<Value>(Service::Identity, &url).unwrap()["ok"],
        true
    );

    // The client installed ring: the provider every TLS client here shares.
    let provider = rustls::crypto::CryptoProvider::get_default().expect("a provider installed");
    let names = |p: &rustls::crypto::CryptoProvider| -> Vec<String> {
        p.cipher_suites
            .iter()
            .map(|s| format!("{:?}", s.suite()))
            .collect()
    };
    assert_eq!(
        names(provider),
        names(&rustls::crypto::ring::default_provider())
    );

    // Without the CA the server's certificate is refused.
    let e = HttpClient::new(&HttpOptions::default())
        .unwrap()
        .send(Service::Identity, Method::GET, &url, &[], None)
        .await
        .unwrap_err();
    assert!(
        format!("{e}").contains("certificate") || format!("{e:?}").contains("UnknownIssuer"),
        "{e:?}"
    );
}
