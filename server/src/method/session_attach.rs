//! `session.attach` (PROTOCOL §4) attaches a session to a WebSocket
//! (`http/ws.rs` serves it there); over HTTP it is refused.

use crate::app::App;
use relay_schemas::RelayError;

caller!(SessionAttach, Session);

pub(crate) async fn handle(_relay: &App, _token: Option<&str>, _body: &[u8]) -> Result<String, RelayError> {
    Err(RelayError::invalid_params("session.attach is a WebSocket method"))
}
