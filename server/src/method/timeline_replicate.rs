//! `timeline.replicate` (PROTOCOL §5): the account's other home relay
//! pulls what it has not acknowledged (`AccountCmd::TimelineReplicate`;
//! the rules are in `relay_core::account::method::timeline_replicate`, the puller is
//! [`crate::replication`]).

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_core::account::method::timeline_replicate::Page;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::ReplicateParams;
use relay_schemas::RelayError;

caller!(TimelineReplicate, Relay);

pub(crate) async fn handle_relay(relay: &App, peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let p: ReplicateParams = parse(body)?;
    check_account_id("account_id", &p.account_id)?;
    if p.notify {
        // The peer has news of the account: pull it (for an account not
        // here yet, that pull is how it arrives; the peer's page proves it).
        relay.pull_from(&p.account_id, peer);
    }
    if !relay.supervisor().account_exists(&p.account_id)? {
        return serde_json::to_string(&Page::default()).map_err(|e| RelayError::internal(e.to_string()));
    }
    let account_id = p.account_id.clone();
    let cmd = AccountCmd::TimelineReplicate { peer: peer.to_owned(), params: p };
    App::json_of(relay.supervisor().ask(&account_id, cmd).await?)
}
