//! `account.register` (PROTOCOL §4): anyone may register an account whose
//! route lists this relay. Every stateless check runs before an actor exists
//! for the account, so a refused stranger leaves nothing behind.

use crate::app::{parse_with_digest, App};
use relay_actors::account::AccountCmd;
use relay_core::account::method::account_register::check_register;
use relay_core::account::Ctx;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::RegisterParams;
use relay_schemas::RelayError;

caller!(AccountRegister, None);

pub(crate) async fn handle(relay: &App, _token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let (params, digest): (RegisterParams, _) = parse_with_digest(body)?;
    check_account_id("route.account_id", &params.route.account_id)?;
    // Every stateless check before an actor exists for the account.
    let sup = relay.supervisor();
    let policy = sup.policy();
    check_register(&params, Ctx::new(sup.clock().now(), &policy))?;
    let account_id = params.route.account_id.clone();
    // The highest revision known here or at the peers.
    let known = sup.resolve_route(&account_id, true).await;
    App::json_of(sup.ask(&account_id, AccountCmd::AccountRegister { params, digest, known }).await?)
}
