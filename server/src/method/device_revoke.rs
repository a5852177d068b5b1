//! `device.revoke` (PROTOCOL §4): a device with a session revokes a device
//! of its own account.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::DeviceRevokeParams;
use relay_schemas::RelayError;

caller!(DeviceRevoke, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: DeviceRevokeParams = parse(body)?;
    relay.own(token, |device| AccountCmd::DeviceRevoke { device, params }).await
}
