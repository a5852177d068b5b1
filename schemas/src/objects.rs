//! The core objects of PROTOCOL §2 and their stateless validity checks.
//!
//! Every object is held as [`Wire<T>`]: the typed view plus the exact bytes
//! it arrived as, so unknown members (covered by signatures) are stored and
//! forwarded byte-for-byte. Checks that need an account's state (is the
//! certificate on file? was the grant revoked?) live in the account core.

use crate::encoding::{b64_decode, b64_decoded_len, jcs_object};
use crate::ids::{account_id_of, check_account_id, check_id, check_message_id, check_relay_id};
use crate::sign::{parse_public_key, verify_object, Tag};
use crate::{ErrorCode, RelayError, UnixSecs};
use ed25519_dalek::VerifyingKey;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::ops::Deref;
use std::sync::{Arc, OnceLock};

/// PROTOCOL §1 *Size bounds*: the default of `limits.max_object_bytes`, the
/// most bytes of canonical JSON one signed object (certificate, revocation,
/// route, registration, grant, invite) may have.
pub const MAX_OBJECT_BYTES: usize = 16 * 1024;

/// The setting an oversized signed object is refused under (`data.limit`).
pub const MAX_OBJECT_BYTES_SETTING: &str = "limits.max_object_bytes";

/// A protocol object as received: the typed view and the original JSON text.
/// Immutable and shared: a send hands its envelope, certificate and route
/// from the request to the acceptance, the receipt, the timeline record and
/// the delivery, and a clone is a reference count, not a copy of the text
/// and of its typed view.
pub struct Wire<T>(Arc<Received<T>>);

struct Received<T> {
    raw: Box<RawValue>,
    body: T,
    /// [`Wire::jcs`], once worked out.
    jcs: OnceLock<Box<[u8]>>,
}

impl<T> Clone for Wire<T> {
    fn clone(&self) -> Self {
        Wire(Arc::clone(&self.0))
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Wire<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wire").field("raw", &self.0.raw).field("body", &self.0.body).finish()
    }
}

impl<T: DeserializeOwned> Wire<T> {
    /// Parses the typed view, after the I-JSON checks ([`crate::ijson`]):
    /// the bytes kept must mean one thing to every parser.
    pub fn from_raw(raw: Box<RawValue>) -> Result<Self, serde_json::Error> {
        if !crate::ijson::within_checked_text() {
            crate::ijson::check(raw.get())?;
        }
        let body = serde_json::from_str(raw.get())?;
        Ok(Wire(Arc::new(Received { raw, body, jcs: OnceLock::new() })))
    }

    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        Self::from_raw(RawValue::from_string(json.to_owned())?)
    }

    /// Builds one from a value (clients and tests); the bytes are its
    /// compact serialization.
    pub fn from_value(v: &Value) -> Result<Self, serde_json::Error> {
        Self::parse(&serde_json::to_string(v)?)
    }
}

impl<T> Wire<T> {
    /// The original JSON text.
    pub fn raw(&self) -> &RawValue {
        &self.0.raw
    }

    /// The object as a JSON map (for signatures and canonical JSON).
    pub fn map(&self) -> Result<Map<String, Value>, RelayError> {
        serde_json::from_str(self.0.raw.get())
            .map_err(|e| RelayError::invalid_params(format!("not a JSON object: {e}")))
    }

    /// Verifies the object's signature; an identical object (same bytes,
    /// tag and key) verified before is not verified again (`verified.rs`).
    pub fn verify(&self, tag: Tag, key: &VerifyingKey) -> Result<(), RelayError> {
        let memo = crate::verified::key(tag.as_str(), key, self.0.raw.get());
        if crate::verified::MEMO.contains(&memo) {
            return Ok(());
        }
        let map = self.map()?;
        verify_object(tag, &map, key)?;
        crate::verified::MEMO.insert(memo, ());
        // The parse is done: the canonical bytes now cost only their writing.
        if self.0.jcs.get().is_none() {
            if let Ok(bytes) = jcs_object(&map) {
                let _ = self.0.jcs.set(bytes.into());
            }
        }
        Ok(())
    }

