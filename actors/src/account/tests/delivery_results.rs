//! Delivery results recorded at the source.

use super::*;

fn alice_sent_one() -> Given {
    let s = given_alice([]);
    given_alice([send_event(&s, &alice_to_bob(1))])
}

fn applied(mut s: Given, events: &[AccountEvent]) -> Given {
    events.iter().for_each(|e| s.apply(e));
    s
}

#[test]
fn record_delivery_moves_delivering_to_a_terminal_state() {
    let s = alice_sent_one();
    let events = record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW));
    assert!(matches!(events.as_slice(), [AccountEvent::DeliveryUpdated { .. }]));
    let s = applied(s, &events);
    assert_eq!(s.sent(&mid(1)).status.status, Status::TargetAccepted);
}

#[test]
fn record_delivery_keeps_the_source_accepted_at() {
    let s = alice_sent_one();
    // The destination's accepted_at is later than the source's.
    let events = record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 42));
    match events.as_slice() {
        [AccountEvent::DeliveryUpdated { status, .. }] => assert_eq!(status, &DeliveryStatus::target_accepted(NOW)),
        e => panic!("expected DeliveryUpdated, got {e:?}"),
    }
    let s = applied(s, &events);
    assert_eq!(s.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
}

#[test]
fn terminal_delivery_states_never_change() {
    let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
    // target_accepted stays.
    let s = alice_sent_one();
    let s = applied(s.clone(), &record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)));
    assert!(record_delivery(&s, &mid(1), &failed).is_empty());
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 9)).is_empty());
    // failed stays, with its reason.
    let s = alice_sent_one();
    let s = applied(s.clone(), &record_delivery(&s, &mid(1), &failed));
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)).is_empty());
    let other_failure = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::ClockSkew, "late"));
    assert!(record_delivery(&s, &mid(1), &other_failure).is_empty());
    let status = then_send_duplicate(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 1)));
    assert_eq!(status, failed);
}

#[test]
fn record_delivery_of_an_unchanged_status_or_unknown_message_is_a_no_op() {
    let s = alice_sent_one();
    assert!(record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
    assert!(record_delivery(&s, &mid(9), &DeliveryStatus::target_accepted(NOW)).is_empty());
}

#[test]
fn record_delivery_never_changes_a_self_delivery() {
    let s = given_alice([]);
    let s = given_alice([send_event(&s, &alice_to_self(1, &["phone"]))]);
    let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
    assert!(record_delivery(&s, &mid(1), &failed).is_empty());
}
