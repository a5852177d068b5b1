//! `message.deliver` (PROTOCOL §5): a home relay of the sender hands this
//! relay a message for an account it serves. The peer must be allowed to
//! deliver for the sender (*Who may deliver*); the recipient's account then
//! writes the receipt (`AccountCmd::MessageDeliver`), answering a retry with
//! the stored result.

use crate::app::{parse_with_digest, App};
use relay_actors::account::AccountCmd;
use relay_core::account::method::message_deliver;
use relay_core::account::Ctx;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::DeliverParams;
use relay_schemas::RelayError;

caller!(MessageDeliver, Relay);

pub(crate) async fn handle_relay(relay: &App, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let (params, digest): (DeliverParams, _) = parse_with_digest(body)?;
    may_deliver(relay, peer, &params).await?;
    let to = params.envelope.to.clone();
    App::json_of(relay.on_local(&to, AccountCmd::MessageDeliver { params, digest }).await?)
}

/// PROTOCOL §5 *Who may deliver*: `peer` must be a home relay of the
/// sender under the route the message was accepted with, and when this
/// relay serves the sender too, the sending device must be valid here.
async fn may_deliver(relay: &App, peer: &str, p: &DeliverParams) -> Result<(), RelayError> {
    let sup = relay.supervisor();
    let env = &p.envelope;
    check_account_id("envelope.from", &env.from)?;
    let known = sup.routes().get(&env.from).map_err(|e| RelayError::internal(e.to_string()))?;
    let policy = sup.policy();
    let ctx = Ctx::new(sup.clock().now(), &policy);
    message_deliver::may_deliver(p.sender_route.as_ref(), known.as_ref(), peer, env, ctx)?;
    sup.check_sending_device(env, known.as_ref()).await?;
    if let Some(route) = &p.sender_route {
        // Checked valid above: the route book keeps it if it is newer.
        let _ = sup.routes().offer(route);
    }
    Ok(())
}