    /// RFC 8785 (JCS) bytes of the whole object, its signature included,
    /// worked out once per object (a [`Wire::verify`] that parsed it leaves
    /// them behind). A send's deliver digest is made of its objects' bytes
    /// (`DeliverParams::jcs`), and the sender's certificate and route are
    /// the same objects, held by the account, for every send.
    pub fn jcs(&self) -> Result<&[u8], RelayError> {
        if let Some(bytes) = self.0.jcs.get() {
            return Ok(bytes);
        }
        let bytes = jcs_object(&self.map()?)?;
        Ok(self.0.jcs.get_or_init(|| bytes.into()))
    }

    /// PROTOCOL §1 *Size bounds*: a signed object is at most `max` bytes of
    /// canonical JSON, its signature and unknown members included, so what
    /// one stranger can make a relay keep, and answer to others, is bounded.
    /// Every signed object's check starts here: an oversized one costs no
    /// signature verification. The JCS bytes are kept for the digests that
    /// need them anyway.
    pub fn check_size(&self, what: &str, max: usize) -> Result<(), RelayError> {
        let len = self.jcs()?.len();
        if len > max {
            return Err(RelayError::over_limit(
                MAX_OBJECT_BYTES_SETTING,
                format!("{what}: {len} bytes of canonical JSON, limit {max}"),
            ));
        }
        Ok(())
    }
}

impl<T> Deref for Wire<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.body
    }
}

/// Same content: equal bytes, or equal JSON values (member order and
/// whitespace do not make two objects different, as under JCS).
impl<T> PartialEq for Wire<T> {
    fn eq(&self, other: &Self) -> bool {
        self.0.raw.get() == other.0.raw.get()
            || matches!(
                (serde_json::from_str::<Value>(self.0.raw.get()), serde_json::from_str::<Value>(other.0.raw.get())),
                (Ok(a), Ok(b)) if a == b
            )
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Wire<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = Box::<RawValue>::deserialize(d)?;
        Wire::from_raw(raw).map_err(D::Error::custom)
    }
}

impl<T> Serialize for Wire<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.raw.serialize(s)
    }
}

/// For optional members: absent is `None`, but an explicit `null` is a
/// type error like any other wrong type (the JSON Schemas agree).
pub(crate) fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

fn invalid(m: impl Into<String>) -> RelayError {
    RelayError::invalid_params(m)
}

/// Checks `issued_at`/`expires_at` of a credential against `now`.
fn check_validity_window(
    what: &str,
    issued_at: u64,
    expires_at: Option<u64>,
    now: UnixSecs,
    tolerance: u64,
    code: ErrorCode,
) -> Result<(), RelayError> {
    if issued_at > now.plus(tolerance) {
        return Err(RelayError::new(code, format!("{what}: issued_at is in the future")));
    }
    if let Some(exp) = expires_at {
        if exp <= now {
            return Err(RelayError::new(code, format!("{what}: expired")));
        }
    }
    Ok(())
}

