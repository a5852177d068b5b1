//! The idempotency ledger: the result of every accepted `message.send` and
//! every received message, kept until its `retention_until` for idempotent
//! retries and `message.delivery.status`.
//!
//! It lives in the store, not in the actor, so an account's memory and
//! snapshot do not grow with its history. Entries are blobs (values the
//! store keeps in its log, with a pointer in sled's leaves), under keys of
//! one length per account:
//!
//! - `l/{account_id}/` ‖ 16 bytes of `blake3("s", message_id)` → [`SendEntry`]
//! - `l/{account_id}/` ‖ 16 bytes of `blake3("r", from, message_id)` →
//!   [`ReceiptEntry`]
//! - kv `l/{account_id}/v` → [`VERSION`]: the ledger holds every entry the
//!   account's events give, in this layout.
//!
//! An older ledger is moved on the account's first load (see [`layout`] and
//! `AccountActor::load`): version 1 (kv entries `i/{account_id}/s/{message_id}`
//! and `i/{account_id}/r/{from}/{message_id}`, marked by `i/{account_id}/v`)
//! by renaming its entries, none (written before the ledger left the state)
//! by rebuilding it from the events. The old entries and marker go in the
//! same batch, so an earlier binary run on this store again finds no ledger
//! of its own and rebuilds one from the events, and this one, back again,
//! finds that marker and rebuilds from the events in turn.
//!
//! Why hashed keys: sled 0.34 rewrites a whole leaf every few inserts to it,
//! so the bytes its leaves carry per entry are what a send costs on disk.
//! A message id is up to the client, and a receipt's key held two ids; 16
//! bytes of a hash make every key short and the same length. Two ids of one
//! account meeting in 128 bits is not a risk (a birthday bound of 2^64
//! entries; aiming at another's key is a second preimage).
//!
//! An entry is written in the same atomic batch as the event that creates or
//! changes it, so it is always exactly what the events say. [`written`] is
//! that projection, pure; [`Ledger`] is the same fold in memory (unit tests,
//! audit, upgrading old data).

use super::events::AccountEvent;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::{ErrorCode, RelayError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use keys::{prefix, receipt_key, send_key, version_key, VERSION};

/// The acceptance result of one `message.send`.
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

impl SendEntry {
    /// What the retention sweep leaves of an entry past its retention
    /// (PROTOCOL §10) until no retry of the message could be taken as new
    /// (`retention::tombstone_until`): its retention and nothing it said
    /// (no digest, no recipient, no status), so a retry or a status query
    /// is answered `message_expired` rather than taken as a new message.
    pub fn swept(retention_until: u64) -> Self {
        let expired = RelayError::new(ErrorCode::MessageExpired, "result retention has ended");
        SendEntry {
            digest: String::new(),
            to: String::new(),
            deadline: 0,
            retention_until,
            status: DeliveryStatus::failed(0, expired),
            sequence: None,
        }
    }

    pub fn is_swept(&self) -> bool {
        self.digest.is_empty()
    }
}

impl ReceiptEntry {
    /// A received message's entry past retention: see [`SendEntry::swept`].
    pub fn swept(retention_until: u64) -> Self {
        ReceiptEntry { digest: String::new(), accepted_at: 0, retention_until, sequence: 0 }
    }

    pub fn is_swept(&self) -> bool {
        self.digest.is_empty()
    }
}

/// The current layout's keys and version, apart: the version 1 layout
/// ([`v1`]) names them when it renames its entries, and the ledger uses
/// both, so neither module depends on the other.
mod keys {
    /// The ledger format of an account (the value of its [`version_key`]).
    pub const VERSION: &[u8] = b"2";

    /// The blob keys of one account's entries start with this.
    pub fn prefix(account_id: &str) -> Vec<u8> {
        format!("l/{account_id}/").into_bytes()
    }

    fn hashed(account_id: &str, kind: &[u8], ids: &[&str]) -> Vec<u8> {
        let mut h = blake3::Hasher::new();
        h.update(kind);
        for id in ids {
            // Length-prefixed, so no two lists of ids hash the same bytes.
            h.update(&(id.len() as u64).to_le_bytes());
            h.update(id.as_bytes());
        }
        let mut key = prefix(account_id);
        key.extend_from_slice(&h.finalize().as_bytes()[..16]);
        key
    }

    pub fn send_key(account_id: &str, message_id: &str) -> Vec<u8> {
        hashed(account_id, b"s", &[message_id])
    }

    pub fn receipt_key(account_id: &str, from: &str, message_id: &str) -> Vec<u8> {
        hashed(account_id, b"r", &[from, message_id])
    }

    /// The kv key marking a ledger in this layout.
    pub fn version_key(account_id: &str) -> Vec<u8> {
        format!("l/{account_id}/v").into_bytes()
    }
}

/// Where an account's ledger is, from the values of its two markers
/// ([`version_key`], [`v1::version_key`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Complete, in this layout.
    Current,
    /// Complete in the v1 layout: its entries are renamed.
    V1,
    /// To be rebuilt from the events: none written (a stream from before
    /// the ledger left the state), or v1 entries written by an earlier
    /// binary after this one had moved them (both markers: an earlier
    /// binary does not know a settled `message_sent`'s status).
    Rebuild,
}

