//! One account's part of a retention sweep (PROTOCOL §10): the writes that
//! delete what is past its retention, built for the account actor to
//! commit. The rules (what is past, what may leave the prefix, what a
//! swept entry leaves) are in `relay_core::retention`.

use super::ledger::{ReceiptEntry, SendEntry};
use super::{timeline, AccountEvent, AccountState};
use crate::internal;
use crate::policy::Policy;
use crate::store::{Batch, Store, StoredEvent};
use relay_core::retention::{self, IndexEntry, LedgerSweep, Traces};
use relay_schemas::{RelayError, UnixSecs};

/// Events one sweep turn of an account reads from its stream's prefix at
/// most: bounded work per turn (the next turn goes on from the marker).
pub const MAX_PRUNED_PER_TURN: usize = 1024;

/// A message whose send has not finished (its delivery outlived its
/// retention: the relay was down at its deadline) is looked at again this
/// much later.
pub const DEFER_SECS: u64 = 60;

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
    /// their time) and of the stream's prefix as far as it may go.
    pub fn run(&self, batch: &mut Batch, due: &[(IndexEntry, Vec<u8>)]) -> Result<Swept, RelayError> {
        let account = self.state.account_id.as_str();
        let mut swept = Swept::default();
        for (entry, value) in due {
            if let Some((&retention::SWEPT, ledger_key)) = value.split_first() {
                // Second stage: the swept entry has answered long enough.
                batch.kv_remove(&retention::index_key(entry.until, account, entry.seq));
                batch.blob_remove(ledger_key);
                swept.messages += 1;
                continue;
            }
            // First stage. An event already pruned took its traces with it.
            let event = match self.event(entry.seq)? {
                Some(event) => event,
                None => {
                    batch.kv_remove(&retention::index_key(entry.until, account, entry.seq));
                    continue;
                }
            };
            let Some(traces) = retention::traces(account, &event) else {
                batch.kv_remove(&retention::index_key(entry.until, account, entry.seq));
                continue;
            };
            if self.traces(batch, entry.seq, &traces)? {
                swept.messages += 1;
            }
        }
        swept.pruned = self.prefix(batch, &mut swept)?;
        Ok(swept)
    }

    /// Deletes the prefix of events that may go, folding them into the
    /// marker's state; the number of events deleted.
    fn prefix(&self, batch: &mut Batch, swept: &mut Swept) -> Result<u64, RelayError> {
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
            if let Some(traces) = retention::traces(account, &event) {
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
    /// has not finished, which defers it.
    fn traces(&self, batch: &mut Batch, seq: u64, t: &Traces) -> Result<bool, RelayError> {
        let account = self.state.account_id.as_str();
        let index = retention::index_key(t.retention_until, account, seq);
        if let Some(message_id) = &t.delivery {
            if !self.send_finished(&t.ledger_key)? {
                batch.kv_remove(&index);
                let later = self.now.0 + DEFER_SECS;
                batch.kv_put(&retention::index_key(later.max(t.retention_until), account, seq), retention::DUE);
                return Ok(false);
            }
            self.delivery(batch, message_id)?;
        }
        batch.kv_remove(&index);
        if let Some(sequence) = t.record {
            batch.kv_remove(&timeline::key(account, sequence));
        }
        match retention::ledger_sweep(t.retention_until, self.now, self.policy) {
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
