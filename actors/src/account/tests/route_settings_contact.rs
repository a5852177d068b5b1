//! `route.update`, `account.settings.update` and `contact.revoke`.

use super::*;

#[test]
fn route_update_with_a_higher_revision_replaces_the_route() {
    let s = given_alice([]);
    let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
    let events = then_events(decide::update_route(&s, &wire(&r2), at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::RouteUpdated { .. }]));
    let s = given_alice(events);
    assert_eq!(s.route().unwrap().revision, 2);
}

#[test]
fn route_update_with_an_equal_revision_is_a_no_op_when_identical_and_state_conflict_otherwise() {
    let s = given_alice([]);
    then_no_events(decide::update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)));
    let other = route(&alice(), 1, &[RELAY, "relay-b"]);
    then_error(decide::update_route(&s, &wire(&other), at(NOW)), ErrorCode::StateConflict);
}

#[test]
fn route_update_with_a_lower_revision_is_route_stale_carrying_the_newer_route() {
    let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
    let s = given_alice([route_updated(&r2)]);
    let e = then_error(decide::update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)), ErrorCode::RouteStale);
    assert_eq!(e.data.unwrap()["route"], r2);
}

#[test]
fn settings_update_is_a_no_op_when_unchanged() {
    let s = given_alice([]);
    then_no_events(decide::update_settings(&s, false, at(NOW)));
    let events = then_events(decide::update_settings(&s, true, at(NOW)));
    assert!(given_alice(events).public_discovery);
}

#[test]
fn contact_revoke_is_idempotent_and_keyed_by_kind_and_id() {
    let s = given_alice([]);
    let p = ContactRevokeParams { grant_id: Some("grant-bob".into()), invite_id: None };
    let events = then_events(decide::revoke_contact(&s, &p, at(NOW)));
    assert_eq!(events.len(), 1);
    let s = given_alice(events);
    then_no_events(decide::revoke_contact(&s, &p, at(NOW)));
    // An invite with the same id is another credential.
    let invite = ContactRevokeParams { grant_id: None, invite_id: Some("grant-bob".into()) };
    assert_eq!(then_events(decide::revoke_contact(&s, &invite, at(NOW))).len(), 1);
    let both = ContactRevokeParams { grant_id: Some("a".into()), invite_id: Some("b".into()) };
    then_error(decide::revoke_contact(&s, &both, at(NOW)), ErrorCode::InvalidParams);
}
