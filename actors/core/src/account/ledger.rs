//! The idempotency ledger: the result of every accepted `message.send` and
//! every received message, kept until its `retention_until` for idempotent
//! retries and `message.delivery.status`.
//!
//! It lives in the kv space, not in the actor, so an account's memory and
//! snapshot do not grow with its history:
//!
//! - `i/{account_id}/s/{message_id}` → [`SendEntry`]
//! - `i/{account_id}/r/{from}/{message_id}` → [`ReceiptEntry`]
//! - `i/{account_id}/v` → [`VERSION`]: the ledger holds every entry the
//!   account's events give (absent for accounts written before the ledger
//!   left the state; see `AccountActor::load`).
//!
//! An entry is written in the same atomic batch as the event that creates or
//! changes it, so it is always exactly what the events say. [`written`] is
//! that projection, pure; [`Ledger`] is the same fold in memory (unit tests,
//! audit, upgrading old data).

use super::events::AccountEvent;
use relay_schemas::DeliveryStatus;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The ledger format of an account (the value of its `i/{account_id}/v`).
pub const VERSION: &[u8] = b"1";

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

pub fn send_key(account_id: &str, message_id: &str) -> Vec<u8> {
    format!("i/{account_id}/s/{message_id}").into_bytes()
}

pub fn receipt_key(account_id: &str, from: &str, message_id: &str) -> Vec<u8> {
    format!("i/{account_id}/r/{from}/{message_id}").into_bytes()
}

pub fn version_key(account_id: &str) -> Vec<u8> {
    format!("i/{account_id}/v").into_bytes()
}

/// One ledger entry and its kv key.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    Send { message_id: String, entry: SendEntry },
    Receipt { from: String, message_id: String, entry: ReceiptEntry },
}

impl Entry {
    pub fn key(&self, account_id: &str) -> Vec<u8> {
        match self {
            Entry::Send { message_id, .. } => send_key(account_id, message_id),
            Entry::Receipt { from, message_id, .. } => receipt_key(account_id, from, message_id),
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
        AccountEvent::MessageSent { message_id, to, digest, accepted_at, deadline, retention_until, record } => {
            Some(Entry::Send {
                message_id: message_id.clone(),
                entry: SendEntry {
                    digest: digest.clone(),
                    to: to.clone(),
                    deadline: *deadline,
                    retention_until: *retention_until,
                    status: DeliveryStatus::delivering(*accepted_at),
                    sequence: record.as_ref().map(|r| r.sequence),
                },
            })
        }
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
        AccountEvent::MessageReceived { from, message_id, digest, accepted_at, retention_until, record } => {
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

    /// Folds one event, exactly as the kv projection is written.
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

    /// Every entry, as written to the kv space.
    pub fn entries(&self) -> impl Iterator<Item = Entry> + '_ {
        let sends = self.sends.iter().map(|(m, e)| Entry::Send { message_id: m.clone(), entry: e.clone() });
        let receipts = self.receipts.iter().filter_map(|(k, e)| {
            let (from, message_id) = k.split_once('/')?;
            Some(Entry::Receipt { from: from.into(), message_id: message_id.into(), entry: e.clone() })
        });
        sends.chain(receipts)
    }
}
