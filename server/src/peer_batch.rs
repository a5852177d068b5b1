//! Deliveries to one peer coalesced into `message.deliver.batch` calls
//! (PROTOCOL §5), without adding a wait: a delivery goes out at once while
//! fewer than `in_flight` calls to its peer are under way; past that,
//! deliveries queue, and each call that ends takes what queued meanwhile
//! (up to 256 items and the body limit) as its next batch. Light load
//! thus sends single `message.deliver` calls with no added latency, and
//! heavy load sends batches, as the store's writer groups commits.
//!
//! A peer that answers the batch method `not_found` (a relay without it)
//! gets single calls for [`NO_BATCH_FOR`], then is tried again.

use crate::peers::{CallError, PeerClient};
use relay_actors::delivery::transport::AttemptOutcome;
use relay_schemas::error::RemoteError;
use relay_schemas::methods::{DeliverBatchParams, DeliverBatchResult};
use relay_schemas::{ErrorCode, Method, RelayError};
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How long a peer without the batch method gets single calls only.
pub const NO_BATCH_FOR: Duration = Duration::from_secs(600);

/// `{"items":[` and `]}`.
const ENVELOPE_BYTES: usize = 12;

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

/// One delivery waiting for a call: its `message.deliver` body and who
/// waits for its outcome.
struct Item {
    body: Vec<u8>,
    done: oneshot::Sender<AttemptOutcome>,
}

#[derive(Default)]
struct PeerQueue {
    /// Calls to this peer under way (each drains the queue when it ends).
    busy: usize,
    waiting: VecDeque<Item>,
    /// Until when this peer gets single calls (it lacks the batch method).
    no_batch_until: Option<Instant>,
}

pub struct Batcher {
    batching: Batching,
    peers: Mutex<HashMap<String, PeerQueue>>,
}

