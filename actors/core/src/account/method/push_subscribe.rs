//! `push.subscribe` (PROTOCOL §9): the session's device's Web Push
//! subscription; and who a new record is pushed to ([`push_targets`]).

use crate::account::decision::{Decision, Reply};
use crate::account::events::{AccountEvent, PushSubscription};
use crate::account::shared::{check_session, registered_route, Ctx};
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
    registered_route(state)?;
    let subscription =
        PushSubscription { endpoint: p.endpoint.clone(), p256dh: p.keys.p256dh.clone(), auth: p.keys.auth.clone() };
    if state.push().get(device_id) == Some(&subscription) {
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
        .push()
        .iter()
        .filter(|(device, _)| visible.iter().any(|v| v == device))
        .filter(|(device, _)| Some(*device) != sender_device)
        .filter(|(device, _)| state.device_valid(device, now))
        .filter(|(device, _)| !connected(device))
        .collect()
}

#[cfg(test)]
mod tests {
    //! `push.subscribe`, `push.unsubscribe` and gone subscriptions (PROTOCOL §9).

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn push_subscribe_binds_to_the_session_device_and_a_new_one_replaces_it() {
        let s = given_alice([subscribed("phone", 1)]);
        assert_eq!(s.push()["phone"].endpoint, "https://push.example/sub/1");
        assert!(push_subscribe(&s, "phone", &push_params(1)).unwrap().is_empty(), "same subscription: no-op");
        let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
        assert_eq!(s.push()["phone"].endpoint, "https://push.example/sub/2");
        assert_eq!(s.push().len(), 1);
    }

    #[test]
    fn push_goes_only_to_subscribed_visible_devices_without_a_websocket() {
        let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
        let targets = |visible: &[&str], sender: Option<&str>, connected: &[&str]| -> Vec<String> {
            let visible: Vec<String> = visible.iter().map(|v| v.to_string()).collect();
            push_targets(&s, &visible, sender, |d| connected.contains(&d), UnixSecs(NOW))
                .into_iter()
                .map(|(d, _)| d.to_owned())
                .collect()
        };
        assert_eq!(targets(&["phone", "laptop"], None, &[]), ["laptop", "phone"]);
        assert_eq!(targets(&["phone"], None, &[]), ["phone"], "laptop may not read the record");
        assert_eq!(targets(&["phone", "laptop"], None, &["phone"]), ["laptop"], "phone has a socket open");
        assert_eq!(targets(&["phone", "laptop"], Some("laptop"), &[]), ["phone"], "the sending device knows");
        assert!(targets(&["tablet"], None, &[]).is_empty(), "no subscription");
        let s = given_alice([subscribed("phone", 1), device_revoked(&alice(), "laptop"), subscribed("laptop", 2)]);
        let visible = vec!["laptop".to_string()];
        assert!(push_targets(&s, &visible, None, |_| false, UnixSecs(NOW)).is_empty(), "revoked devices get nothing");
    }
}
