//! The store's side of [`Reads`]: what an account's decision reads besides
//! its state, served from the ledger and timeline projections and the
//! account's own stream (the actor's own writes included, durable or not).

use crate::shell::internal;
use crate::store::Store;
use relay_core::account::ledger::{self, ReceiptEntry, SendEntry};
use relay_core::account::timeline::{self, IndexEntry};
use relay_core::account::{AccountEvent, Reads};
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_schemas::methods::DeliverParams;
use relay_schemas::RelayError;
use serde::de::DeserializeOwned;
use std::cell::RefCell;

pub struct StoreReads<'a> {
    pub store: &'a Store,
    pub account_id: &'a str,
    /// The account's stream.
    pub stream: &'a str,
    /// The account actor's memo of its unfinished sends; `None` for a read
    /// from outside the actor.
    pub unfinished: Option<&'a UnfinishedSends>,
}

/// The send entries of an account's sends still under way, as its actor
/// last read or wrote them, absent ones included: the steps of one send
/// (its decision, the settle's or report's decision, and the write of its
/// entry) read the ledger once, not three times. Sound because the actor
/// is the only writer of its account's ledger while it is resident (an
/// upgrade of the ledger's layout runs before it starts), and it records
/// each entry it writes once the commit is made: what the memo holds is
/// what the store holds, durable or not. A send leaves the memo when its
/// entry becomes terminal (a later retry reads the store), and past
/// [`UnfinishedSends::CAPACITY`] the least used leave, so it stays small
/// whatever ids clients send.
#[derive(Debug)]
pub struct UnfinishedSends(RefCell<quick_cache::unsync::Cache<String, Option<SendEntry>>>);

impl Default for UnfinishedSends {
    fn default() -> Self {
        UnfinishedSends(RefCell::new(quick_cache::unsync::Cache::new(Self::CAPACITY)))
    }
}

impl UnfinishedSends {
    pub const CAPACITY: usize = 256;

    fn get(&self, message_id: &str) -> Option<Option<SendEntry>> {
        self.0.borrow().get(message_id).cloned()
    }

    /// Records the ledger's entry of `message_id` as read or just written.
    pub fn record(&self, message_id: &str, entry: Option<&SendEntry>) {
        let mut known = self.0.borrow_mut();
        if entry.is_some_and(|e| e.status.status.is_terminal()) {
            known.remove(message_id);
            return;
        }
        known.insert(message_id.to_owned(), entry.cloned());
    }

    pub fn is_empty(&self) -> bool {
        self.0.borrow().is_empty()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.borrow().len()
    }
}

impl StoreReads<'_> {
    /// The send entry of an account whose ledger is still in the version 1
    /// layout (not loaded since the upgrade); `None` otherwise.
    pub fn v1_send_entry(&self, message_id: &str) -> Option<SendEntry> {
        let bytes = self.store.kv_get(&ledger::v1::send_key(self.account_id, message_id)).ok()??;
        serde_json::from_slice(&bytes).ok()
    }

    fn ledger<T: DeserializeOwned>(&self, key: &[u8]) -> Result<Option<T>, RelayError> {
        let Some(bytes) = self.store.blob_get(key).map_err(|e| internal(&e))? else { return Ok(None) };
        serde_json::from_slice(&bytes).map(Some).map_err(|e| internal(&e))
    }
}

