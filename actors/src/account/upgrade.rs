//! Data written before the idempotency ledger took its current layout
//! (`ledger.rs`): its ledger is rebuilt once, on the account's first load.

use super::ledger::{self, Ledger, ReceiptEntry, SendEntry};
use crate::store::{Snapshot, Store, StoreError, Ticket};
use serde::Deserialize;
use std::collections::BTreeMap;

/// The maps an account snapshot held before the ledger left the state.
#[derive(Deserialize)]
struct LegacySnapshot {
    sends: Option<BTreeMap<String, SendEntry>>,
    receipts: Option<BTreeMap<String, ReceiptEntry>>,
}

/// Writes the ledger of an account whose ledger is not in the current
/// layout: one written before the ledger left the state (no
/// `i/{account_id}/v`), from an old snapshot's maps and the events after
/// it, or else from all its events; one in the [`ledger::V1`] layout from
/// all its events, its kv entries removed. One batch, with the version.
/// Streams written since keep their ledger with their events, so this runs
/// once per old account.
pub(super) fn ledger(
    store: &Store,
    stream: &str,
    account_id: &str,
    snapshot: Option<&Snapshot>,
) -> Result<Ticket, StoreError> {
    let legacy = snapshot.and_then(|snap| {
        let maps: LegacySnapshot = serde_json::from_slice(&snap.state).ok()?;
        Some((Ledger { sends: maps.sends?, receipts: maps.receipts.unwrap_or_default() }, snap.seq))
    });
    let (mut ledger, after) = legacy.unwrap_or_default();
    for ev in store.read(stream, after) {
        ledger.apply(account_id, &crate::upcast::account_event(&ev?)?);
    }
    let mut batch = store.batch();
    for item in store.kv_scan_prefix(&ledger::v1::prefix(account_id)) {
        batch.kv_remove(&item?.0);
    }
    for entry in ledger.entries() {
        let value = entry.value().map_err(|e| StoreError::Invalid(format!("ledger entry: {e}")))?;
        batch.blob_put(&entry.key(account_id), &value);
    }
    batch.kv_put(&ledger::version_key(account_id), ledger::VERSION);
    tracing::debug!(%stream, sends = ledger.sends.len(), receipts = ledger.receipts.len(), "ledger upgraded");
    store.commit(batch)
}
