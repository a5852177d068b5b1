//! The state of one account: the fold of its event stream. `apply` cannot
//! fail; every rule lives in `decide`.

use super::events::AccountEvent;
use ed25519_dalek::VerifyingKey;
use relay_schemas::objects::{DeviceCertificate, DeviceRevocation, Route};
use relay_schemas::sign::parse_public_key;
use relay_schemas::{DeliveryStatus, Wire};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The acceptance result of one `message.send`, kept for idempotency and
/// `message.delivery.status` until `retention_until`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SendEntry {
    pub digest: String,
    pub to: String,
    pub deadline: u64,
    pub retention_until: u64,
    pub status: DeliveryStatus,
    pub sequence: Option<u64>,
}

/// The acceptance result of one received message (key `(from, message_id)`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReceiptEntry {
    pub digest: String,
    pub accepted_at: u64,
    pub retention_until: u64,
    pub sequence: u64,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AccountState {
    pub account_id: String,
    pub route: Option<Wire<Route>>,
    pub register_digest: String,
    pub devices: BTreeMap<String, Wire<DeviceCertificate>>,
    pub revocations: BTreeMap<String, Wire<DeviceRevocation>>,
    pub public_discovery: bool,
    /// Revoked contact credentials as `grant:{id}` / `invite:{id}`.
    pub revoked_contacts: BTreeSet<String>,
    /// The last timeline sequence handed out (0 = none yet).
    pub last_sequence: u64,
    pub sends: HashMap<String, SendEntry>,
    /// Keyed by `{from}/{message_id}`.
    pub receipts: HashMap<String, ReceiptEntry>,
    /// Per-device ack cursor (`message.timeline.ack`).
    pub cursors: BTreeMap<String, u64>,
    /// Parsed keys, derived from the certificates (not stored).
    #[serde(skip)]
    keys: HashMap<String, VerifyingKey>,
    #[serde(skip)]
    account_key: Option<VerifyingKey>,
}

pub fn receipt_key(from: &str, message_id: &str) -> String {
    format!("{from}/{message_id}")
}

pub fn contact_key(kind: &str, id: &str) -> String {
    format!("{kind}:{id}")
}

impl AccountState {
    pub fn new(account_id: impl Into<String>) -> Self {
        AccountState { account_id: account_id.into(), ..Default::default() }
    }

    pub fn is_registered(&self) -> bool {
        self.route.is_some()
    }

    pub fn route(&self) -> Option<&Wire<Route>> {
        self.route.as_ref()
    }

    pub fn account_key(&self) -> Option<&VerifyingKey> {
        self.account_key.as_ref()
    }

    /// A device is valid when its certificate is on file, unrevoked and
    /// unexpired.
    pub fn device_key(&self, device_id: &str, now: u64) -> Option<&VerifyingKey> {
        let cert = self.devices.get(device_id)?;
        if self.revocations.contains_key(device_id) || cert.is_expired(now) {
            return None;
        }
        self.keys.get(device_id)
    }

    pub fn device_valid(&self, device_id: &str, now: u64) -> bool {
        self.device_key(device_id, now).is_some()
    }

    /// Rebuilds the derived caches after loading a snapshot.
    pub fn rebuild_caches(&mut self) {
        self.keys = self
            .devices
            .iter()
            .filter_map(|(id, c)| Some((id.clone(), parse_public_key("device_key", &c.device_key).ok()?)))
            .collect();
        self.account_key = self.route.as_ref().and_then(|r| parse_public_key("account_key", &r.account_key).ok());
    }

    fn add_device(&mut self, cert: &Wire<DeviceCertificate>) {
        if let Ok(key) = parse_public_key("device_key", &cert.device_key) {
            self.keys.insert(cert.device_id.clone(), key);
        }
        self.devices.insert(cert.device_id.clone(), cert.clone());
    }

    pub fn apply(&mut self, event: &AccountEvent) {
        match event {
            AccountEvent::Registered { route, device_certificate, public_discovery, params_digest } => {
                self.account_key = parse_public_key("account_key", &route.account_key).ok();
                self.route = Some(route.clone());
                self.register_digest = params_digest.clone();
                self.public_discovery = *public_discovery;
                self.add_device(device_certificate);
            }
            AccountEvent::DeviceAdded { device_certificate } => self.add_device(device_certificate),
            AccountEvent::DeviceRevoked { revocation } => {
                self.revocations.insert(revocation.device_id.clone(), revocation.clone());
            }
            AccountEvent::SettingsUpdated { public_discovery } => self.public_discovery = *public_discovery,
            AccountEvent::RouteUpdated { route } => self.route = Some(route.clone()),
            AccountEvent::ContactRevoked { kind, id } => {
                self.revoked_contacts.insert(contact_key(kind, id));
            }
            AccountEvent::MessageSent { message_id, to, digest, accepted_at, deadline, retention_until, record } => {
                if let Some(r) = record {
                    self.last_sequence = r.sequence;
                }
                self.sends.insert(
                    message_id.clone(),
                    SendEntry {
                        digest: digest.clone(),
                        to: to.clone(),
                        deadline: *deadline,
                        retention_until: *retention_until,
                        status: DeliveryStatus::delivering(*accepted_at),
                        sequence: record.as_ref().map(|r| r.sequence),
                    },
                );
            }
            AccountEvent::SelfDelivered { message_id, digest, accepted_at, retention_until, record } => {
                self.last_sequence = record.sequence;
                self.sends.insert(
                    message_id.clone(),
                    SendEntry {
                        digest: digest.clone(),
                        to: self.account_id.clone(),
                        deadline: *accepted_at,
                        retention_until: *retention_until,
                        status: DeliveryStatus::target_accepted(*accepted_at),
                        sequence: Some(record.sequence),
                    },
                );
            }
            AccountEvent::MessageReceived { from, message_id, digest, accepted_at, retention_until, record } => {
                self.last_sequence = record.sequence;
                self.receipts.insert(
                    receipt_key(from, message_id),
                    ReceiptEntry {
                        digest: digest.clone(),
                        accepted_at: *accepted_at,
                        retention_until: *retention_until,
                        sequence: record.sequence,
                    },
                );
            }
            AccountEvent::DeliveryUpdated { message_id, status } => {
                if let Some(entry) = self.sends.get_mut(message_id) {
                    entry.status = status.clone();
                }
            }
            AccountEvent::CursorMoved { device_id, through } => {
                self.cursors.insert(device_id.clone(), *through);
            }
        }
    }
}
