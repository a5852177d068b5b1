//! The state of one account: the fold of its event stream. `apply` cannot
//! fail; every rule lives in `decide`.

use super::events::{AccountEvent, PushSubscription};
use ed25519_dalek::VerifyingKey;
use relay_schemas::objects::{DeviceCertificate, DeviceRevocation, Route, Wire};
use relay_schemas::sign::parse_public_key;
use relay_schemas::{AccountId, UnixSecs};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};

/// A device's certificate, and its key parsed once, when its first
/// message is checked (derived: a snapshot holds the certificate alone; a
/// device that only receives never holds the ~200 bytes of a decompressed
/// key). The certificate is kept as its text until first read: its typed
/// view (~480 bytes of strings) is a quarter of an idle actor's heap
/// (issue 44's budget, `actors/tests/actor_heap.rs`).
#[derive(Debug)]
pub struct Device {
    certificate: Mutex<Certificate>,
    key: OnceLock<Option<Box<VerifyingKey>>>,
}

#[derive(Clone, Debug)]
enum Certificate {
    /// Text that parsed once (it came from a `Wire`, or a snapshot that
    /// was checked when read), so it parses again.
    Text(Box<RawValue>),
    Parsed(Wire<DeviceCertificate>),
}

impl Device {
    fn new(certificate: &Wire<DeviceCertificate>) -> Self {
        let text = Certificate::Text(certificate.raw().to_owned());
        Device { certificate: Mutex::new(text), key: OnceLock::new() }
    }

    /// The certificate, parsed on the first read.
    pub fn certificate(&self) -> Wire<DeviceCertificate> {
        let mut held = self.certificate.lock().unwrap_or_else(|e| e.into_inner());
        if let Certificate::Text(raw) = &*held {
            let parsed = Wire::from_raw(raw.clone()).expect("a device certificate's text parsed when it was kept");
            *held = Certificate::Parsed(parsed);
        }
        match &*held {
            Certificate::Parsed(wire) => wire.clone(),
            Certificate::Text(_) => unreachable!("parsed above"),
        }
    }

    fn key(&self) -> Option<&VerifyingKey> {
        self.key
            .get_or_init(|| parse_public_key("device_key", &self.certificate().device_key).ok().map(Box::new))
            .as_deref()
    }
}

impl Clone for Device {
    fn clone(&self) -> Self {
        let held = self.certificate.lock().unwrap_or_else(|e| e.into_inner()).clone();
        Device { certificate: Mutex::new(held), key: self.key.clone() }
    }
}

/// A snapshot holds the certificate's text as it was signed.
impl Serialize for Device {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match &*self.certificate.lock().unwrap_or_else(|e| e.into_inner()) {
            Certificate::Text(raw) => raw.serialize(s),
            Certificate::Parsed(wire) => wire.serialize(s),
        }
    }
}

/// Checked as a `Wire` when read (so it parses again when first used),
/// then kept as text.
impl<'de> Deserialize<'de> for Device {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(Device::new(&Wire::<DeviceCertificate>::deserialize(d)?))
    }
}

/// A map of an account's few per-device entries, kept as a sorted Vec: it
/// costs exactly its entries where a B-tree node has room for eleven (most
/// of an idle actor's memory, with one or two devices). Serialized as a map
/// in key order, as the `BTreeMap` it replaces.
#[derive(Clone, Debug, PartialEq)]
pub struct SmallMap<V>(Vec<(String, V)>);

impl<V> Default for SmallMap<V> {
    fn default() -> Self {
        SmallMap(Vec::new())
    }
}

