//! `session.challenge` (PROTOCOL §4): anyone may ask a local account for a
//! challenge its device signs in `session.open`.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::ChallengeParams;
use relay_schemas::{ErrorCode, RelayError};

caller!(SessionChallenge, None);

pub(crate) async fn handle(relay: &App, _token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let p: ChallengeParams = parse(body)?;
    let cmd = AccountCmd::SessionChallenge { device_id: p.device_id };
    relay.local(&p.account_id, ErrorCode::NotFound, cmd).await
}