impl Batcher {
    pub fn new(batching: Batching) -> Self {
        Batcher { batching, peers: Mutex::default() }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, PeerQueue>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `message.deliver` with `body` at `peer` (a configured peer), alone
    /// or in a batch.
    pub async fn deliver(client: PeerClient, peer: String, body: Vec<u8>) -> AttemptOutcome {
        let batcher = client.batcher();
        if batcher.batching.in_flight == 0 {
            return client.deliver_one(&peer, body).await;
        }
        let (done, outcome) = oneshot::channel();
        let start = {
            let mut peers = batcher.lock();
            let q = peers.entry(peer.clone()).or_default();
            q.waiting.push_back(Item { body, done });
            let start = q.busy < batcher.batching.in_flight;
            q.busy += usize::from(start);
            start
        };
        if start {
            // Spawned, not awaited here: deliveries arriving before it runs
            // join its first call, and it outlives this caller if need be.
            actix_rt::spawn(drain(client, peer));
        }
        outcome.await.unwrap_or_else(|_| {
            AttemptOutcome::Unknown(RelayError::internal("the batch carrying this delivery was dropped"))
        })
    }

    /// The next call's items for `peer` (none: the caller's call ends),
    /// and whether they may go as a batch.
    fn next(&self, peer: &str) -> (Vec<Item>, bool) {
        let mut peers = self.lock();
        let Some(q) = peers.get_mut(peer) else { return (vec![], false) };
        let mut items: Vec<Item> = vec![];
        let mut bytes = ENVELOPE_BYTES;
        while let Some(item) = q.waiting.front() {
            let fits = bytes + item.body.len() < self.batching.max_bytes;
            if !items.is_empty() && (!fits || items.len() == DeliverBatchParams::MAX_ITEMS) {
                break;
            }
            bytes += item.body.len() + 1;
            items.extend(q.waiting.pop_front());
        }
        if items.is_empty() {
            // The entry stays: one per configured peer, with its
            // `no_batch_until`.
            q.busy -= 1;
            return (items, false);
        }
        let batch = q.no_batch_until.is_none_or(|until| Instant::now() >= until);
        (items, batch)
    }

    fn no_batch(&self, peer: &str) {
        if let Some(q) = self.lock().get_mut(peer) {
            q.no_batch_until = Some(Instant::now() + NO_BATCH_FOR);
        }
    }
}

/// One call's worth of `peer`'s queue at a time, until it is empty.
async fn drain(client: PeerClient, peer: String) {
    let mut slot = Slot { batcher: client.batcher(), peer: &peer, held: true };
    loop {
        let (items, batch) = client.batcher().next(&peer);
        match items.len() {
            0 => {
                // `next` gave the slot back.
                slot.held = false;
                return;
            }
            1 => singly(&client, &peer, items).await,
            _ if !batch => singly(&client, &peer, items).await,
            _ => as_batch(&client, &peer, items).await,
        }
    }
}

/// A drain's call slot, given back should its task be dropped mid-call
/// (its arbiter stopping): the peer's later deliveries would otherwise
/// queue behind a call that never ends.
struct Slot<'a> {
    batcher: &'a Batcher,
    peer: &'a str,
    held: bool,
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

async fn singly(client: &PeerClient, peer: &str, items: Vec<Item>) {
    let calls = items.into_iter().map(|Item { body, done }| async move {
        let _ = done.send(client.deliver_one(peer, body).await);
    });
    futures_util::future::join_all(calls).await;
}

async fn as_batch(client: &PeerClient, peer: &str, items: Vec<Item>) {
    let mut body = Vec::with_capacity(ENVELOPE_BYTES + items.iter().map(|i| i.body.len() + 1).sum::<usize>());
    body.extend_from_slice(br#"{"items":["#);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item.body);
    }
    body.extend_from_slice(b"]}");
    let outcomes = match client.call(peer, Method::MessageDeliverBatch, body).await {
        Ok(bytes) => match serde_json::from_slice::<DeliverBatchResult>(&bytes) {
            Ok(r) if r.results.len() == items.len() => r.results.iter().map(|raw| item_outcome(raw.get())).collect(),
            Ok(r) => {
                let why = format!("{peer}: {} results for a batch of {}", r.results.len(), items.len());
                vec![AttemptOutcome::Unknown(RelayError::new(ErrorCode::BadGateway, why)); items.len()]
            }
            Err(e) => {
                let why = format!("{peer}: unreadable batch answer: {e}");
                vec![AttemptOutcome::Unknown(RelayError::new(ErrorCode::BadGateway, why)); items.len()]
            }
        },
        // A relay without the batch method, or a callee whose body limit
        // is lower than ours: the same deliveries, one by one.
        Err(CallError::Answered { error, .. }) if error.code == ErrorCode::NotFound => {
            client.batcher().no_batch(peer);
            return singly(client, peer, items).await;
        }
        Err(CallError::Answered { error, .. }) if error.code == ErrorCode::PayloadTooLarge => {
            return singly(client, peer, items).await;
        }
        // Whatever ended the whole call (unreachable, no answer, a refusal
        // of our authentication, rate_limited) ends each item alike.
        Err(e) => {
            let outcome = PeerClient::deliver_outcome(Err(e));
            vec![outcome; items.len()]
        }
    };
    for (item, outcome) in items.into_iter().zip(outcomes) {
        let _ = item.done.send(outcome);
    }
}

/// A batch item's answer: a `DeliveryStatus`, or `{"error": …}` (an object
/// without `status`), read as the same answer to a single call would be.
fn item_outcome(raw: &str) -> AttemptOutcome {
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        status: Option<serde::de::IgnoredAny>,
        error: RemoteError,
    }
    match serde_json::from_str::<ErrorItem>(raw) {
        Ok(ErrorItem { status: None, error: e }) => {
            let error = RelayError::from_remote(&e.code, &e.message, e.data);
            PeerClient::deliver_outcome(Err(CallError::Answered { code: e.code, error }))
        }
        _ => PeerClient::deliver_outcome(Ok(actix_web::web::Bytes::copy_from_slice(raw.as_bytes()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::DeliveryStatus;

    #[test]
    fn a_batch_item_reads_as_the_same_answer_to_a_single_call_would() {
        let accepted = serde_json::to_string(&DeliveryStatus::target_accepted(7)).unwrap();
        assert!(matches!(item_outcome(&accepted), AttemptOutcome::Answered(s) if s.accepted_at == 7));
        // A failed status carries `error` too, and stays a status.
        let failed = serde_json::to_string(&DeliveryStatus::failed(8, RelayError::invalid_params("x"))).unwrap();
        assert!(matches!(item_outcome(&failed), AttemptOutcome::Answered(s) if s.accepted_at == 8));
        let refused = r#"{"error":{"code":"forbidden","message":"no"}}"#;
        assert!(matches!(item_outcome(refused), AttemptOutcome::Rejected(e) if e.code == ErrorCode::Forbidden));
        let unknown = r#"{"error":{"code":"something_new","message":"?"}}"#;
        assert!(matches!(item_outcome(unknown), AttemptOutcome::Unrecognized(_)));
        assert!(matches!(item_outcome("[]"), AttemptOutcome::Unknown(_)));
    }

    #[test]
    fn a_drain_dropped_mid_call_gives_its_slot_back_once() {
        let b = Batcher::new(Batching { in_flight: 1, max_bytes: 1 << 20 });
        b.lock().entry("relay-b".into()).or_default().busy = 1;
        drop(Slot { batcher: &b, peer: "relay-b", held: true });
        assert_eq!(b.lock()["relay-b"].busy, 0);
        // A slot `next` gave back (the queue was empty) is not given back twice.
        b.lock().get_mut("relay-b").unwrap().busy = 1;
        assert!(b.next("relay-b").0.is_empty());
        drop(Slot { batcher: &b, peer: "relay-b", held: false });
        assert_eq!(b.lock()["relay-b"].busy, 0);
    }
}
