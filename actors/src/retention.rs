//! The retention sweep's shell (PROTOCOL §10): what is past its promised
//! retention is deleted on a timer, a bounded amount per turn; the rules
//! are in `relay_core::retention`, one account's deletions in
//! `account::sweep`.
//!
//! A pass, every `limits.retention_sweep`:
//! 1. reads at most [`TURN`] entries of the retention index that are due
//!    (the index sorts by time: nothing else is read), and stops when none
//!    are;
//! 2. before the first deletion of the pass, has a signed checkpoint
//!    written ([`Checkpointer`](crate::supervisor::Checkpointer)), so whatever it prunes was covered by one
//!    its peers could witness; without one it deletes nothing;
//! 3. hands each account its entries; the account actor deletes and
//!    answers once that is durable (it serializes with the account's own
//!    commands, so nothing it deletes is being written);
//! 4. rests after a full turn three times as long as the turn took (as
//!    long when it is late: `retention::rest_after`), and waits while the
//!    store's writer is behind ([`BUSY_BACKLOG`] commits not yet durable):
//!    sweeping yields to traffic.
//!
//! A pass whose turn finds the same first entry as the turn before stops:
//! an account that cannot sweep is not retried in a loop (its entries
//! wait for the next pass). A pass that ends with nothing due sets
//! `relay_retention_caught_up_seconds` to its clock: what the sweep is
//! behind by, and (tests) when everything past its retention is gone.

use crate::supervisor::Supervisor;
use relay_core::retention::{self, IndexEntry};
use std::collections::BTreeMap;
use std::time::Duration;

/// Index entries one turn takes at most.
pub const TURN: usize = 512;
/// Commits waiting for durability past which a turn waits.
pub const BUSY_BACKLOG: u64 = 256;
const BUSY_WAIT: Duration = Duration::from_millis(20);

/// What a pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pass {
    pub messages: u64,
    pub pruned: u64,
    pub turns: u64,
}

/// The kv key marking that every message in the store has its index
/// entry (stores written before the index get theirs once, [`backfill`]).
pub const INDEXED_KEY: &[u8] = b"retention/indexed";
/// Index entries one backfill commit writes at most.
const BACKFILL_BATCH: usize = 4096;

/// Writes the index entries of every message a store written before the
/// index holds, once (then [`INDEXED_KEY`]); the number written. Reads
/// every account stream: a store from before retention is read whole one
/// time, beside the relay's traffic. Racing an account's own writes is
/// harmless: an entry is a pure function of its event, and the sweep takes
/// an entry whose event is already gone as done.
pub fn backfill(store: &crate::store::Store) -> Result<u64, String> {
    if store.kv_get(INDEXED_KEY).map_err(|e| e.to_string())?.is_some() {
        return Ok(0);
    }
    let mut written = 0;
    let mut batch = store.batch();
    let mut in_batch = 0;
    for stream in store.streams() {
        let stream = stream.map_err(|e| e.to_string())?;
        let Some(account) = stream.strip_prefix("account/") else { continue };
        for ev in store.read(&stream, 0) {
            let ev = ev.map_err(|e| e.to_string())?;
            let event = crate::upcast::account_event(&ev).map_err(|e| e.to_string())?;
            if let Some(t) = retention::traces(account, &event) {
                batch.kv_put(&retention::index_key(t.retention_until, account, ev.seq), retention::DUE);
                (written, in_batch) = (written + 1, in_batch + 1);
            }
            if in_batch == BACKFILL_BATCH {
                store.commit_durable_blocking(std::mem::take(&mut batch)).map_err(|e| e.to_string())?;
                in_batch = 0;
            }
        }
    }
    batch.kv_put(INDEXED_KEY, b"1");
    store.commit_durable_blocking(batch).map_err(|e| e.to_string())?;
    Ok(written)
}

/// Runs a pass every `every`, the first at once (after the backfill of a
/// store from before the index).
pub async fn run(sup: Supervisor, every: Duration) {
    let store = sup.store();
    match tokio::task::spawn_blocking(move || backfill(&store)).await {
        Ok(Ok(0)) => {}
        Ok(Ok(n)) => tracing::info!(entries = n, "retention index written for the messages already stored"),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "retention index backfill failed: nothing is swept");
            return;
        }
        Err(e) => {
            tracing::error!(error = %e, "retention index backfill failed: nothing is swept");
            return;
        }
    }
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match pass(&sup, every).await {
            Ok(p) if p.messages > 0 || p.pruned > 0 => {
                tracing::info!(messages = p.messages, pruned = p.pruned, turns = p.turns, "retention sweep")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep"),
        }
    }
}

