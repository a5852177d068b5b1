//! The hop inside a cluster: a node's front to a shard's owner, and one
//! shard's core to a sibling's. With `cluster.secret_file` set, every such
//! connection is TLS 1.3 in which both ends prove they hold the cluster's
//! key, derived from that secret (the same file on every node, like
//! `relay.key_file`): someone who reaches an internal address but does not
//! hold the secret gets no request answered, sees nothing passing and
//! cannot pose as an owner to a front.
//!
//! The key is a P-256 key presented as a raw public key (RFC 7250), not in
//! a certificate: there is exactly one key to trust, so there is no CA,
//! no name to check and nothing to expire; each end accepts exactly the
//! key the secret gives. What is derived from the secret, and how, is
//! fixed (`KEY_CONTEXT`): nodes of one cluster agree on the key whatever
//! version they run.

use std::fmt;
use std::sync::Arc;

use crate::config::MIN_CLUSTER_SECRET;
use p256::pkcs8::{EncodePrivateKey, EncodePublicKey};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls13_signature_with_raw_key, WebPkiSupportedAlgorithms};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime,
};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, DistinguishedName, Error, ServerConfig, SignatureScheme,
};

/// The header that makes a relay call a sibling shard's, unsigned: taken
/// only on a connection whose client proved it holds the cluster's key
/// ([`Verified`]), and never passed on by a front (`router::hop_by_hop`),
/// so a client of the public address cannot send it to an owner. A
/// signature per call would prove again what the hop's handshake proved
/// once per connection: that the caller is one of the cluster's nodes.
pub const SIBLING_HEADER: &str = "relay-cluster-sibling";

/// Set on a connection of an owner's internal listener whose client
/// presented the cluster's key in the TLS handshake ([`mark_verified`]).
#[derive(Clone, Copy, Debug)]
pub struct Verified;

/// The `on_connect` mark of a hop connection: [`Verified`] when the client
/// presented a key, which on a listener of [`Hop::server`] is the
/// cluster's (its verifier takes no other, and requires one).
pub fn mark_verified(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    use actix_tls::accept::rustls_0_23::TlsStream;
    if let Some(tls) = conn.downcast_ref::<TlsStream<actix_web::rt::net::TcpStream>>() {
        if tls.get_ref().1.peer_certificates().is_some_and(|keys| !keys.is_empty()) {
            ext.insert(Verified);
        }
    }
}

/// blake3's key-derivation context for the hop key (never change it: the
/// nodes of a cluster must derive the same key).
const KEY_CONTEXT: &str = "relay 2026-12 cluster hop key (P-256)";

/// The TLS settings both ends of a hop use.
#[derive(Clone)]
pub struct Hop {
    /// For an owner's internal listener: a client must present the key.
    pub server: Arc<ServerConfig>,
    /// For a front or a sibling calling an owner: the owner must present it.
    pub client: Arc<ClientConfig>,
}

impl fmt::Debug for Hop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Hop(..)")
    }
}

impl Hop {
    /// The hop's settings for the cluster secret `secret`.
    pub fn from_secret(secret: &[u8]) -> Result<Hop, String> {
        if secret.len() < MIN_CLUSTER_SECRET {
            return Err(format!(
                "the cluster secret is {} bytes; at least {MIN_CLUSTER_SECRET} are needed",
                secret.len()
            ));
        }
        let key = derive_key(secret);
        let pkcs8 = key.to_pkcs8_der().map_err(|e| format!("cluster hop key: {e}"))?;
        let spki = key.verifying_key().to_public_key_der().map_err(|e| format!("cluster hop key: {e}"))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let signer = provider
            .key_provider
            .load_private_key(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(pkcs8.as_bytes().to_vec())))
            .map_err(|e| format!("cluster hop key: {e}"))?;
        let spki = spki.as_bytes().to_vec();
        let certified = Arc::new(CertifiedKey::new(vec![CertificateDer::from(spki.clone())], signer));
        let pinned = Arc::new(Pinned { spki, algorithms: provider.signature_verification_algorithms });
        let tls13 = &[&rustls::version::TLS13];
        let server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(tls13)
            .map_err(|e| e.to_string())?
            .with_client_cert_verifier(pinned.clone())
            .with_cert_resolver(Arc::new(rustls::server::AlwaysResolvesServerRawPublicKeys::new(certified.clone())));
        let client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(tls13)
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(pinned)
            .with_client_cert_resolver(Arc::new(rustls::client::AlwaysResolvesClientRawPublicKeys::new(certified)));
        Ok(Hop { server: Arc::new(server), client: Arc::new(client) })
    }
}

/// The P-256 key of `secret`. A derived scalar outside the group's order
/// (odds about 2^-32) is derived again with a counter.
fn derive_key(secret: &[u8]) -> p256::ecdsa::SigningKey {
    let mut hasher = blake3::Hasher::new_derive_key(KEY_CONTEXT);
    hasher.update(secret);
    let mut stream = hasher.finalize_xof();
    loop {
        let mut scalar = [0u8; 32];
        stream.fill(&mut scalar);
        if let Ok(key) = p256::ecdsa::SigningKey::from_slice(&scalar) {
            return key;
        }
    }
}

