//! `device.add` (PROTOCOL §4): a device with a session adds a device
//! certificate to its own account.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::DeviceAddParams;
use relay_schemas::RelayError;

caller!(DeviceAdd, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: DeviceAddParams = parse(body)?;
    relay.own(token, |device| AccountCmd::DeviceAdd { device, params }).await
}