impl<V> SmallMap<V> {
    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }

    pub fn get(&self, key: &str) -> Option<&V> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    pub fn insert(&mut self, key: String, value: V) {
        match self.find(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => {
                self.0.reserve_exact(1);
                self.0.insert(i, (key, value));
            }
        }
    }

    /// The entry of `key`, made with its default if absent.
    pub fn entry(&mut self, key: &str) -> &mut V
    where
        V: Default,
    {
        let i = match self.find(key) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, (key.to_owned(), V::default()));
                i
            }
        };
        &mut self.0[i].1
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &V)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn values(&self) -> impl Iterator<Item = &V> {
        self.0.iter().map(|(_, v)| v)
    }

    pub fn remove(&mut self, key: &str) -> Option<V> {
        self.find(key).ok().map(|i| self.0.remove(i).1)
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.0.iter_mut().map(|(_, v)| v)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<V> std::ops::Index<&str> for SmallMap<V> {
    type Output = V;
    fn index(&self, key: &str) -> &V {
        self.get(key).unwrap_or_else(|| panic!("no entry {key:?}"))
    }
}

impl<V: Serialize> Serialize for SmallMap<V> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for SmallMap<V> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Through a BTreeMap: sorted, one entry per key, exact capacity.
        Ok(SmallMap(BTreeMap::<String, V>::deserialize(d)?.into_iter().collect()))
    }
}

#[derive(Clone, Debug, Default)]
pub struct AccountState {
    pub account_id: AccountId,
    pub route: Option<Wire<Route>>,
    /// blake3(JCS(params)) of the `account.register` that made the account
    /// here; empty when it came from the other home (`timeline.replicate`).
    pub register_digest: ParamsDigest,
    pub devices: SmallMap<Device>,
    pub public_discovery: bool,
    /// When the settings last changed (0: at registration, or before this
    /// was kept). Absent from snapshots while 0.
    pub settings_at: u64,
    /// The last timeline sequence handed out (0 = none yet).
    pub last_sequence: u64,
    /// Per-device ack cursor (`message.timeline.ack`).
    pub cursors: SmallMap<u64>,
    /// What most accounts never hold ([`Rare`]): `None` while all of it is
    /// empty.
    rare: Option<Box<Rare>>,
    /// Parsed when first asked (adding or revoking a device, a contact
    /// grant checked): an idle account does not hold the ~200 bytes of a
    /// decompressed key.
    account_key: OnceLock<Option<Box<VerifyingKey>>>,
}

/// A registration's params digest as the state holds it: the server's
/// digests (64 lowercase hex digits of a blake3 hash) as their 32 bytes
/// inline, where a `String` is a 64-byte allocation of every resident
/// actor; any other text (tests, tools) as it is. Read and written as the
/// same text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ParamsDigest {
    /// No registration of this relay's (the account came by replication).
    #[default]
    None,
    Blake3([u8; 32]),
    Text(Box<str>),
}

impl ParamsDigest {
    pub fn is_empty(&self) -> bool {
        *self == ParamsDigest::None
    }
}

impl From<&str> for ParamsDigest {
    fn from(text: &str) -> Self {
        match blake3::Hash::from_hex(text) {
            // Only the lowercase form, so the text reads back unchanged.
            Ok(hash) if hash.to_hex().as_str() == text => ParamsDigest::Blake3(*hash.as_bytes()),
            _ if text.is_empty() => ParamsDigest::None,
            _ => ParamsDigest::Text(text.into()),
        }
    }
}

impl PartialEq<str> for ParamsDigest {
    fn eq(&self, text: &str) -> bool {
        match self {
            ParamsDigest::None => text.is_empty(),
            ParamsDigest::Blake3(bytes) => blake3::Hash::from_bytes(*bytes).to_hex().as_str() == text,
            ParamsDigest::Text(own) => **own == *text,
        }
    }
}

impl PartialEq<&str> for ParamsDigest {
    fn eq(&self, text: &&str) -> bool {
        *self == **text
    }
}

impl Serialize for ParamsDigest {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            ParamsDigest::None => s.serialize_str(""),
            ParamsDigest::Blake3(bytes) => s.serialize_str(blake3::Hash::from_bytes(*bytes).to_hex().as_str()),
            ParamsDigest::Text(text) => s.serialize_str(text),
        }
    }
}

