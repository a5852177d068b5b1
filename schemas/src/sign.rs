//! Signatures with domain tags (PROTOCOL §1).
//!
//! The signed bytes are `TAG || "\n" || JCS(object without "signature")`.
//! Verification is strict: non-canonical encodings and small-order keys or
//! points are rejected.

use crate::encoding::{b64_decode_array, b64_encode, jcs, jcs_object_without};
use crate::RelayError;
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde_json::{Map, Value};

/// The domain tag of each signed object kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    DeviceCertificate,
    DeviceRevocation,
    Route,
    Envelope,
    ContactGrant,
    ContactInvite,
    Session,
    Registration,
    RelayRequest,
    Checkpoint,
}

impl Tag {
    pub fn as_str(self) -> &'static str {
        match self {
            Tag::DeviceCertificate => "relay/v1/device-certificate",
            Tag::DeviceRevocation => "relay/v1/device-revocation",
            Tag::Route => "relay/v1/route",
            Tag::Envelope => "relay/v1/envelope",
            Tag::ContactGrant => "relay/v1/contact-grant",
            Tag::ContactInvite => "relay/v1/contact-invite",
            Tag::Session => "relay/v1/session",
            Tag::Registration => "relay/v1/registration",
            Tag::RelayRequest => "relay/v1/relay-request",
            Tag::Checkpoint => "relay/v1/checkpoint",
        }
    }
}

/// The bytes an object's signature covers: every member but `signature`.
pub fn signed_bytes(tag: Tag, object: &Map<String, Value>) -> Result<Vec<u8>, RelayError> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(tag.as_str().as_bytes());
    out.push(b'\n');
    out.extend_from_slice(&jcs_object_without(object, "signature")?);
    Ok(out)
}

/// Parses a base64url Ed25519 public key, rejecting small-order (weak) keys.
/// A key accepted before is not decompressed again (`verified.rs`).
pub fn parse_public_key(field: &str, b64: &str) -> Result<VerifyingKey, RelayError> {
    let bytes: [u8; 32] = b64_decode_array(field, b64)?;
    if let Some(key) = crate::verified::KEYS.get(&bytes) {
        return Ok(key);
    }
    let key = VerifyingKey::from_bytes(&bytes)
        .map_err(|_| RelayError::invalid_params(format!("{field}: not an Ed25519 public key")))?;
    if key.is_weak() {
        return Err(RelayError::invalid_signature(format!("{field}: small-order key")));
    }
    crate::verified::KEYS.insert(bytes, key);
    Ok(key)
}

/// Strict verification of raw bytes.
pub fn verify_bytes(key: &VerifyingKey, message: &[u8], signature_b64: &str) -> Result<(), RelayError> {
    let sig: [u8; 64] = b64_decode_array("signature", signature_b64)?;
    key.verify_strict(message, &Signature::from_bytes(&sig))
        .map_err(|_| RelayError::invalid_signature("signature does not verify"))
}

/// Verifies the `signature` member of a signed object under `key`.
pub fn verify_object(tag: Tag, object: &Map<String, Value>, key: &VerifyingKey) -> Result<(), RelayError> {
    let sig = match object.get("signature") {
        Some(Value::String(s)) => s,
        _ => return Err(RelayError::invalid_params("signature: missing")),
    };
    verify_bytes(key, &signed_bytes(tag, object)?, sig)
}

