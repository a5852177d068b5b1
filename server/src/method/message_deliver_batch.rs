//! `message.deliver.batch` (PROTOCOL §5): a home relay of the senders hands
//! this relay many `message.deliver` params in one signed request. Each
//! item is the body of a single `message.deliver` and goes through exactly
//! its handler (who may deliver, digest, idempotency), so the answers are
//! what single calls would have got, and the source may retry any item
//! singly. A batch costs its peer's delivery budget one unit per item.
//!
//! A cluster of several shards does not offer it to its peers: its front
//! routes a request by the one recipient in it, and a batch has many. It
//! answers them `not_found`, as a relay without the method would, and they
//! fall back to single calls. Its own shards send each other batches: a
//! sibling's batch holds deliveries for the callee's shard only (queued by
//! shard, `crate::peer_batch`), and an item for another shard is answered
//! as a single call to the wrong owner would be.

use super::message_deliver;
use crate::app::{parse, App};
use relay_schemas::methods::DeliverBatchParams;
use relay_schemas::RelayError;

caller!(MessageDeliverBatch, Relay);

pub(crate) async fn handle_relay(relay: &App, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    if relay.peers().sharded() && peer != relay.supervisor().policy().relay_id {
        return Err(RelayError::not_found("message.deliver.batch is not offered by a cluster of several shards"));
    }
    let p: DeliverBatchParams = parse(body)?;
    let n = p.items.len();
    if !(1..=DeliverBatchParams::MAX_ITEMS).contains(&n) {
        let max = DeliverBatchParams::MAX_ITEMS;
        return Err(RelayError::invalid_params(format!("items: {n} items, a batch holds 1 to {max}")));
    }
    relay.limits().deliveries(peer, n)?;
    let answers = futures_util::future::join_all(
        p.items.iter().map(|item| message_deliver::handle_relay(relay, peer, item.get().as_bytes())),
    )
    .await;
    // The items' answers are JSON already: the statuses as they would be
    // sent alone, the errors as their `{"error":…}` bodies.
    let mut out = String::with_capacity(64 + 128 * n);
    out.push_str(r#"{"results":["#);
    for (i, answer) in answers.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        match answer {
            Ok(json) => out.push_str(&json),
            Err(e) => out.push_str(&e.to_body().to_string()),
        }
    }
    out.push_str("]}");
    Ok(out)
}
