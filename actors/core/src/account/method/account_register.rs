//! `account.register` (PROTOCOL §4): a new account's first route and
//! device, signed by the account key and asking this relay to serve it.
//! The stateless checks ([`check_register`]) run before any actor exists
//! for the account; [`register`] decides against its state.

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::events::AccountEvent;
use crate::account::shared::{route_after, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::{RegisterParams, RegisterResult};
use relay_schemas::objects::{Route, Wire};
use relay_schemas::{ErrorCode, RelayError};

/// Writes the registration (none when it is here already) and answers the
/// account's route.
pub(crate) fn decide(
    state: &AccountState,
    params: &RegisterParams,
    digest: &str,
    known: Option<&Wire<Route>>,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let events = register(state, params, digest, known, ctx)?;
    let route = route_after(state, &events)?;
    let reply = json(&RegisterResult { account_id: &state.account_id, route })?;
    Ok(Decision::write(events, reply))
}

/// The stateless checks of `account.register`: signatures, identity
/// binding, this relay named in the route and in a fresh registration, and
/// unsigned settings that agree with the signed ones. The transport runs
/// them before any actor exists for the account, so a stranger's garbage
/// costs no memory; [`register`] runs them again.
pub fn check_register(p: &RegisterParams, ctx: Ctx) -> Result<(), RelayError> {
    let (tolerance, max_bytes) = (ctx.policy.clock_tolerance, ctx.policy.max_object_bytes);
    p.route.check(ctx.now, tolerance, max_bytes)?;
    if !p.route.lists_relay(&ctx.policy.relay_id) {
        return Err(RelayError::invalid_params(format!("route must list this relay ({})", ctx.policy.relay_id)));
    }
    let cert = &p.device_certificate;
    cert.check(ctx.now, tolerance, max_bytes)?;
    if cert.account_id != p.route.account_id || cert.account_key != p.route.account_key {
        return Err(RelayError::invalid_params("device_certificate names another account"));
    }
    p.registration.check(&p.route, &ctx.policy.relay_id, ctx.now, tolerance, max_bytes)?;
    let unsigned = p.settings.as_ref().and_then(|s| s.public_discovery);
    if unsigned.is_some_and(|d| d != p.registration.public_discovery) {
        return Err(RelayError::invalid_params("settings.public_discovery disagrees with the signed registration"));
    }
    Ok(())
}

/// `account.register`. `known` is the highest route revision of the account
/// this relay knows or learned from its peers: an older route would let a
/// replayed registration bring back relays or devices the account has left.
pub fn register(
    state: &AccountState,
    p: &RegisterParams,
    digest: &str,
    known: Option<&Wire<Route>>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    check_register(p, ctx)?;
    if p.route.account_id != state.account_id {
        return Err(RelayError::invalid_params("route.account_id does not match"));
    }
    let cert = &p.device_certificate;
    if state.revocations().contains_key(&cert.device_id) {
        return Err(RelayError::device_unknown(format!("device {} was revoked", cert.device_id)));
    }
    let highest = [known, state.route()].into_iter().flatten().max_by_key(|r| r.revision);
    if let Some(highest) = highest {
        if p.route.revision < highest.revision {
            return Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision of this account is known")
                .with_data(serde_json::json!({ "route": highest })));
        }
        if p.route.revision == highest.revision && p.route != *highest {
            return Err(RelayError::state_conflict("same route revision with different content"));
        }
    }
    if state.is_registered() {
        // The same account the other home registered (it came here by
        // `timeline.replicate`): registering here too changes nothing.
        let same = state.register_digest.is_empty()
            && state.route() == Some(&p.route)
            && state.certificate(&cert.device_id).as_ref() == Some(cert)
            && state.public_discovery == p.registration.public_discovery;
        return if state.register_digest == digest || same {
            Ok(vec![])
        } else {
            Err(RelayError::state_conflict("account already registered with different content"))
        };
    }
    Ok(vec![AccountEvent::Registered {
        route: p.route.clone(),
        device_certificate: cert.clone(),
        public_discovery: p.registration.public_discovery,
        params_digest: digest.to_owned(),
        registration: Some(Box::new(p.registration.clone())),
    }])
}

