//! `message.timeline.ack` (PROTOCOL §4): a device with a session moves its
//! ack cursor.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::AckParams;
use relay_schemas::RelayError;

caller!(MessageTimelineAck, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: AckParams = parse(body)?;
    relay.own(token, |device| AccountCmd::MessageTimelineAck { device, params }).await
}
