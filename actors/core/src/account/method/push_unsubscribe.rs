//! `push.unsubscribe` (PROTOCOL §9): the session's device drops its
//! subscription; and `PushGone`, the relay's own command when the push
//! service says the endpoint is gone ([`push_gone`]).

use crate::account::decision::{Decision, Reply};
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
    match state.push().get(device_id) {
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
    match state.push().get(device_id) {
        Some(s) if s.endpoint == endpoint => vec![AccountEvent::PushUnsubscribed {
            device_id: device_id.into(),
            endpoint: endpoint.into(),
            reason: "gone".into(),
        }],
        _ => vec![],
    }
}

#[cfg(test)]
mod tests {
    //! `push.subscribe`, `push.unsubscribe` and gone subscriptions (PROTOCOL §9).

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn push_unsubscribe_removes_it_and_revoking_the_device_does_too() {
        let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2)]);
        let events = push_unsubscribe(&s, "phone");
        let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), events[0].clone()]);
        assert!(!s.push().contains_key("phone"));
        assert!(push_unsubscribe(&s, "phone").is_empty(), "nothing left to remove");
        let s = given_alice([subscribed("phone", 1), subscribed("laptop", 2), device_revoked(&alice(), "laptop")]);
        assert!(!s.push().contains_key("laptop"), "a revoked device's subscription leaves with it");
        assert!(s.push().contains_key("phone"));
    }

    #[test]
    fn a_gone_endpoint_drops_only_the_subscription_it_belongs_to() {
        let s = given_alice([subscribed("phone", 1), subscribed("phone", 2)]);
        assert!(push_gone(&s, "phone", "https://push.example/sub/1").is_empty(), "resubscribed since");
        let events = push_gone(&s, "phone", "https://push.example/sub/2");
        assert!(matches!(&events[..], [AccountEvent::PushUnsubscribed { reason, .. }] if reason == "gone"));
    }
}
