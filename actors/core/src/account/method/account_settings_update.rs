//! `account.settings.update` (PROTOCOL §4): the account's public
//! discovery setting.

use crate::account::decision::{Decision, Reply};
use crate::account::events::AccountEvent;
use crate::account::shared::{check_session, registered_route, Ctx};
use crate::account::state::AccountState;
use relay_schemas::methods::SettingsUpdateParams;
use relay_schemas::RelayError;

pub(crate) fn decide(
    state: &AccountState,
    device: &str,
    params: &SettingsUpdateParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    check_session(state, device, ctx)?;
    Ok(Decision::write(update_settings(state, params.public_discovery, ctx)?, Reply::ok()))
}

pub fn update_settings(
    state: &AccountState,
    public_discovery: bool,
    ctx: Ctx,
) -> Result<Vec<AccountEvent>, RelayError> {
    registered_route(state)?;
    if state.public_discovery == public_discovery {
        return Ok(vec![]);
    }
    Ok(vec![AccountEvent::SettingsUpdated { public_discovery, at: Some(ctx.now.0) }])
}

#[cfg(test)]
mod tests {
    //! `route.update`, `account.settings.update` and `contact.revoke`.

    use super::*;
    use crate::account::testkit::*;

    #[test]
    fn settings_update_is_a_no_op_when_unchanged() {
        let s = given_alice([]);
        then_no_events(update_settings(&s, false, at(NOW)));
        let events = then_events(update_settings(&s, true, at(NOW)));
        assert!(given_alice(events).public_discovery);
    }
}
