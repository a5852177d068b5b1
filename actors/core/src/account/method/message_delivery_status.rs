//! `message.delivery.status` (PROTOCOL §4): the sender's view of its
//! message's delivery, from the ledger ([`delivery_status`]). What writes
//! it there is `message.send`'s: the acceptance, `Settle`, and
//! `RecordDelivery` (a delivery's end, `message_send::record_delivery`).

use crate::account::decision::{Decision, Reads, Reply};
use crate::account::ledger::SendEntry;
use crate::account::shared::{check_session, retained, Ctx};
use crate::account::state::AccountState;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::{RelayError, UnixSecs};

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

/// `message.delivery.status`: the ledger's result while it is retained
/// (the same retention an idempotent retry is answered within).
pub fn delivery_status(entry: Option<&SendEntry>, now: UnixSecs) -> Result<DeliveryStatus, RelayError> {
    let entry = entry.ok_or_else(|| RelayError::not_found("unknown message"))?;
    retained(entry.retention_until, now)?;
    Ok(entry.status.clone())
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