/// Checks that `account_id` derives from `account_key` and returns the key.
fn bound_account_key(account_id: &str, account_key: &str) -> Result<VerifyingKey, RelayError> {
    check_account_id("account_id", account_id)?;
    let key = parse_public_key("account_key", account_key)?;
    if account_id_of(key.as_bytes()) != account_id {
        return Err(RelayError::invalid_signature("account_id does not derive from account_key"));
    }
    Ok(key)
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceCertificate {
    pub account_id: String,
    pub account_key: String,
    pub device_id: String,
    pub device_key: String,
    pub box_key: String,
    pub issued_at: u64,
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<u64>,
    pub signature: String,
}

impl Wire<DeviceCertificate> {
    /// Signature and identity binding; returns the device key. Whether the
    /// account lists this certificate is the account's business.
    pub fn check(&self, now: UnixSecs, tolerance: u64, max_bytes: usize) -> Result<VerifyingKey, RelayError> {
        let device_key = self.check_signed(max_bytes)?;
        check_validity_window(
            "device_certificate",
            self.issued_at,
            self.expires_at,
            now,
            tolerance,
            ErrorCode::InvalidParams,
        )?;
        Ok(device_key)
    }

    /// Signature and identity binding only, whatever the time: a
    /// certificate as it was when something it signed was accepted
    /// (history replicated from an account's other home); returns the
    /// device key.
    pub fn check_signed(&self, max_bytes: usize) -> Result<VerifyingKey, RelayError> {
        self.check_size("device_certificate", max_bytes)?;
        let account_key = bound_account_key(&self.account_id, &self.account_key)?;
        check_id("device_id", &self.device_id)?;
        let device_key = parse_public_key("device_key", &self.device_key)?;
        if b64_decode("box_key", &self.box_key)?.len() != 32 {
            return Err(invalid("box_key: expected 32 bytes"));
        }
        self.verify(Tag::DeviceCertificate, &account_key)?;
        Ok(device_key)
    }

    pub fn is_expired(&self, now: UnixSecs) -> bool {
        self.expires_at.is_some_and(|e| e <= now)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DeviceRevocation {
    pub account_id: String,
    pub device_id: String,
    pub revoked_at: u64,
    pub signature: String,
}

impl Wire<DeviceRevocation> {
    pub fn check(&self, account_key: &VerifyingKey, max_bytes: usize) -> Result<(), RelayError> {
        self.check_size("revocation", max_bytes)?;
        check_account_id("account_id", &self.account_id)?;
        check_id("device_id", &self.device_id)?;
        self.verify(Tag::DeviceRevocation, account_key)
    }
}

/// A route's `relays[].url`: where other relays POST to this one, so an
/// `http://` or `https://` URL with a host, at most 2048 bytes, and nothing
/// a log line or a terminal would read as more than a URL (no whitespace or
/// control characters).
fn check_relay_url(url: &str) -> Result<(), RelayError> {
    let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
    let host_present = rest.is_some_and(|r| !r.is_empty() && !r.starts_with(['/', '?', '#', ':']));
    if url.len() > 2048 || !host_present || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid("route.relays[].url: expected an http:// or https:// URL with a host, at most 2048 bytes"));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayRef {
    pub id: String,
    pub url: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Route {
    pub account_id: String,
    pub account_key: String,
    pub revision: u64,
    pub relays: Vec<RelayRef>,
    pub issued_at: u64,
    pub signature: String,
}

impl Wire<Route> {
    /// Size, signature, identity binding and shape; returns the account key.
    pub fn check(&self, now: UnixSecs, tolerance: u64, max_bytes: usize) -> Result<VerifyingKey, RelayError> {
        self.check_size("route", max_bytes)?;
        let key = bound_account_key(&self.account_id, &self.account_key)?;
        if !(1..=2).contains(&self.relays.len()) {
            return Err(invalid("route.relays: expected 1 or 2 relays"));
        }
        for r in &self.relays {
            check_relay_id("route.relays[].id", &r.id)?;
            check_relay_url(&r.url)?;
        }
        if self.relays.len() == 2 && self.relays[0].id == self.relays[1].id {
            return Err(invalid("route.relays: duplicate relay id"));
        }
        self.verify(Tag::Route, &key)?;
        check_validity_window("route", self.issued_at, None, now, tolerance, ErrorCode::InvalidParams)?;
        Ok(key)
    }

    pub fn lists_relay(&self, relay_id: &str) -> bool {
        self.relays.iter().any(|r| r.id == relay_id)
    }
}

/// Proof that the holder of the account key asks this relay to serve the
/// account with these settings (PROTOCOL §2 *Registration*). Routes and
/// device certificates are public objects anyone can replay; this one is
/// fresh and names the relay, so a registration cannot be made from them.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Registration {
    pub account_id: String,
    pub relay_id: String,
    pub public_discovery: bool,
    pub issued_at: u64,
    pub signature: String,
}

impl Wire<Registration> {
    /// Signed by the route's `account_key`, for this account (any relay,
    /// any time: the proof an account's other home kept of its own
    /// registration).
    pub fn check_signed(&self, route: &Wire<Route>, max_bytes: usize) -> Result<(), RelayError> {
        self.check_size("registration", max_bytes)?;
        let key = bound_account_key(&route.account_id, &route.account_key)?;
        if self.account_id != route.account_id {
            return Err(invalid("registration.account_id does not match the route"));
        }
        self.verify(Tag::Registration, &key)
    }

    /// Signed by the route's `account_key`, for this account and relay,
    /// issued within `tolerance` of `now` either way.
    pub fn check(
        &self,
        route: &Wire<Route>,
        relay_id: &str,
        now: UnixSecs,
        tolerance: u64,
        max_bytes: usize,
    ) -> Result<(), RelayError> {
        self.check_size("registration", max_bytes)?;
        if self.relay_id != relay_id {
            return Err(invalid(format!("registration.relay_id must be this relay ({relay_id})")));
        }
        self.check_signed(route, max_bytes)?;
        if self.issued_at.abs_diff(now.0) > tolerance {
            return Err(invalid("registration.issued_at is not within the clock tolerance of this relay"));
        }
        Ok(())
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MessageEnvelope {
    pub message_id: String,
    pub from: String,
    pub from_device_id: String,
    pub to: String,
    pub created_at: u64,
    pub ciphertext: String,
    pub signature: String,
}

impl Wire<MessageEnvelope> {
    /// Object constraints (not the signature: that needs the device key).
    pub fn check_constraints(&self, max_ciphertext_bytes: usize) -> Result<(), RelayError> {
        check_message_id("envelope.message_id", &self.message_id)?;
        check_account_id("envelope.from", &self.from)?;
        check_account_id("envelope.to", &self.to)?;
        check_id("envelope.from_device_id", &self.from_device_id)?;
        // Size first, from the encoded length, so an oversize body is
        // refused before it is decoded.
        let len = b64_decoded_len(&self.ciphertext)
            .ok_or_else(|| invalid("envelope.ciphertext: not base64url without padding"))?;
        if len > max_ciphertext_bytes {
            return Err(RelayError::over_limit(
                "limits.max_ciphertext_bytes",
                format!("envelope.ciphertext: {len} bytes, limit {max_ciphertext_bytes}"),
            ));
        }
        if b64_decode("envelope.ciphertext", &self.ciphertext)?.is_empty() {
            return Err(invalid("envelope.ciphertext: empty"));
        }
        Ok(())
    }
}

/// Exactly `device_id` and `box` (PROTOCOL §2): a box is not signed, so
/// extra members would only travel unchecked to the recipient's devices.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyBox {
    pub device_id: String,
    #[serde(rename = "box")]
    pub key_box: String,
}

pub const MAX_BOX_BYTES: usize = 1024;

/// `recipient_boxes` / `sender_boxes`: 1..=max boxes, distinct devices,
/// each box 1..=1024 bytes.
pub fn check_boxes(field: &str, boxes: &[Wire<KeyBox>], max_boxes: usize) -> Result<(), RelayError> {
    if boxes.is_empty() {
        return Err(invalid(format!("{field}: at least one box")));
    }
    if boxes.len() > max_boxes {
        let why = format!("{field}: {} boxes, limit {max_boxes}", boxes.len());
        return Err(RelayError::over_limit("limits.max_boxes", why));
    }
    let mut seen = std::collections::HashSet::with_capacity(boxes.len());
    for b in boxes {
        check_id(&format!("{field}[].device_id"), &b.device_id)?;
        if !seen.insert(b.device_id.as_str()) {
            return Err(invalid(format!("{field}: duplicate device_id {}", b.device_id)));
        }
        let len = b64_decoded_len(&b.key_box)
            .ok_or_else(|| invalid(format!("{field}[].box: not base64url without padding")))?;
        if len > MAX_BOX_BYTES {
            return Err(RelayError::payload_too_large(format!("{field}[].box: {len} bytes, limit {MAX_BOX_BYTES}")));
        }
        if b64_decode(&format!("{field}[].box"), &b.key_box)?.is_empty() {
            return Err(invalid(format!("{field}[].box: empty")));
        }
    }
    Ok(())
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ContactGrant {
    pub grant_id: String,
    pub grantor: String,
    pub grantee: String,
    pub issued_at: u64,
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<u64>,
    pub signature: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ContactInvite {
    pub invite_id: String,
    pub issuer: String,
    pub issued_at: u64,
    pub expires_at: u64,
    pub signature: String,
}

/// The `authorization` param of a send.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Authorization {
    ContactGrant(Wire<ContactGrant>),
    ContactInvite(Wire<ContactInvite>),
}

impl Authorization {
    /// The credential's size bound (PROTOCOL §1), which a source checks
    /// without the recipient's key before it keeps the credential.
    pub fn check_size(&self, max_bytes: usize) -> Result<(), RelayError> {
        match self {
            Authorization::ContactGrant(g) => g.check_size("authorization.contact_grant", max_bytes),
            Authorization::ContactInvite(i) => i.check_size("authorization.contact_invite", max_bytes),
        }
    }

    /// Checks the credential lets `sender` deliver to `recipient`, whose
    /// account key is `recipient_key`. An oversized one is
    /// `payload_too_large`; any other failure is `forbidden`: invalid
    /// credentials never fall back to public discovery. Revocation is checked
    /// by the caller, which knows the recipient's revoked ids.
    pub fn check(
        &self,
        sender: &str,
        recipient: &str,
        recipient_key: &VerifyingKey,
        now: UnixSecs,
        tolerance: u64,
        max_bytes: usize,
    ) -> Result<(), RelayError> {
        self.check_size(max_bytes)?;
        let forbid = |why: &str| RelayError::forbidden(format!("authorization: {why}"));
        match self {
            Authorization::ContactGrant(g) => {
                check_id("grant_id", &g.grant_id).map_err(|_| forbid("malformed grant_id"))?;
                if g.grantor != recipient || g.grantee != sender {
                    return Err(forbid("grant names another account"));
                }
                g.verify(Tag::ContactGrant, recipient_key).map_err(|_| forbid("bad grant signature"))?;
                check_validity_window("grant", g.issued_at, g.expires_at, now, tolerance, ErrorCode::Forbidden)
                    .map_err(|_| forbid("grant not valid now"))
            }
            Authorization::ContactInvite(i) => {
                check_id("invite_id", &i.invite_id).map_err(|_| forbid("malformed invite_id"))?;
                if i.issuer != recipient {
                    return Err(forbid("invite names another account"));
                }
                i.verify(Tag::ContactInvite, recipient_key).map_err(|_| forbid("bad invite signature"))?;
                check_validity_window("invite", i.issued_at, Some(i.expires_at), now, tolerance, ErrorCode::Forbidden)
                    .map_err(|_| forbid("invite not valid now"))
            }
        }
    }

    /// `(kind, id)` for revocation lookups.
    pub fn revocation_key(&self) -> (&'static str, &str) {
        match self {
            Authorization::ContactGrant(g) => ("grant", &g.grant_id),
            Authorization::ContactInvite(i) => ("invite", &i.invite_id),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Delivering,
    TargetAccepted,
    Failed,
}

impl Status {
    pub fn is_terminal(self) -> bool {
        self != Status::Delivering
    }

    /// The protocol string (as serialized).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Delivering => "delivering",
            Status::TargetAccepted => "target_accepted",
            Status::Failed => "failed",
        }
    }
}

/// `DeliveryStatus` exactly as in the seed: `error` iff `failed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeliveryStatus {
    pub status: Status,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RelayError>,
    pub accepted_at: u64,
}

impl DeliveryStatus {
    pub fn delivering(accepted_at: u64) -> Self {
        DeliveryStatus { status: Status::Delivering, error: None, accepted_at }
    }
    pub fn target_accepted(accepted_at: u64) -> Self {
        DeliveryStatus { status: Status::TargetAccepted, error: None, accepted_at }
    }
    pub fn failed(accepted_at: u64, error: RelayError) -> Self {
        DeliveryStatus { status: Status::Failed, error: Some(error), accepted_at }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    Received,
    Sent,
}

/// One record of `message.timeline.sync`.
#[derive(Clone, Debug, Serialize)]
pub struct TimelineRecord<'a> {
    pub sequence: u64,
    pub direction: Direction,
    pub accepted_at: u64,
    pub expires_at: u64,
    pub envelope: &'a RawValue,
    #[serde(rename = "box")]
    pub key_box: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delivery: Option<DeliveryStatus>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorCode;

    #[test]
    fn error_is_present_when_failed_and_omitted_otherwise() {
        let failed = DeliveryStatus::failed(7, RelayError::new(ErrorCode::DeviceUnknown, "gone"));
        let v = serde_json::to_value(&failed).unwrap();
        assert_eq!(v["status"], "failed");
        assert_eq!(v["error"]["code"], "device_unknown");
        for ok in [DeliveryStatus::delivering(7), DeliveryStatus::target_accepted(7)] {
            let v = serde_json::to_value(&ok).unwrap();
            assert!(v.get("error").is_none(), "{v}");
            assert_eq!(v["accepted_at"], 7);
        }
    }

    #[test]
    fn signed_objects_keep_unknown_members_byte_for_byte() {
        let text = r#"{"invite_id":"i", "issuer":"a","issued_at":1,"expires_at":2,"signature":"s",  "x-later":[1.50,{"z":1e3}]}"#;
        let i: Wire<ContactInvite> = Wire::parse(text).unwrap();
        assert_eq!(i.raw().get(), text);
        assert_eq!(serde_json::to_string(&i).unwrap(), text);
        assert_eq!(i.invite_id, "i");
    }

    #[test]
    fn a_cloned_wire_object_shares_its_bytes_and_typed_view() {
        let text = r#"{"invite_id":"i","issuer":"a","issued_at":1,"expires_at":2,"signature":"s"}"#;
        let i: Wire<ContactInvite> = Wire::parse(text).unwrap();
        let j = i.clone();
        assert!(std::ptr::eq(i.raw(), j.raw()), "a clone copies no text");
        assert!(std::ptr::eq(&*i, &*j), "nor the typed view");
        assert_eq!(i, j);
        assert_eq!(format!("{j:?}"), format!("{i:?}"));
        assert!(format!("{i:?}").starts_with("Wire { raw: "), "{i:?}");
    }

    #[test]
    fn a_routes_relay_url_must_be_an_http_or_https_url() {
        for ok in ["http://127.0.0.1:8080", "https://relay.example/base", "https://[::1]:443/"] {
            assert!(check_relay_url(ok).is_ok(), "{ok}");
        }
        let long = format!("https://{}", "a".repeat(2048));
        for bad in [
            "",
            "relay.example",
            "ftp://relay.example",
            "javascript:alert(1)",
            "file:///etc/passwd",
            "https://",
            "https:///path",
            "http://relay.example/\u{1b}[2J",
            "http://relay.example/a b",
            "http://relay.example/\nforged line",
            long.as_str(),
        ] {
            assert_eq!(check_relay_url(bad).unwrap_err().code, ErrorCode::InvalidParams, "{bad:?}");
        }
    }

    #[test]
    fn a_signed_objects_size_bound_is_on_its_canonical_json_and_names_the_setting() {
        let alice = crate::client::Account::from_seed([3; 32]);
        let route = alice.route(1, &[("relay-a", "https://a.example")], 1000);
        let w: Wire<Route> = Wire::from_value(&route).unwrap();
        let len = w.jcs().unwrap().len();
        assert!(w.check(UnixSecs(1000), 300, len).is_ok(), "exactly the limit is accepted");
        let e = w.check(UnixSecs(1000), 300, len - 1).unwrap_err();
        assert_eq!(e.code, ErrorCode::PayloadTooLarge);
        assert_eq!(e.data.unwrap()["limit"], MAX_OBJECT_BYTES_SETTING);
        // Whitespace is not canonical JSON: the same route spread out is no larger.
        let spread = serde_json::to_string_pretty(&route).unwrap().replace('\n', "\n        ");
        let spread: Wire<Route> = Wire::parse(&spread).unwrap();
        assert!(spread.raw().get().len() > len + 100);
        assert!(spread.check(UnixSecs(1000), 300, len).is_ok());
        // A signed unknown member counts: valid signature, still refused, before it is verified.
        let padded = alice.with_member(Tag::Route, &route, "x-pad", Value::String("a".repeat(MAX_OBJECT_BYTES)));
        let padded: Wire<Route> = Wire::from_value(&padded).unwrap();
        assert!(padded.verify(Tag::Route, &alice.key.verifying_key()).is_ok());
        assert_eq!(padded.check(UnixSecs(1000), 300, MAX_OBJECT_BYTES).unwrap_err().code, ErrorCode::PayloadTooLarge);
    }

    #[test]
    fn key_boxes_have_exactly_their_two_members() {
        assert!(Wire::<KeyBox>::parse(r#"{"device_id":"p","box":"AQ","extra":1}"#).is_err());
    }

    #[test]
    fn repeated_members_and_unsafe_integers_are_refused_in_wire_objects() {
        let dup = r#"{"invite_id":"i","issuer":"a","issued_at":1,"expires_at":2,"signature":"s","x":1,"x":2}"#;
        assert!(Wire::<ContactInvite>::parse(dup).is_err());
        let big = r#"{"invite_id":"i","issuer":"a","issued_at":1,"expires_at":1152921504606846976,"signature":"s"}"#;
        assert!(Wire::<ContactInvite>::parse(big).is_err());
    }

    #[test]
    fn same_content_in_another_member_order_is_equal() {
        let a: Wire<KeyBox> = Wire::parse(r#"{"device_id":"p","box":"AQ"}"#).unwrap();
        let b: Wire<KeyBox> = Wire::parse(r#"{ "box":"AQ", "device_id":"p" }"#).unwrap();
        let c: Wire<KeyBox> = Wire::parse(r#"{"device_id":"p","box":"AA"}"#).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
    }
}
