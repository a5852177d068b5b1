//! Data written before the idempotency ledger took its current layout
//! (`ledger.rs`): its ledger is moved once, on the account's first load.

use crate::store::{Snapshot, Store, StoreError, Ticket};
use relay_core::account::ledger::{self, Ledger, ReceiptEntry, SendEntry};
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

/// The layout an account's stored markers name (`ledger::layout`); the
/// inner `Err` names a marker this version does not know.
pub fn stored_layout(store: &Store, account_id: &str) -> Result<Result<ledger::Layout, String>, StoreError> {
    let current = store.kv_get(&ledger::version_key(account_id))?;
    let v1 = store.kv_get(&ledger::v1::version_key(account_id))?;
    Ok(ledger::layout(current.as_deref(), v1.as_deref()))
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
    let old: Vec<Pair> = store.kv_scan_prefix(&ledger::v1::prefix(account_id)).collect::<Result<_, _>>()?;
    let renamed = match layout {
        ledger::Layout::V1 => renamed(account_id, &old),
        _ => None,
    };
    let mut batch = store.batch();
    for (key, _) in &old {
        batch.kv_remove(key);
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

/// A version 1 ledger's entries (`old`: its keys and values) under their
/// current keys, values unchanged; `None` if a key is neither an entry nor
/// the marker (never written: the events decide then).
fn renamed(account_id: &str, old: &[Pair]) -> Option<Vec<Pair>> {
    let marker = ledger::v1::version_key(account_id);
    let mut entries = Vec::with_capacity(old.len());
    for (key, value) in old {
        match ledger::v1::renamed(account_id, key) {
            Some(current) => entries.push((current, value.clone())),
            None if *key == marker => {}
            None => return None,
        }
    }
    Some(entries)
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