/// The layout the markers name; `Err` for a marker this version does not
/// know (a later version's), which must not be rewritten.
pub fn layout(current: Option<&[u8]>, v1: Option<&[u8]>) -> Result<Layout, String> {
    let unknown = |v: &[u8]| Err(format!("unknown ledger version {:?}", String::from_utf8_lossy(v)));
    match (current, v1) {
        (Some(c), _) if c != VERSION => unknown(c),
        (_, Some(o)) if o != v1::VERSION => unknown(o),
        (Some(_), None) => Ok(Layout::Current),
        (None, Some(_)) => Ok(Layout::V1),
        (Some(_), Some(_)) | (None, None) => Ok(Layout::Rebuild),
    }
}

/// The kv layout of version 1 (moving and auditing old data).
pub mod v1 {
    pub const VERSION: &[u8] = b"1";

    pub fn version_key(account_id: &str) -> Vec<u8> {
        format!("i/{account_id}/v").into_bytes()
    }

    /// Every v1 entry of an account, and its marker, starts with this.
    pub fn prefix(account_id: &str) -> Vec<u8> {
        format!("i/{account_id}/").into_bytes()
    }

    pub fn send_key(account_id: &str, message_id: &str) -> Vec<u8> {
        format!("i/{account_id}/s/{message_id}").into_bytes()
    }

    pub fn receipt_key(account_id: &str, from: &str, message_id: &str) -> Vec<u8> {
        format!("i/{account_id}/r/{from}/{message_id}").into_bytes()
    }

    /// The current key of the entry under v1 key `key` (the marker and
    /// anything else: `None`). Unambiguous: account and message ids hold
    /// no `/` (PROTOCOL: hex, and `[A-Za-z0-9_-]`).
    pub fn renamed(account_id: &str, key: &[u8]) -> Option<Vec<u8>> {
        let rest = key.strip_prefix(prefix(account_id).as_slice())?;
        let rest = std::str::from_utf8(rest).ok()?;
        match rest.split_once('/')? {
            ("s", message_id) if !message_id.contains('/') => Some(super::keys::send_key(account_id, message_id)),
            ("r", ids) => {
                let (from, message_id) = ids.split_once('/')?;
                (!message_id.contains('/')).then(|| super::keys::receipt_key(account_id, from, message_id))
            }
            _ => None,
        }
    }
}

/// One ledger entry and its key.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Send { message_id: String, entry: SendEntry },
    Receipt { from: String, message_id: String, entry: ReceiptEntry },
}

impl Entry {
    /// Its blob key.
    pub fn key(&self, account_id: &str) -> Vec<u8> {
        match self {
            Entry::Send { message_id, .. } => send_key(account_id, message_id),
            Entry::Receipt { from, message_id, .. } => receipt_key(account_id, from, message_id),
        }
    }

    /// Its kv key in the v1 layout.
    pub fn v1_key(&self, account_id: &str) -> Vec<u8> {
        match self {
            Entry::Send { message_id, .. } => v1::send_key(account_id, message_id),
            Entry::Receipt { from, message_id, .. } => v1::receipt_key(account_id, from, message_id),
        }
    }

    /// Until when the entry is kept (PROTOCOL §10).
    pub fn retention_until(&self) -> u64 {
        match self {
            Entry::Send { entry, .. } => entry.retention_until,
            Entry::Receipt { entry, .. } => entry.retention_until,
        }
    }

    /// How the audit names it.
    pub fn name(&self) -> String {
        match self {
            Entry::Send { message_id, .. } => format!("sent {message_id}"),
            Entry::Receipt { from, message_id, .. } => format!("received {message_id} from {from}"),
        }
    }

    pub fn value(&self) -> Result<Vec<u8>, serde_json::Error> {
        match self {
            Entry::Send { entry, .. } => serde_json::to_vec(entry),
            Entry::Receipt { entry, .. } => serde_json::to_vec(entry),
        }
    }
}

/// The message whose send entry `event` changes (rather than creates): the
/// shell reads that entry and passes it to [`written`].
pub fn changes(event: &AccountEvent) -> Option<&str> {
    match event.origin() {
        AccountEvent::DeliveryUpdated { message_id, .. } => Some(message_id),
        _ => None,
    }
}

