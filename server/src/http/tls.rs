//! TLS: the public listener's certificate (`http.tls_cert_file` and
//! `http.tls_key_file`), swapped on SIGHUP, and the roots the
//! relay-to-relay client trusts (webpki's, plus `http.tls_extra_roots`).
//!
//! rustls asks the [`Certificate`] resolver once per handshake, so a reload
//! changes what new connections see and leaves open ones as they are: no
//! connection is dropped. A file that does not load keeps the certificate in
//! use (and says why in an ERROR line).

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificate chain of a PEM file (leaf first), at least one.
fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let chain = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("{shown}: {e}"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{shown}: {e}"))?;
    if chain.is_empty() {
        return Err(format!("{shown}: no PEM certificate in it"));
    }
    Ok(chain)
}

/// The certificate chain and private key in PEM files, checked to belong
/// together (a key for another certificate fails every handshake).
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, String> {
    let chain = read_chain(cert)?;
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| match e {
        pem::Error::NoItemsFound => format!("{}: no PEM private key in it", key.display()),
        e => format!("{}: {e}", key.display()),
    })?;
    CertifiedKey::from_der(chain, der, &provider()).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            format!("{} is not the private key of the certificate in {}", key.display(), cert.display())
        }
        e => format!("{} with {}: {e}", cert.display(), key.display()),
    })
}

/// The listener's certificate, replaced whole by [`Certificate::reload`].
#[derive(Debug)]
pub struct Certificate {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: RwLock<Arc<CertifiedKey>>,
}

impl Certificate {
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, String> {
        let current = RwLock::new(Arc::new(load_certified_key(cert_file, key_file)?));
        Ok(Certificate { cert_file: cert_file.into(), key_file: key_file.into(), current })
    }

    /// Reads both files again; on success new handshakes use them, on
    /// failure nothing changes.
    pub fn reload(&self) -> Result<(), String> {
        let fresh = Arc::new(load_certified_key(&self.cert_file, &self.key_file)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The server side of rustls, resolving every handshake through `cert`.
    pub fn server_config(cert: Arc<Certificate>) -> Result<ServerConfig, String> {
        Ok(ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_no_client_auth()
            .with_cert_resolver(cert))
    }
}

/// Handles SIGHUP for as long as the process runs: reloads `cert` if the
/// listener has one, else logs that there is nothing to reload (instead of
/// the default action, which ends the process).
pub async fn on_sighup(cert: Option<Arc<Certificate>>) {
    use actix_web::rt::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(s) => s,
        Err(e) => return tracing::error!(error = %e, "cannot listen for SIGHUP: the certificate is not reloaded"),
    };
    while hup.recv().await.is_some() {
        let Some(cert) = &cert else {
            tracing::info!("SIGHUP: no TLS certificate to reload (http.tls_cert_file is not set)");
            continue;
        };
        match cert.reload() {
            Ok(()) => tracing::info!(cert = %cert.cert_file.display(), "TLS certificate reloaded"),
            Err(e) => tracing::error!(error = %e, "TLS certificate reload failed: the previous one stays in use"),
        }
    }
}

impl ResolvesServerCert for Certificate {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// The relay-to-relay client's TLS: webpki's roots and the certificates in
/// `extra_roots` (a private CA); HTTP/1.1, which is what relays speak.
pub fn client_config(extra_roots: Option<&Path>) -> Result<ClientConfig, String> {
    let mut roots: RootCertStore = actix_tls::connect::rustls_0_23::webpki_roots_cert_store();
    if let Some(path) = extra_roots {
        for cert in read_chain(path)? {
            roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
