//! Data written before the idempotency ledger took its current layout
//! (`ledger.rs`): its ledger is moved once, on the account's first load.

use super::ledger::{self, Ledger, ReceiptEntry, SendEntry};
use crate::store::{Snapshot, Store, StoreError, Ticket};
use serde::Deserialize;
use std::collections::BTreeMap;

/// A blob's key and value.
type Pair = (Vec<u8>, Vec<u8>);

/// The maps an account snapshot held before the ledger left the state.
#[derive(Deserialize)]
struct LegacySnapshot {
    sends: Option<BTreeMap<String, SendEntry>>,
    receipts: Option<BTreeMap<String, ReceiptEntry>>,
}

/// Moves an account's ledger to the current layout (`ledger::layout`), in
/// one batch with the current marker: version 1 by renaming its entries
/// (values unchanged), a ledger to rebuild from an old snapshot's maps and
/// the events after it, or else from all its events. Either way every
/// version 1 key of the account (entries and marker) is removed. Streams
/// written since keep their ledger with their events, so this runs once
/// per old account.
pub(super) fn ledger(
    store: &Store,
    stream: &str,
    account_id: &str,
    snapshot: Option<&Snapshot>,
    layout: ledger::Layout,
) -> Result<Ticket, StoreError> {
    let renamed = match layout {
        ledger::Layout::V1 => renamed(store, account_id)?,
        _ => None,
    };
    let mut batch = store.batch();
    for item in store.kv_scan_prefix(&ledger::v1::prefix(account_id)) {
        batch.kv_remove(&item?.0);
    }
    let from_events = renamed.is_none();
    let entries = match renamed {
        Some(entries) => entries,
        None => rebuilt(store, stream, account_id, snapshot)?
            .entries()
            .map(|e| Ok((e.key(account_id), e.value().map_err(|e| StoreError::Invalid(format!("ledger entry: {e}")))?)))
            .collect::<Result<_, StoreError>>()?,
    };
    for (key, value) in &entries {
        batch.blob_put(key, value);
    }
    batch.kv_put(&ledger::version_key(account_id), ledger::VERSION);
    tracing::debug!(%stream, entries = entries.len(), from_events, "ledger moved to the current layout");
    store.commit(batch)
}

/// A version 1 ledger's entries under their current keys, values
/// unchanged; `None` if a key under its prefix is neither an entry nor the
/// marker (never written: the events decide then).
fn renamed(store: &Store, account_id: &str) -> Result<Option<Vec<Pair>>, StoreError> {
    let mut entries = Vec::new();
    for item in store.kv_scan_prefix(&ledger::v1::prefix(account_id)) {
        let (key, value) = item?;
        match ledger::v1::renamed(account_id, &key) {
            Some(current) => entries.push((current, value)),
            None if key == ledger::v1::version_key(account_id) => {}
            None => return Ok(None),
        }
    }
    Ok(Some(entries))
}

/// The ledger the account's events give (after an old snapshot's maps).
fn rebuilt(store: &Store, stream: &str, account_id: &str, snapshot: Option<&Snapshot>) -> Result<Ledger, StoreError> {
    let legacy = snapshot.and_then(|snap| {
        let maps: LegacySnapshot = serde_json::from_slice(&snap.state).ok()?;
        Some((Ledger { sends: maps.sends?, receipts: maps.receipts.unwrap_or_default() }, snap.seq))
    });
    let (mut ledger, after) = legacy.unwrap_or_default();
    for ev in store.read(stream, after) {
        ledger.apply(account_id, &crate::upcast::account_event(&ev?)?);
    }
    Ok(ledger)
}
