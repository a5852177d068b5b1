//! `route.get` (PROTOCOL §4): the account's current route, to anyone.

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::state::AccountState;
use relay_schemas::{ErrorCode, RelayError};

/// Reads the route; writes nothing.
pub(crate) fn decide(state: &AccountState) -> Result<Decision, RelayError> {
    let route =
        state.route().ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
    Ok(Decision::reply(json(route)?))
}

#[cfg(test)]
mod tests {
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::testkit::*;
    #[test]
    fn a_route_get_for_an_account_without_a_route_is_route_not_found() {
        then_error(when(&Given::new(&alice().id), Cmd::RouteGet), ErrorCode::RouteNotFound);
    }
}
