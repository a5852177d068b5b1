//! `device.add`, `device.revoke` and the sessions of devices.

use super::*;

#[test]
fn add_device_appends_device_added_for_a_new_certificate() {
    let s = given(&alice(), &[registered(&alice(), &phone())]);
    let events = then_events(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::DeviceAdded { .. }]));
    let s = given(&alice(), &history([]));
    assert!(s.device_valid("laptop", UnixSecs(NOW)));
}

#[test]
fn add_device_with_the_identical_certificate_is_a_no_op() {
    let s = given_alice([]);
    then_no_events(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
}

#[test]
fn add_device_with_another_certificate_for_a_known_device_id_is_state_conflict() {
    let s = given_alice([]);
    // Same id "laptop", another key.
    let other = Device::from_seed("laptop", [99; 32]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &other)), at(NOW)), ErrorCode::StateConflict);
    // Same key, other validity window.
    let reissued = alice().certificate(&laptop(), ISSUED + 1, None);
    then_error(decide::add_device(&s, &wire(&reissued), at(NOW)), ErrorCode::StateConflict);
}

#[test]
fn a_revoked_device_id_cannot_be_added_again() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::InvalidState);
    let fresh = Device::from_seed("laptop", [98; 32]);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &fresh)), at(NOW)), ErrorCode::InvalidState);
}

#[test]
fn add_device_refuses_a_certificate_of_another_account() {
    let s = given_alice([]);
    then_error(decide::add_device(&s, &wire(&cert(&bob(), &bob_phone())), at(NOW)), ErrorCode::Forbidden);
}

#[test]
fn add_device_rejects_a_certificate_not_signed_by_the_account_key() {
    let s = given_alice([]);
    let by_device = signed(Tag::DeviceCertificate, cert(&alice(), &tablet()), &tablet().key);
    then_error(decide::add_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn add_device_on_an_unregistered_account_is_not_found() {
    let s = AccountState::new(&alice().id);
    then_error(decide::add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::NotFound);
}

#[test]
fn revoke_device_signed_by_the_account_key_appends_device_revoked() {
    let s = given_alice([]);
    let rev: Wire<DeviceRevocation> = wire(&alice().revocation("laptop", NOW));
    let events = then_events(decide::revoke_device(&s, &rev, at(NOW)));
    assert!(matches!(events.as_slice(), [AccountEvent::DeviceRevoked { .. }]));
    let s = given_alice(events);
    assert!(!s.device_valid("laptop", UnixSecs(NOW)));
    assert!(s.device_valid("phone", UnixSecs(NOW)));
}

#[test]
fn revoke_device_refuses_a_revocation_not_signed_by_the_account_key() {
    let s = given_alice([]);
    let by_device = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &phone().key);
    then_error(decide::revoke_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
    let by_bob = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &bob().key);
    then_error(decide::revoke_device(&s, &wire(&by_bob), at(NOW)), ErrorCode::InvalidSignature);
    let wrong_tag = signed(Tag::DeviceCertificate, alice().revocation("laptop", NOW), &alice().key);
    then_error(decide::revoke_device(&s, &wire(&wrong_tag), at(NOW)), ErrorCode::InvalidSignature);
}

#[test]
fn revoke_device_refuses_a_revocation_naming_another_account() {
    let s = given_alice([]);
    let other = signed(
        Tag::DeviceRevocation,
        json!({"account_id": bob().id, "device_id": "laptop", "revoked_at": NOW}),
        &alice().key,
    );
    then_error(decide::revoke_device(&s, &wire(&other), at(NOW)), ErrorCode::Forbidden);
}

#[test]
fn revoke_device_of_an_unknown_device_is_not_found() {
    let s = given_alice([]);
    then_error(decide::revoke_device(&s, &wire(&alice().revocation("tablet", NOW)), at(NOW)), ErrorCode::NotFound);
}

#[test]
fn revoking_an_already_revoked_device_is_a_no_op() {
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_no_events(decide::revoke_device(&s, &wire(&alice().revocation("laptop", NOW)), at(NOW)));
}

#[test]
fn a_revoked_devices_session_is_refused() {
    let s = given_alice([]);
    decide::check_session(&s, "laptop", at(NOW)).expect("laptop valid before revocation");
    let s = given_alice([device_revoked(&alice(), "laptop")]);
    then_error(decide::check_session(&s, "laptop", at(NOW)), ErrorCode::Unauthorized);
    decide::check_session(&s, "phone", at(NOW)).expect("other devices keep their sessions");
}

#[test]
fn a_session_of_an_unknown_device_or_account_is_refused() {
    let s = given_alice([]);
    then_error(decide::check_session(&s, "tablet", at(NOW)), ErrorCode::Unauthorized);
    let unregistered = AccountState::new(&alice().id);
    then_error(decide::check_session(&unregistered, "phone", at(NOW)), ErrorCode::Unauthorized);
}

#[test]
fn an_expired_certificate_makes_the_device_invalid() {
    let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 100));
    let s = given_alice([device_added_cert(&expiring)]);
    assert!(s.device_valid("tablet", UnixSecs(NOW + 99)));
    decide::check_session(&s, "tablet", at(NOW + 99)).unwrap();
    assert!(!s.device_valid("tablet", UnixSecs(NOW + 100)));
    then_error(decide::check_session(&s, "tablet", at(NOW + 100)), ErrorCode::Unauthorized);
    // It can no longer send ...
    let v = send_value(envelope(&tablet(), &alice(), &bob(), 1, NOW + 100), &["bob-phone"], None);
    then_error(when_send(&s, "tablet", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
    // ... nor be the only reader of a record.
    let v = send_value(envelope(&phone(), &alice(), &alice(), 2, NOW + 100), &["tablet"], None);
    then_error(when_send(&s, "phone", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
}

#[test]
fn add_device_refuses_an_already_expired_certificate() {
    let s = given_alice([]);
    let expired = alice().certificate(&tablet(), ISSUED, Some(NOW));
    then_rejected(decide::add_device(&s, &wire(&expired), at(NOW)));
}
