//! `message.timeline.ack` (PROTOCOL §4): the device's read cursor moves
//! forward.

use crate::account::decision::{Decision, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::AckParams;
use relay_schemas::RelayError;

pub(crate) fn decide(state: &AccountState, device: &str, params: &AckParams, ctx: Ctx) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(ack(state, device, params.through)?, Reply::ok()))
}

/// `message.timeline.ack`: moves the device's cursor forward only. Acking
/// beyond the last sequence is `invalid_params`; acking at or behind the
/// cursor is ignored.
pub fn ack(state: &AccountState, device_id: &str, through: u64) -> Result<Vec<AccountEvent>, RelayError> {
    if through > state.last_sequence {
        return Err(RelayError::invalid_params(format!(
            "through {through} is beyond the last sequence {}",
            state.last_sequence
        )));
    }
    if through <= state.cursors.get(device_id).copied().unwrap_or(0) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::CursorMoved { device_id: device_id.into(), through }])
}

#[cfg(test)]
mod tests {
    //! Timeline sequences and `message.timeline.ack`.

    use super::*;
    use crate::account::testkit::*;

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
        let events = then_events(ack(&s, "phone", 1));
        assert!(
            matches!(events.as_slice(), [AccountEvent::CursorMoved { device_id, through: 1 }] if device_id == "phone")
        );
        let mut s = s;
        events.iter().for_each(|e| s.apply(e));
        assert_eq!(s.cursors["phone"], 1);
        assert_eq!(then_events(ack(&s, "phone", 2)).len(), 1);
        // Cursors are per device.
        assert_eq!(then_events(ack(&s, "laptop", 1)).len(), 1);
    }

    #[test]
    fn ack_beyond_the_last_sequence_is_invalid_params() {
        let s = alice_with_two_records();
        then_error(ack(&s, "phone", 3), ErrorCode::InvalidParams);
        let empty = given_alice([]);
        then_error(ack(&empty, "phone", 1), ErrorCode::InvalidParams);
    }

    #[test]
    fn ack_at_or_behind_the_cursor_is_a_no_op() {
        let mut s = alice_with_two_records();
        s.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
        then_no_events(ack(&s, "phone", 2));
        then_no_events(ack(&s, "phone", 1));
        then_no_events(ack(&s, "phone", 0));
    }
}
