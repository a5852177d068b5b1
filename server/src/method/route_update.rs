//! `route.update` (PROTOCOL §4): a device with a session moves its account
//! to a newer route.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::RouteUpdateParams;
use relay_schemas::RelayError;

caller!(RouteUpdate, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: RouteUpdateParams = parse(body)?;
    relay.own(token, |device| AccountCmd::RouteUpdate { device, params }).await
}
