//! `message.delivery.peer_status` (PROTOCOL §5): another home relay of the
//! sender asks whether this relay accepted a message, and its status
//! (`AccountCmd::MessageDeliveryPeerStatus`, read-only).

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::ids::check_message_id;
use relay_schemas::methods::PeerStatusParams;
use relay_schemas::RelayError;

caller!(MessageDeliveryPeerStatus, Relay);

pub(crate) async fn handle_relay(relay: &App, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let p: PeerStatusParams = parse(body)?;
    check_message_id("message_id", &p.message_id)?;
    let cmd = AccountCmd::MessageDeliveryPeerStatus { peer: peer.to_owned(), message_id: p.message_id };
    App::json_of(relay.on_local(&p.from, cmd).await?)
}
