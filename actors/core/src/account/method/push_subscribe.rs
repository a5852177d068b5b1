//! `push.subscribe` (PROTOCOL §9): the session's device's Web Push
//! subscription; and who a new record is pushed to ([`push_targets`]).

use crate::account::command::{Decision, Reply};
use crate::account::events::{AccountEvent, PushSubscription};
use crate::account::shared::{check_session, registered, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::PushSubscribeParams;
use relay_schemas::{RelayError, UnixSecs};

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &PushSubscribeParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(push_subscribe(state, device, params)?, Reply::ok()))
}

/// `push.subscribe`: binds the subscription to the session's device (its
/// shape already checked by the transport); the same subscription again
/// is a no-op, another one replaces it.
pub fn push_subscribe(
    state: &AccountState,
    device_id: &str,
    p: &PushSubscribeParams,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    let subscription =
        PushSubscription { endpoint: p.endpoint.clone(), p256dh: p.keys.p256dh.clone(), auth: p.keys.auth.clone() };
    if state.push.get(device_id) == Some(&subscription) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::PushSubscribed { device_id: device_id.into(), subscription }])
}

/// Who gets a Web Push for a new record (PROTOCOL §9): the devices of the
/// record's visible set (fixed at acceptance: the devices that may read
/// it) that have a subscription, are still valid at `now`, and have no
/// open WebSocket (`connected`); never `sender_device`, the device whose
/// own send wrote the record (it knows).
pub fn push_targets<'a>(
    state: &'a AccountState,
    visible: &[String],
    sender_device: Option<&str>,
    connected: impl Fn(&str) -> bool,
    now: UnixSecs,
) -> Vec<(&'a str, &'a PushSubscription)> {
    state
        .push
        .iter()
        .filter(|(device, _)| visible.iter().any(|v| v == device))
        .filter(|(device, _)| Some(*device) != sender_device)
        .filter(|(device, _)| state.device_valid(device, now))
        .filter(|(device, _)| !connected(device))
        .collect()
}
