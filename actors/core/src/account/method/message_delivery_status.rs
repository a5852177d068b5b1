//! `message.delivery.status` (PROTOCOL §4): the sender's view of its
//! message's delivery, from the ledger ([`delivery_status`]); and
//! `RecordDelivery`, the relay's own command that writes a delivery's
//! outcome there ([`record_delivery`]).

use crate::account::command::{Decision, Reads, Reply};
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
    Ok(Decision::write(events, Reply::Settled(current)))
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
mod tests {
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
