//! The timeline projection: `t/{account_id}/{sequence}` → where the record's
//! event is and who may read it. Written in the same batch as the event, so
//! it is always exactly what the events say.

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IndexEntry {
    /// Sequence of the event (in the account stream) holding the record.
    pub event: u64,
    /// Devices that may read the record, fixed at acceptance.
    pub visible: Vec<String>,
}

pub fn prefix(account_id: &str) -> Vec<u8> {
    format!("t/{account_id}/").into_bytes()
}

pub fn key(account_id: &str, sequence: u64) -> Vec<u8> {
    let mut k = prefix(account_id);
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

pub fn sequence_of(key: &[u8]) -> Option<u64> {
    let tail: [u8; 8] = key.get(key.len().checked_sub(8)?..)?.try_into().ok()?;
    Some(u64::from_be_bytes(tail))
}
