//! Harnesses shared by the AFL++ targets in `fuzz_targets/` (and the seed
//! generator): each takes raw fuzzer bytes and panics only when a property
//! of the relay's input handling is broken. The same properties are
//! checked by the proptest suites in `schemas/tests/properties.rs` and
//! `tests/it/properties.rs`.

use ed25519_dalek::{SigningKey, VerifyingKey};
use relay::relay_rpc::{PeerKeys, RelayHeaders};
use relay_schemas::encoding::jcs;
use relay_schemas::objects::*;
use relay_schemas::sign::{relay_request_bytes, sign_relay_request, signed_bytes, verify_bytes, Tag};
use relay_schemas::{ErrorCode, RelayError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;

// The params harness (NOW, TOLERANCE, the limits, `call`, `valid_params`,
// `METHODS`, `world`, `is_content_error`) is shared with the proptest suite.
#[path = "../../schemas/tests/common/params.rs"]
mod params;
pub use params::{call, is_content_error, valid_params, METHODS, NOW, TOLERANCE};
use params::{world, MAX_CIPHERTEXT};

/// Target `parse_params`: byte 0 picks the method, the rest is the body.
pub fn fuzz_parse_params(data: &[u8]) {
    let Some((&m, body)) = data.split_first() else { return };
    let method = METHODS[m as usize % METHODS.len()];
    let is_object = serde_json::from_slice::<Value>(body).is_ok_and(|v| v.is_object());
    if let Err(e) = call(method, body) {
        assert!(is_content_error(e.code), "{method}: {e}");
        assert!(is_object || e.code == ErrorCode::InvalidParams, "{method}: {e}");
    }
}

// ---- canonical JSON -------------------------------------------------------------------------

/// Target `canonical_json`: whatever serde_json parses canonicalizes, the
/// output is JSON, and canonicalization is idempotent and deterministic.
pub fn fuzz_canonical_json(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    let once = jcs(&v).expect("a parsed value canonicalizes");
    assert_eq!(once, jcs(&v).unwrap(), "not deterministic");
    let back: Value = serde_json::from_slice(&once).expect("JCS output parses");
    assert_eq!(jcs(&back).unwrap(), once, "not idempotent");
}

// ---- signed objects -------------------------------------------------------------------------

pub const KINDS: [&str; 6] = ["route", "certificate", "revocation", "envelope", "grant", "invite"];

/// One valid object of each kind, signed by the fixed keys below (seeds).
pub fn valid_object(kind: &str) -> Value {
    let w = world();
    let (a, b) = (&w.alice, &w.bob);
    match kind {
        "route" => a.route(3, &[("relay-a", "https://a"), ("relay-b", "https://b")], NOW),
        "certificate" => a.certificate(&w.phone, NOW, Some(NOW + 60)),
        "revocation" => a.revocation("tab", NOW),
        "envelope" => w.phone.envelope(&a.id, &b.id, "msg-0000000000000001", NOW, b"ciphertext"),
        // Bob (recipient) lets Alice (sender) write to him.
        "grant" => b.grant("g1", &a.id, NOW, Some(NOW + 60)),
        "invite" => b.invite("i1", NOW, NOW + 60),
        _ => unreachable!(),
    }
}

fn wire<T: DeserializeOwned>(text: &str) -> Result<Wire<T>, RelayError> {
    Wire::parse(text).map_err(|e| RelayError::invalid_params(e.to_string()))
}

fn typed<T: Serialize>(w: &Wire<T>) -> Value {
    serde_json::to_value(&**w).unwrap()
}

/// Parses and checks `text` as `kind`: the typed view and the signed bytes
/// on success.
pub fn check_object(kind: &str, text: &str) -> Result<(Value, Vec<u8>), RelayError> {
    let w = world();
    let (alice, bob) = (w.alice.key.verifying_key(), w.bob.key.verifying_key());
    match kind {
        "route" => {
            let o = wire::<Route>(text)?;
            o.check(NOW, TOLERANCE, MAX_OBJECT_BYTES)?;
            Ok((typed(&o), signed_bytes(Tag::Route, &o.map()?)?))
        }
        "certificate" => {
            let o = wire::<DeviceCertificate>(text)?;
            o.check(NOW, TOLERANCE, MAX_OBJECT_BYTES)?;
            Ok((typed(&o), signed_bytes(Tag::DeviceCertificate, &o.map()?)?))
        }
        "revocation" => {
            let o = wire::<DeviceRevocation>(text)?;
            o.check(&alice, MAX_OBJECT_BYTES)?;
            Ok((typed(&o), signed_bytes(Tag::DeviceRevocation, &o.map()?)?))
        }
        "envelope" => {
            let o = wire::<MessageEnvelope>(text)?;
            o.check_constraints(MAX_CIPHERTEXT)?;
            o.verify(Tag::Envelope, &w.phone.key.verifying_key())?;
            Ok((typed(&o), signed_bytes(Tag::Envelope, &o.map()?)?))
        }
        "grant" => {
            let o = wire::<ContactGrant>(text)?;
            let (t, bytes) = (typed(&o), signed_bytes(Tag::ContactGrant, &o.map()?)?);
            Authorization::ContactGrant(o).check(&w.alice.id, &w.bob.id, &bob, NOW, TOLERANCE, MAX_OBJECT_BYTES)?;
            Ok((t, bytes))
        }
        "invite" => {
            let o = wire::<ContactInvite>(text)?;
            let (t, bytes) = (typed(&o), signed_bytes(Tag::ContactInvite, &o.map()?)?);
            Authorization::ContactInvite(o).check(&w.alice.id, &w.bob.id, &bob, NOW, TOLERANCE, MAX_OBJECT_BYTES)?;
            Ok((t, bytes))
        }
        _ => unreachable!(),
    }
}

fn originals() -> &'static Vec<(Value, Vec<u8>)> {
    static O: OnceLock<Vec<(Value, Vec<u8>)>> = OnceLock::new();
    O.get_or_init(|| KINDS.iter().map(|k| check_object(k, &valid_object(k).to_string()).unwrap()).collect())
}

