//! One account's part of a retention sweep (PROTOCOL §10): the writes that
//! delete what is past its retention, built for the account actor to
//! commit. The rules (what is past, what may leave the prefix, what a
//! swept entry leaves) are in `relay_core::retention`.

use crate::shell::internal;
use crate::store::{Batch, Store, StoredEvent};
use relay_core::account::ledger::{ReceiptEntry, SendEntry};
use relay_core::account::{timeline, AccountEvent, AccountState};
use relay_core::policy::Policy;
use relay_core::retention::{self, IndexEntry, LedgerSweep, Traces};
use relay_schemas::{RelayError, UnixSecs};
use std::collections::HashSet;

/// Events one sweep turn of an account reads from its stream's prefix at
/// most: bounded work per turn (the next turn goes on from the marker).
pub const MAX_PRUNED_PER_TURN: usize = 1024;

/// A message whose send has not finished (its delivery outlived its
/// retention: the relay was down at its deadline, which ends it as soon as
/// the relay is back) is looked at again this much later: soon, so its
/// traces go right after it ends, by the first pass after this.
pub const DEFER_SECS: u64 = 5;

/// What one turn did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Swept {
    /// Messages whose traces went (or whose swept entry went).
    pub messages: usize,
    /// Events deleted from the stream's prefix.
    pub pruned: u64,
}

pub struct Sweep<'a> {
    pub store: &'a Store,
    pub state: &'a AccountState,
    pub stream: &'a str,
    pub now: UnixSecs,
    pub policy: &'a Policy,
}