#[cfg(test)]
mod tests {
    //! `account.register`.
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    #[test]
    fn register_accepts_a_route_listing_this_relay_and_records_the_first_device() {
        let s = AccountState::new(&alice().id);
        let events = then_events(when_register(&s, &register_value(&alice(), &phone(), &[RELAY], None), at(NOW)));
        assert_eq!(events.len(), 1);
        assert!(matches!(&events[0], AccountEvent::Registered { public_discovery: false, .. }));
        let s = given(&alice(), &events);
        assert!(s.is_registered());
        assert!(s.device_valid("phone", UnixSecs(NOW)));
        assert!(!s.public_discovery, "public discovery defaults to off");
    }

    #[test]
    fn register_requires_the_route_to_list_this_relay() {
        let s = AccountState::new(&alice().id);
        let v = register_value(&alice(), &phone(), &["relay-b"], None);
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn register_accepts_this_relay_as_the_second_home_relay_of_the_route() {
        let s = AccountState::new(&alice().id);
        let v = register_value(&alice(), &phone(), &["relay-b", RELAY], None);
        assert_eq!(then_events(when_register(&s, &v, at(NOW))).len(), 1);
    }

    #[test]
    fn register_requires_the_route_account_id_to_derive_from_the_account_key() {
        // Bob's id with Alice's key, properly signed by Alice's key.
        let forged = signed(
            Tag::Route,
            json!({"account_id": bob().id, "account_key": alice().public_key(), "revision": 1,
                   "relays": [{"id": RELAY, "url": URL_A}], "issued_at": ISSUED}),
            &alice().key,
        );
        let v = json!({"route": forged, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
        let s = AccountState::new(&bob().id);
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn register_requires_the_certificate_account_id_to_derive_from_its_account_key() {
        let forged = signed(
            Tag::DeviceCertificate,
            tampered(cert(&alice(), &phone()), "account_id", json!(bob().id)),
            &alice().key,
        );
        let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": forged, "registration": registration(&alice(), false)});
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn register_requires_the_route_to_be_for_the_account_being_registered() {
        let v = register_value(&alice(), &phone(), &[RELAY], None);
        then_error(when_register(&AccountState::new(&bob().id), &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn register_requires_the_certificate_to_name_the_same_account_as_the_route() {
        // A valid certificate, but of Bob's account.
        let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": cert(&bob(), &bob_phone()), "registration": registration(&alice(), false)});
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn register_rejects_a_route_with_a_bad_signature() {
        let s = AccountState::new(&alice().id);
        let v = json!({"route": tampered(route(&alice(), 1, &[RELAY]), "revision", json!(2)),
                       "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        // Signed by another account's key.
        let by_bob = signed(Tag::Route, route(&alice(), 1, &[RELAY]), &bob().key);
        let v = json!({"route": by_bob, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn register_rejects_a_route_signed_under_another_domain_tag() {
        let s = AccountState::new(&alice().id);
        let wrong_tag = signed(Tag::DeviceCertificate, route(&alice(), 1, &[RELAY]), &alice().key);
        let v = json!({"route": wrong_tag, "device_certificate": cert(&alice(), &phone()), "registration": registration(&alice(), false)});
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn register_rejects_a_certificate_with_a_bad_signature() {
        let s = AccountState::new(&alice().id);
        let v = json!({"route": route(&alice(), 1, &[RELAY]),
                       "device_certificate": tampered(cert(&alice(), &phone()), "device_id", json!("other")),
                       "registration": registration(&alice(), false)});
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
        let by_bob = signed(Tag::DeviceCertificate, cert(&alice(), &phone()), &bob().key);
        let v = json!({"route": route(&alice(), 1, &[RELAY]), "device_certificate": by_bob, "registration": registration(&alice(), false)});
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn identical_re_register_is_a_no_op() {
        let v = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": true})));
        let s = given(&alice(), &[registered_with(&alice(), &v)]);
        then_no_events(when_register(&s, &v, at(NOW + 60)));
    }

    #[test]
    fn re_register_with_different_content_is_state_conflict() {
        let original = register_value(&alice(), &phone(), &[RELAY], None);
        let s = given(&alice(), &[registered_with(&alice(), &original)]);
        // Only optional-field presence differs.
        let with_settings = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": false})));
        then_error(when_register(&s, &with_settings, at(NOW)), ErrorCode::StateConflict);
        let other_device = register_value(&alice(), &laptop(), &[RELAY], None);
        then_error(when_register(&s, &other_device, at(NOW)), ErrorCode::StateConflict);
        // The original registration is untouched.
        then_no_events(when_register(&s, &original, at(NOW)));
    }

    #[test]
    fn register_takes_public_discovery_from_the_signed_registration() {
        let v = register_value(&alice(), &phone(), &[RELAY], Some(json!({"public_discovery": true})));
        let s = given(&alice(), &[registered_with(&alice(), &v)]);
        assert!(s.public_discovery);
        let v = register_value(&alice(), &phone(), &[RELAY], None);
        let v = json!({"route": v["route"], "device_certificate": v["device_certificate"],
                       "registration": registration(&alice(), true)});
        assert!(given(&alice(), &[registered_with(&alice(), &v)]).public_discovery);
    }

    #[test]
    fn register_refuses_unsigned_settings_that_disagree_with_the_registration() {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v["settings"] = json!({"public_discovery": true});
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn register_requires_a_registration() {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v.as_object_mut().unwrap().remove("registration");
        assert!(serde_json::from_str::<RegisterParams>(&v.to_string()).is_err());
    }

    #[test]
    fn register_requires_the_registration_to_be_signed_by_the_account_key() {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v["registration"] = signed(Tag::Registration, registration(&alice(), false), &bob().key);
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
        // Public objects alone (a route and a certificate) are no registration,
        // whatever their tag says.
        v["registration"] = signed(Tag::Route, registration(&alice(), false), &alice().key);
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidSignature);
    }

    #[test]
    fn register_requires_the_registration_to_name_this_relay_and_account() {
        let mut v = register_value(&alice(), &phone(), &[RELAY], None);
        v["registration"] = alice().registration("relay-b", false, NOW);
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
        v["registration"] = signed(
            Tag::Registration,
            tampered(registration(&alice(), false), "account_id", json!(bob().id)),
            &alice().key,
        );
        then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn register_requires_a_registration_issued_within_the_clock_tolerance_both_ways() {
        let tolerance = POLICY.clock_tolerance;
        for issued in [NOW - tolerance - 1, NOW + tolerance + 1] {
            let mut v = register_value(&alice(), &phone(), &[RELAY], None);
            v["registration"] = alice().registration(RELAY, false, issued);
            then_error(when_register(&AccountState::new(&alice().id), &v, at(NOW)), ErrorCode::InvalidParams);
        }
        for issued in [NOW - tolerance, NOW + tolerance] {
            let mut v = register_value(&alice(), &phone(), &[RELAY], None);
            v["registration"] = alice().registration(RELAY, false, issued);
            assert_eq!(then_events(when_register(&AccountState::new(&alice().id), &v, at(NOW))).len(), 1);
        }
    }

    #[test]
    fn register_refuses_a_route_older_than_the_highest_revision_known_here_or_at_peers() {
        let v = register_value(&alice(), &phone(), &[RELAY], None);
        let newer = route(&alice(), 2, &["relay-b"]);
        let e = when_register_knowing(&AccountState::new(&alice().id), &v, &newer, at(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::RouteStale);
        assert_eq!(e.data.unwrap()["route"], newer);
        // Known at the same revision and equal: fine.
        let same = route(&alice(), 1, &[RELAY]);
        assert_eq!(then_events(when_register_knowing(&AccountState::new(&alice().id), &v, &same, at(NOW))).len(), 1);
    }

    #[test]
    fn register_refuses_a_certificate_revoked_in_the_account_state() {
        let v = register_value(&alice(), &phone(), &[RELAY], None);
        let s = given(&alice(), &[registered_with(&alice(), &v), device_revoked(&alice(), "phone")]);
        then_error(when_register(&s, &v, at(NOW)), ErrorCode::DeviceUnknown);
    }

    #[test]
    fn register_answers_the_route_it_writes_and_a_repeat_answers_the_route_it_has() {
        let v = register_value(&alice(), &phone(), &[RELAY], None);
        let d = when(
            &Given::new(&alice().id),
            AccountCmd::AccountRegister { params: parse(&v), digest: digest(&v), known: None },
        )
        .unwrap();
        assert_eq!(d.events.len(), 1);
        assert_eq!(reply_json(&d.reply), json!({"account_id": alice().id, "route": route(&alice(), 1, &[RELAY])}));
        let again = given(&alice(), &d.events);
        let d =
            when(&again, AccountCmd::AccountRegister { params: parse(&v), digest: digest(&v), known: None }).unwrap();
        assert!(d.events.is_empty(), "the same registration again writes nothing");
        assert_eq!(reply_json(&d.reply)["route"], route(&alice(), 1, &[RELAY]));
    }
}