impl<'de> Deserialize<'de> for ParamsDigest {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(ParamsDigest::from(<std::borrow::Cow<'de, str>>::deserialize(d)?.as_ref()))
    }
}

/// The parts of an account's state most accounts never write, in one
/// allocation made when one is first written: four empty collections
/// inline are 96 bytes of every resident actor, and an idle actor's bytes
/// inline are what decide the size class of actix's task holding it
/// (issue 44's budget, `actors/tests/actor_heap.rs`).
#[derive(Clone, Debug, Default)]
struct Rare {
    revocations: SmallMap<Wire<DeviceRevocation>>,
    /// Revoked contact credentials as `grant:{id}` / `invite:{id}`.
    revoked_contacts: BTreeSet<String>,
    /// Per-device Web Push subscription (PROTOCOL §9).
    push: SmallMap<PushSubscription>,
    /// Per partner home relay: how far replication went each way
    /// (`timeline.replicate`).
    replicas: SmallMap<Replica>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        self.revocations.is_empty()
            && self.revoked_contacts.is_empty()
            && self.push.is_empty()
            && self.replicas.is_empty()
    }
}

/// What an account without any of [`Rare`] reads.
static NO_RARE: Rare = Rare {
    revocations: SmallMap(Vec::new()),
    revoked_contacts: BTreeSet::new(),
    push: SmallMap(Vec::new()),
    replicas: SmallMap(Vec::new()),
};

/// A snapshot of the state, as written before [`Rare`] was apart: the
/// same members in the same order, so snapshot bytes are unchanged.
#[derive(Serialize)]
struct SnapshotOut<'a> {
    account_id: &'a AccountId,
    route: &'a Option<Wire<Route>>,
    register_digest: &'a ParamsDigest,
    devices: &'a SmallMap<Device>,
    revocations: &'a SmallMap<Wire<DeviceRevocation>>,
    public_discovery: bool,
    /// Absent while 0.
    #[serde(skip_serializing_if = "is_zero")]
    settings_at: u64,
    revoked_contacts: &'a BTreeSet<String>,
    last_sequence: u64,
    cursors: &'a SmallMap<u64>,
    /// Absent while empty, so snapshots of accounts that never subscribed
    /// are as before push.
    #[serde(skip_serializing_if = "is_empty_map")]
    push: &'a SmallMap<PushSubscription>,
    /// Absent while empty.
    #[serde(skip_serializing_if = "is_empty_map")]
    replicas: &'a SmallMap<Replica>,
}

/// A snapshot as read: [`SnapshotOut`]'s members, the same ones required.
#[derive(Deserialize)]
struct SnapshotIn {
    account_id: AccountId,
    route: Option<Wire<Route>>,
    register_digest: ParamsDigest,
    devices: SmallMap<Device>,
    revocations: SmallMap<Wire<DeviceRevocation>>,
    public_discovery: bool,
    #[serde(default)]
    settings_at: u64,
    revoked_contacts: BTreeSet<String>,
    last_sequence: u64,
    cursors: SmallMap<u64>,
    #[serde(default)]
    push: SmallMap<PushSubscription>,
    #[serde(default)]
    replicas: SmallMap<Replica>,
}

fn is_empty_map<V>(m: &&SmallMap<V>) -> bool {
    m.is_empty()
}

impl Serialize for AccountState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let rare = self.rare();
        SnapshotOut {
            account_id: &self.account_id,
            route: &self.route,
            register_digest: &self.register_digest,
            devices: &self.devices,
            revocations: &rare.revocations,
            public_discovery: self.public_discovery,
            settings_at: self.settings_at,
            revoked_contacts: &rare.revoked_contacts,
            last_sequence: self.last_sequence,
            cursors: &self.cursors,
            push: &rare.push,
            replicas: &rare.replicas,
        }
        .serialize(s)
    }
}

