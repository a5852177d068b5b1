//! What every method's decision shares: the context it is made under
//! ([`Ctx`]: time, policy, randomness), the checks several methods make
//! (the account served here, a session's device, a message's times and
//! idempotency key), and the helpers that build records and replies.
//! Pure: no I/O, no clock, no actix.

use super::events::{AccountEvent, Record};
use super::state::AccountState;
use crate::policy::Policy;
use relay_schemas::objects::{KeyBox, MessageEnvelope, Route, Wire};
use relay_schemas::{ErrorCode, RelayError, UnixSecs};

/// The time, policy and randomness a decision is made under.
#[derive(Clone, Copy)]
pub struct Ctx<'a> {
    pub now: UnixSecs,
    pub policy: &'a Policy,
    /// Fresh random bytes, for the commands that draw any (a session
    /// challenge, a session token); such a command is refused without.
    pub random: Option<[u8; 32]>,
}

impl<'a> Ctx<'a> {
    /// For decisions that draw no randomness.
    pub fn new(now: UnixSecs, policy: &'a Policy) -> Self {
        Ctx { now, policy, random: None }
    }

    /// With `random` for the commands that draw it.
    pub fn with_random(self, random: [u8; 32]) -> Self {
        Ctx { random: Some(random), ..self }
    }

    /// The fresh random bytes; an internal error where none came in.
    pub fn random(&self) -> Result<[u8; 32], RelayError> {
        self.random.ok_or_else(|| RelayError::internal("a decision that draws randomness got none"))
    }
}

pub(crate) fn registered_route(state: &AccountState) -> Result<&Wire<Route>, RelayError> {
    state.route().ok_or_else(|| RelayError::not_found(format!("unknown account {}", state.account_id)))
}

/// Receiving rule 1: this relay is a home relay in the account's current
/// route. An account that moved away keeps its new route here, and callers
/// get it back with `route_stale`.
pub(crate) fn served_here(state: &AccountState, ctx: Ctx) -> Result<(), RelayError> {
    let route = registered_route(state)?;
    if route.lists_relay(&ctx.policy.relay_id) {
        return Ok(());
    }
    Err(not_served_here(Some(route)))
}

/// Where an account this relay does not serve lives now: `route_stale`
/// with the newest route known here, else `target_not_local`.
pub fn not_served_here(known: Option<&Wire<Route>>) -> RelayError {
    match known {
        Some(route) => RelayError::new(ErrorCode::RouteStale, "the account's current route names other relays")
            .with_data(serde_json::json!({ "route": route })),
        None => RelayError::new(ErrorCode::TargetNotLocal, "this relay does not serve the account"),
    }
}

/// The session's device must still be valid (a revoked device's sessions
/// end at once).
pub fn check_session(state: &AccountState, device_id: &str, ctx: Ctx) -> Result<(), RelayError> {
    registered_route(state).map_err(|_| RelayError::unauthorized("session account unknown"))?;
    if !state.device_valid(device_id, ctx.now) {
        return Err(RelayError::unauthorized("session device is no longer valid"));
    }
    Ok(())
}

/// `created_at` against this relay's clock tolerance and age limit
/// (receiving rule 3; the source applies its own policy the same way).
pub(crate) fn check_created_at(envelope: &MessageEnvelope, ctx: Ctx) -> Result<(), RelayError> {
    if envelope.created_at > ctx.now.plus(ctx.policy.clock_tolerance) {
        return Err(RelayError::new(ErrorCode::ClockSkew, "envelope.created_at is beyond clock tolerance"));
    }
    if envelope.created_at.saturating_add(ctx.policy.delivery_age_limit) <= ctx.now {
        return Err(RelayError::new(ErrorCode::MessageExpired, "envelope is beyond the delivery age limit"));
    }
    Ok(())
}

/// Devices named in `boxes` that are valid now: the record's visible set,
/// fixed at acceptance.
pub(crate) fn visible_devices(state: &AccountState, boxes: &[Wire<KeyBox>], now: UnixSecs) -> Vec<String> {
    boxes.iter().filter(|b| state.device_valid(&b.device_id, now)).map(|b| b.device_id.clone()).collect()
}

