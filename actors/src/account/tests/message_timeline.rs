//! Timeline sequences and `message.timeline.ack`.

use super::*;

#[test]
fn timeline_sequences_strictly_increase_across_sent_self_and_received_records() {
    let mut events = alice_history();
    let mut sequences = Vec::new();
    let mut step = |events: &mut Vec<AccountEvent>, event: AccountEvent| {
        if let Some(r) = event.record() {
            sequences.push(r.sequence);
        }
        events.push(event);
    };
    let s = given(&alice(), &events);
    step(&mut events, send_event(&s, &alice_to_bob(1)));
    let s = given(&alice(), &events);
    let no_record = send_value(envelope(&phone(), &alice(), &bob(), 2, NOW), &["bob-phone"], None);
    step(&mut events, send_event(&s, &no_record));
    let s = given(&alice(), &events);
    step(&mut events, receive_event(&s, &bob_to_alice(3)));
    let s = given(&alice(), &events);
    step(&mut events, send_event(&s, &alice_to_self(4, &["phone"])));
    let s = given(&alice(), &events);
    let grant = alice().grant("grant-carol", &carol().id, ISSUED, None);
    let from_carol = with_auth(
        deliver_value(
            envelope(&carol_phone(), &carol(), &alice(), 5, NOW),
            &["laptop"],
            cert(&carol(), &carol_phone()),
        ),
        grant_auth(grant),
    );
    step(&mut events, receive_event(&s, &from_carol));
    let s = given(&alice(), &events);
    step(&mut events, send_event(&s, &alice_to_bob(6)));
    let s = given(&alice(), &events);
    assert_eq!(sequences, vec![1, 2, 3, 4, 5]);
    assert_eq!(s.last_sequence, 5);
    assert_eq!(s.sent(&mid(1)).sequence, Some(1));
    assert_eq!(s.sent(&mid(2)).sequence, None);
    assert_eq!(s.sent(&mid(4)).sequence, Some(3));
    assert_eq!(s.sent(&mid(6)).sequence, Some(5));
}

// =============================================================================
// message.timeline.ack
// =============================================================================

fn alice_with_two_records() -> Given {
    let s = given_alice([]);
    let first = send_event(&s, &alice_to_self(1, &["phone", "laptop"]));
    let s = given_alice([first.clone()]);
    let second = send_event(&s, &alice_to_self(2, &["phone", "laptop"]));
    given_alice([first, second])
}

#[test]
fn ack_moves_the_devices_cursor_forward() {
    let s = alice_with_two_records();
    let events = then_events(decide::ack(&s, "phone", 1));
    assert!(matches!(events.as_slice(), [AccountEvent::CursorMoved { device_id, through: 1 }] if device_id == "phone"));
    let mut s = s;
    events.iter().for_each(|e| s.apply(e));
    assert_eq!(s.cursors["phone"], 1);
    assert_eq!(then_events(decide::ack(&s, "phone", 2)).len(), 1);
    // Cursors are per device.
    assert_eq!(then_events(decide::ack(&s, "laptop", 1)).len(), 1);
}

#[test]
fn ack_beyond_the_last_sequence_is_invalid_params() {
    let s = alice_with_two_records();
    then_error(decide::ack(&s, "phone", 3), ErrorCode::InvalidParams);
    let empty = given_alice([]);
    then_error(decide::ack(&empty, "phone", 1), ErrorCode::InvalidParams);
}

#[test]
fn ack_at_or_behind_the_cursor_is_a_no_op() {
    let mut s = alice_with_two_records();
    s.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
    then_no_events(decide::ack(&s, "phone", 2));
    then_no_events(decide::ack(&s, "phone", 1));
    then_no_events(decide::ack(&s, "phone", 0));
}
