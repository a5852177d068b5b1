//! `session.open` (PROTOCOL §4): the device signs its challenge and gets a
//! session token; the shell stores the session ([`Effect::StoreSession`]).

use crate::account::command::{Decision, Effect, Token};
use crate::account::session::Challenges;
use crate::account::shared::{json, Ctx};
use crate::account::state::AccountState;
use relay_schemas::encoding::b64_encode;
use relay_schemas::methods::{SessionOpenParams, SessionOpenResult};
use relay_schemas::RelayError;

/// Answers the challenge with a token drawn from the context's randomness.
pub(crate) fn decide(
    state: &AccountState,
    challenges: &mut Challenges,
    params: &SessionOpenParams,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    // Drawn first: a refusal must not use up the challenge.
    let token = format!("{}{}", ctx.policy.token_prefix, b64_encode(&ctx.random()?));
    let grant = challenges.answer(state, params, ctx)?;
    let reply = json(&SessionOpenResult { token: token.clone(), expires_at: grant.expires_at })?;
    Ok(Decision { events: Vec::new(), reply, effects: vec![Effect::StoreSession { token: Token(token), grant }] })
}
