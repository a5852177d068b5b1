//! The ledger of data written before it left the state: accounts written
//! by the previous version are upgraded on load. Stays in the shell: the
//! upgrade is the store's layout, read and rewritten by the actor's load.

use super::*;
use crate::account::actor::AccountActor;
use crate::account::stream_id;
use crate::delivery::NoPeers;
use crate::store::{Head, NewEvent, Snapshot, Store};
use crate::Supervisor;
use relay_core::account::ledger;
use relay_core::clock::ManualClock;
use std::sync::Arc;

/// A store holding Alice's busy history as the previous version wrote
/// it: events only (no ledger entries, no ledger version), and, with
/// `snapshot_at`, a snapshot there that still holds `sends`/`receipts`.
fn old_store(events: &[AccountEvent], snapshot_at: Option<usize>) -> Store {
    let store = Store::temporary().unwrap();
    let stream = stream_id(&alice().id);
    let new: Vec<NewEvent> = events
        .iter()
        .map(|e| NewEvent::new(e.event_type(), AccountEvent::VERSION, UnixSecs(NOW), e).unwrap())
        .collect();
    let mut b = store.batch();
    b.append(&stream, Head::default(), new);
    store.commit_durable_blocking(b).unwrap();
    if let Some(k) = snapshot_at {
        let then = given(&alice(), &events[..k]);
        let mut old = serde_json::to_value(&then.state).unwrap();
        old["sends"] = serde_json::to_value(&then.ledger.sends).unwrap();
        old["receipts"] = serde_json::to_value(&then.ledger.receipts).unwrap();
        let at = store.read(&stream, k as u64 - 1).next().unwrap().unwrap().head();
        let mut b = store.batch();
        b.put_snapshot(&stream, Snapshot { seq: at.seq, hash: at.hash, state: serde_json::to_vec(&old).unwrap() });
        store.commit_durable_blocking(b).unwrap();
    }
    store
}

/// Alice's actor loaded from `store`, as a relay starts it.
fn load(store: &Store) -> Result<AccountActor, crate::store::StoreError> {
    let sup = Supervisor::new(store.clone(), POLICY.clone(), ManualClock::at_ms(NOW * 1000), Arc::new(NoPeers));
    AccountActor::load(sup.account_env(), sup.account_ports(), &alice().id)
}

/// The ledger entries the store holds for Alice, once her ledger's
/// version is the current one.
fn stored_ledger(store: &Store) -> Vec<(Vec<u8>, Vec<u8>)> {
    let version = store.kv_get(&ledger::version_key(&alice().id)).unwrap();
    assert_eq!(version.as_deref(), Some(ledger::VERSION));
    store.blob_scan_prefix(&ledger::prefix(&alice().id)).map(Result::unwrap).collect()
}

fn expected_ledger(events: &[AccountEvent]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let id = alice().id;
    let mut kv: Vec<(Vec<u8>, Vec<u8>)> =
        given(&alice(), events).ledger.entries().map(|e| (e.key(&id), e.value().unwrap())).collect();
    kv.sort();
    kv
}

#[test]
fn an_old_log_without_a_snapshot_gets_its_ledger_from_all_its_events_at_load() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    assert_eq!(store.kv_get(&ledger::version_key(&alice().id)).unwrap(), None);
    let actor = load(&store).unwrap();
    assert_eq!(stored_ledger(&store), expected_ledger(&events));
    assert_eq!(actor.state().last_sequence, busy_alice().last_sequence);
}

#[test]
fn an_old_snapshot_with_idempotency_results_still_loads_and_fills_the_ledger() {
    let events = busy_alice_events();
    // After the first send, before the delivery result and the receipt.
    let k = events.iter().position(|e| matches!(e, AccountEvent::MessageSent { .. })).unwrap() + 1;
    assert!(k < events.len() - 2);
    let store = old_store(&events, Some(k));
    let actor = load(&store).unwrap();
    assert_eq!(stored_ledger(&store), expected_ledger(&events));
    // The state decides as the state folded from every event does.
    let loaded = Given { state: actor.state().clone(), ..busy_alice() };
    assert_eq!(decisions(&loaded), decisions(&busy_alice()));
}

