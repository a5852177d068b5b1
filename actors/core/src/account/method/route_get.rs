//! `route.get` (PROTOCOL §4): the account's current route, to anyone.

use crate::account::command::Decision;
use crate::account::shared::json;
use crate::account::state::AccountState;
use relay_schemas::{ErrorCode, RelayError};

/// Reads the route; writes nothing.
pub(crate) fn decide(state: &AccountState) -> Result<Decision, RelayError> {
    let route =
        state.route().ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
    Ok(Decision::reply(json(route)?))
}
