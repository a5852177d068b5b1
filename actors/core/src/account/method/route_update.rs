//! `route.update` (PROTOCOL §4): a newer route of the account, signed by
//! the account key; also how a route updated at the other home is decided
//! here.

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, route_after, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::RouteUpdateParams;
use relay_schemas::objects::{Route, Wire};
use relay_schemas::{ErrorCode, RelayError};

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

/// A valid route of an account next to the one known for it: the rule by
/// which `route.update` and the route book both keep the highest revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// A higher revision (or none known): it replaces the known one.
    Newer,
    /// The known route itself: nothing changes.
    Same,
    /// A lower revision: the known one stays.
    Older,
    /// The same revision with other content (`state_conflict`): the known
    /// one stays, so a route once seen is never replaced at its revision.
    Conflict,
}

/// How `route` compares with `known` (both already checked valid).
pub fn offer(known: Option<&Wire<Route>>, route: &Wire<Route>) -> Offer {
    match known {
        None => Offer::Newer,
        Some(known) if route.revision > known.revision => Offer::Newer,
        Some(known) if route.revision < known.revision => Offer::Older,
        Some(known) if known == route => Offer::Same,
        Some(_) => Offer::Conflict,
    }
}

/// `route.update`: a higher revision replaces a lower one; an equal
/// revision with other content is `state_conflict`; a lower one is stale.
pub fn update_route(state: &AccountState, route: &Wire<Route>, ctx: Ctx) -> Result<Vec<AccountEvent>, RelayError> {
    let current = registered_route(state)?;
    route.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    if route.account_id != state.account_id || route.account_key != current.account_key {
        return Err(RelayError::forbidden("route names another account"));
    }
    match offer(Some(current), route) {
        Offer::Newer => Ok(vec![AccountEvent::RouteUpdated { route: route.clone() }]),
        Offer::Same => Ok(vec![]),
        Offer::Older => Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision is known")
            .with_data(serde_json::json!({ "route": current }))),
        Offer::Conflict => Err(RelayError::state_conflict("same route revision with different content")),
    }
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
    fn the_highest_revision_wins_and_a_known_revision_is_never_replaced_by_other_content() {
        let r1: Wire<Route> = wire(&route(&alice(), 1, &[RELAY]));
        let r1_other: Wire<Route> = wire(&route(&alice(), 1, &[RELAY, "relay-b"]));
        let r2: Wire<Route> = wire(&route(&alice(), 2, &[RELAY, "relay-b"]));
        assert_eq!(offer(None, &r1), Offer::Newer, "the first route known");
        assert_eq!(offer(Some(&r1), &r2), Offer::Newer);
        assert_eq!(offer(Some(&r2), &r1), Offer::Older);
        assert_eq!(offer(Some(&r1), &r1.clone()), Offer::Same);
        assert_eq!(offer(Some(&r1), &r1_other), Offer::Conflict);
    }

    #[test]
    fn route_update_with_a_lower_revision_is_route_stale_carrying_the_newer_route() {
        let r2 = route(&alice(), 2, &[RELAY, "relay-b"]);
        let s = given_alice([route_updated(&r2)]);
        let e = then_error(update_route(&s, &wire(&route(&alice(), 1, &[RELAY])), at(NOW)), ErrorCode::RouteStale);
        assert_eq!(e.data.unwrap()["route"], r2);
    }
}