pub(crate) fn record(
    state: &AccountState,
    envelope: &Wire<MessageEnvelope>,
    boxes: &[Wire<KeyBox>],
    visible: Vec<String>,
    expires_at: u64,
) -> Box<Record> {
    Box::new(Record {
        sequence: state.last_sequence + 1,
        expires_at,
        envelope: envelope.clone(),
        boxes: boxes.to_vec(),
        visible,
    })
}

/// Idempotency lookup shared by sends and receipts: `Some(accepted_at)` for
/// the same content, `state_conflict` for different content,
/// `message_expired` once the promised retention has passed.
pub(crate) fn idempotent(
    digest: &str,
    stored_digest: &str,
    retention_until: u64,
    now: UnixSecs,
) -> Result<(), RelayError> {
    retained(retention_until, now)?;
    if stored_digest != digest {
        return Err(RelayError::state_conflict("message_id already used with different content"));
    }
    Ok(())
}

/// A result is kept at least until `retention_until`, that second included.
pub(crate) fn retained(retention_until: u64, now: UnixSecs) -> Result<(), RelayError> {
    if retention_until < now {
        return Err(RelayError::new(ErrorCode::MessageExpired, "result retention has ended"));
    }
    Ok(())
}

/// The account's route once `events` are applied.
pub(crate) fn route_after<'a>(
    state: &'a AccountState,
    events: &'a [AccountEvent],
) -> Result<&'a Wire<Route>, RelayError> {
    let written = events.iter().rev().find_map(|e| match e {
        AccountEvent::Registered { route, .. } | AccountEvent::RouteUpdated { route } => Some(route),
        _ => None,
    });
    written.or(state.route()).ok_or_else(|| RelayError::internal("route missing"))
}

#[cfg(test)]
mod tests {
    //! `device.add`, `device.revoke` and the sessions of devices.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn a_revoked_devices_session_is_refused() {
        let s = given_alice([]);
        check_session(&s, "laptop", at(NOW)).expect("laptop valid before revocation");
        let s = given_alice([device_revoked(&alice(), "laptop")]);
        then_error(check_session(&s, "laptop", at(NOW)), ErrorCode::Unauthorized);
        check_session(&s, "phone", at(NOW)).expect("other devices keep their sessions");
    }

    #[test]
    fn a_session_of_an_unknown_device_or_account_is_refused() {
        let s = given_alice([]);
        then_error(check_session(&s, "tablet", at(NOW)), ErrorCode::Unauthorized);
        let unregistered = AccountState::new(&alice().id);
        then_error(check_session(&unregistered, "phone", at(NOW)), ErrorCode::Unauthorized);
    }

    #[test]
    fn an_expired_certificate_makes_the_device_invalid() {
        let expiring = alice().certificate(&tablet(), ISSUED, Some(NOW + 100));
        let s = given_alice([device_added_cert(&expiring)]);
        assert!(s.device_valid("tablet", UnixSecs(NOW + 99)));
        check_session(&s, "tablet", at(NOW + 99)).unwrap();
        assert!(!s.device_valid("tablet", UnixSecs(NOW + 100)));
        then_error(check_session(&s, "tablet", at(NOW + 100)), ErrorCode::Unauthorized);
        // It can no longer send ...
        let v = send_value(envelope(&tablet(), &alice(), &bob(), 1, NOW + 100), &["bob-phone"], None);
        then_error(when_send(&s, "tablet", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
        // ... nor be the only reader of a record.
        let v = send_value(envelope(&phone(), &alice(), &alice(), 2, NOW + 100), &["tablet"], None);
        then_error(when_send(&s, "phone", &v, at(NOW + 100)), ErrorCode::DeviceUnknown);
    }

    #[test]
    fn an_account_not_served_here_is_pointed_at_its_newer_route_or_is_not_local() {
        let route = relay_schemas::client::Account::from_seed([5; 32]).route(3, &[("relay-c", "http://c")], 1);
        let route: Wire<Route> = Wire::from_value(&route).unwrap();
        let e = not_served_here(Some(&route));
        assert_eq!(e.code, ErrorCode::RouteStale);
        assert_eq!(e.data.unwrap()["route"]["revision"], 3);
        assert_eq!(not_served_here(None).code, ErrorCode::TargetNotLocal);
    }
}
