//! Connecting: unreachable brokers, refused credentials, what the broker
//! sees of the connection, and `amqps://` with a private CA.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_broker_is_a_clear_connect_error_within_the_timeout() {
    // A port nobody listens on.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(800),
        ..options("unreachable")
    };
    let started = std::time::Instant::now();
    let e = connect_err(&format!("amqp://guest:guest@127.0.0.1:{port}/%2f"), opts).await;
    assert!(matches!(e, BusError::Connect { .. }), "{e}");
    assert!(e.is_retryable());
    assert!(
        e.to_string().contains(&format!("127.0.0.1:{port}")),
        "the error names the endpoint: {e}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // A peer that accepts but never speaks AMQP: bounded by connect_timeout too.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = tokio::spawn(async move {
        let mut held = vec![];
        while let Ok((s, _)) = silent.accept().await {
            held.push(s);
        }
    });
    let opts = ConnectOptions {
        connect_timeout: Duration::from_millis(800),
        ..options("silent")
    };
    let started = std::time::Instant::now();
    let e = connect_err(&format!("amqp://guest:guest@{addr}/%2f"), opts).await;
    assert!(matches!(e, BusError::Connect { .. }), "{e}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    holder.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_credentials_and_unknown_vhost_are_auth_errors() {
    let mut u = url::Url::parse(&broker_url()).unwrap();
    u.set_password(Some("certainly-not-the-password")).unwrap();
    let started = std::time::Instant::now();
    let e = connect_err(u.as_str(), options("badpass")).await;
    assert!(matches!(e, BusError::Auth { .. }), "{e}");
    assert!(!e.is_retryable());
    assert!(!e.to_string().contains("certainly-not-the-password"), "{e}");
    // Refused at once, not retried until connect_timeout.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    let mut u = url::Url::parse(&broker_url()).unwrap();
    u.set_path(&format!("/{}", uniq()));
    let e = connect_err(u.as_str(), options("badvhost")).await;
    assert!(matches!(e, BusError::Auth { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_name_and_heartbeat_reach_the_broker() {
    let name = format!("gearshift-test-props-{}", uniq());
    let opts = ConnectOptions {
        name: name.clone(),
        heartbeat: Duration::from_secs(7),
        ..options("props")
    };
    let bus = connect(&broker_url(), opts).await;
    let mut found = None;
    for _ in 0..20 {
        let out = rabbitmqctl(&[
            "list_connections",
            "-q",
            "timeout",
            "client_properties",
            "--formatter",
            "json",
        ])
        .await;
        let v: serde_json::Value = serde_json::from_str(&out).expect("rabbitmqctl JSON");
        found = v.as_array().and_then(|conns| {
            conns
                .iter()
                .find(|c| c["client_properties"].to_string().contains(&name))
                .cloned()
        });
        if found.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let conn = found.expect("the broker lists our connection under its name");
    assert_eq!(conn["timeout"], 7, "{conn}");
    bus.close().await;
}

/// A private CA, a server certificate for `rabbit.test` and a client certificate.
struct Pki {
    dir: PathBuf,
    server: Arc<rustls::ServerConfig>,
    ca_file: PathBuf,
    cert_file: PathBuf,
    key_file: PathBuf,
    other_ca_file: PathBuf,
}

impl Pki {
    fn new() -> Pki {
        let dir = std::env::temp_dir().join(format!("gearshift-amqps-{}", uniq()));
        std::fs::create_dir_all(&dir).unwrap();
        let ca = |cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(vec![]).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name
                .push(rcgen::DnType::CommonName, cn.to_string());
            let cert = p.self_signed(&key).unwrap();
            (cert, rcgen::Issuer::new(p, key))
        };
        let (ca_cert, issuer) = ca("gearshift test CA");
        let (other_ca, _) = ca("someone else's CA");
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server_cert = rcgen::CertificateParams::new(vec!["rabbit.test".into()])
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let client_key = rcgen::KeyPair::generate().unwrap();
        let client_cert = rcgen::CertificateParams::new(vec!["node-1.test".into()])
            .unwrap()
            .signed_by(&client_key, &issuer)
            .unwrap();
        let write = |name: &str, data: String| {
            let p = dir.join(name);
            std::fs::write(&p, data).unwrap();
            p
        };
        let ca_file = write("ca.pem", ca_cert.pem());
        let other_ca_file = write("other-ca.pem", other_ca.pem());
        let cert_file = write("client.pem", client_cert.pem());
        let key_file = write("client.key", client_key.serialize_pem());

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca_cert.der().clone()).unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            provider.clone(),
        )
        .build()
        .unwrap();
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server_cert.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(server_key.serialize_der()).unwrap(),
            )
            .unwrap();
        Pki {
            dir,
            server: Arc::new(server),
            ca_file,
            cert_file,
            key_file,
            other_ca_file,
        }
    }

    fn client(&self) -> TlsOptions {
        TlsOptions {
            ca_file: Some(self.ca_file.clone()),
            cert_file: Some(self.cert_file.clone()),
            key_file: Some(self.key_file.clone()),
            server_name: Some("rabbit.test".into()),
        }
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqps_with_a_private_ca_a_client_certificate_and_a_server_name() {
    let pki = Pki::new();
    let proxy = Proxy::start(broker_addr(), Some(pki.server.clone())).await;
    let url = url_via("amqps", proxy.addr);
    let opts = ConnectOptions {
        tls: pki.client(),
        ..options("amqps")
    };
    let bus = connect(&url, opts.clone()).await;
    let t = uniq();
    let mut sub = bus.subscribe(&format!("{t}.#")).await.unwrap();
    // The subscription is bound once subscribe returns; the publish is confirmed.
    bus.publish(OutMessage::new(format!("{t}.tls"), "over TLS").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut sub).await), "over TLS");

    // And it reconnects over TLS too.
    let mut events = bus.events();
    proxy.cut();
    wait_event(&mut events, |e| matches!(e, BusEvent::Disconnected { .. })).await;
    proxy.restore();
    wait_event(&mut events, |e| matches!(e, BusEvent::Connected { .. })).await;
    bus.publish(OutMessage::new(format!("{t}.tls"), "again").transient())
        .await
        .unwrap();
    assert_eq!(text(&recv(&mut sub).await), "again");
    drop(sub);
    bus.close().await;

    // A server certificate from another CA, or for another name, is refused.
    let quick = |tls: TlsOptions| ConnectOptions {
        tls,
        connect_timeout: Duration::from_secs(2),
        ..options("amqps-bad")
    };
    let e = connect_err(
        &url,
        quick(TlsOptions {
            ca_file: Some(pki.other_ca_file.clone()),
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    let e = connect_err(
        &url,
        quick(TlsOptions {
            server_name: None,
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
    // Unusable TLS settings are refused before any network access.
    let e = connect_err(
        &url,
        quick(TlsOptions {
            ca_file: Some(pki.dir.join("missing.pem")),
            ..pki.client()
        }),
    )
    .await;
    assert!(matches!(e, BusError::Tls(_)), "{e}");
}
