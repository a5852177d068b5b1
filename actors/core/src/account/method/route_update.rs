//! `route.update` (PROTOCOL §4): a newer route of the account, signed by
//! the account key; also how a route updated at the other home is decided
//! here.

use crate::account::command::Decision;
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, json, registered, route_after, Ctx};
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
    let current = registered(state)?;
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
mod tests {
    use super::*;
    use crate::account::testkit::limits::*;
    use relay_schemas::UnixSecs;
    use crate::account::method::message_deliver::may_deliver;
    use crate::policy::Policy;
    use relay_schemas::objects::{MessageEnvelope, MAX_OBJECT_BYTES_SETTING};
    use relay_schemas::sign::Tag;
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
