//! `session.challenge` (PROTOCOL §4): a fresh challenge for a device of
//! the account, kept in memory by the challenge book ([`Challenges`]).

use crate::account::decision::json;
use crate::account::decision::Decision;
use crate::account::session::Challenges;
use crate::account::shared::Ctx;
use crate::account::state::AccountState;
use relay_schemas::RelayError;

/// Draws a challenge from the context's randomness; writes nothing.
pub(crate) fn decide(
    state: &AccountState,
    challenges: &mut Challenges,
    device_id: &str,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    Ok(Decision::reply(json(&challenges.issue(state, device_id, ctx.random()?, ctx)?)?))
}
