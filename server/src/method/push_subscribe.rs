//! `push.subscribe` (PROTOCOL §9): a device with a session registers a Web
//! Push subscription; its shape is checked here, before the account sees it.

use crate::app::{parse, App};
use relay_actors::account::AccountCmd;
use relay_schemas::methods::PushSubscribeParams;
use relay_schemas::RelayError;

caller!(PushSubscribe, Session);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let s = relay.session(token)?;
    let params: PushSubscribeParams = parse(body)?;
    let push = relay.push();
    crate::push::check_subscription(&params, push.allow_http, push.allow_private)?;
    let cmd = AccountCmd::PushSubscribe { device: s.device_id, params };
    App::json_of(relay.supervisor().ask(&s.account_id, cmd).await?)
}
