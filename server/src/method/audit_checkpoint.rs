//! `audit.checkpoint` (PROTOCOL §5, §10): a peer asks for this relay's
//! latest signed checkpoint, to witness it (`crate::checkpoint`). Relays
//! only: clients are not given checkpoints (they reveal counts of accounts
//! and events).

use crate::app::{parse, App};
use relay_schemas::RelayError;
use serde_json::{Map, Value};

caller!(AuditCheckpoint, Relay);

pub(crate) async fn handle_relay(relay: &App, _peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let _: Map<String, Value> = parse(body)?;
    match relay.checkpoints().and_then(|c| c.latest_json()) {
        Some(json) => Ok(json.to_string()),
        None => Err(RelayError::not_found("no checkpoint written yet")),
    }
}
