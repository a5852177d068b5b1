//! The state of one account: the fold of its event stream. `apply` cannot
//! fail; every rule lives in `decide`.

use super::events::{AccountEvent, PushSubscription};
use ed25519_dalek::VerifyingKey;
use relay_schemas::objects::{DeviceCertificate, DeviceRevocation, Route};
use relay_schemas::sign::parse_public_key;
use relay_schemas::{AccountId, UnixSecs, Wire};
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

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AccountState {
    pub account_id: AccountId,
    pub route: Option<Wire<Route>>,
    /// blake3(JCS(params)) of the `account.register` that made the account
    /// here; empty when it came from the other home (`timeline.replicate`).
    pub register_digest: String,
    pub devices: SmallMap<Device>,
    pub revocations: SmallMap<Wire<DeviceRevocation>>,
    pub public_discovery: bool,
    /// When the settings last changed (0: at registration, or before this
    /// was kept). Absent from snapshots while 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub settings_at: u64,
    /// Revoked contact credentials as `grant:{id}` / `invite:{id}`.
    pub revoked_contacts: BTreeSet<String>,
    /// The last timeline sequence handed out (0 = none yet).
    pub last_sequence: u64,
    /// Per-device ack cursor (`message.timeline.ack`).
    pub cursors: SmallMap<u64>,
    /// Per-device Web Push subscription (PROTOCOL §9). Absent from
    /// snapshots while empty, so snapshots of accounts that never
    /// subscribed are as before.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    pub push: SmallMap<PushSubscription>,
    /// Per partner home relay: how far replication went each way
    /// (`timeline.replicate`). Absent from snapshots while empty.
    #[serde(default, skip_serializing_if = "SmallMap::is_empty")]
    pub replicas: SmallMap<Replica>,
    /// Parsed when first asked (adding or revoking a device, a contact
    /// grant checked): an idle account does not hold the ~200 bytes of a
    /// decompressed key.
    #[serde(skip)]
    account_key: OnceLock<Option<Box<VerifyingKey>>>,
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
        if self.revocations.contains_key(device_id) || device.certificate().is_expired(now) {
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
        if self.revocations.get(device_id).is_some_and(|r| r.revoked_at <= at.0) {
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
        self.replicas.get(partner).copied().unwrap_or_default()
    }

    fn replica_mut(&mut self, partner: &str) -> &mut Replica {
        self.replicas.entry(partner)
    }

    fn add_device(&mut self, cert: &Wire<DeviceCertificate>) {
        self.devices.insert(cert.device_id.clone(), Device::new(cert));
    }

    pub fn apply(&mut self, event: &AccountEvent) {
        match event {
            AccountEvent::Registered { route, device_certificate, public_discovery, params_digest, .. } => {
                self.account_key = OnceLock::new();
                self.route = Some(route.clone());
                self.register_digest = params_digest.clone();
                self.public_discovery = *public_discovery;
                self.add_device(device_certificate);
            }
            AccountEvent::DeviceAdded { device_certificate } => self.add_device(device_certificate),
            AccountEvent::DeviceRevoked { revocation } => {
                self.revocations.insert(revocation.device_id.clone(), revocation.clone());
                // A revoked device is never woken again.
                self.push.remove(&revocation.device_id);
            }
            AccountEvent::SettingsUpdated { public_discovery, at } => {
                self.public_discovery = *public_discovery;
                self.settings_at = at.unwrap_or(self.settings_at);
            }
            AccountEvent::RouteUpdated { route } => self.route = Some(route.clone()),
            AccountEvent::ContactRevoked { kind, id } => {
                self.revoked_contacts.insert(contact_key(kind, id));
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
                self.push.insert(device_id.clone(), subscription.clone());
            }
            AccountEvent::PushUnsubscribed { device_id, .. } => {
                self.push.remove(device_id);
            }
            AccountEvent::Replicated { event, .. } => {
                self.apply(event);
                if let AccountEvent::Registered { .. } = **event {
                    // Registered at the other home: no registration request
                    // of this relay's to compare a repeat with.
                    self.register_digest.clear();
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