/// Trusts one raw public key, the cluster's, at either end of a handshake.
#[derive(Debug)]
struct Pinned {
    spki: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl Pinned {
    fn check(&self, presented: &CertificateDer<'_>) -> Result<(), Error> {
        match presented.as_ref() == self.spki.as_slice() {
            true => Ok(()),
            // Another cluster's key, or a certificate: not one of ours.
            false => Err(Error::InvalidCertificate(CertificateError::ApplicationVerificationFailure)),
        }
    }

    fn signed(
        &self,
        message: &[u8],
        key: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.check(key)?;
        verify_tls13_signature_with_raw_key(
            message,
            &SubjectPublicKeyInfoDer::from(key.as_ref()),
            dss,
            &self.algorithms,
        )
    }
}

/// Only TLS 1.3 is offered (raw public keys need it), so never reached.
fn tls12_refused() -> Result<HandshakeSignatureValid, Error> {
    Err(Error::General("the cluster hop speaks TLS 1.3 only".into()))
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        self.check(end_entity).map(|()| ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        tls12_refused()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        key: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.signed(message, key, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for Pinned {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        self.check(end_entity).map(|()| ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        tls12_refused()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        key: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.signed(message, key, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }

    fn requires_raw_public_keys(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const OTHER: &[u8] = b"fedcba9876543210fedcba9876543210";

    /// One connection over loopback: `client` dials a server with
    /// `server`, says "ping", and the server answers "pong". The outcome
    /// at each end: the bytes read, or the error met.
    async fn exchange(
        server: Arc<ServerConfig>,
        client: Arc<ClientConfig>,
    ) -> (Result<Vec<u8>, String>, Result<Vec<u8>, String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let serving = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
            let mut tls = tokio_rustls::TlsAcceptor::from(server).accept(tcp).await.map_err(|e| e.to_string())?;
            let mut got = [0u8; 4];
            tls.read_exact(&mut got).await.map_err(|e| e.to_string())?;
            tls.write_all(b"pong").await.map_err(|e| e.to_string())?;
            tls.shutdown().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(got.to_vec())
        });
        let calling = async {
            let tcp = tokio::net::TcpStream::connect(at).await.map_err(|e| e.to_string())?;
            let name = ServerName::IpAddress(at.ip().into());
            let mut tls =
                tokio_rustls::TlsConnector::from(client).connect(name, tcp).await.map_err(|e| e.to_string())?;
            tls.write_all(b"ping").await.map_err(|e| e.to_string())?;
            let mut got = Vec::new();
            tls.read_to_end(&mut got).await.map_err(|e| e.to_string())?;
            Ok::<_, String>(got)
        };
        let bounded = std::time::Duration::from_secs(10);
        let called = tokio::time::timeout(bounded, calling).await.expect("the client ends in time");
        let served = tokio::time::timeout(bounded, serving).await.expect("the server ends in time").unwrap();
        (served, called)
    }

    #[actix_web::test]
    async fn nodes_holding_the_same_secret_talk_over_the_hop() {
        let (a, b) = (Hop::from_secret(SECRET).unwrap(), Hop::from_secret(SECRET).unwrap());
        let (served, called) = exchange(a.server, b.client).await;
        assert_eq!(served.unwrap(), b"ping");
        assert_eq!(called.unwrap(), b"pong");
    }

    #[actix_web::test]
    async fn an_owner_answers_no_caller_without_the_secret() {
        let owner = Hop::from_secret(SECRET).unwrap();
        // A caller with another cluster's secret: its key is refused.
        let (served, _) = exchange(owner.server.clone(), Hop::from_secret(OTHER).unwrap().client).await;
        assert!(served.is_err(), "a caller with another secret was served: {served:?}");
        // A caller that presents no key at all (any TLS client).
        let anonymous = ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS13])
            .unwrap()
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Pinned {
                spki: owner_spki(SECRET),
                algorithms: rustls::crypto::ring::default_provider().signature_verification_algorithms,
            }))
            .with_no_client_auth();
        let (served, _) = exchange(owner.server, Arc::new(anonymous)).await;
        assert!(served.is_err(), "a caller without a key was served: {served:?}");
    }

    #[actix_web::test]
    async fn a_front_sends_nothing_to_an_owner_without_the_secret() {
        let impostor = Hop::from_secret(OTHER).unwrap();
        let (_, called) = exchange(impostor.server, Hop::from_secret(SECRET).unwrap().client).await;
        assert!(called.is_err(), "a front talked to an owner with another secret: {called:?}");
    }

    #[actix_web::test]
    async fn a_plain_connection_to_an_owners_hop_gets_no_answer() {
        let owner = Hop::from_secret(SECRET).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let at = listener.local_addr().unwrap();
        let serving = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.unwrap();
            tokio_rustls::TlsAcceptor::from(owner.server).accept(tcp).await.map(|_| ())
        });
        let mut plain = tokio::net::TcpStream::connect(at).await.unwrap();
        plain
            .write_all(b"POST /v1/rpc/account.register HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), plain.read_to_end(&mut answer)).await;
        assert!(tokio::time::timeout(std::time::Duration::from_secs(10), serving).await.unwrap().unwrap().is_err());
        // At most a TLS alert (content type 21), never an HTTP answer.
        if let Ok(Ok(_)) = read {
            assert!(!answer.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&answer));
        }
    }

    #[test]
    fn the_same_secret_gives_the_same_key_and_another_secret_another() {
        assert_eq!(owner_spki(SECRET), owner_spki(SECRET));
        assert_ne!(owner_spki(SECRET), owner_spki(OTHER));
        assert!(Hop::from_secret(b"too short").is_err());
    }

    fn owner_spki(secret: &[u8]) -> Vec<u8> {
        derive_key(secret).verifying_key().to_public_key_der().unwrap().as_bytes().to_vec()
    }
}