/// The entry `event` writes, if any. `current` is the send entry it changes
/// (see [`changes`]); a status update for an unknown message writes nothing.
pub fn written(account_id: &str, event: &AccountEvent, current: Option<&SendEntry>) -> Option<Entry> {
    match event.origin() {
        AccountEvent::MessageSent {
            message_id,
            to,
            digest,
            accepted_at,
            deadline,
            retention_until,
            record,
            status,
        } => Some(Entry::Send {
            message_id: message_id.clone(),
            entry: SendEntry {
                digest: digest.clone(),
                to: to.clone(),
                deadline: *deadline,
                retention_until: *retention_until,
                status: status.clone().unwrap_or_else(|| DeliveryStatus::delivering(*accepted_at)),
                sequence: record.as_ref().map(|r| r.sequence),
            },
        }),
        AccountEvent::SelfDelivered { message_id, digest, accepted_at, retention_until, record } => Some(Entry::Send {
            message_id: message_id.clone(),
            entry: SendEntry {
                digest: digest.clone(),
                to: account_id.to_owned(),
                deadline: *accepted_at,
                retention_until: *retention_until,
                status: DeliveryStatus::target_accepted(*accepted_at),
                sequence: Some(record.sequence),
            },
        }),
        AccountEvent::MessageReceived { from, message_id, digest, accepted_at, retention_until, record, .. } => {
            Some(Entry::Receipt {
                from: from.clone(),
                message_id: message_id.clone(),
                entry: ReceiptEntry {
                    digest: digest.clone(),
                    accepted_at: *accepted_at,
                    retention_until: *retention_until,
                    sequence: record.sequence,
                },
            })
        }
        AccountEvent::DeliveryUpdated { message_id, status } => current.map(|entry| Entry::Send {
            message_id: message_id.clone(),
            entry: SendEntry { status: status.clone(), ..entry.clone() },
        }),
        _ => None,
    }
}

/// The whole ledger of one account in memory, keyed as the state kept it
/// before it moved to the kv space (`sends` by message id, `receipts` by
/// `{from}/{message_id}`), so an old snapshot's maps read as one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    #[serde(default)]
    pub sends: BTreeMap<String, SendEntry>,
    #[serde(default)]
    pub receipts: BTreeMap<String, ReceiptEntry>,
}

impl Ledger {
    pub fn send(&self, message_id: &str) -> Option<&SendEntry> {
        self.sends.get(message_id)
    }

    pub fn receipt(&self, from: &str, message_id: &str) -> Option<&ReceiptEntry> {
        self.receipts.get(&format!("{from}/{message_id}"))
    }

    pub fn is_empty(&self) -> bool {
        self.sends.is_empty() && self.receipts.is_empty()
    }

    /// Folds one event, exactly as the store's projection is written.
    pub fn apply(&mut self, account_id: &str, event: &AccountEvent) {
        let current = changes(event).and_then(|m| self.sends.get(m));
        match written(account_id, event, current) {
            Some(Entry::Send { message_id, entry }) => {
                self.sends.insert(message_id, entry);
            }
            Some(Entry::Receipt { from, message_id, entry }) => {
                self.receipts.insert(format!("{from}/{message_id}"), entry);
            }
            None => {}
        }
    }

    /// Every entry, as written to the store.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        let sends = self.sends.iter().map(|(m, e)| Entry::Send { message_id: m.clone(), entry: e.clone() });
        let receipts = self.receipts.iter().filter_map(|(k, e)| {
            let (from, message_id) = k.split_once('/')?;
            Some(Entry::Receipt { from: from.into(), message_id: message_id.into(), entry: e.clone() })
        });
        sends.chain(receipts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_markers_name_the_layout_and_a_later_version_is_refused() {
        let (v2, v1) = (Some(VERSION), Some(v1::VERSION));
        assert_eq!(layout(v2, None), Ok(Layout::Current));
        assert_eq!(layout(None, v1), Ok(Layout::V1));
        assert_eq!(layout(None, None), Ok(Layout::Rebuild));
        assert_eq!(layout(v2, v1), Ok(Layout::Rebuild), "an earlier binary wrote after the move");
        assert!(layout(Some(b"3"), None).is_err());
        assert!(layout(None, Some(b"3")).is_err());
    }

    #[test]
    fn a_v1_key_is_renamed_to_the_hashed_key_of_the_same_entry() {
        let (a, b) = ("0123456789abcdef0123456789abcdef", "fedcba9876543210fedcba9876543210");
        let m = "msg-0000000000000001";
        assert_eq!(v1::renamed(a, &v1::send_key(a, m)), Some(send_key(a, m)));
        assert_eq!(v1::renamed(a, &v1::receipt_key(a, b, m)), Some(receipt_key(a, b, m)));
        assert_eq!(v1::renamed(a, &v1::version_key(a)), None);
        assert_eq!(v1::renamed(b, &v1::send_key(a, m)), None, "another account's");
        assert_eq!(v1::renamed(a, format!("i/{a}/s/x/y").as_bytes()), None);
        assert_ne!(send_key(a, m), receipt_key(a, b, m));
        assert_eq!(send_key(a, m).len(), receipt_key(a, b, m).len());
    }
}
