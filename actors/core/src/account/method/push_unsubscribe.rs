//! `push.unsubscribe` (PROTOCOL §9): the session's device drops its
//! subscription; and `PushGone`, the relay's own command when the push
//! service says the endpoint is gone ([`push_gone`]).

use crate::account::command::{Decision, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, Ctx};
use crate::account::state::AccountState;
use relay_schemas::RelayError;

pub(crate) fn decide(state: &AccountState, device: &str, ctx: Ctx) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(push_unsubscribe(state, device), Reply::ok()))
}

/// `PushGone`: never refused.
pub(crate) fn decide_gone(state: &AccountState, device_id: &str, endpoint: &str) -> Decision {
    Decision::write(push_gone(state, device_id, endpoint), Reply::ok())
}

/// `push.unsubscribe`: removes the session's device's subscription (none:
/// nothing to do).
pub fn push_unsubscribe(state: &AccountState, device_id: &str) -> Vec<AccountEvent> {
    match state.push.get(device_id) {
        Some(s) => vec![AccountEvent::PushUnsubscribed {
            device_id: device_id.into(),
            endpoint: s.endpoint.clone(),
            reason: "unsubscribed".into(),
        }],
        None => vec![],
    }
}

/// The push service answered 404/410 for `endpoint`: the subscription is
/// dropped, unless the device has subscribed anew since (another endpoint).
pub fn push_gone(state: &AccountState, device_id: &str, endpoint: &str) -> Vec<AccountEvent> {
    match state.push.get(device_id) {
        Some(s) if s.endpoint == endpoint => vec![AccountEvent::PushUnsubscribed {
            device_id: device_id.into(),
            endpoint: endpoint.into(),
            reason: "gone".into(),
        }],
        _ => vec![],
    }
}
