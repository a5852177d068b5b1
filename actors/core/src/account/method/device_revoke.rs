//! `device.revoke` (PROTOCOL §4): a revocation signed by the account key
//! ends the device for good; the shell ends its sessions and sockets
//! ([`Effect::EndDevice`]).

use crate::account::decision::{Decision, Effect, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::DeviceRevokeParams;
use relay_schemas::objects::{DeviceRevocation, Wire};
use relay_schemas::RelayError;

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &DeviceRevokeParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let events = revoke_device(state, &params.revocation, ctx)?;
    let device_id = params.revocation.device_id.clone();
    Ok(Decision { events, reply: Reply::ok(), effects: vec![Effect::EndDevice { device_id }] })
}

pub fn revoke_device(
    state: &AccountState,
    rev: &Wire<DeviceRevocation>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered_route(state)?;
    let key = state.account_key().ok_or_else(|| RelayError::internal("account key unreadable"))?;
    rev.check(key, ctx.policy.max_object_bytes)?;
    if rev.account_id != state.account_id {
        return Err(RelayError::forbidden("revocation names another account"));
    }
    if !state.devices.contains_key(&rev.device_id) {
        return Err(RelayError::not_found(format!("unknown device {}", rev.device_id)));
    }
    if state.revocations().contains_key(&rev.device_id) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::DeviceRevoked { revocation: rev.clone() }])
}

#[cfg(test)]
mod tests {
    //! `device.add`, `device.revoke` and the sessions of devices.
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    #[test]
    fn a_revoked_device_has_its_sessions_ended_by_the_shell() {
        let s = given_alice([]);
        let params = parse(&json!({ "revocation": alice().revocation("laptop", NOW) }));
        let d = when(&s, Cmd::DeviceRevoke { device: "phone".into(), params }).unwrap();
        assert_eq!(d.events.len(), 1);
        assert!(matches!(&d.effects[..], [Effect::EndDevice { device_id }] if device_id == "laptop"));
    }

    #[test]
    fn revoke_device_signed_by_the_account_key_appends_device_revoked() {
        let s = given_alice([]);
        let rev: Wire<DeviceRevocation> = wire(&alice().revocation("laptop", NOW));
        let events = then_events(revoke_device(&s, &rev, at(NOW)));
        assert!(matches!(events.as_slice(), [AccountEvent::DeviceRevoked { .. }]));
        let s = given_alice(events);
        assert!(!s.device_valid("laptop", UnixSecs(NOW)));
        assert!(s.device_valid("phone", UnixSecs(NOW)));
    }

    #[test]
    fn revoke_device_refuses_a_revocation_not_signed_by_the_account_key() {
        let s = given_alice([]);
        let by_device = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &phone().key);
        then_error(revoke_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
        let by_bob = signed(Tag::DeviceRevocation, alice().revocation("laptop", NOW), &bob().key);
        then_error(revoke_device(&s, &wire(&by_bob), at(NOW)), ErrorCode::InvalidSignature);
        let wrong_tag = signed(Tag::DeviceCertificate, alice().revocation("laptop", NOW), &alice().key);
        then_error(revoke_device(&s, &wire(&wrong_tag), at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn revoke_device_refuses_a_revocation_naming_another_account() {
        let s = given_alice([]);
        let other = signed(
            Tag::DeviceRevocation,
            json!({"account_id": bob().id, "device_id": "laptop", "revoked_at": NOW}),
            &alice().key,
        );
        then_error(revoke_device(&s, &wire(&other), at(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn revoke_device_of_an_unknown_device_is_not_found() {
        let s = given_alice([]);
        then_error(revoke_device(&s, &wire(&alice().revocation("tablet", NOW)), at(NOW)), ErrorCode::NotFound);
    }

    #[test]
    fn revoking_an_already_revoked_device_is_a_no_op() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        then_no_events(revoke_device(&s, &wire(&alice().revocation("laptop", NOW)), at(NOW)));
    }
}
