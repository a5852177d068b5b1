//! `session.open` (PROTOCOL §4): the device signs its challenge and gets a
//! session token; the shell stores the session ([`Effect::StoreSession`]).

use crate::account::decision::json;
use crate::account::decision::{Decision, Effect, Token};
use crate::account::session::Challenges;
use crate::account::shared::Ctx;
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

#[cfg(test)]
mod tests {
    //! Through `command::decide`, the one entry the shell calls: what the
    //! method answers and which effects it asks of the shell.

    use super::*;
    use crate::account::command::decide;
    use crate::account::testkit::*;
    use relay_schemas::encoding::b64_encode;
    use relay_schemas::methods::SessionOpenParams;

    #[test]
    fn a_challenge_and_its_session_token_come_from_the_context_randomness() {
        let s = given_alice([]);
        let mut challenges = Challenges::default();
        let ctx = at(NOW).with_random([7; 32]);
        let ask = Cmd::SessionChallenge { device_id: "phone".into() };
        let d = decide(&s, &mut challenges, &ask, &s, ctx).unwrap();
        let challenge = reply_json(&d.reply)["challenge"].as_str().unwrap().to_owned();
        assert_eq!(challenge, b64_encode(&[7; 32]));
        assert!(d.events.is_empty() && d.effects.is_empty(), "a challenge is kept in memory only");

        let params: SessionOpenParams = serde_json::from_value(json!({
            "account_id": alice().id, "device_id": "phone", "challenge": challenge,
            "signature": phone().session_proof(&alice().id, &challenge, RELAY)}))
        .unwrap();
        let ctx = at(NOW).with_random([9; 32]);
        let d = decide(&s, &mut challenges, &Cmd::SessionOpen { params }, &s, ctx).unwrap();
        let token = b64_encode(&[9; 32]);
        let expires_at = NOW + POLICY.session_ttl;
        assert_eq!(reply_json(&d.reply), json!({"token": token, "expires_at": expires_at}));
        let grant = Grant { account_id: alice().id, device_id: "phone".into(), expires_at };
        assert!(matches!(&d.effects[..], [Effect::StoreSession { token: t, grant: g }] if t.0 == token && *g == grant));
        assert!(!format!("{:?}", d.effects).contains(&token), "a token is never printed");
        assert!(d.events.is_empty());
    }

    #[test]
    fn a_session_command_without_randomness_is_refused_and_leaves_the_challenge() {
        let s = given_alice([]);
        let mut challenges = Challenges::default();
        let ask = Cmd::SessionChallenge { device_id: "phone".into() };
        then_error(decide(&s, &mut challenges, &ask, &s, at(NOW)), ErrorCode::InternalError);
        let d = decide(&s, &mut challenges, &ask, &s, at(NOW).with_random([7; 32])).unwrap();
        let challenge = reply_json(&d.reply)["challenge"].as_str().unwrap().to_owned();
        let params: SessionOpenParams = serde_json::from_value(json!({
            "account_id": alice().id, "device_id": "phone", "challenge": challenge,
            "signature": phone().session_proof(&alice().id, &challenge, RELAY)}))
        .unwrap();
        let open = Cmd::SessionOpen { params };
        then_error(decide(&s, &mut challenges, &open, &s, at(NOW)), ErrorCode::InternalError);
        assert!(
            decide(&s, &mut challenges, &open, &s, at(NOW).with_random([9; 32])).is_ok(),
            "the challenge still answers"
        );
    }
}