impl<'de> Deserialize<'de> for AccountState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = SnapshotIn::deserialize(d)?;
        let rare = Rare {
            revocations: s.revocations,
            revoked_contacts: s.revoked_contacts,
            push: s.push,
            replicas: s.replicas,
        };
        Ok(AccountState {
            account_id: s.account_id,
            route: s.route,
            register_digest: s.register_digest,
            devices: s.devices,
            public_discovery: s.public_discovery,
            settings_at: s.settings_at,
            last_sequence: s.last_sequence,
            cursors: s.cursors,
            rare: (!rare.is_empty()).then(|| Box::new(rare)),
            account_key: OnceLock::new(),
        })
    }
}

/// Replication with one partner home relay: `pulled`, this relay's cursor
/// in the partner's stream (what it applied); `served`, the end of the
/// last page it sent the partner; `acked`, what the partner acknowledged
/// storing (the synced items are those through `acked`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub pulled: u64,
    pub served: u64,
    pub acked: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn contact_key(kind: &str, id: &str) -> String {
    format!("{kind}:{id}")
}

impl AccountState {
    pub fn new(account_id: impl Into<AccountId>) -> Self {
        AccountState { account_id: account_id.into(), ..Default::default() }
    }

    fn rare(&self) -> &Rare {
        self.rare.as_deref().unwrap_or(&NO_RARE)
    }

