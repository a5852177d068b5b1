//! The calls of PROTOCOL §4 (client) and §5 (relay), independent of
//! transport: a method name, the caller (a session token, or an
//! authenticated peer) and the params bytes in; the result object's JSON
//! or a `RelayError` out. HTTP and WebSocket call [`call`] and
//! [`call_relay`]: rate limits, the cluster lease and metrics here, then
//! the method's own file in [`crate::method`].

use crate::app::App;
use relay_schemas::methods::{Caller, Method};
use relay_schemas::RelayError;
use std::net::IpAddr;
use std::time::Instant;

/// One client call. `ip` is the caller's address: methods without a
/// session are rate limited per address.
pub async fn call(
    app: &App,
    method: &str,
    token: Option<&str>,
    ip: Option<IpAddr>,
    body: &[u8],
) -> Result<String, RelayError> {
    let started = Instant::now();
    let result = match Method::from_client_wire(method) {
        Some(m) => match m.caller() {
            Caller::None => app.limits().anonymous(ip).map(|()| m),
            Caller::Session | Caller::Relay => Ok(m),
        },
        None => Err(RelayError::not_found(format!("unknown method {method:?}"))),
    };
    let result = match result {
        Ok(m) => app.under_lease(crate::method::client(app, m, token, body)).await,
        Err(e) => Err(e),
    };
    app.observe(method, started, &result);
    result
}

/// One relay call from the authenticated `peer` (its signature checked
/// by [`crate::peer_rpc`]).
pub async fn call_relay(app: &App, method: &str, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let started = Instant::now();
    // A sibling shard of this relay (same id and key) is not a
    // stranger to rate-limit: its calls are this relay's own sends.
    let limited =
        if peer == app.supervisor().policy().relay_id.as_str() { Ok(()) } else { app.limits().peer(peer, method) };
    let result = match limited {
        Ok(()) => match Method::from_relay_wire(method) {
            Some(m) => app.under_lease(crate::method::relay(app, m, peer, body)).await,
            None => Err(RelayError::not_found(format!("unknown relay method {method:?}"))),
        },
        Err(e) => Err(e),
    };
    app.observe(&format!("relay/{method}"), started, &result);
    result
}
