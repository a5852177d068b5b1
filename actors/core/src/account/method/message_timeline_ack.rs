//! `message.timeline.ack` (PROTOCOL §4): the device's read cursor moves
//! forward.

use crate::account::command::{Decision, Reply};
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
