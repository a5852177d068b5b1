//! `route.get`, both sides. A client (PROTOCOL §4) needs no session: a
//! stranger gets what this relay knows, and only a device with a session
//! here makes it ask its peers. A peer (PROTOCOL §5) gets only what this
//! relay knows, so a question never recurses through relays.

use crate::app::{parse, App};
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::AccountIdParams;
use relay_schemas::{ErrorCode, RelayError};

caller!(RouteGet, None);
caller!(RelayRouteGet, Relay);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let p: AccountIdParams = parse(body)?;
    check_account_id("account_id", &p.account_id)?;
    let sup = relay.supervisor();
    let route = match token.map(|t| relay.session(Some(t))).transpose()? {
        Some(_) => sup.resolve_route(&p.account_id, false).await,
        None => sup.routes().get(&p.account_id).map_err(|e| RelayError::internal(e.to_string()))?,
    };
    let route = route.ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
    Ok(route.raw().get().to_owned())
}

pub(crate) async fn handle_relay(relay: &App, _peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let p: AccountIdParams = parse(body)?;
    check_account_id("account_id", &p.account_id)?;
    let route = relay.supervisor().routes().get(&p.account_id).map_err(|e| RelayError::internal(e.to_string()))?;
    let route = route.ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
    Ok(route.raw().get().to_owned())
}