/// Signs an object in place (sets `signature`). Used by clients, tests and
/// the relay for its own requests.
pub fn sign_object(tag: Tag, object: &mut Map<String, Value>, key: &SigningKey) {
    object.remove("signature");
    let bytes = signed_bytes(tag, object).expect("a Map always canonicalizes");
    let sig = key.sign(&bytes);
    object.insert("signature".into(), Value::String(b64_encode(&sig.to_bytes())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7u8; 32])
    }

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    /// `.cargo/config.toml` compiles curve25519-dalek's AVX-512 IFMA backend
    /// (picked at run time, AVX2 and portable code as fallbacks): Ed25519
    /// verification is one of the largest costs of a send. A RUSTFLAGS
    /// environment variable replaces the config's flags and drops it.
    #[test]
    #[cfg(target_arch = "x86_64")]
    // The build's configuration is the constant under test.
    #[allow(clippy::assertions_on_constants)]
    fn ed25519_is_built_with_the_avx512_backend_on_x86_64() {
        assert!(
            cfg!(curve25519_dalek_backend = "avx512"),
            "built without .cargo/config.toml's rustflags (is RUSTFLAGS set?)"
        );
    }

    #[test]
    fn signature_covers_unknown_members() {
        let k = key();
        let mut o = obj(json!({"a": 1, "x-future": "kept"}));
        sign_object(Tag::Route, &mut o, &k);
        verify_object(Tag::Route, &o, &k.verifying_key()).unwrap();
        o.insert("x-future".into(), json!("changed"));
        let e = verify_object(Tag::Route, &o, &k.verifying_key()).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidSignature);
    }

    #[test]
    fn wrong_domain_tag_is_invalid_signature() {
        let k = key();
        let mut o = obj(json!({"a": 1}));
        sign_object(Tag::Envelope, &mut o, &k);
        let e = verify_object(Tag::Route, &o, &k.verifying_key()).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidSignature);
    }

    #[test]
    fn signed_bytes_are_tag_newline_jcs_without_signature() {
        let o = obj(json!({"b": 2, "a": "x", "signature": "zz"}));
        assert_eq!(signed_bytes(Tag::Session, &o).unwrap(), b"relay/v1/session\n{\"a\":\"x\",\"b\":2}".to_vec());
    }

    #[test]
    fn small_order_public_key_is_rejected() {
        // The identity point: a small-order key that plain verification accepts.
        let mut id = [0u8; 32];
        id[0] = 1;
        // Twice: a refusal is never remembered as a key.
        for _ in 0..2 {
            let e = parse_public_key("k", &b64_encode(&id)).unwrap_err();
            assert_eq!(e.code, crate::ErrorCode::InvalidSignature);
        }
        assert!(crate::verified::KEYS.get(&id).is_none());
    }

    #[test]
    fn malformed_signature_encoding_is_invalid_params() {
        let k = key();
        let mut o = obj(json!({"a": 1}));
        o.insert("signature".into(), json!("not base64!"));
        let e = verify_object(Tag::Route, &o, &k.verifying_key()).unwrap_err();
        assert_eq!(e.code, crate::ErrorCode::InvalidParams);
    }
}

/// The bytes a relay signs for a relay-to-relay request (PROTOCOL §3):
/// `relay/v1/relay-request\n{method}\n{target relay_id}\n{timestamp}\n{hex blake3(body)}`.
pub fn relay_request_bytes(method: &str, target: &str, timestamp: u64, body: &[u8]) -> Vec<u8> {
    format!("{}\n{method}\n{target}\n{timestamp}\n{}", Tag::RelayRequest.as_str(), blake3::hash(body).to_hex())
        .into_bytes()
}

/// What a device signs to open a session (PROTOCOL §4 `session.open`).
#[derive(serde::Serialize)]
pub struct SessionProof<'a> {
    pub account_id: &'a str,
    pub device_id: &'a str,
    pub challenge: &'a str,
    pub relay_id: &'a str,
}

impl SessionProof<'_> {
    /// The signed bytes: `relay/v1/session\n` + JCS of the object.
    pub fn signed_bytes(&self) -> Result<Vec<u8>, RelayError> {
        let mut bytes = Tag::Session.as_str().as_bytes().to_vec();
        bytes.push(b'\n');
        bytes.extend_from_slice(&jcs(self)?);
        Ok(bytes)
    }
}

/// The `Relay-Signature` header value for a request.
pub fn sign_relay_request(key: &SigningKey, method: &str, target: &str, timestamp: u64, body: &[u8]) -> String {
    b64_encode(&key.sign(&relay_request_bytes(method, target, timestamp, body)).to_bytes())
}

#[cfg(test)]
mod relay_request_tests {
    use super::*;

    #[test]
    fn relay_request_signature_covers_method_target_time_and_body() {
        let k = SigningKey::from_bytes(&[3u8; 32]);
        let sig = sign_relay_request(&k, "message.deliver", "relay-b", 100, b"{}");
        let vk = k.verifying_key();
        verify_bytes(&vk, &relay_request_bytes("message.deliver", "relay-b", 100, b"{}"), &sig).unwrap();
        for (m, t, ts, body) in [
            ("route.get", "relay-b", 100, &b"{}"[..]),
            ("message.deliver", "relay-c", 100, b"{}"),
            ("message.deliver", "relay-b", 101, b"{}"),
            ("message.deliver", "relay-b", 100, b"{ }"),
        ] {
            assert!(verify_bytes(&vk, &relay_request_bytes(m, t, ts, body), &sig).is_err());
        }
        assert!(relay_request_bytes("m", "t", 1, b"").starts_with(b"relay/v1/relay-request\nm\nt\n1\n"));
    }
}
