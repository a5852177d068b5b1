//! The store's side of [`Reads`]: what an account's decision reads besides
//! its state, served from the ledger and timeline projections and the
//! account's own stream (the actor's own writes included, durable or not).

use super::ledger::{self, ReceiptEntry, SendEntry};
use super::timeline::{self, IndexEntry};
use super::{AccountEvent, Reads};
use crate::delivery::core::DeliveryEvent;
use crate::internal;
use crate::store::Store;
use relay_schemas::methods::DeliverParams;
use relay_schemas::RelayError;
use serde::de::DeserializeOwned;

pub struct StoreReads<'a> {
    pub store: &'a Store,
    pub account_id: &'a str,
    /// The account's stream.
    pub stream: &'a str,
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
        self.ledger(&ledger::send_key(self.account_id, message_id))
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