impl Reads for StoreReads<'_> {
    fn send_entry(&self, message_id: &str) -> Result<Option<SendEntry>, RelayError> {
        if let Some(known) = self.unfinished.and_then(|u| u.get(message_id)) {
            return Ok(known);
        }
        let entry = self.ledger(&ledger::send_key(self.account_id, message_id))?;
        if let Some(unfinished) = self.unfinished {
            unfinished.record(message_id, entry.as_ref());
        }
        Ok(entry)
    }

    fn receipt_entry(&self, from: &str, message_id: &str) -> Result<Option<ReceiptEntry>, RelayError> {
        self.ledger(&ledger::receipt_key(self.account_id, from, message_id))
    }

    fn timeline_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, IndexEntry), RelayError>> {
        let from = timeline::key(self.account_id, after.saturating_add(1));
        self.store.kv_scan_from(&timeline::prefix(self.account_id), &from).map(|item| {
            let (key, value) = item.map_err(|e| internal(&e))?;
            let seq = timeline::sequence_of(&key).ok_or_else(|| RelayError::internal("bad timeline key"))?;
            Ok((seq, serde_json::from_slice(&value).map_err(|e| internal(&e))?))
        })
    }

    fn event(&self, seq: u64) -> Result<AccountEvent, RelayError> {
        let after = seq.checked_sub(1).ok_or_else(|| RelayError::internal("no event 0"))?;
        let ev = self
            .store
            .read(self.stream, after)
            .next()
            .ok_or_else(|| RelayError::internal("timeline event missing"))?
            .map_err(|e| internal(&e))?;
        serde_json::from_str(ev.data.get()).map_err(|e| internal(&e))
    }

    fn events_after(&self, after: u64) -> impl Iterator<Item = Result<(u64, AccountEvent), RelayError>> {
        self.store.read(self.stream, after).map(|ev| {
            let ev = ev.map_err(|e| internal(&e))?;
            Ok((ev.seq, crate::upcast::account_event(&ev).map_err(|e| internal(&e))?))
        })
    }

    fn delivery_params(&self, message_id: &str) -> Result<Option<DeliverParams>, RelayError> {
        let stream = crate::delivery::stream_id(self.account_id, message_id);
        let Some(first) = self.store.read(&stream, 0).next() else { return Ok(None) };
        let first = first.map_err(|e| internal(&e))?;
        match crate::upcast::delivery_event(&first).map_err(|e| internal(&e))? {
            DeliveryEvent::Accepted { params, .. } => Ok(Some(*params)),
            _ => Err(RelayError::internal("a delivery stream that does not begin with its acceptance")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::DeliveryStatus;

    fn entry(status: DeliveryStatus) -> SendEntry {
        SendEntry { digest: "d".into(), to: "bob".into(), deadline: 2, retention_until: 3, status, sequence: None }
    }

    #[test]
    fn the_memo_of_unfinished_sends_forgets_a_send_once_its_entry_is_terminal() {
        let memo = UnfinishedSends::default();
        memo.record("m1", None);
        assert_eq!(memo.get("m1"), Some(None), "known absent");
        let delivering = entry(DeliveryStatus::delivering(1));
        memo.record("m1", Some(&delivering));
        assert_eq!(memo.get("m1"), Some(Some(delivering)));
        memo.record("m1", Some(&entry(DeliveryStatus::target_accepted(1))));
        assert_eq!(memo.get("m1"), None, "a finished send is read from the store");
        memo.record("m2", Some(&entry(DeliveryStatus::target_accepted(1))));
        assert_eq!(memo.get("m2"), None);
    }

    #[test]
    fn the_memo_of_unfinished_sends_is_bounded_whatever_ids_are_sent() {
        let memo = UnfinishedSends::default();
        for n in 0..UnfinishedSends::CAPACITY * 3 + 7 {
            memo.record(&format!("m{n}"), None);
            assert!(memo.len() <= UnfinishedSends::CAPACITY);
        }
        // The newest is kept; an id it holds is updated in place.
        let last = format!("m{}", UnfinishedSends::CAPACITY * 3 + 6);
        assert_eq!(memo.get(&last), Some(None));
        let len = memo.len();
        memo.record(&last, Some(&entry(DeliveryStatus::delivering(1))));
        assert_eq!(memo.len(), len);
    }

    #[test]
    fn a_hot_unfinished_send_survives_a_full_memo() {
        let memo = UnfinishedSends::default();
        memo.record("hot", None);
        for n in 0..UnfinishedSends::CAPACITY * 2 {
            memo.record(&format!("m{n}"), None);
            assert_eq!(memo.get("hot"), Some(None), "forgotten after {n} others");
        }
    }
}