/// One pass: sweeps until nothing is due (`every`: the sweep's interval,
/// which says when it is late).
pub async fn pass(sup: &Supervisor, every: Duration) -> Result<Pass, String> {
    let store = sup.store();
    let mut done = Pass::default();
    let mut checkpointed = false;
    let mut first_seen: Option<IndexEntry> = None;
    loop {
        let (now, started) = (sup.clock().now(), std::time::Instant::now());
        let scan = store.clone();
        let due = tokio::task::spawn_blocking(move || due_entries(&scan, now)).await.map_err(|e| e.to_string())??;
        let Some((first, _)) = due.first() else {
            // Every entry due before `now` is handled (a send still
            // delivering has one again, `account::sweep::DEFER_SECS` on).
            sup.metrics().retention_caught_up.set(now.0 as i64);
            break;
        };
        let (full, late) = (due.len() == TURN, retention::sweep_late(now, first.until, every.as_secs()));
        if first_seen.as_ref() == Some(first) {
            return Err(format!("account {} could not be swept; the rest waits", first.account_id));
        }
        first_seen = Some(first.clone());
        if !checkpointed {
            if let Some(c) = sup.checkpointer() {
                tokio::task::spawn_blocking(move || c.checkpoint())
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("no checkpoint, nothing pruned: {e}"))?;
            }
            checkpointed = true;
        }
        let mut by_account: BTreeMap<String, Vec<(IndexEntry, Vec<u8>)>> = BTreeMap::new();
        for (entry, value) in due {
            by_account.entry(entry.account_id.clone()).or_default().push((entry, value));
        }
        for (account, entries) in by_account {
            match sup.sweep_account(&account, entries).await {
                Ok(swept) => {
                    done.messages += swept.messages as u64;
                    done.pruned += swept.pruned;
                    sup.metrics().retention_swept.inc_by(swept.messages as u64);
                    sup.metrics().retention_pruned.inc_by(swept.pruned);
                }
                Err(e) => tracing::warn!(%account, error = %e.message, "retention sweep of an account"),
            }
        }
        done.turns += 1;
        if full {
            tokio::time::sleep(retention::rest_after(started.elapsed(), late)).await;
        }
        while store.backlog() > BUSY_BACKLOG {
            tokio::time::sleep(BUSY_WAIT).await;
        }
    }
    Ok(done)
}

/// At most [`TURN`] index entries due at `now`, in time order.
fn due_entries(
    store: &crate::store::Store,
    now: relay_schemas::UnixSecs,
) -> Result<Vec<(IndexEntry, Vec<u8>)>, String> {
    let end = retention::due_end(now);
    let mut due = Vec::new();
    for kv in store.kv_scan_prefix(retention::INDEX_PREFIX) {
        let (key, value) = kv.map_err(|e| e.to_string())?;
        if key >= end || due.len() == TURN {
            break;
        }
        match retention::parse_index_key(&key) {
            Some(entry) => due.push((entry, value)),
            None => tracing::warn!(key = %String::from_utf8_lossy(&key), "retention index: bad key"),
        }
    }
    Ok(due)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Head, NewEvent, Store};
    use relay_core::account::AccountEvent;
    use relay_schemas::UnixSecs;

    fn received(message_id: &str, retention_until: u64) -> AccountEvent {
        let env = serde_json::json!({"message_id": message_id, "from": "alice", "from_device_id": "d", "to": "bob",
                                     "created_at": 1, "ciphertext": "AA", "signature": "s"});
        let v = serde_json::json!({"message_received": {
            "from": "alice", "message_id": message_id, "digest": "d", "accepted_at": 10,
            "retention_until": retention_until,
            "record": {"sequence": 1, "expires_at": retention_until, "envelope": env, "boxes": [], "visible": []}}});
        serde_json::from_str(&v.to_string()).unwrap()
    }

    /// A store written before the index: its messages get their entries
    /// once, so they are swept like every later one.
    #[test]
    fn messages_stored_before_the_index_are_indexed_once() {
        let store = Store::temporary().unwrap();
        let mut batch = store.batch();
        let settings = AccountEvent::SettingsUpdated { public_discovery: true, at: None };
        let events = [settings, received("m1", 110), received("m2", 120)];
        let encoded = events.iter().map(|e| NewEvent::new(e.event_type(), 3, UnixSecs(10), e).unwrap()).collect();
        batch.append("account/bob", Head::default(), encoded);
        store.commit_durable_blocking(batch).unwrap();

        assert_eq!(backfill(&store).unwrap(), 2);
        let keys: Vec<_> = store.kv_scan_prefix(retention::INDEX_PREFIX).map(|kv| kv.unwrap().0).collect();
        assert_eq!(keys, [retention::index_key(110, "bob", 2), retention::index_key(120, "bob", 3)]);
        assert_eq!(backfill(&store).unwrap(), 0, "once");
    }
}