impl Sweep<'_> {
    /// Adds to `batch` the deletion of what `due` names (index entries past
    /// their time: runs, single messages, swept entries) and of the
    /// stream's prefix as far as it may go.
    pub fn run(&self, batch: &mut Batch, due: &[(IndexEntry, Vec<u8>)]) -> Result<Swept, RelayError> {
        let account = self.state.account_id.as_str();
        let mut swept = Swept::default();
        let mut done = HashSet::new();
        for (entry, value) in due {
            let own = retention::index_key(entry.until, account, entry.seq);
            if let Some((&retention::SWEPT, ledger_key)) = value.split_first() {
                // Second stage: the swept entry has answered long enough.
                batch.kv_remove(&own);
                batch.blob_remove(ledger_key);
                swept.messages += 1;
                continue;
            }
            batch.kv_remove(&own);
            if value.as_slice() == retention::SINGLE {
                // An event already pruned took its traces with it.
                let Some(event) = self.event(entry.seq)? else { continue };
                if let Some(traces) = retention::traces(account, &event) {
                    if self.traces(batch, entry.seq, &traces)? {
                        swept.messages += 1;
                        done.insert(entry.seq);
                    }
                }
                continue;
            }
            self.walk(batch, entry.seq, &mut swept, &mut done)?;
        }
        swept.pruned = self.prefix(batch, &mut swept, &done)?;
        Ok(swept)
    }

    /// Sweeps the run that starts at event `start` (`retention` module
    /// doc): its messages in stream order while they are past, up to the
    /// next run's start; the run's entry moves to the first message not
    /// past (or to the one after [`MAX_PRUNED_PER_TURN`] events), and goes
    /// at the stream's end. Events before `start` already pruned took
    /// their traces with them; the walk reads what is left.
    fn walk(
        &self,
        batch: &mut Batch,
        start: u64,
        swept: &mut Swept,
        done: &mut HashSet<u64>,
    ) -> Result<(), RelayError> {
        let account = self.state.account_id.as_str();
        for (n, ev) in self.store.read(self.stream, start.saturating_sub(1)).enumerate() {
            let ev = ev.map_err(|e| internal(&e))?;
            let event = decode(&ev)?;
            let Some(traces) = retention::traces(account, &event) else { continue };
            let own = retention::index_key(traces.retention_until, account, ev.seq);
            if ev.seq != start && self.store.kv_get(&own).map_err(|e| internal(&e))?.as_deref() == Some(retention::DUE)
            {
                return Ok(()); // The next run: its own entry takes it.
            }
            if n >= MAX_PRUNED_PER_TURN || !retention::is_past(traces.retention_until, self.now) {
                batch.kv_put(&own, retention::DUE);
                return Ok(());
            }
            if self.traces(batch, ev.seq, &traces)? {
                swept.messages += 1;
                done.insert(ev.seq);
            }
        }
        Ok(())
    }

    /// Deletes the prefix of events that may go, folding them into the
    /// marker's state; the number of events deleted.
    /// `done`: the events whose traces this turn already deleted.
    fn prefix(&self, batch: &mut Batch, swept: &mut Swept, done: &HashSet<u64>) -> Result<u64, RelayError> {
        let account = self.state.account_id.as_str();
        let marker = self.store.pruned(self.stream).map_err(|e| internal(&e))?;
        let after = marker.as_ref().map_or(0, |m| m.head.seq);
        let mut state = match &marker {
            Some(m) => {
                let mut s: AccountState = serde_json::from_slice(&m.state).map_err(|e| internal(&e))?;
                s.rebuild_caches();
                s
            }
            None => AccountState::new(account),
        };
        let through = self.replicated_through();
        let mut last = None;
        for ev in self.store.read(self.stream, after).take(MAX_PRUNED_PER_TURN) {
            let ev = ev.map_err(|e| internal(&e))?;
            let event = decode(&ev)?;
            if !retention::may_prune(account, ev.seq, &event, self.now, through) {
                break;
            }
            if let Some(traces) = retention::traces(account, &event).filter(|_| !done.contains(&ev.seq)) {
                if !self.traces(batch, ev.seq, &traces)? {
                    break;
                }
                swept.messages += 1;
            }
            state.apply(&event);
            last = Some(ev.head());
        }
        let Some(last) = last else { return Ok(0) };
        let state = serde_json::to_vec(&state).map_err(|e| internal(&e))?;
        batch.prune(self.stream, after, last, self.now, state);
        Ok(last.seq - after)
    }

    /// Deletes one message's traces (not its event); false when its send
    /// has not finished, which defers it (an entry for it alone). Its own
    /// index entry, if it has one, stays: that entry starts a run, which
    /// may go on past it (the prefix prunes messages whose entry is not
    /// due yet at the scan); when due, the walk reads on from what is left.
    fn traces(&self, batch: &mut Batch, seq: u64, t: &Traces) -> Result<bool, RelayError> {
        let account = self.state.account_id.as_str();
        if let Some(message_id) = &t.delivery {
            if !self.send_finished(&t.ledger_key)? {
                let later = self.now.0 + DEFER_SECS;
                batch.kv_put(&retention::index_key(later.max(t.retention_until), account, seq), retention::SINGLE);
                return Ok(false);
            }
            self.delivery(batch, message_id)?;
        }
        if let Some(sequence) = t.record {
            batch.kv_remove(&timeline::key(account, sequence));
        }
        match retention::ledger_sweep(t, self.now, self.policy) {
            LedgerSweep::Swept { until } => {
                let swept = match t.sent {
                    true => serde_json::to_vec(&SendEntry::swept(t.retention_until)),
                    false => serde_json::to_vec(&ReceiptEntry::swept(t.retention_until)),
                };
                batch.blob_put(&t.ledger_key, &swept.map_err(|e| internal(&e))?);
                let mut value = vec![retention::SWEPT];
                value.extend_from_slice(&t.ledger_key);
                batch.kv_put(&retention::index_key(until, account, seq), &value);
            }
            LedgerSweep::Remove => batch.blob_remove(&t.ledger_key),
        }
        Ok(true)
    }

    /// Deletes a finished delivery's stream whole; its marker stays, so a
    /// checkpoint that listed it is still extended.
    fn delivery(&self, batch: &mut Batch, message_id: &str) -> Result<(), RelayError> {
        let stream = crate::delivery::stream_id(&self.state.account_id, message_id);
        let head = self.store.head(&stream).map_err(|e| internal(&e))?;
        let after = self.store.pruned(&stream).map_err(|e| internal(&e))?.map_or(0, |m| m.head.seq);
        if head.seq > after {
            batch.prune(&stream, after, head, self.now, Vec::new());
            batch.remove_snapshot(&stream);
        }
        Ok(())
    }

    /// Whether the send entry under `key` is terminal (or gone or swept:
    /// nothing is running for it).
    fn send_finished(&self, key: &[u8]) -> Result<bool, RelayError> {
        let Some(bytes) = self.store.blob_get(key).map_err(|e| internal(&e))? else { return Ok(true) };
        let entry: SendEntry = serde_json::from_slice(&bytes).map_err(|e| internal(&e))?;
        Ok(entry.is_swept() || entry.status.status.is_terminal())
    }

    /// The lowest seq of this stream every partner home acknowledged
    /// (`None` without partners): an account event it has not seen stays.
    fn replicated_through(&self) -> Option<u64> {
        let own = &self.policy.relay_id;
        let relays = self.state.route().map(|r| r.relays.as_slice()).unwrap_or_default();
        relays.iter().filter(|r| r.id != **own).map(|r| self.state.replica(&r.id).acked).min()
    }

    fn event(&self, seq: u64) -> Result<Option<AccountEvent>, RelayError> {
        let Some(ev) = self.store.read(self.stream, seq.saturating_sub(1)).next() else { return Ok(None) };
        let ev = ev.map_err(|e| internal(&e))?;
        if ev.seq != seq {
            return Ok(None);
        }
        decode(&ev).map(Some)
    }
}

