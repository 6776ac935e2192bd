//! TLS client configuration for `stomp+ssl://` (and any transport that wants
//! it): a private CA from a PEM file or the system's roots, an optional
//! client certificate, and a server-name override. Everything is loaded and
//! checked before any connection is attempted; errors are [`BusError::Tls`]
//! and name the file at fault.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};

use crate::TlsOptions;
use crate::error::BusError;

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, BusError> {
    let bytes = std::fs::read(path)
        .map_err(|e| BusError::Tls(format!("cannot read {what} {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BusError::Tls(format!("{what} {} is not valid PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(BusError::Tls(format!(
            "{what} {} contains no certificate",
            path.display()
        )));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, BusError> {
    let bytes = std::fs::read(path).map_err(|e| {
        BusError::Tls(format!(
            "cannot read client key file {}: {e}",
            path.display()
        ))
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| {
        BusError::Tls(format!(
            "client key file {} holds no usable private key: {e}",
            path.display()
        ))
    })
}

/// The root certificates: the CA file when given, else the system's.
fn roots(opts: &TlsOptions) -> Result<RootCertStore, BusError> {
    let mut store = RootCertStore::empty();
    match &opts.ca_file {
        Some(path) => {
            for cert in read_certs(path, "CA file")? {
                store.add(cert).map_err(|e| {
                    BusError::Tls(format!(
                        "CA file {}: unusable certificate: {e}",
                        path.display()
                    ))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            for cert in found.certs {
                // Some system stores carry certificates rustls rejects; skip them.
                let _ = store.add(cert);
            }
            if store.is_empty() {
                return Err(BusError::Tls(
                    "no CA file configured and no system root certificates found".into(),
                ));
            }
        }
    }
    Ok(store)
}

/// Builds the rustls client configuration for `opts`.
pub fn client_config(opts: &TlsOptions) -> Result<Arc<ClientConfig>, BusError> {
    match (&opts.cert_file, &opts.key_file) {
        (Some(cert), None) => {
            return Err(BusError::Tls(format!(
                "client certificate {} given without a key file",
                cert.display()
            )));
        }
        (None, Some(key)) => {
            return Err(BusError::Tls(format!(
                "client key {} given without a certificate file",
                key.display()
            )));
        }
        _ => {}
    }
    let roots = roots(opts)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| BusError::Tls(format!("TLS protocol versions: {e}")))?
        .with_root_certificates(roots);
    let config = match (&opts.cert_file, &opts.key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "client certificate file")?;
            let key_der = read_key(key)?;
            builder.with_client_auth_cert(chain, key_der).map_err(|e| {
                BusError::Tls(format!(
                    "client certificate {} and key {} do not work together: {e}",
                    cert.display(),
                    key.display()
                ))
            })?
        }
        // A lone certificate or key was refused above.
        _ => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

/// The name the server certificate must carry: the override, else the URL's host.
pub fn server_name(host: &str, opts: &TlsOptions) -> Result<ServerName<'static>, BusError> {
    let name = opts.server_name.as_deref().unwrap_or(host);
    ServerName::try_from(name.to_string())
        .map_err(|e| BusError::Tls(format!("{name:?} is not a valid TLS server name: {e}")))
}

/// Whether an I/O error of a TLS handshake is a certificate or TLS protocol
/// problem (not retryable: a configuration error) rather than a network one.
pub fn is_tls_failure(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn missing_and_bad_files_are_named() {
        let opts = TlsOptions {
            ca_file: Some(PathBuf::from("/nonexistent/ca.pem")),
            ..TlsOptions::default()
        };
        let e = client_config(&opts).unwrap_err();
        assert!(matches!(e, BusError::Tls(_)));
        assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");

        let dir = std::env::temp_dir().join(format!("gs-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = client_config(&TlsOptions {
            ca_file: Some(empty.clone()),
            ..TlsOptions::default()
        })
        .unwrap_err();
        assert!(e.to_string().contains("empty.pem"), "{e}");
        assert!(e.to_string().contains("no certificate"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn cert_without_key_is_refused() {
        let opts = TlsOptions {
            cert_file: Some(PathBuf::from("/x/cert.pem")),
            ..TlsOptions::default()
        };
        let e = client_config(&opts).unwrap_err();
        assert!(e.to_string().contains("/x/cert.pem"), "{e}");
        assert!(e.to_string().contains("without a key"), "{e}");
        assert!(server_name("broker.example.com", &TlsOptions::default()).is_ok());
        assert!(server_name("bad name!", &TlsOptions::default()).is_err());
    }
}
