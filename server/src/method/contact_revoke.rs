//! `contact.revoke` (PROTOCOL §4): a device with a session revokes a grant
//! or invite of its account.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::ContactRevokeParams;
use relay_schemas::RelayError;

caller!(ContactRevoke, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: ContactRevokeParams = parse(body)?;
    relay.own(token, |device| AccountCmd::ContactRevoke { device, params }).await
}
