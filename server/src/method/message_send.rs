//! `message.send` (PROTOCOL §4): a device with a session hands its relay an
//! envelope. The supervisor carries out the send's process manager
//! (`SendProcess`, beside the method's rule in
//! `relay_core::account::method::message_send`): it accepts the message at
//! the sender's account (`AccountCmd::MessageSend`) and delivers it; for
//! another account the answer waits for the first delivery attempt (a
//! local delivery is immediate), so the client usually gets the terminal
//! status at once.

use crate::app::{parse_with_digest, status_json, App};
use relay_core::account::method::message_send::first_attempt_wait_ms;
use relay_schemas::methods::SendParams;
use relay_schemas::RelayError;
use std::time::Duration;

caller!(MessageSend, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let s = relay.session(token)?;
    let (params, digest): (SendParams, _) = parse_with_digest(body)?;
    let sup = relay.supervisor();
    let sent = sup.message_send(&s.account_id, s.device_id, params, digest).await?;
    let status = match sent.first_attempt {
        Some(first_attempt) => {
            let wait = Duration::from_millis(first_attempt_wait_ms(&sup.policy()));
            match tokio::time::timeout(wait, first_attempt).await {
                Ok(Ok(after_attempt)) => after_attempt,
                _ => sent.status,
            }
        }
        None => sent.status,
    };
    status_json(&status)
}
