//! `session.attach` (the WebSocket's attach, and any request under a
//! session token): the session's device is still valid, and what it has
//! to catch up on. Both read only.

use crate::account::command::{Decision, Reads, Reply};
use crate::account::shared::{check_session, Ctx};
use crate::account::state::AccountState;
use relay_schemas::RelayError;

/// `CheckSession`: the session's device is still valid here.
pub(crate) fn decide_check(state: &AccountState, device: &str, ctx: Ctx) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::reply(Reply::ok()))
}

/// `Backlog`: the latest record beyond the device's ack cursor it may
/// read, if any.
pub(crate) fn decide_backlog(
    state: &AccountState,
    device: &str,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let cursor = state.cursors.get(device).copied().unwrap_or(0);
    let mut latest = None;
    for item in reads.timeline_after(cursor) {
        let (seq, entry) = item?;
        if entry.visible.iter().any(|d| d == device) {
            latest = Some(seq);
        }
    }
    Ok(Decision::reply(Reply::Backlog(latest)))
}
