//! `session.open` (PROTOCOL §4): anyone holding a device key answers a
//! challenge and gets a session token.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::SessionOpenParams;
use relay_schemas::{ErrorCode, RelayError};

caller!(SessionOpen, None);

pub(crate) async fn handle(relay: &App, _token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let params: SessionOpenParams = parse(body)?;
    relay.local(&params.account_id.clone(), ErrorCode::NotFound, AccountCmd::SessionOpen { params }).await
}