    /// [`Rare`] to write into, made when first written.
    fn rare_mut(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Default::default)
    }

    /// Drops [`Rare`] once all of it is empty again.
    fn rare_rest(&mut self) {
        if self.rare.as_ref().is_some_and(|r| r.is_empty()) {
            self.rare = None;
        }
    }

    /// Revoked devices' revocations.
    pub fn revocations(&self) -> &SmallMap<Wire<DeviceRevocation>> {
        &self.rare().revocations
    }

    /// Revoked contact credentials as `grant:{id}` / `invite:{id}`.
    pub fn revoked_contacts(&self) -> &BTreeSet<String> {
        &self.rare().revoked_contacts
    }

    /// Per-device Web Push subscription (PROTOCOL §9).
    pub fn push(&self) -> &SmallMap<PushSubscription> {
        &self.rare().push
    }

    /// Per partner home relay: how far replication went each way.
    pub fn replicas(&self) -> &SmallMap<Replica> {
        &self.rare().replicas
    }

    pub fn is_registered(&self) -> bool {
        self.route.is_some()
    }

    pub fn route(&self) -> Option<&Wire<Route>> {
        self.route.as_ref()
    }

    pub fn account_key(&self) -> Option<&VerifyingKey> {
        self.account_key
            .get_or_init(|| {
                let route = self.route.as_ref()?;
                parse_public_key("account_key", &route.account_key).ok().map(Box::new)
            })
            .as_deref()
    }

    /// A device is valid when its certificate is on file, unrevoked and
    /// unexpired.
    pub fn device_key(&self, device_id: &str, now: UnixSecs) -> Option<&VerifyingKey> {
        let device = self.devices.get(device_id)?;
        if self.revocations().contains_key(device_id) || device.certificate().is_expired(now) {
            return None;
        }
        device.key()
    }

    /// A device valid at `at` (an envelope's `created_at`), not only now:
    /// its certificate on file, issued by then (within `tolerance`) and
    /// not expired then, and no revocation dated at or before then.
    pub fn device_key_at(&self, device_id: &str, at: UnixSecs, tolerance: u64) -> Option<&VerifyingKey> {
        let device = self.devices.get(device_id)?;
        let cert = device.certificate();
        if cert.issued_at > at.plus(tolerance).0 || cert.is_expired(at) {
            return None;
        }
        if self.revocations().get(device_id).is_some_and(|r| r.revoked_at <= at.0) {
            return None;
        }
        device.key()
    }

    pub fn certificate(&self, device_id: &str) -> Option<Wire<DeviceCertificate>> {
        self.devices.get(device_id).map(Device::certificate)
    }

    pub fn certificates(&self) -> impl Iterator<Item = Wire<DeviceCertificate>> + '_ {
        self.devices.values().map(Device::certificate)
    }

    pub fn device_valid(&self, device_id: &str, now: UnixSecs) -> bool {
        self.device_key(device_id, now).is_some()
    }

    /// Forgets the derived keys after loading a snapshot (each is parsed
    /// again when first asked).
    pub fn rebuild_caches(&mut self) {
        for device in self.devices.values_mut() {
            device.key = OnceLock::new();
        }
        self.account_key = OnceLock::new();
    }

    /// Replication with `partner` so far (all zero before any).
    pub fn replica(&self, partner: &str) -> Replica {
        self.replicas().get(partner).copied().unwrap_or_default()
    }

    fn replica_mut(&mut self, partner: &str) -> &mut Replica {
        self.rare_mut().replicas.entry(partner)
    }

    fn add_device(&mut self, cert: &Wire<DeviceCertificate>) {
        self.devices.insert(cert.device_id.clone(), Device::new(cert));
    }

    pub fn apply(&mut self, event: &AccountEvent) {
        match event {
            AccountEvent::Registered { route, device_certificate, public_discovery, params_digest, .. } => {
                self.account_key = OnceLock::new();
                self.route = Some(route.clone());
                self.register_digest = ParamsDigest::from(params_digest.as_str());
                self.public_discovery = *public_discovery;
                self.add_device(device_certificate);
            }
            AccountEvent::DeviceAdded { device_certificate } => self.add_device(device_certificate),
            AccountEvent::DeviceRevoked { revocation } => {
                let rare = self.rare_mut();
                rare.revocations.insert(revocation.device_id.clone(), revocation.clone());
                // A revoked device is never woken again.
                rare.push.remove(&revocation.device_id);
            }
            AccountEvent::SettingsUpdated { public_discovery, at } => {
                self.public_discovery = *public_discovery;
                self.settings_at = at.unwrap_or(self.settings_at);
            }
            AccountEvent::RouteUpdated { route } => self.route = Some(route.clone()),
            AccountEvent::ContactRevoked { kind, id } => {
                self.rare_mut().revoked_contacts.insert(contact_key(kind, id));
            }
            AccountEvent::MessageSent { record, .. } => {
                if let Some(r) = record {
                    self.last_sequence = r.sequence;
                }
            }
            AccountEvent::SelfDelivered { record, .. } | AccountEvent::MessageReceived { record, .. } => {
                self.last_sequence = record.sequence;
            }
            // The idempotency results live in the ledger (`ledger.rs`).
            AccountEvent::DeliveryUpdated { .. } => {}
            AccountEvent::CursorMoved { device_id, through } => {
                self.cursors.insert(device_id.clone(), *through);
            }
            AccountEvent::PushSubscribed { device_id, subscription } => {
                self.rare_mut().push.insert(device_id.clone(), subscription.clone());
            }
            AccountEvent::PushUnsubscribed { device_id, .. } => {
                if let Some(rare) = &mut self.rare {
                    rare.push.remove(device_id);
                }
                self.rare_rest();
            }
            AccountEvent::Replicated { event, .. } => {
                self.apply(event);
                if let AccountEvent::Registered { .. } = **event {
                    // Registered at the other home: no registration request
                    // of this relay's to compare a repeat with.
                    self.register_digest = ParamsDigest::None;
                }
            }
            AccountEvent::ReplicaPulled { partner, through } => self.replica_mut(partner).pulled = *through,
            AccountEvent::ReplicaServed { partner, through } => self.replica_mut(partner).served = *through,
            AccountEvent::ReplicaAcked { partner, through } => self.replica_mut(partner).acked = *through,
            AccountEvent::ReplicaReset { partner } => {
                let r = self.replica_mut(partner);
                (r.served, r.acked) = (0, 0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! `apply` and snapshots.

    use super::*;
    use crate::account::testkit::*;

    /// What a relay restoring from a snapshot does: serde round trip of the
    /// state, then the derived caches. The ledger stays in the store.
    fn snapshot_round_trip(s: &Given) -> Given {
        let bytes = serde_json::to_vec(&s.state).expect("snapshot serializes");
        let mut restored: AccountState = serde_json::from_slice(&bytes).expect("snapshot deserializes");
        restored.rebuild_caches();
        Given { state: restored, ..s.clone() }
    }

    #[test]
    fn a_snapshot_decides_exactly_like_the_state_it_was_taken_from() {
        let original = busy_alice();
        let restored = snapshot_round_trip(&original);
        let (before, after) = (decisions(&original), decisions(&restored));
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            assert_eq!(b, a, "decision {i} differs after the snapshot");
        }
        // And the decisions compared are the interesting ones.
        then_send_duplicate(when_send(&restored, "phone", &alice_to_bob(1), at(NOW + 5)));
        then_receive_duplicate(when_receive(&restored, &bob_to_alice(3), at(NOW + 5)));
        assert!(restored.device_valid("phone", UnixSecs(NOW + 5)));
        assert!(!restored.device_valid("laptop", UnixSecs(NOW + 5)));
        assert!(restored.device_valid("tablet", UnixSecs(NOW + 5)));
        assert!(!restored.device_valid("tablet", UnixSecs(NOW + 100)));
        then_no_events(add_device(&restored, &wire(&cert(&alice(), &phone())), at(NOW + 5)));
        then_no_events(when_register(&restored, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5)));
        assert_eq!(
            then_events(revoke_device(&restored, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))).len(),
            1
        );
        let (event, _) = then_accepted(when_receive(&restored, &bob_to_alice_without_auth(14), at(NOW + 5)));
        assert_eq!(record_of(&event).sequence, 4);
        assert_eq!(record_of(&event).visible, strings(&["phone"]));
    }

    #[test]
    fn a_snapshot_keeps_signed_objects_byte_for_byte() {
        // A certificate with an unknown member, covered by its signature.
        let mut with_extra = cert(&alice(), &tablet());
        with_extra["x-future"] = json!({"b": 1, "a": [2, 1]});
        let with_extra = signed(Tag::DeviceCertificate, with_extra, &alice().key);
        let s = given_alice([]);
        assert_eq!(then_events(add_device(&s, &wire(&with_extra), at(NOW))).len(), 1);
        let s = given_alice([device_added_cert(&with_extra)]);
        let restored = snapshot_round_trip(&s);
        assert_eq!(restored.devices["tablet"].certificate().raw().get(), s.devices["tablet"].certificate().raw().get());
        then_no_events(add_device(&restored, &wire(&with_extra), at(NOW)));
        assert!(restored.device_valid("tablet", UnixSecs(NOW)));
    }

    #[test]
    fn apply_folds_registration_into_a_usable_account() {
        let s = given(&alice(), &[registered(&alice(), &phone())]);
        assert_eq!(s.route().map(|r| r.revision), Some(1));
        assert!(s.account_key().is_some());
        assert!(s.devices.contains_key("phone"));
        let _: &Wire<Route> = s.route().unwrap();
        let _: Wire<DeviceCertificate> = s.devices["phone"].certificate();
    }

    #[test]
    fn a_snapshot_holds_no_idempotency_results() {
        let s = busy_alice();
        assert!(!s.ledger.sends.is_empty() && !s.ledger.receipts.is_empty());
        let snapshot = serde_json::to_value(&s.state).unwrap();
        assert!(snapshot.get("sends").is_none() && snapshot.get("receipts").is_none(), "{snapshot}");
    }

    #[test]
    fn the_rarely_written_parts_take_no_allocation_until_written_and_snapshot_in_their_old_places() {
        let members = |s: &AccountState| {
            let v = serde_json::to_value(s).unwrap();
            v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
        };
        let plain = given_alice([]);
        assert!(plain.rare.is_none());
        let text = serde_json::to_string(&plain.state).unwrap();
        assert!(text.contains(r#""revocations":{},"public_discovery""#), "{text}");
        assert!(text.contains(r#""revoked_contacts":[],"last_sequence""#), "{text}");
        assert!(!text.contains("push") && !text.contains("replicas"), "{text}");
        let all = given_alice([
            subscribed("phone", 1),
            device_revoked(&alice(), "laptop"),
            contact_revoked("grant", "g1"),
            AccountEvent::ReplicaPulled { partner: "relay-b".into(), through: 3 },
        ]);
        let order = [
            "account_id",
            "route",
            "register_digest",
            "devices",
            "revocations",
            "public_discovery",
            "revoked_contacts",
            "last_sequence",
            "cursors",
            "push",
            "replicas",
        ];
        // serde_json's map is sorted: compare the written order instead.
        let text = serde_json::to_string(&all.state).unwrap();
        let at = |k: &str| text.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("{k} missing: {text}"));
        assert!(order.windows(2).all(|w| at(w[0]) < at(w[1])), "{text}");
        assert_eq!(members(&snapshot_round_trip(&all).state), members(&all.state));
        let restored = snapshot_round_trip(&all);
        assert!(restored.revocations().contains_key("laptop") && restored.push().contains_key("phone"));
        assert!(restored.revoked_contacts().contains("grant:g1") && restored.replica("relay-b").pulled == 3);
        // The last subscription gone, nothing rare is left: the allocation goes.
        let mut s = given_alice([subscribed("phone", 1)]);
        assert!(s.rare.is_some());
        s.state.apply(&AccountEvent::PushUnsubscribed {
            device_id: "phone".into(),
            endpoint: "e".into(),
            reason: "r".into(),
        });
        assert!(s.rare.is_none());
    }

    #[test]
    fn a_registration_digest_reads_and_writes_as_the_text_it_was_and_compares_with_it() {
        use crate::account::state::ParamsDigest;
        let hex = blake3::hash(b"params").to_hex().to_string();
        for text in [hex.as_str(), &hex.to_uppercase(), "bench", "", &hex[..62]] {
            let d = ParamsDigest::from(text);
            assert!(d == text && d != "other", "{text:?}");
            assert_eq!(d.is_empty(), text.is_empty());
            let json = serde_json::to_string(&d).unwrap();
            assert_eq!(json, serde_json::to_string(text).unwrap());
            assert_eq!(serde_json::from_str::<ParamsDigest>(&json).unwrap(), d);
        }
        assert!(matches!(ParamsDigest::from(hex.as_str()), ParamsDigest::Blake3(_)), "held as its bytes");
        assert!(matches!(ParamsDigest::from(hex.to_uppercase().as_str()), ParamsDigest::Text(_)));
    }

    #[test]
    fn a_small_map_reads_and_writes_as_the_btree_map_it_replaces() {
        use crate::account::state::SmallMap;
        let json = r#"{"tablet":3,"laptop":1,"phone":2,"laptop":4}"#;
        let small: SmallMap<u64> = serde_json::from_str(json).unwrap();
        let btree: std::collections::BTreeMap<String, u64> = serde_json::from_str(json).unwrap();
        assert_eq!(serde_json::to_string(&small).unwrap(), serde_json::to_string(&btree).unwrap());
        let mut m = SmallMap::default();
        for (k, v) in [("phone", 1), ("laptop", 2), ("phone", 3)] {
            m.insert(k.to_string(), v);
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), [("laptop", &2), ("phone", &3)]);
        assert_eq!((m["phone"], m.get("tablet"), m.len()), (3, None, 2));
    }
}
