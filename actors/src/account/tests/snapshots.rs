//! `apply` and snapshots.

use super::*;

/// What a relay restoring from a snapshot does: serde round trip of the
/// state, then the derived caches. The ledger stays in the store.
fn snapshot_round_trip(s: &Given) -> Given {
    let bytes = serde_json::to_vec(&s.state).expect("snapshot serializes");
    let mut restored: AccountState = serde_json::from_slice(&bytes).expect("snapshot deserializes");
    restored.rebuild_caches();
    Given { state: restored, ..s.clone() }
}

/// A busy account: devices added, revoked and expiring, settings, a revoked
/// contact, sent, self-delivered and received messages, a delivery result and
/// a cursor.
pub(super) fn busy_alice() -> Given {
    given(&alice(), &busy_alice_events())
}

pub(super) fn busy_alice_events() -> Vec<AccountEvent> {
    let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 100));
    let mut events = history([
        device_added_cert(&expiring),
        device_revoked(&alice(), "laptop"),
        public_discovery(true),
        contact_revoked("grant", "grant-old"),
    ]);
    let s = given(&alice(), &events);
    events.push(send_event(&s, &alice_to_bob(1)));
    let s = given(&alice(), &events);
    events.push(send_event(&s, &alice_to_self(2, &["phone", "tablet"])));
    let s = given(&alice(), &events);
    events.push(receive_event(&s, &bob_to_alice(3)));
    let s = given(&alice(), &events);
    events.extend(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 1)));
    events.push(AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
    events
}

/// The decisions an account makes, rendered for comparison.
pub(super) fn decisions(s: &Given) -> Vec<String> {
    let old_grant = alice().grant("grant-old", &bob().id, ISSUED, None);
    let revoked_grant = with_auth(bob_to_alice_without_auth(20), grant_auth(old_grant));
    vec![
        format!("{:?}", when_send(s, "phone", &alice_to_bob(1), at(NOW + 5))),
        format!("{:?}", when_send(s, "phone", &alice_to_self(2, &["phone", "tablet"]), at(NOW + 5))),
        format!("{:?}", when_receive(s, &bob_to_alice(3), at(NOW + 5))),
        format!("{:?}", when_send(s, "phone", &alice_to_bob(10), at(NOW + 5))),
        format!(
            "{:?}",
            when_send(
                s,
                "tablet",
                &send_value(envelope(&tablet(), &alice(), &bob(), 11, NOW), &["bob-phone"], None),
                at(NOW + 5)
            )
        ),
        format!(
            "{:?}",
            when_send(
                s,
                "tablet",
                &send_value(envelope(&tablet(), &alice(), &bob(), 12, NOW + 100), &["bob-phone"], None),
                at(NOW + 100)
            )
        ),
        format!(
            "{:?}",
            when_send(
                s,
                "laptop",
                &send_value(envelope(&laptop(), &alice(), &bob(), 13, NOW), &["bob-phone"], None),
                at(NOW + 5)
            )
        ),
        format!("{:?}", when_receive(s, &bob_to_alice_without_auth(14), at(NOW + 5))),
        format!("{:?}", when_receive(s, &revoked_grant, at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "phone", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "laptop", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "tablet", at(NOW + 5))),
        format!("{:?}", decide::check_session(s, "tablet", at(NOW + 100))),
        format!("{:?}", decide::add_device(s, &wire(&cert(&alice(), &phone())), at(NOW + 5))),
        format!("{:?}", decide::add_device(s, &wire(&cert(&alice(), &laptop())), at(NOW + 5))),
        format!("{:?}", decide::revoke_device(s, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))),
        format!("{:?}", when_register(s, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5))),
        format!("{:?}", decide::ack(s, "phone", 3)),
        format!("{:?}", decide::ack(s, "phone", 2)),
        format!("{:?}", decide::ack(s, "phone", 4)),
        format!("{:?}", record_delivery(s, &mid(1), &DeliveryStatus::delivering(NOW))),
    ]
}

