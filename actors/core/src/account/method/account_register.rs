//! `account.register` (PROTOCOL §4): a new account's first route and
//! device, signed by the account key and asking this relay to serve it.
//! The stateless checks ([`check_register`]) run before any actor exists
//! for the account; [`register`] decides against its state.

use crate::account::command::Decision;
use crate::account::events::AccountEvent;
use crate::account::shared::{json, route_after, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::{RegisterParams, RegisterResult};
use relay_schemas::objects::Route;
use relay_schemas::{ErrorCode, RelayError, Wire};

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
    if state.revocations.contains_key(&cert.device_id) {
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
            && state.certificate(&cert.device_id) == Some(cert)
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
