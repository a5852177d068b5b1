//! `device.revoke` (PROTOCOL §4): a revocation signed by the account key
//! ends the device for good; the shell ends its sessions and sockets
//! ([`Effect::EndDevice`]).

use crate::account::command::{Decision, Effect, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::DeviceRevokeParams;
use relay_schemas::objects::DeviceRevocation;
use relay_schemas::{RelayError, Wire};

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &DeviceRevokeParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    let events = revoke_device(state, &params.revocation, ctx)?;
    let device_id = params.revocation.device_id.clone();
    Ok(Decision { events, reply: Reply::ok(), effects: vec![Effect::EndDevice { device_id }] })
}

pub fn revoke_device(
    state: &AccountState,
    rev: &Wire<DeviceRevocation>,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered(state)?;
    let key = state.account_key().ok_or_else(|| RelayError::internal("account key unreadable"))?;
    rev.check(key, ctx.policy.max_object_bytes)?;
    if rev.account_id != state.account_id {
        return Err(RelayError::forbidden("revocation names another account"));
    }
    if !state.devices.contains_key(&rev.device_id) {
        return Err(RelayError::not_found(format!("unknown device {}", rev.device_id)));
    }
    if state.revocations.contains_key(&rev.device_id) {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::DeviceRevoked { revocation: rev.clone() }])
}
