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

/// What a record adds to a sync page beyond its envelope and its box: the
/// other members and a delivery status (an upper bound, so a page's real
/// size stays under the cap).
pub const RECORD_OVERHEAD: usize = 512;

/// Whether a record of `record_bytes` may join a page that holds `records`
/// records of `page_bytes` so far under `max_page_bytes`: always the first,
/// so a record larger than the cap is still served (alone).
pub fn fits_page(page_bytes: usize, records: usize, record_bytes: usize, max_page_bytes: usize) -> bool {
    records == 0 || page_bytes.saturating_add(record_bytes) <= max_page_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_takes_records_until_the_next_would_pass_the_byte_cap() {
        assert!(fits_page(0, 0, 100, 250));
        assert!(fits_page(100, 1, 100, 250));
        assert!(!fits_page(200, 2, 100, 250));
        assert!(fits_page(150, 1, 100, 250), "exactly at the cap fits");
    }

    #[test]
    fn a_page_always_takes_its_first_record_even_over_the_cap() {
        assert!(fits_page(0, 0, 10_000, 250));
        assert!(!fits_page(10_000, 1, 1, 250));
    }
}
