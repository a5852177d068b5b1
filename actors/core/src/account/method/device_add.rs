//! `device.add` (PROTOCOL §4): a new device certificate of the account,
//! signed by the account key; also how a device added at the other home
//! is decided here ([`add_signed_device`]).

use crate::account::decision::{Decision, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, Ctx};
use crate::account::state::AccountState;
use crate::policy::{Policy, MAX_DEVICES_SETTING};
use relay_schemas::methods::DeviceAddParams;
use relay_schemas::objects::{DeviceCertificate, Wire};
use relay_schemas::RelayError;

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &DeviceAddParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(add_device(state, &params.device_certificate, ctx)?, Reply::ok()))
}

/// `device.add` (and a device added at the account's other home, as
/// replicated): a new certificate while the account holds fewer than
/// `max_devices`, revoked ones included (PROTOCOL §1); the same certificate
/// again is a no-op even on a full account.
pub fn add_device(
    state: &AccountState,
    cert: &Wire<DeviceCertificate>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered_route(state)?;
    cert.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    add_signed_device(state, cert, ctx.policy)
}

/// `device.add` past the certificate's own checks (its size and signature,
/// and its validity window now, or, for one replicated from the account's
/// other home, at the time it was added there).
pub fn add_signed_device(
    state: &AccountState,
    cert: &Wire<DeviceCertificate>,
    policy: &Policy,
) -> Result<Vec<AccountEvent>, RelayError> {
    let route = registered_route(state)?;
    if cert.account_id != state.account_id || cert.account_key != route.account_key {
        return Err(RelayError::forbidden("device_certificate names another account"));
    }
    if state.revocations().contains_key(&cert.device_id) {
        return Err(RelayError::invalid_state("device_id was revoked and cannot be reused"));
    }
    match state.certificate(&cert.device_id) {
        Some(existing) if existing == *cert => Ok(vec![]),
        Some(_) => Err(RelayError::state_conflict("device_id already has another certificate")),
        None if state.devices.len() >= policy.max_devices => Err(RelayError::over_limit(
            MAX_DEVICES_SETTING,
            format!("the account holds {} device certificates, limit {}", state.devices.len(), policy.max_devices),
        )),
        None => Ok(vec![AccountEvent::DeviceAdded { device_certificate: cert.clone() }]),
    }
}

#[cfg(test)]
/// The rule at the limits of its policy.
mod at_the_limits {
    use super::*;
    use crate::account::method::account_register::register;
    use crate::account::method::device_revoke::revoke_device;
    use crate::account::testkit::limits::*;
    use relay_schemas::methods::RegisterParams;
    use relay_schemas::objects::MAX_OBJECT_BYTES_SETTING;
    use relay_schemas::UnixSecs;

    #[test]
    fn a_device_add_past_max_devices_is_payload_too_large_naming_the_setting() {
        let policy = policy(3, 1024);
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(3, ctx);
        let e = add_device(&state, &wire(&alice().certificate(&device(3), NOW, None)), ctx).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_devices");
        // A certificate on file already is still the no-op it always was.
        let again = add_device(&state, &wire(&alice().certificate(&device(1), NOW, None)), ctx).unwrap();
        assert!(again.is_empty());
    }

    #[test]
    fn revoked_certificates_count_toward_max_devices() {
        let policy = policy(3, 1024);
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut state = alice_with(3, ctx);
        for e in revoke_device(&state, &wire(&alice().revocation("device-2", NOW)), ctx).unwrap() {
            state.apply(&e);
        }
        let e = add_device(&state, &wire(&alice().certificate(&device(3), NOW, None)), ctx).unwrap_err();
        assert_eq!(limit_of(&e), "limits.max_devices");
    }

    #[test]
    fn a_certificate_over_max_object_bytes_is_refused_by_device_add_and_account_register() {
        let policy = Policy::with_relay_id("relay-a");
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(1, ctx);
        let at_limit = padded_certificate(1, policy.max_object_bytes);
        assert_eq!(add_device(&state, &wire(&at_limit), ctx).unwrap().len(), 1, "exactly the limit is accepted");
        let over = padded_certificate(1, policy.max_object_bytes + 1);
        let e = add_device(&state, &wire(&over), ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
        let p: RegisterParams =
            serde_json::from_str(&register_value(&padded_certificate(0, 20_000)).to_string()).unwrap();
        let e = register(&AccountState::new(&alice().id), &p, "digest", None, ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING);
    }
}

#[cfg(test)]
mod tests {
    //! `device.add`, `device.revoke` and the sessions of devices.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn add_device_appends_device_added_for_a_new_certificate() {
        let s = given(&alice(), &[registered(&alice(), &phone())]);
        let events = then_events(add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
        assert!(matches!(events.as_slice(), [AccountEvent::DeviceAdded { .. }]));
        let s = given(&alice(), &history([]));
        assert!(s.device_valid("laptop", UnixSecs(NOW)));
    }

    #[test]
    fn add_device_with_the_identical_certificate_is_a_no_op() {
        let s = given_alice([]);
        then_no_events(add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)));
    }

    #[test]
    fn add_device_with_another_certificate_for_a_known_device_id_is_state_conflict() {
        let s = given_alice([]);
        // Same id "laptop", another key.
        let other = Device::from_seed("laptop", [99; 32]);
        then_error(add_device(&s, &wire(&cert(&alice(), &other)), at(NOW)), ErrorCode::StateConflict);
        // Same key, other validity window.
        let reissued = alice().certificate(&laptop(), ISSUED + 1, None);
        then_error(add_device(&s, &wire(&reissued), at(NOW)), ErrorCode::StateConflict);
    }

    #[test]
    fn a_revoked_device_id_cannot_be_added_again() {
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        then_error(add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::InvalidState);
        let fresh = Device::from_seed("laptop", [98; 32]);
        then_error(add_device(&s, &wire(&cert(&alice(), &fresh)), at(NOW)), ErrorCode::InvalidState);
    }

    #[test]
    fn add_device_refuses_a_certificate_of_another_account() {
        let s = given_alice([]);
        then_error(add_device(&s, &wire(&cert(&bob(), &bob_phone())), at(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn add_device_rejects_a_certificate_not_signed_by_the_account_key() {
        let s = given_alice([]);
        let by_device = signed(Tag::DeviceCertificate, cert(&alice(), &tablet()), &tablet().key);
        then_error(add_device(&s, &wire(&by_device), at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn add_device_on_an_unregistered_account_is_not_found() {
        let s = AccountState::new(&alice().id);
        then_error(add_device(&s, &wire(&cert(&alice(), &laptop())), at(NOW)), ErrorCode::NotFound);
    }

    #[test]
    fn add_device_refuses_an_already_expired_certificate() {
        let s = given_alice([]);
        let expired = alice().certificate(&tablet(), ISSUED, Some(NOW));
        then_rejected(add_device(&s, &wire(&expired), at(NOW)));
    }
}
