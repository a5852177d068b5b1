//! `push.unsubscribe` (PROTOCOL §9): a device with a session drops its Web
//! Push subscription.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::RelayError;

caller!(PushUnsubscribe, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let _: serde_json::Value = parse(body)?;
    relay.own(token, |device| AccountCmd::PushUnsubscribe { device }).await
}