fn decode(ev: &StoredEvent) -> Result<AccountEvent, RelayError> {
    crate::upcast::account_event(ev).map_err(|e| internal(&e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Head, NewEvent};
    use relay_core::account::ledger;
    use serde_json::json;

    fn record(message_id: &str, sequence: u64, until: u64) -> serde_json::Value {
        let env = json!({"message_id": message_id, "from": "alice", "from_device_id": "d", "to": "bob",
                         "created_at": 1, "ciphertext": "AA", "signature": "s"});
        json!({"sequence": sequence, "expires_at": until, "envelope": env, "boxes": [], "visible": []})
    }

    fn received(message_id: &str, sequence: u64, until: u64) -> AccountEvent {
        let v = json!({"message_received": {"from": "alice", "message_id": message_id, "digest": "d",
            "accepted_at": 10, "retention_until": until, "record": record(message_id, sequence, until)}});
        serde_json::from_str(&v.to_string()).unwrap()
    }

    fn sent_delivering(message_id: &str, until: u64) -> AccountEvent {
        let v = json!({"message_sent": {"message_id": message_id, "to": "carol", "digest": "d",
            "accepted_at": 10, "deadline": until, "retention_until": until, "record": null}});
        serde_json::from_str(&v.to_string()).unwrap()
    }

    /// `bob`'s stream holding `events` with their ledger entries and index
    /// entries, as the account actor writes them (an entry per run); its
    /// state folded.
    fn stream(events: &[AccountEvent]) -> (Store, AccountState) {
        stream_indexed(events, false)
    }

    /// ... with an entry per message when `per_message` (a store written
    /// before runs).
    fn stream_indexed(events: &[AccountEvent], per_message: bool) -> (Store, AccountState) {
        let store = Store::temporary().unwrap();
        let mut batch = store.batch();
        let mut state = AccountState::new("bob");
        let mut run_until = None;
        for (i, e) in events.iter().enumerate() {
            if let Some(w) = ledger::written("bob", e, None) {
                batch.blob_put(&w.key("bob"), &w.value().unwrap());
            }
            if let Some(t) = retention::traces("bob", e) {
                if per_message || retention::starts_run(run_until, t.retention_until) {
                    batch.kv_put(&retention::index_key(t.retention_until, "bob", i as u64 + 1), retention::DUE);
                }
                run_until = Some(t.retention_until);
            }
            if let Some(r) = e.record() {
                batch.kv_put(&timeline::key("bob", r.sequence), b"{}");
            }
            state.apply(e);
        }
        let encoded = events.iter().map(|e| NewEvent::new(e.event_type(), 3, UnixSecs(10), e).unwrap()).collect();
        batch.append("account/bob", Head::default(), encoded);
        store.commit_durable_blocking(batch).unwrap();
        (store, state)
    }

    fn sweep(store: &Store, state: &AccountState, now: u64) -> Swept {
        let due: Vec<_> = store
            .kv_scan_prefix(retention::INDEX_PREFIX)
            .map(|kv| kv.unwrap())
            .filter_map(|(k, v)| retention::parse_index_key(&k).filter(|e| e.until < now).map(|e| (e, v)))
            .collect();
        sweep_due(store, state, now, &due)
    }

    /// A turn at `now` handed `due` (the scan's, read a little earlier).
    fn sweep_due(store: &Store, state: &AccountState, now: u64, due: &[(IndexEntry, Vec<u8>)]) -> Swept {
        let policy = Policy::with_relay_id("relay-a");
        let s = Sweep { store, state, stream: "account/bob", now: UnixSecs(now), policy: &policy };
        let mut batch = store.batch();
        let swept = s.run(&mut batch, due).unwrap();
        store.commit_durable_blocking(batch).unwrap();
        swept
    }

    #[test]
    fn a_streams_prefix_goes_up_to_the_first_message_still_retained() {
        let settings = AccountEvent::SettingsUpdated { public_discovery: true, at: Some(5) };
        let events = [settings, received("m1", 1, 110), received("m2", 2, 200), received("m3", 3, 120)];
        let (store, state) = stream(&events);
        let swept = sweep(&store, &state, 150);

        // m1 and m3 are past: their traces go; m2 holds the prefix at seq 3.
        assert_eq!(swept, Swept { messages: 2, pruned: 2 });
        let left: Vec<u64> = store.read("account/bob", 0).map(|e| e.unwrap().seq).collect();
        assert_eq!(left, [3, 4], "a prefix goes, never a middle: m3's event waits for m2");
        let marker = store.pruned("account/bob").unwrap().unwrap();
        assert_eq!(marker.head.seq, 2);
        let folded: AccountState = serde_json::from_slice(&marker.state).unwrap();
        assert!(folded.public_discovery && folded.last_sequence == 1, "the marker holds the state through it");
        for (seq, gone) in [(1, true), (2, false), (3, true)] {
            assert_eq!(store.kv_get(&timeline::key("bob", seq)).unwrap().is_none(), gone, "record {seq}");
        }
        let m1: ledger::ReceiptEntry =
            serde_json::from_slice(&store.blob_get(&ledger::receipt_key("bob", "alice", "m1")).unwrap().unwrap())
                .unwrap();
        assert!(m1.is_swept() && m1.retention_until == 110, "{m1:?}");

        // Later the swept entry goes too, and m2 takes the rest of the prefix.
        let policy = Policy::with_relay_id("relay-a");
        let later = retention::tombstone_until(10, &policy) + 1;
        sweep(&store, &state, later);
        assert!(store.blob_get(&ledger::receipt_key("bob", "alice", "m1")).unwrap().is_none());
        assert_eq!(store.read("account/bob", 0).count(), 0);
        assert_eq!(store.pruned("account/bob").unwrap().unwrap().head, store.head("account/bob").unwrap());
        assert!(store.kv_scan_prefix(retention::INDEX_PREFIX).next().is_none(), "nothing left to sweep");
    }

    fn index(store: &Store) -> Vec<Vec<u8>> {
        store.kv_scan_prefix(retention::INDEX_PREFIX).map(|kv| kv.unwrap().0).collect()
    }

    fn record_left(store: &Store, sequence: u64) -> bool {
        store.kv_get(&timeline::key("bob", sequence)).unwrap().is_some()
    }

    #[test]
    fn one_entry_sweeps_a_run_of_messages_and_moves_to_the_first_not_yet_past() {
        let events = [received("m1", 1, 110), received("m2", 2, 120), received("m3", 3, 200), received("m4", 4, 210)];
        let (store, state) = stream(&events);
        assert_eq!(index(&store), [retention::index_key(110, "bob", 1)], "one entry for the run");

        assert_eq!(sweep(&store, &state, 150), Swept { messages: 2, pruned: 2 });
        assert_eq!((1..=4).map(|s| record_left(&store, s)).collect::<Vec<_>>(), [false, false, true, true]);
        let run = retention::index_key(200, "bob", 3);
        assert!(index(&store).contains(&run), "the run goes on from m3");
        let swept_forms = index(&store).into_iter().filter(|k| *k != run).count();
        assert_eq!(swept_forms, 2, "and m1 and m2 left their swept entries");

        assert_eq!(sweep(&store, &state, 215).pruned, 2);
        assert!(!record_left(&store, 3) && !record_left(&store, 4));
        assert!(!index(&store).iter().any(|k| retention::parse_index_key(k).unwrap().until <= 210), "the run is done");
    }

    #[test]
    fn a_message_kept_shorter_than_the_one_before_is_swept_on_time_not_behind_it() {
        // m1 was accepted under a long retention, m2 and m3 after it was shortened.
        let events = [received("m1", 1, 500), received("m2", 2, 120), received("m3", 3, 130)];
        let (store, state) = stream(&events);
        assert_eq!(index(&store), [retention::index_key(120, "bob", 2), retention::index_key(500, "bob", 1)]);

        assert_eq!(sweep(&store, &state, 150), Swept { messages: 2, pruned: 0 });
        assert_eq!((1..=3).map(|s| record_left(&store, s)).collect::<Vec<_>>(), [true, false, false]);
        let until_of = |k: &Vec<u8>| retention::parse_index_key(k).unwrap().until;
        assert!(index(&store).iter().any(|k| until_of(k) == 500), "m1 keeps its promise");
        assert!(!index(&store).iter().any(|k| until_of(k) == 120), "m2's run is done");
    }

    #[test]
    fn a_walk_stops_where_the_next_run_begins() {
        // Two runs, both due: each entry sweeps its own run once.
        let events = [received("m1", 1, 110), received("m2", 2, 140), received("m3", 3, 100), received("m4", 4, 120)];
        let (store, state) = stream(&events);
        assert_eq!(index(&store).len(), 2);
        assert_eq!(sweep(&store, &state, 150), Swept { messages: 4, pruned: 4 });
        assert!((1..=4).all(|s| !record_left(&store, s)));
    }

    #[test]
    fn a_run_whose_first_message_the_prefix_took_goes_on_from_its_entry() {
        // The scan ran just before m1's time; the turn, just after, prunes it.
        let (store, state) = stream(&[received("m1", 1, 110), received("m2", 2, 200)]);
        assert_eq!(sweep_due(&store, &state, 150, &[]), Swept { messages: 1, pruned: 1 });
        assert_eq!(index(&store)[0], retention::index_key(110, "bob", 1), "the run's entry stays");

        assert_eq!(sweep(&store, &state, 250).messages, 1);
        assert!(!record_left(&store, 2), "m2 went with the rest of the run");
    }

    #[test]
    fn entries_of_a_store_from_before_runs_one_per_message_still_sweep() {
        let events = [received("m1", 1, 110), received("m2", 2, 120), received("m3", 3, 200)];
        let (store, state) = stream_indexed(&events, true);
        assert_eq!(index(&store).len(), 3);
        assert_eq!(sweep(&store, &state, 150), Swept { messages: 2, pruned: 2 });
        assert_eq!((1..=3).map(|s| record_left(&store, s)).collect::<Vec<_>>(), [false, false, true]);
        assert!(index(&store).contains(&retention::index_key(200, "bob", 3)));
    }

    #[test]
    fn a_send_still_delivering_past_its_retention_is_deferred_not_deleted() {
        let (store, state) = stream(&[sent_delivering("m1", 110)]);
        let swept = sweep(&store, &state, 150);
        assert_eq!(swept, Swept { messages: 0, pruned: 0 });
        assert_eq!(store.read("account/bob", 0).count(), 1);
        let entry = store.blob_get(&ledger::send_key("bob", "m1")).unwrap().unwrap();
        assert!(!serde_json::from_slice::<SendEntry>(&entry).unwrap().is_swept());
        let keys: Vec<_> = store.kv_scan_prefix(retention::INDEX_PREFIX).map(|kv| kv.unwrap().0).collect();
        assert_eq!(keys, [retention::index_key(150 + DEFER_SECS, "bob", 1)], "looked at again later");
        let value = store.kv_get(&keys[0]).unwrap().unwrap();
        assert_eq!(value, retention::SINGLE, "by itself: the messages after it go on");
    }
}
