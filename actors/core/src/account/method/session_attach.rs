//! `session.attach` (the WebSocket's attach, and any request under a
//! session token): the session's device is still valid, and what it has
//! to catch up on. Both read only.

use crate::account::decision::{Decision, Reads, Reply};
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

#[cfg(test)]
mod tests {
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    #[test]
    fn the_backlog_is_the_latest_record_past_the_cursor_the_device_may_read() {
        let mut s = given_alice([]);
        let backlog = |s: &Given, device: &str| match when(s, Cmd::Backlog { device: device.into() }).unwrap().reply {
            Reply::Backlog(b) => b,
            r => panic!("expected a backlog, got {r:?}"),
        };
        assert_eq!(backlog(&s, "phone"), None);
        s.apply(&receive_event(&s, &bob_to_alice(1)));
        s.apply(&send_event(&s, &alice_to_self(2, &["phone"])));
        assert_eq!(backlog(&s, "phone"), Some(2));
        assert_eq!(backlog(&s, "laptop"), Some(1), "record 2 is not the laptop's");
        let acked = when(&s, Cmd::MessageTimelineAck { device: "phone".into(), params: parse(&json!({"through": 2})) })
            .unwrap()
            .events;
        s.apply(&acked[0]);
        assert_eq!(backlog(&s, "phone"), None);
    }
}
