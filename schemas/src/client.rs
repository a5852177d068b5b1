//! Building and signing protocol objects as a client does: used by the
//! example client, the load benchmark and the tests. Pure: the caller
//! supplies keys and times.

use crate::encoding::b64_encode;
use crate::ids::account_id_of;
use crate::sign::{sign_object, SessionProof, Tag};
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Map, Value};

fn signed(tag: Tag, v: Value, key: &SigningKey) -> Value {
    let mut m: Map<String, Value> = match v {
        Value::Object(m) => m,
        _ => unreachable!("objects only"),
    };
    sign_object(tag, &mut m, key);
    Value::Object(m)
}

/// An account: its Ed25519 key and derived id.
#[derive(Clone)]
pub struct Account {
    pub key: SigningKey,
    pub id: String,
}

/// A device of an account: its signing key and X25519 box key.
#[derive(Clone)]
pub struct Device {
    pub id: String,
    pub key: SigningKey,
    pub box_key: [u8; 32],
    /// The X25519 secret behind `box_key`, for devices that read messages
    /// (`relay-e2e/v1`); `None` where the box key is only a placeholder.
    pub box_secret: Option<[u8; 32]>,
}

impl Account {
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let id = account_id_of(key.verifying_key().as_bytes());
        Account { key, id }
    }

    pub fn public_key(&self) -> String {
        b64_encode(self.key.verifying_key().as_bytes())
    }

    /// A signed Route listing `relays` as `(id, url)`.
    pub fn route(&self, revision: u64, relays: &[(&str, &str)], issued_at: u64) -> Value {
        let relays: Vec<Value> = relays.iter().map(|(id, url)| json!({"id": id, "url": url})).collect();
        signed(
            Tag::Route,
            json!({"account_id": self.id, "account_key": self.public_key(), "revision": revision,
                   "relays": relays, "issued_at": issued_at}),
            &self.key,
        )
    }

    /// A signed Registration asking `relay_id` to serve this account.
    pub fn registration(&self, relay_id: &str, public_discovery: bool, issued_at: u64) -> Value {
        signed(
            Tag::Registration,
            json!({"account_id": self.id, "relay_id": relay_id, "public_discovery": public_discovery,
                   "issued_at": issued_at}),
            &self.key,
        )
    }

    /// `account.register` params: this route and first device's certificate,
    /// with a registration for `relay_id` issued at `now`.
    pub fn register_params(
        &self,
        route: &Value,
        cert: &Value,
        relay_id: &str,
        public_discovery: bool,
        now: u64,
    ) -> Value {
        json!({"route": route, "device_certificate": cert,
               "registration": self.registration(relay_id, public_discovery, now)})
    }

    pub fn certificate(&self, device: &Device, issued_at: u64, expires_at: Option<u64>) -> Value {
        let mut v = json!({"account_id": self.id, "account_key": self.public_key(), "device_id": device.id,
                           "device_key": device.public_key(), "box_key": b64_encode(&device.box_key),
                           "issued_at": issued_at});
        if let Some(e) = expires_at {
            v["expires_at"] = json!(e);
        }
        signed(Tag::DeviceCertificate, v, &self.key)
    }

    pub fn revocation(&self, device_id: &str, revoked_at: u64) -> Value {
        signed(
            Tag::DeviceRevocation,
            json!({"account_id": self.id, "device_id": device_id, "revoked_at": revoked_at}),
            &self.key,
        )
    }

    /// A ContactGrant from this account (the recipient) to `grantee`.
    pub fn grant(&self, grant_id: &str, grantee: &str, issued_at: u64, expires_at: Option<u64>) -> Value {
        let mut v = json!({"grant_id": grant_id, "grantor": self.id, "grantee": grantee, "issued_at": issued_at});
        if let Some(e) = expires_at {
            v["expires_at"] = json!(e);
        }
        signed(Tag::ContactGrant, v, &self.key)
    }

    /// `object` (one this account signs under `tag`) with member `name`
    /// set to `value`, signed again: an unknown member the signature
    /// covers, which a relay keeps byte for byte. Tests and examples use it
    /// to make valid objects of a chosen size.
    pub fn with_member(&self, tag: Tag, object: &Value, name: &str, value: Value) -> Value {
        let mut v = object.clone();
        v[name] = value;
        signed(tag, v, &self.key)
    }

    pub fn invite(&self, invite_id: &str, issued_at: u64, expires_at: u64) -> Value {
        signed(
            Tag::ContactInvite,
            json!({"invite_id": invite_id, "issuer": self.id, "issued_at": issued_at, "expires_at": expires_at}),
            &self.key,
        )
    }
}

impl Device {
    /// A device whose box key is a placeholder (no X25519 work: load
    /// tests make millions of these and never decrypt).
    pub fn from_seed(id: &str, seed: [u8; 32]) -> Self {
        let mut box_key = *blake3::hash(&seed).as_bytes();
        box_key[0] ^= 1;
        Device { id: id.into(), key: SigningKey::from_bytes(&seed), box_key, box_secret: None }
    }

    /// A device that can read `relay-e2e/v1` messages: `box_key` is the
    /// X25519 public key of `box_secret`.
    pub fn with_box_secret(id: &str, seed: [u8; 32], box_secret: [u8; 32]) -> Self {
        let box_key = crate::e2e::box_public(&box_secret);
        Device { id: id.into(), key: SigningKey::from_bytes(&seed), box_key, box_secret: Some(box_secret) }
    }

    pub fn public_key(&self) -> String {
        b64_encode(self.key.verifying_key().as_bytes())
    }

    /// A signed MessageEnvelope from this device of `from` to `to`.
    pub fn envelope(&self, from: &str, to: &str, message_id: &str, created_at: u64, ciphertext: &[u8]) -> Value {
        signed(
            Tag::Envelope,
            json!({"message_id": message_id, "from": from, "from_device_id": self.id, "to": to,
                   "created_at": created_at, "ciphertext": b64_encode(ciphertext)}),
            &self.key,
        )
    }

    /// The `session.open` signature over `{account_id, device_id, challenge, relay_id}`.
    pub fn session_proof(&self, account_id: &str, challenge: &str, relay_id: &str) -> String {
        let proof = SessionProof { account_id, device_id: &self.id, challenge, relay_id };
        b64_encode(&self.key.sign(&proof.signed_bytes().expect("canonical")).to_bytes())
    }
}

/// A key box for `device_id` holding opaque bytes.
pub fn key_box(device_id: &str, bytes: &[u8]) -> Value {
    json!({"device_id": device_id, "box": b64_encode(bytes)})
}
