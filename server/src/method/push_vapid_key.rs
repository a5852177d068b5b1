//! `push.vapid_key` (PROTOCOL §9): anyone may read the relay's VAPID public
//! key to subscribe a browser.

use crate::app::{parse, App};
use relay_schemas::methods::VapidKeyResult;
use relay_schemas::RelayError;

caller!(PushVapidKey, None);

pub(crate) async fn handle(relay: &App, _token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let _: serde_json::Value = parse(body)?;
    let push = relay.push();
    if push.vapid_public_key.is_empty() {
        return Err(RelayError::unavailable("this relay has no VAPID key"));
    }
    serde_json::to_string(&VapidKeyResult { public_key: push.vapid_public_key.clone() })
        .map_err(|e| RelayError::internal(e.to_string()))
}