#[test]
fn an_upgraded_ledger_is_not_rewritten_at_the_next_load() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    load(&store).unwrap();
    // Were it rebuilt from the events, this entry would come back.
    let mut b = store.batch();
    b.blob_remove(&ledger::send_key(&alice().id, &mid(1)));
    store.commit_durable_blocking(b).unwrap();
    load(&store).unwrap();
    assert_eq!(stored_ledger(&store).len(), expected_ledger(&events).len() - 1);
}

/// Alice's ledger as version 1 wrote it: readable kv keys, values inline,
/// the marker (with `drop_first`, less its first entry).
fn put_v1_ledger(store: &Store, events: &[AccountEvent], drop_first: bool) {
    let id = alice().id;
    let mut b = store.batch();
    for entry in given(&alice(), events).ledger.entries().skip(usize::from(drop_first)) {
        b.kv_put(&entry.v1_key(&id), &entry.value().unwrap());
    }
    b.kv_put(&ledger::v1::version_key(&id), ledger::v1::VERSION);
    store.commit_durable_blocking(b).unwrap();
}

fn v1_keys(store: &Store) -> Vec<Vec<u8>> {
    store.kv_scan_prefix(&ledger::v1::prefix(&alice().id)).map(|kv| kv.unwrap().0).collect()
}

#[test]
fn a_ledger_in_the_v1_layout_moves_to_hashed_blob_keys_at_load() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    put_v1_ledger(&store, &events, false);
    assert!(v1_keys(&store).len() > 2, "a busy ledger");

    load(&store).unwrap();
    assert_eq!(stored_ledger(&store), expected_ledger(&events));
    assert_eq!(v1_keys(&store), Vec::<Vec<u8>>::new(), "its entries and marker are gone");
}

#[test]
fn a_v1_ledger_moves_by_renaming_its_entries_not_by_reading_the_events() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    // One entry fewer than the events give: a rename keeps it so.
    put_v1_ledger(&store, &events, true);
    load(&store).unwrap();
    assert_eq!(stored_ledger(&store).len(), expected_ledger(&events).len() - 1);
}

#[test]
fn a_v1_ledger_written_again_by_an_earlier_binary_is_rebuilt_from_the_events() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    load(&store).unwrap();
    // An earlier binary, run on this store, wrote its own (here short) ledger.
    put_v1_ledger(&store, &events, true);
    load(&store).unwrap();
    assert_eq!(stored_ledger(&store), expected_ledger(&events));
    assert_eq!(v1_keys(&store), Vec::<Vec<u8>>::new());
}

#[test]
fn a_ledger_of_an_unknown_later_version_is_refused_not_rewritten() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    let mut b = store.batch();
    b.kv_put(&ledger::version_key(&alice().id), b"3");
    store.commit_durable_blocking(b).unwrap();
    let err = load(&store).err().expect("refused");
    assert!(err.to_string().contains("unknown ledger version \"3\""), "{err}");
    assert_eq!(store.kv_get(&ledger::version_key(&alice().id)).unwrap().as_deref(), Some(&b"3"[..]));
}

#[test]
fn a_sender_not_loaded_since_the_upgrade_is_read_in_its_v1_ledger() {
    let events = busy_alice_events();
    let store = old_store(&events, None);
    put_v1_ledger(&store, &events, false);
    let (message_id, entry) = given(&alice(), &events).ledger.sends.into_iter().next().expect("a send");
    let stream = stream_id(&alice().id);
    let reads =
        crate::account::StoreReads { store: &store, account_id: &alice().id, stream: &stream, unfinished: None };
    assert_eq!(reads.v1_send_entry(&message_id), Some(entry));
    load(&store).unwrap();
    assert_eq!(reads.v1_send_entry(&message_id), None, "moved at load");
}
