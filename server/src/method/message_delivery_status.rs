//! `message.delivery.status` (PROTOCOL §4): a device with a session asks for
//! the delivery status of a message its account sent.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::MessageIdParams;
use relay_schemas::RelayError;

caller!(MessageDeliveryStatus, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let p: MessageIdParams = parse(body)?;
    relay.own(token, |device| AccountCmd::MessageDeliveryStatus { device, message_id: p.message_id }).await
}
