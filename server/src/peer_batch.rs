//! The queues of deliveries to each peer (and, in a cluster of several
//! shards, to each sibling shard), for `message.deliver.batch` calls
//! (PROTOCOL §5). What goes out at once, what a call takes and for
//! how long a peer without the batch method gets single calls are rules
//! of the core (`relay_core::delivery::batch`); this holds the queues,
//! and the peer client (`crate::peers`) drives them with its calls, so the
//! two import one way.

use relay_core::delivery::batch;
use relay_core::delivery::outcome::AttemptOutcome;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;
use tokio::sync::oneshot;

/// How deliveries to peers are grouped (`delivery.batches_in_flight`,
/// `limits.max_body_bytes`).
#[derive(Clone, Copy, Debug)]
pub struct Batching {
    /// Calls under way to one peer before deliveries queue for a batch;
    /// 0 sends every delivery alone.
    pub in_flight: usize,
    /// A batch's body at most: the callee's body limit, assumed ours.
    pub max_bytes: usize,
}

impl Batching {
    /// From the configuration: a batch's body is at most our own body
    /// limit, which a peer on the defaults shares.
    pub fn from_config(cfg: &crate::config::Config) -> Self {
        Batching { in_flight: cfg.delivery.batches_in_flight, max_bytes: cfg.limits.max_body_bytes }
    }
}

/// Where a queue's deliveries go: a configured peer, or (in a cluster of
/// several shards) a sibling shard of this relay, whoever owns it now.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Dest {
    Peer(String),
    Shard(u32),
}

impl std::fmt::Display for Dest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dest::Peer(id) => f.write_str(id),
            Dest::Shard(k) => write!(f, "shard {k}"),
        }
    }
}

/// One delivery waiting for a call: its `message.deliver` body and who
/// waits for its outcome.
pub(crate) struct Item {
    pub(crate) body: Vec<u8>,
    pub(crate) done: oneshot::Sender<AttemptOutcome>,
}

#[derive(Default)]
pub(crate) struct PeerQueue {
    /// Calls to this peer under way (each drains the queue when it ends).
    pub(crate) busy: usize,
    pub(crate) waiting: VecDeque<Item>,
    /// Until when this peer gets single calls (it lacks the batch method).
    no_batch_until: Option<Instant>,
}

pub struct Batcher {
    pub(crate) batching: Batching,
    peers: Mutex<HashMap<Dest, PeerQueue>>,
}

impl Batcher {
    pub fn new(batching: Batching) -> Self {
        Batcher { batching, peers: Mutex::default() }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Dest, PeerQueue>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next call's items for `peer` (none: the caller's call ends),
    /// and whether they may go as a batch.
    pub(crate) fn next(&self, peer: &Dest) -> (Vec<Item>, bool) {
        let mut peers = self.lock();
        let Some(q) = peers.get_mut(peer) else { return (vec![], false) };
        let n = batch::next_call(q.waiting.iter().map(|i| i.body.len()), self.batching.max_bytes);
        let items: Vec<Item> = q.waiting.drain(..n).collect();
        if items.is_empty() {
            // The entry stays: one per configured peer (or sibling
            // shard), with its `no_batch_until`.
            q.busy -= 1;
            return (items, false);
        }
        let batch = batch::may_batch(items.len(), q.no_batch_until, Instant::now());
        (items, batch)
    }

    /// `peer` lacks the batch method: single calls only for a while.
    pub(crate) fn no_batch(&self, peer: &Dest) {
        if let Some(q) = self.lock().get_mut(peer) {
            q.no_batch_until = Some(Instant::now() + batch::NO_BATCH_FOR);
        }
    }
}

/// A drain's call slot, given back should its task be dropped mid-call
/// (its arbiter stopping): the peer's later deliveries would otherwise
/// queue behind a call that never ends.
pub(crate) struct Slot<'a> {
    pub(crate) batcher: &'a Batcher,
    pub(crate) peer: &'a Dest,
    pub(crate) held: bool,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if self.held {
            if let Some(q) = self.batcher.lock().get_mut(self.peer) {
                q.busy -= 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_dropped_mid_call_gives_its_slot_back_once() {
        let b = Batcher::new(Batching { in_flight: 1, max_bytes: 1 << 20 });
        let peer = Dest::Peer("relay-b".into());
        b.lock().entry(peer.clone()).or_default().busy = 1;
        drop(Slot { batcher: &b, peer: &peer, held: true });
        assert_eq!(b.lock()[&peer].busy, 0);
        // A slot `next` gave back (the queue was empty) is not given back twice.
        b.lock().get_mut(&peer).unwrap().busy = 1;
        assert!(b.next(&peer).0.is_empty());
        drop(Slot { batcher: &b, peer: &peer, held: false });
        assert_eq!(b.lock()[&peer].busy, 0);
    }
}
