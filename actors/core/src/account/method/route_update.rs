//! `route.update` (PROTOCOL §4): a newer route of the account, signed by
//! the account key; also how a route updated at the other home is decided
//! here.

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, route_after, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::RouteUpdateParams;
use relay_schemas::objects::Route;
use relay_schemas::{ErrorCode, RelayError, Wire};

/// Writes the route (none when it is the current one) and answers the
/// account's route.
pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &RouteUpdateParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let events = update_route(state, &params.route, ctx)?;
    let reply = json(route_after(state, &events)?)?;
    Ok(Decision::write(events, reply))
}

/// `route.update`: a higher revision replaces a lower one; an equal
/// revision with other content is `state_conflict`; a lower one is stale.
pub fn update_route(state: &AccountState, route: &Wire<Route>, ctx: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    let current = registered_route(state)?;
    route.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    if route.account_id != state.account_id || route.account_key != current.account_key {
        return Err(RelayError::forbidden("route names another account"));
    }
    if route.revision < current.revision {
        return Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision is known")
            .with_data(serde_json::json!({ "route": current })));
    }
    if route.revision == current.revision {
        return if route == current {
            Ok(vec![])
        } else {
            Err(RelayError::state_conflict("same route revision with different content"))
        };
    }
    Ok(vec![AccountEvent::RouteUpdated { route: route.clone() }])
}

#[cfg(test)]
/// The rule at the limits of its policy.
mod at_the_limits {
    use super::*;
    use crate::account::method::message_deliver::may_deliver;
    use crate::account::testkit::limits::*;
    use crate::policy::Policy;
    use relay_schemas::objects::{MessageEnvelope, MAX_OBJECT_BYTES_SETTING};
    use relay_schemas::sign::Tag;
    use relay_schemas::UnixSecs;
    use serde_json::json;

    #[test]
    fn a_route_over_max_object_bytes_is_refused_by_route_update_and_by_a_deliverer() {
        let policy = Policy::with_relay_id("relay-a");
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let state = alice_with(1, ctx);
        let route = alice().route(2, &[("relay-a", "https://a.example")], NOW);
        let big: Wire<Route> = wire(&alice().with_member(Tag::Route, &route, "x-pad", json!("a".repeat(20_000))));
        assert_eq!(limit_of(&update_route(&state, &big, ctx).unwrap_err()), MAX_OBJECT_BYTES_SETTING);
        let env: Wire<MessageEnvelope> =
            wire(&device(0).envelope(&alice().id, &"b".repeat(32), "message-000000000001", NOW, b"x"));
        let e = may_deliver(Some(&big), None, "relay-a", &env, ctx).unwrap_err();
        assert_eq!(limit_of(&e), MAX_OBJECT_BYTES_SETTING, "a size refusal, not forbidden");
    }
}

#[cfg(test)]
mod tests {
    //! `route.update`, `account.settings.update` and `contact.revoke`.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn route_update_with_a_higher_revision_replaces_the_route() {
        let s = given_alice([]);
        let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
        let events = then_events(update_route(&s, &wire(&r2), at(NOW)));
        assert!(matches!(events.as_slice(), [AccountEvent::RouteUpdated { .. }]));
        let s = given_alice(events);
        assert_eq!(s.route().unwrap().revision, 2);
    }

    #[test]
    fn route_update_with_an_equal_revision_is_a_no_op_when_identical_and_state_conflict_otherwise() {
        let s = given_alice([]);
        then_no_events(update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)));
        let other = route(&alice(), 1, &[RELAY, "relay-b"]);
        then_error(update_route(&s, &wire(&other), at(NOW)), ErrorCode::StateConflict);
    }

    #[test]
    fn route_update_with_a_lower_revision_is_route_stale_carrying_the_newer_route() {
        let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
        let s = given_alice([route_updated(&r2)]);
        let e = then_error(update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)), ErrorCode::RouteStale);
        assert_eq!(e.data.unwrap()["route"], r2);
    }
}
