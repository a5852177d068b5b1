//! `message.delivery.peer_status` (PROTOCOL §5): the account's other home
//! reads a message's delivery status from the ledger here.

use crate::account::command::{Decision, Reads};
use crate::account::shared::json;
use crate::account::state::AccountState;
use relay_schemas::methods::PeerStatusResult;
use relay_schemas::RelayError;

/// Read only.
pub(crate) fn decide(
    state: &AccountState,
    peer: &str,
    message_id: &str,
    reads: &impl Reads,
) -> Result<Decision, RelayError> {
    may_ask_peer_status(state, peer)?;
    let status = reads.send_entry(message_id)?.map(|e| e.status);
    let result = PeerStatusResult { known: status.is_some(), status };
    // Through a JSON value, as this answer has always been sent: members sorted.
    let value = serde_json::to_value(result).map_err(|e| RelayError::internal(e.to_string()))?;
    Ok(Decision::reply(json(&value)?))
}

/// `message.delivery.peer_status` is answered only to a relay the
/// account's current route names: its other home (SHiNE's read-only
/// exchange of delivery results between a user's two servers).
pub fn may_ask_peer_status(state: &AccountState, peer: &str) -> Result<(), RelayError> {
    let route = state.route().ok_or_else(|| RelayError::not_found("unknown account"))?;
    if !route.lists_relay(peer) {
        return Err(RelayError::forbidden("only the account's other home relay may ask"));
    }
    Ok(())
}
