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
//!    written ([`Checkpointer`]), so whatever it prunes was covered by one
//!    its peers could witness; without one it deletes nothing;
//! 3. hands each account its entries; the account actor deletes and
//!    answers once that is durable (it serializes with the account's own
//!    commands, so nothing it deletes is being written);
//! 4. waits while the store's writer is behind ([`BUSY_BACKLOG`] commits
//!    not yet durable): sweeping yields to traffic.
//!
//! A pass whose turn finds the same first entry as the turn before stops:
//! an account that cannot sweep is not retried in a loop (its entries
//! wait for the next pass).

use crate::supervisor::Supervisor;
use relay_core::retention::{self, IndexEntry};
use std::collections::BTreeMap;
use std::time::Duration;

/// Writes a signed checkpoint of the whole store (PROTOCOL §10): the sweep
/// asks for one before it prunes anything, so every pruned event was
/// covered by a checkpoint its peers could witness. Blocking: the sweep
/// calls it off the event loop.
pub trait Checkpointer: Send + Sync + 'static {
    fn checkpoint(&self) -> Result<(), String>;
}

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

/// Runs a pass every `every`, the first at once.
pub async fn run(sup: Supervisor, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match pass(&sup).await {
            Ok(p) if p.messages > 0 || p.pruned > 0 => {
                tracing::info!(messages = p.messages, pruned = p.pruned, turns = p.turns, "retention sweep")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "retention sweep"),
        }
    }
}

/// One pass: sweeps until nothing is due.
pub async fn pass(sup: &Supervisor) -> Result<Pass, String> {
    let store = sup.store();
    let mut done = Pass::default();
    let mut checkpointed = false;
    let mut first_seen: Option<IndexEntry> = None;
    loop {
        let now = sup.clock().now();
        let scan = store.clone();
        let due = tokio::task::spawn_blocking(move || due_entries(&scan, now))
            .await
            .map_err(|e| e.to_string())??;
        let Some((first, _)) = due.first() else { break };
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
