//! Harnesses shared by the AFL++ targets in `fuzz_targets/` (and the seed
//! generator): each takes raw fuzzer bytes and panics only when a property
//! of the relay's input handling is broken. The same properties are
//! checked by the proptest suites in `schemas/tests/properties.rs` and
//! `tests/properties.rs`.

use ed25519_dalek::{SigningKey, VerifyingKey};
use relay::relay_rpc::{PeerKeys, RelayHeaders};
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::{b64_decode, jcs, jcs_digest};
use relay_schemas::ids::{check_account_id, check_id, check_message_id};
use relay_schemas::methods::*;
use relay_schemas::objects::*;
use relay_schemas::sign::{relay_request_bytes, sign_relay_request, signed_bytes, verify_bytes, Tag};
use relay_schemas::{ErrorCode, RelayError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::OnceLock;

pub const NOW: u64 = 1_764_400_000;
pub const TOLERANCE: u64 = 300;
const MAX_CIPHERTEXT: usize = 65536;
const MAX_BOXES: usize = 64;

/// Codes a request's own content may earn before any state is consulted.
pub fn is_content_error(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::InvalidParams
            | ErrorCode::InvalidSignature
            | ErrorCode::PayloadTooLarge
            | ErrorCode::Forbidden
            | ErrorCode::ClockSkew
    )
}

// ---- request parsing ------------------------------------------------------------------------

/// `relay::rpc::parse` (crate-private), replicated.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, RelayError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(RelayError::invalid_params("params must be a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| RelayError::invalid_params(format!("params: {e}")))
}

/// `relay::rpc::params_digest`, replicated.
fn params_digest(body: &[u8]) -> Result<String, RelayError> {
    let v: Value = parse(body)?;
    if !v.is_object() {
        return Err(RelayError::invalid_params("params must be a JSON object"));
    }
    Ok(hex::encode(jcs_digest(&v)?))
}

fn checked<T: DeserializeOwned>(
    body: &[u8],
    check: impl FnOnce(T) -> Result<(), RelayError>,
) -> Result<(), RelayError> {
    let p: T = parse(body)?;
    params_digest(body)?;
    check(p)
}

pub const METHODS: &[&str] = &[
    "account.register",
    "session.challenge",
    "session.open",
    "device.add",
    "device.revoke",
    "account.devices.get",
    "account.settings.update",
    "route.get",
    "route.update",
    "contact.revoke",
    "message.send",
    "message.deliver",
    "message.delivery.status",
    "message.timeline.sync",
    "message.timeline.ack",
];

struct World {
    alice: Account,
    phone: Device,
    bob: Account,
}

fn world() -> &'static World {
    static W: OnceLock<World> = OnceLock::new();
    W.get_or_init(|| World {
        alice: Account::from_seed([1; 32]),
        phone: Device::from_seed("phone", [101; 32]),
        bob: Account::from_seed([42; 32]),
    })
}

/// Parses and statelessly checks `body` as the params of `method`.
pub fn call(method: &str, body: &[u8]) -> Result<(), RelayError> {
    let bob = world().bob.key.verifying_key();
    match method {
        "account.register" => checked(body, |p: RegisterParams| {
            check_account_id("route.account_id", &p.route.account_id)?;
            p.route.check(NOW, TOLERANCE)?;
            p.device_certificate.check(NOW, TOLERANCE).map(drop)
        }),
        "session.challenge" => checked(body, |p: ChallengeParams| {
            check_account_id("account_id", &p.account_id)?;
            check_id("device_id", &p.device_id)
        }),
        "session.open" => checked(body, |p: SessionOpenParams| {
            check_account_id("account_id", &p.account_id)?;
            b64_decode("signature", &p.signature).map(drop)
        }),
        "device.add" => checked(body, |p: DeviceAddParams| p.device_certificate.check(NOW, TOLERANCE).map(drop)),
        "device.revoke" => checked(body, |p: DeviceRevokeParams| p.revocation.check(&bob)),
        "account.devices.get" | "route.get" => {
            checked(body, |p: AccountIdParams| check_account_id("account_id", &p.account_id))
        }
        "account.settings.update" => checked(body, |_: SettingsUpdateParams| Ok(())),
        "route.update" => checked(body, |p: RouteUpdateParams| p.route.check(NOW, TOLERANCE).map(drop)),
        "contact.revoke" => checked(body, |p: ContactRevokeParams| match (&p.grant_id, &p.invite_id) {
            (Some(g), None) => check_id("grant_id", g),
            (None, Some(i)) => check_id("invite_id", i),
            _ => Err(RelayError::invalid_params("exactly one of grant_id and invite_id")),
        }),
        "message.send" => checked(body, |p: SendParams| {
            p.envelope.check_constraints(MAX_CIPHERTEXT)?;
            check_boxes("recipient_boxes", &p.recipient_boxes, MAX_BOXES)?;
            if let Some(b) = &p.sender_boxes {
                check_boxes("sender_boxes", b, MAX_BOXES)?;
            }
            if let Some(a) = &p.authorization {
                a.check(&p.envelope.from, &p.envelope.to, &bob, NOW, TOLERANCE)?;
            }
            Ok(())
        }),
        "message.deliver" => checked(body, |p: DeliverParams| {
            p.envelope.check_constraints(MAX_CIPHERTEXT)?;
            check_boxes("recipient_boxes", &p.recipient_boxes, MAX_BOXES)?;
            let device_key = p.sender_device_certificate.check(NOW, TOLERANCE)?;
            p.envelope.verify(Tag::Envelope, &device_key)?;
            if let Some(a) = &p.authorization {
                a.check(&p.envelope.from, &p.envelope.to, &bob, NOW, TOLERANCE)?;
            }
            Ok(())
        }),
        "message.delivery.status" => checked(body, |p: MessageIdParams| check_message_id("message_id", &p.message_id)),
        "message.timeline.sync" => checked(body, |_: SyncParams| Ok(())),
        "message.timeline.ack" => checked(body, |_: AckParams| Ok(())),
        _ => Err(RelayError::not_found("unknown method")),
    }
}

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