/// Target `object_validation`: byte 0 picks the kind, the rest is the
/// object. Nothing panics, failures are protocol codes, and whatever
/// verifies under the fixed keys has the original's signed bytes and typed
/// view (the keys signed nothing else).
pub fn fuzz_object_validation(data: &[u8]) {
    let Some((&k, rest)) = data.split_first() else { return };
    let i = k as usize % KINDS.len();
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match check_object(KINDS[i], text) {
        Ok((typed, bytes)) => {
            let (want_typed, want_bytes) = &originals()[i];
            assert_eq!(&bytes, want_bytes, "{} verified with other signed bytes: {text}", KINDS[i]);
            assert_eq!(&typed, want_typed, "{} verified with another typed view: {text}", KINDS[i]);
        }
        Err(e) => assert!(is_content_error(e.code), "{}: {e}", KINDS[i]),
    }
}

// ---- relay-request authentication ----------------------------------------------------------

fn peer_key() -> SigningKey {
    SigningKey::from_bytes(&[11; 32])
}

fn peers() -> &'static PeerKeys {
    static P: OnceLock<PeerKeys> = OnceLock::new();
    P.get_or_init(|| {
        let keys: HashMap<String, VerifyingKey> = [("relay-b".to_string(), peer_key().verifying_key())].into();
        PeerKeys::new("relay-a", keys, TOLERANCE, 1024)
    })
}

/// Splits `data` into up to `N` fields at 0xff bytes.
fn fields<const N: usize>(data: &[u8]) -> [&[u8]; N] {
    let mut out = [&data[..0]; N];
    for (slot, part) in out.iter_mut().zip(data.splitn(N, |b| *b == 0xff)) {
        *slot = part;
    }
    out
}

/// Target `relay_auth`. Byte 0: mode. Mode even: the fuzzer supplies every
/// header, the method, the body and the clock; the only key that can sign
/// is the harness's, so nothing may pass. Mode odd: the harness signs the
/// request described by the first fields with the configured peer's key
/// and presents the one described by the others; it must pass exactly when
/// the two are the same request and the timestamp is within tolerance.
pub fn fuzz_relay_auth(data: &[u8]) {
    relay_auth(data);
}

/// [`fuzz_relay_auth`]; `Some(accepted)` for a harness-signed request.
pub fn relay_auth(data: &[u8]) -> Option<bool> {
    let (&mode, rest) = data.split_first()?;
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    // The clock: NOW, or within ±1000 s of it as the field says.
    let now = |b: &[u8]| match b {
        [] => NOW,
        b => NOW + b.iter().fold(0u64, |a, x| a.wrapping_mul(31).wrapping_add(*x as u64)) % 2001 - 1000,
    };
    if mode % 2 == 0 {
        let [id, ts, sig, method, body, clock] = fields::<6>(rest);
        let (id, ts, sig) = (s(id), s(ts), s(sig));
        let opt = |flag: u8, v: &str| -> Option<String> { (mode & flag == 0).then(|| v.to_string()) };
        let (id, ts, sig) = (opt(2, &id), opt(4, &ts), opt(8, &sig));
        let h = RelayHeaders { relay_id: id.as_deref(), timestamp: ts.as_deref(), signature: sig.as_deref() };
        let e = peers().authenticate(&h, &s(method), body, now(clock)).unwrap_err();
        assert_eq!(e.code, ErrorCode::Unauthorized);
        return None;
    }
    let [s_method, s_target, s_ts, s_body, p_id, p_method, p_ts, p_body, clock] = fields::<9>(rest);
    let s_ts: u64 = s(s_ts).parse().unwrap_or(NOW);
    let sig = sign_relay_request(&peer_key(), &s(s_method), &s(s_target), s_ts, s_body);
    let (p_id, p_method, p_ts) = (s(p_id), s(p_method), s(p_ts));
    let h = RelayHeaders { relay_id: Some(&p_id), timestamp: Some(&p_ts), signature: Some(&sig) };
    let now = now(clock);
    let got = peers().authenticate(&h, &p_method, p_body, now);
    let presented: Option<u64> = p_ts.parse().ok();
    let exact = p_id == "relay-b"
        && s(s_method) == p_method
        && s(s_target) == "relay-a"
        && Some(s_ts) == presented
        && s_body == p_body
        && presented.is_some_and(|t| t.abs_diff(now) <= TOLERANCE);
    match got {
        Ok(peer) => {
            assert!(exact, "accepted a request other than the signed one");
            assert_eq!(peer, "relay-b");
            // And the signature really is over what was presented.
            let bytes = relay_request_bytes(&p_method, "relay-a", presented.unwrap(), p_body);
            verify_bytes(&peer_key().verifying_key(), &bytes, &sig).unwrap();
        }
        Err(e) => {
            assert!(!exact, "refused the signed request: {e}");
            assert_eq!(e.code, ErrorCode::Unauthorized);
        }
    }
    Some(exact)
}
