//! A test CA made at test time (rcgen), the loopback certificates it
//! issues, and clients that trust it (and only it besides webpki's roots,
//! through the relay's own [`relay::http::tls::client_config`]).

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// The CA certificate (PEM), for `http.tls_extra_roots`.
    pub pem: PathBuf,
}

/// A certificate for 127.0.0.1 and localhost, written to PEM files.
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The leaf certificate, as a TLS client sees it.
    pub der: Vec<u8>,
}

impl Issued {
    /// The `[http]` lines that make a relay serve this certificate.
    pub fn http_lines(&self) -> String {
        format!(
            "tls_cert_file = {:?}\ntls_key_file = {:?}\n",
            self.cert.display().to_string(),
            self.key.display().to_string()
        )
    }

    /// Writes this certificate and key over `to`'s files (for a reload).
    pub fn copy_to(&self, to: &Issued) {
        std::fs::copy(&self.cert, &to.cert).unwrap();
        std::fs::copy(&self.key, &to.key).unwrap();
    }
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/{name}.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = dir.join(format!("{name}.pem"));
        std::fs::write(&pem, issuer.pem()).unwrap();
        TestCa { issuer, pem }
    }

    /// Issues `dir/{name}.crt` and `dir/{name}.key` for 127.0.0.1 and localhost.
    pub fn issue(&self, dir: &Path, name: &str) -> Issued {
        let key = KeyPair::generate().unwrap();
        let params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let issued = Issued {
            cert: dir.join(format!("{name}.crt")),
            key: dir.join(format!("{name}.key")),
            der: cert.der().to_vec(),
        };
        std::fs::write(&issued.cert, cert.pem()).unwrap();
        std::fs::write(&issued.key, key.serialize_pem()).unwrap();
        issued
    }

    /// A rustls client config that trusts this CA.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        Arc::new(relay::http::tls::client_config(Some(&self.pem)).unwrap())
    }

    /// An HTTP client that trusts this CA.
    pub fn http(&self) -> awc::Client {
        self.client(None)
    }

    /// Like [`TestCa::http`], connecting from loopback address `source`
    /// (127.0.0.2, …: Linux routes all of 127/8 to lo), so that a server
    /// sees clients at distinct addresses.
    pub fn http_from(&self, source: std::net::IpAddr) -> awc::Client {
        self.client(Some(source))
    }

    fn client(&self, source: Option<std::net::IpAddr>) -> awc::Client {
        let mut builder = awc::Client::builder().timeout(std::time::Duration::from_secs(30));
        if let Some(source) = source {
            builder = builder.local_address(source);
        }
        builder.connector(awc::Connector::new().rustls_0_23(self.client_config())).finish()
    }
}
