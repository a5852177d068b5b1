//! The params harness shared by `schemas/tests/properties.rs` and the fuzz
//! targets in `fuzz/` (which include this file by path): method params
//! parsed and statelessly checked as the relay does, and a valid params
//! object of every method in a fixed world.

use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::{b64_decode, jcs_digest};
use relay_schemas::ids::{check_account_id, check_id, check_message_id};
use relay_schemas::methods::*;
use relay_schemas::objects::*;
use relay_schemas::sign::Tag;
use relay_schemas::{ErrorCode, RelayError, UnixSecs};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

pub const NOW: u64 = 1_764_400_000;
pub const TOLERANCE: u64 = 300;
pub const MAX_CIPHERTEXT: usize = 65536;
pub const MAX_BOXES: usize = 64;

/// `relay::rpc::parse` (crate-private), replicated: params are a JSON
/// object; any JSON or type error is `invalid_params`.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, RelayError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(RelayError::invalid_params("params must be a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| RelayError::invalid_params(format!("params: {e}")))
}

/// `relay::rpc::params_digest`, replicated.
pub fn params_digest(body: &[u8]) -> Result<String, RelayError> {
    let v: Value = parse(body)?;
    if !v.is_object() {
        return Err(RelayError::invalid_params("params must be a JSON object"));
    }
    Ok(hex::encode(jcs_digest(&v)?))
}

/// The stateless checks the relay applies to a method's params after
/// parsing them (the account core adds the stateful ones).
fn checked<T: DeserializeOwned>(
    body: &[u8],
    check: impl FnOnce(T) -> Result<(), RelayError>,
) -> Result<(), RelayError> {
    let p: T = parse(body)?;
    params_digest(body)?;
    check(p)
}

/// Every method's params, parsed and checked like the relay does.
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

pub fn call(method: &str, body: &[u8]) -> Result<(), RelayError> {
    let bob = world().bob.key.verifying_key();
    match method {
        "account.register" => checked(body, |p: RegisterParams| {
            check_account_id("route.account_id", &p.route.account_id)?;
            p.route.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
            p.device_certificate.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES).map(drop)
        }),
        "session.challenge" => checked(body, |p: ChallengeParams| {
            check_account_id("account_id", &p.account_id)?;
            check_id("device_id", &p.device_id)
        }),
        "session.open" => checked(body, |p: SessionOpenParams| {
            check_account_id("account_id", &p.account_id)?;
            check_id("device_id", &p.device_id)?;
            b64_decode("signature", &p.signature).map(drop)
        }),
        "device.add" => checked(body, |p: DeviceAddParams| {
            p.device_certificate.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES).map(drop)
        }),
        "device.revoke" => checked(body, |p: DeviceRevokeParams| p.revocation.check(&bob, MAX_OBJECT_BYTES)),
        "account.devices.get" | "route.get" => {
            checked(body, |p: AccountIdParams| check_account_id("account_id", &p.account_id))
        }
        "account.settings.update" => checked(body, |_: SettingsUpdateParams| Ok(())),
        "route.update" => {
            checked(body, |p: RouteUpdateParams| p.route.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES).map(drop))
        }
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
                a.check(&p.envelope.from, &p.envelope.to, &bob, UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
            }
            Ok(())
        }),
        "message.deliver" => checked(body, |p: DeliverParams| {
            p.envelope.check_constraints(MAX_CIPHERTEXT)?;
            check_boxes("recipient_boxes", &p.recipient_boxes, MAX_BOXES)?;
            let device_key = p.sender_device_certificate.check(UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
            p.envelope.verify(Tag::Envelope, &device_key)?;
            if let Some(a) = &p.authorization {
                a.check(&p.envelope.from, &p.envelope.to, &bob, UnixSecs(NOW), TOLERANCE, MAX_OBJECT_BYTES)?;
            }
            Ok(())
        }),
        "message.delivery.status" => checked(body, |p: MessageIdParams| check_message_id("message_id", &p.message_id)),
        "message.timeline.sync" => checked(body, |_: SyncParams| Ok(())),
        "message.timeline.ack" => checked(body, |_: AckParams| Ok(())),
        _ => Err(RelayError::not_found("unknown method")),
    }
}

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

/// A fixed world: Alice (phone) writes to Bob, who granted and invited her.
pub struct World {
    pub alice: Account,
    pub phone: Device,
    pub bob: Account,
}

pub fn world() -> &'static World {
    static W: std::sync::OnceLock<World> = std::sync::OnceLock::new();
    W.get_or_init(|| World {
        alice: Account::from_seed([1; 32]),
        phone: Device::from_seed("phone", [101; 32]),
        bob: Account::from_seed([42; 32]),
    })
}

/// Valid params of `method` in the world above.
pub fn valid_params(method: &str) -> Value {
    let w = world();
    let (a, b) = (&w.alice, &w.bob);
    let env = || w.phone.envelope(&a.id, &b.id, "msg-0000000000000001", NOW, b"ciphertext bytes");
    match method {
        "account.register" => a.register_params(
            &a.route(1, &[("relay-a", "http://127.0.0.1:1")], NOW),
            &a.certificate(&w.phone, NOW, None),
            "relay-a",
            false,
            NOW,
        ),
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
        _ => unreachable!("{method}"),
    }
}
