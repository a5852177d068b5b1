//! `message.timeline.sync` (PROTOCOL §4): a device with a session reads its
//! account's timeline after a sequence (the account actor pages it).

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::SyncParams;
use relay_schemas::RelayError;

caller!(MessageTimelineSync, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: SyncParams = parse(body)?;
    relay.own(token, |device| AccountCmd::MessageTimelineSync { device, params }).await
}