/// Valid params of each method (seeds).
pub fn valid_params(method: &str) -> Value {
    let w = world();
    let (a, b) = (&w.alice, &w.bob);
    let env = || w.phone.envelope(&a.id, &b.id, "msg-0000000000000001", NOW, b"ciphertext bytes");
    match method {
        "account.register" => json!({
            "route": a.route(1, &[("relay-a", "http://127.0.0.1:1")], NOW),
            "device_certificate": a.certificate(&w.phone, NOW, None),
            "settings": {"public_discovery": false},
        }),
        "session.challenge" => json!({"account_id": a.id, "device_id": "phone"}),
        "session.open" => json!({"account_id": a.id, "device_id": "phone", "challenge": "AAAA",
                                 "signature": w.phone.session_proof(&a.id, "AAAA", "relay-a")}),
        "device.add" => {
            json!({"device_certificate": a.certificate(&Device::from_seed("tab", [7; 32]), NOW, Some(NOW + 9))})
        }
        "device.revoke" => json!({"revocation": b.revocation("tab", NOW)}),
        "account.devices.get" | "route.get" => json!({"account_id": b.id}),
        "account.settings.update" => json!({"public_discovery": true}),
        "route.update" => json!({"route": a.route(2, &[("relay-a", "http://a"), ("relay-b", "http://b")], NOW)}),
        "contact.revoke" => json!({"grant_id": "g1"}),
        "message.send" => json!({
            "envelope": env(),
            "recipient_boxes": [key_box("laptop", b"box")],
            "sender_boxes": [key_box("phone", b"box")],
            "authorization": {"contact_grant": b.grant("g1", &a.id, NOW, Some(NOW + 60))},
        }),
        "message.deliver" => json!({
            "envelope": env(),
            "recipient_boxes": [key_box("laptop", b"box")],
            "sender_device_certificate": a.certificate(&w.phone, NOW, None),
            "authorization": {"contact_invite": b.invite("i1", NOW, NOW + 60)},
        }),
        "message.delivery.status" => json!({"message_id": "msg-0000000000000001"}),
        "message.timeline.sync" => json!({"after": 0, "limit": 500}),
        "message.timeline.ack" => json!({"through": 3}),
        _ => json!({}),
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
            o.check(NOW, TOLERANCE)?;
            Ok((typed(&o), signed_bytes(Tag::Route, &o.map()?)?))
        }
        "certificate" => {
            let o = wire::<DeviceCertificate>(text)?;
            o.check(NOW, TOLERANCE)?;
            Ok((typed(&o), signed_bytes(Tag::DeviceCertificate, &o.map()?)?))
        }
        "revocation" => {
            let o = wire::<DeviceRevocation>(text)?;
            o.check(&alice)?;
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
            Authorization::ContactGrant(o).check(&w.alice.id, &w.bob.id, &bob, NOW, TOLERANCE)?;
            Ok((t, bytes))
        }
        "invite" => {
            let o = wire::<ContactInvite>(text)?;
            let (t, bytes) = (typed(&o), signed_bytes(Tag::ContactInvite, &o.map()?)?);
            Authorization::ContactInvite(o).check(&w.alice.id, &w.bob.id, &bob, NOW, TOLERANCE)?;
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
        PeerKeys::new("relay-a", keys, TOLERANCE)
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
