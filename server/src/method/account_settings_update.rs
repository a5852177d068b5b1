//! `account.settings.update` (PROTOCOL §4): a device with a session changes
//! its account's settings.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::SettingsUpdateParams;
use relay_schemas::RelayError;

caller!(AccountSettingsUpdate, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: SettingsUpdateParams = parse(body)?;
    relay.own(token, |device| AccountCmd::AccountSettingsUpdate { device, params }).await
}