#[test]
fn a_snapshot_decides_exactly_like_the_state_it_was_taken_from() {
    let original = busy_alice();
    let restored = snapshot_round_trip(&original);
    let (before, after) = (decisions(&original), decisions(&restored));
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b, a, "decision {i} differs after the snapshot");
    }
    // And the decisions compared are the interesting ones.
    then_send_duplicate(when_send(&restored, "phone", &alice_to_bob(1), at(NOW + 5)));
    then_receive_duplicate(when_receive(&restored, &bob_to_alice(3), at(NOW + 5)));
    assert!(restored.device_valid("phone", UnixSecs(NOW + 5)));
    assert!(!restored.device_valid("laptop", UnixSecs(NOW + 5)));
    assert!(restored.device_valid("tablet", UnixSecs(NOW + 5)));
    assert!(!restored.device_valid("tablet", UnixSecs(NOW + 100)));
    then_no_events(decide::add_device(&restored, &wire(&cert(&alice(), &phone())), at(NOW + 5)));
    then_no_events(when_register(&restored, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW + 5)));
    assert_eq!(
        then_events(decide::revoke_device(&restored, &wire(&alice().revocation("tablet", NOW)), at(NOW + 5))).len(),
        1
    );
    let (event, _) = then_accepted(when_receive(&restored, &bob_to_alice_without_auth(14), at(NOW + 5)));
    assert_eq!(record_of(&event).sequence, 4);
    assert_eq!(record_of(&event).visible, strings(&["phone"]));
}

#[test]
fn a_snapshot_keeps_signed_objects_byte_for_byte() {
    // A certificate with an unknown member, covered by its signature.
    let mut with_extra = cert(&alice(), &tablet());
    with_extra["x-future"] = json!({"b": 1, "a": [2, 1]});
    let with_extra = signed(Tag::DeviceCertificate, with_extra, &alice().key);
    let s = given_alice([]);
    assert_eq!(then_events(decide::add_device(&s, &wire(&with_extra), at(NOW))).len(), 1);
    let s = given_alice([device_added_cert(&with_extra)]);
    let restored = snapshot_round_trip(&s);
    assert_eq!(restored.devices["tablet"].certificate.raw().get(), s.devices["tablet"].certificate.raw().get());
    then_no_events(decide::add_device(&restored, &wire(&with_extra), at(NOW)));
    assert!(restored.device_valid("tablet", UnixSecs(NOW)));
}

#[test]
fn apply_folds_registration_into_a_usable_account() {
    let s = given(&alice(), &[registered(&alice(), &phone())]);
    assert_eq!(s.route().map(|r| r.revision), Some(1));
    assert!(s.account_key().is_some());
    assert!(s.devices.contains_key("phone"));
    let _: &Wire<Route> = s.route().unwrap();
    let _: &Wire<DeviceCertificate> = &s.devices["phone"].certificate;
}

#[test]
fn a_snapshot_holds_no_idempotency_results() {
    let s = busy_alice();
    assert!(!s.ledger.sends.is_empty() && !s.ledger.receipts.is_empty());
    let snapshot = serde_json::to_value(&s.state).unwrap();
    assert!(snapshot.get("sends").is_none() && snapshot.get("receipts").is_none(), "{snapshot}");
}

#[test]
fn a_small_map_reads_and_writes_as_the_btree_map_it_replaces() {
    use crate::account::state::SmallMap;
    let json = r#"{"tablet":3,"laptop":1,"phone":2,"laptop":4}"#;
    let small: SmallMap<u64> = serde_json::from_str(json).unwrap();
    let btree: std::collections::BTreeMap<String, u64> = serde_json::from_str(json).unwrap();
    assert_eq!(serde_json::to_string(&small).unwrap(), serde_json::to_string(&btree).unwrap());
    let mut m = SmallMap::default();
    for (k, v) in [("phone", 1), ("laptop", 2), ("phone", 3)] {
        m.insert(k.to_string(), v);
    }
    assert_eq!(m.iter().collect::<Vec<_>>(), [("laptop", &2), ("phone", &3)]);
    assert_eq!((m["phone"], m.get("tablet"), m.len()), (3, None, 2));
}
