//! `message.delivery.peer_status` (PROTOCOL §5): the account's other home
//! reads a message's delivery status from the ledger here.

use crate::account::decision::json;
use crate::account::decision::{Decision, Reads};
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

#[cfg(test)]
mod tests {
    //! `message.delivery.peer_status`.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn peer_status_is_answered_only_to_a_relay_the_accounts_route_names() {
        let two_homes = registered_with(&alice(), &register_value(&alice(), &phone(), &[RELAY, "relay-b"], None));
        let s = given(&alice(), &[two_homes]);
        assert!(may_ask_peer_status(&s, "relay-b").is_ok());
        then_error(may_ask_peer_status(&s, "relay-c"), ErrorCode::Forbidden);
        then_error(may_ask_peer_status(&AccountState::new(&alice().id), "relay-b"), ErrorCode::NotFound);
    }
}
