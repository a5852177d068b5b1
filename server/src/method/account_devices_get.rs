//! `account.devices.get`, both sides. A client (PROTOCOL §4) with a session
//! may read any account's devices: a local account answers here, another
//! is asked of its home relay. A peer (PROTOCOL §5) reads only accounts
//! served here, so a question never travels further.

use crate::app::{parse, App};
use crate::peers::CallError;
use relay_actors::account::AccountCmd;
use relay_core::account::method::account_devices_get::check_devices_answer;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::{AccountIdParams, DevicesAnswer, Method};
use relay_schemas::{ErrorCode, RelayError};

caller!(AccountDevicesGet, Session);
caller!(RelayAccountDevicesGet, Relay);

pub(crate) async fn handle(relay: &App, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
    let s = relay.session(token)?;
    let p: AccountIdParams = parse(body)?;
    // The caller's own session must still be valid.
    relay.supervisor().ask(&s.account_id, AccountCmd::CheckSession { device: s.device_id }).await?;
    check_account_id("account_id", &p.account_id)?;
    if relay.supervisor().account_exists(&p.account_id)? {
        return relay.local(&p.account_id, ErrorCode::NotFound, AccountCmd::AccountDevicesGet).await;
    }
    // Asked of its home at most once per few seconds, whoever asks.
    let now = relay.supervisor().clock().now_ms();
    if let Some(answer) = relay.remote_reads().get(&p.account_id, now) {
        return Ok(answer);
    }
    // Only device lists are kept: an error (a busy or unreachable home)
    // is asked about again next time.
    let answer = remote_devices(relay, &p.account_id, body).await?;
    relay.remote_reads().put(&p.account_id, answer.clone(), relay.supervisor().clock().now_ms());
    Ok(answer)
}

/// For an account served elsewhere: asked of its home relay (the first of
/// its route that answers), or of the shard of this relay that holds it.
async fn remote_devices(relay: &App, account_id: &str, body: &[u8]) -> Result<String, RelayError> {
    let route = relay.supervisor().resolve_route(account_id, false).await;
    let route = route.ok_or_else(|| RelayError::not_found(format!("account {account_id} is not known")))?;
    let mut last = RelayError::new(ErrorCode::BadGateway, "no home relay answered");
    let own = relay.supervisor().policy().relay_id.to_string();
    for home in route.relays.iter() {
        let asked = if home.id == own {
            // Served by this relay, in another of its shards (cluster mode).
            relay.peers().call_sibling(account_id, Method::RelayAccountDevicesGet, body.to_vec()).await
        } else {
            relay.peers().call(&home.id, Method::RelayAccountDevicesGet, body.to_vec()).await
        };
        match asked {
            Ok(bytes) => {
                let text = String::from_utf8(bytes.to_vec())
                    .map_err(|_| RelayError::new(ErrorCode::BadGateway, "non-UTF-8 answer"))?;
                let answer: DevicesAnswer = parse(text.as_bytes()).map_err(|e| {
                    RelayError::new(ErrorCode::BadGateway, format!("the home relay's answer: {}", e.message))
                })?;
                // Passed on only within this relay's own bounds.
                check_devices_answer(&answer, &relay.supervisor().policy())?;
                return Ok(text);
            }
            Err(CallError::Answered { error, .. }) => return Err(error),
            Err(CallError::NotSent(e) | CallError::Unknown(e)) => last = e,
        }
    }
    Err(RelayError::new(ErrorCode::BadGateway, last.message))
}

pub(crate) async fn handle_relay(relay: &App, _peer: &str, body: &[u8]) -> Result<String, RelayError> {
    let p: AccountIdParams = parse(body)?;
    App::json_of(relay.on_local(&p.account_id, AccountCmd::AccountDevicesGet).await?)
}
