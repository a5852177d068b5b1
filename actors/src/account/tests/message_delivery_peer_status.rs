//! `message.delivery.peer_status`.

use super::*;

#[test]
fn peer_status_is_answered_only_to_a_relay_the_accounts_route_names() {
    let two_homes = registered_with(&alice(), &register_value(&alice(), &phone(), &[RELAY, "relay-b"], None));
    let s = given(&alice(), &[two_homes]);
    assert!(decide::may_ask_peer_status(&s, "relay-b").is_ok());
    then_error(decide::may_ask_peer_status(&s, "relay-c"), ErrorCode::Forbidden);
    then_error(decide::may_ask_peer_status(&AccountState::new(&alice().id), "relay-b"), ErrorCode::NotFound);
}
