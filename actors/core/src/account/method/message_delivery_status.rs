//! `message.delivery.status` (PROTOCOL §4): the sender's view of its
//! message's delivery, from the ledger ([`delivery_status`]); and
//! `RecordDelivery`, the relay's own command that writes a delivery's
//! outcome there ([`record_delivery`]).

use crate::account::decision::{Decision, Reads, Reply};
use crate::account::events::AccountEvent;
use crate::account::ledger::SendEntry;
use crate::account::shared::{check_session, retained, Ctx};
use crate::account::state::AccountState;
use relay_schemas::{DeliveryStatus, RelayError, UnixSecs};

/// Reads the ledger's result; writes nothing.
pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    message_id: &str,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    relay_schemas::ids::check_message_id("message_id", message_id)?;
    let entry = reads.send_entry(message_id)?;
    Ok(Decision::reply(Reply::Status(delivery_status(entry.as_ref(), ctx.now)?)))
}

/// `RecordDelivery`: a delivery's outcome for the sender, answered with
/// the status as recorded.
pub(crate) fn decide_record(
    message_id: &str,
    status: &DeliveryStatus,
    reads: &impl Reads,
) -> Result<Decision, RelayError> {
    let entry = reads.send_entry(message_id)?;
    let events = record_delivery(entry.as_ref(), message_id, status);
    // The status as recorded: a terminal one never changes.
    let current = match events.first() {
        Some(AccountEvent::DeliveryUpdated { status, .. }) => status.clone(),
        _ => entry.map_or_else(|| status.clone(), |e| e.status),
    };
    Ok(Decision::write(events, Reply::Settled { status: current, head: () }))
}

/// `message.delivery.status`: the ledger's result while it is retained
/// (the same retention an idempotent retry is answered within).
pub fn delivery_status(entry: Option<&SendEntry>, now: UnixSecs) -> Result<DeliveryStatus, RelayError> {
    let entry = entry.ok_or_else(|| RelayError::not_found("unknown message"))?;
    retained(entry.retention_until, now)?;
    Ok(entry.status.clone())
}

/// A delivery outcome reported to the sender's account; `entry` is the
/// ledger's entry for `message_id`. The status keeps the source's
/// `accepted_at`; terminal states never change, so repeated or late
/// reports are no-ops.
pub fn record_delivery(entry: Option<&SendEntry>, message_id: &str, status: &DeliveryStatus) -> Vec<AccountEvent> {
    let Some(entry) = entry else { return vec![] };
    let status = DeliveryStatus { accepted_at: entry.status.accepted_at, ..status.clone() };
    if entry.status.status.is_terminal() || entry.status == status {
        return vec![];
    }
    vec![AccountEvent::DeliveryUpdated { message_id: message_id.into(), status }]
}

#[cfg(test)]
/// The rule at the limits of its policy.
mod at_the_limits {
    use super::*;
    use crate::account::testkit::limits::*;
    use relay_schemas::ErrorCode;

    #[test]
    fn delivery_status_answers_until_retention_ends_that_second_included() {
        assert_eq!(delivery_status(Some(&entry(100)), UnixSecs(100)).unwrap(), DeliveryStatus::target_accepted(10));
        assert_eq!(delivery_status(Some(&entry(100)), UnixSecs(101)).unwrap_err().code, ErrorCode::MessageExpired);
        assert_eq!(delivery_status(None, UnixSecs(0)).unwrap_err().code, ErrorCode::NotFound);
    }
}

#[cfg(test)]
mod tests {
    //! Delivery results recorded at the source.
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    fn alice_sent_one() -> Given {
        let s = given_alice([]);
        given_alice([send_event(&s, &alice_to_bob(1))])
    }

    fn applied(mut s: Given, events: &[AccountEvent]) -> Given {
        events.iter().for_each(|e| s.apply(e));
        s
    }

    #[test]
    fn record_delivery_answers_the_status_as_recorded_and_a_terminal_one_never_changes() {
        let sent = send_event(&given_alice([]), &alice_to_bob(1));
        let s = given_alice([sent]);
        let record = |s: &Given, st: &DeliveryStatus| {
            when(s, Cmd::RecordDelivery { message_id: mid(1), status: st.clone(), settlement: None }).unwrap()
        };
        // Reported with another accepted_at: recorded with the source's.
        let d = record(&s, &DeliveryStatus::target_accepted(NOW + 9));
        assert_eq!(*reply_status(&d.reply), DeliveryStatus::target_accepted(NOW));
        let s = given(&alice(), &[s.events.clone(), d.events].concat());
        let failed = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::MessageExpired, "expired"));
        let d = record(&s, &failed);
        assert!(d.events.is_empty());
        assert_eq!(*reply_status(&d.reply), DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn record_delivery_moves_delivering_to_a_terminal_state() {
        let s = alice_sent_one();
        let events = when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW));
        assert!(matches!(events.as_slice(), [AccountEvent::DeliveryUpdated { .. }]));
        let s = applied(s, &events);
        assert_eq!(s.sent(&mid(1)).status.status, Status::TargetAccepted);
    }

    #[test]
    fn record_delivery_keeps_the_source_accepted_at() {
        let s = alice_sent_one();
        // The destination's accepted_at is later than the source's.
        let events = when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 42));
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
        let s = applied(s.clone(), &when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)));
        assert!(when_record_delivery(&s, &mid(1), &failed).is_empty());
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW + 9)).is_empty());
        // failed stays, with its reason.
        let s = alice_sent_one();
        let s = applied(s.clone(), &when_record_delivery(&s, &mid(1), &failed));
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::target_accepted(NOW)).is_empty());
        let other_failure = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::ClockSkew, "late"));
        assert!(when_record_delivery(&s, &mid(1), &other_failure).is_empty());
        let status = then_send_duplicate(when_send(&s, "phone", &alice_to_bob(1), at(NOW + 1)));
        assert_eq!(status, failed);
    }

    #[test]
    fn record_delivery_of_an_unchanged_status_or_unknown_message_is_a_no_op() {
        let s = alice_sent_one();
        assert!(when_record_delivery(&s, &mid(1), &DeliveryStatus::delivering(NOW)).is_empty());
        assert!(when_record_delivery(&s, &mid(9), &DeliveryStatus::target_accepted(NOW)).is_empty());
    }

    #[test]
    fn record_delivery_never_changes_a_self_delivery() {
        let s = given_alice([]);
        let s = given_alice([send_event(&s, &alice_to_self(1, &["phone"]))]);
        let failed = DeliveryStatus::failed(NOW, RelayError::device_unknown("gone"));
        assert!(when_record_delivery(&s, &mid(1), &failed).is_empty());
    }
}
