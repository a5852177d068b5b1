//! `session.challenge` and `session.open`: a device proves it holds its
//! key by signing a fresh challenge. Challenges are kept only in the
//! account actor's memory, never in its event stream: a restart forgets
//! them and the device asks again. The randomness comes in as bytes.
//!
//! The sessions a grant becomes live in the shell's session store
//! (`relay_actors::sessions`); when one ends ([`expired`]) and which a
//! device gives up for a new one ([`over_cap`]) are decided here.

use super::shared::Ctx;
use super::state::AccountState;
use relay_schemas::encoding::b64_encode;
use relay_schemas::methods::{ChallengeResult, SessionOpenParams};
use relay_schemas::sign::{verify_bytes, SessionProof};
use relay_schemas::{RelayError, UnixSecs};
use std::collections::HashMap;
use subtle::ConstantTimeEq;

/// A device asking again and again keeps only its latest few challenges.
pub const PER_DEVICE: usize = 8;

/// What a session is opened for; the caller issues its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub account_id: String,
    pub device_id: String,
    pub expires_at: u64,
}

/// Outstanding challenges per device: `(challenge, expires_at)`.
#[derive(Debug, Default)]
pub struct Challenges {
    by_device: HashMap<String, Vec<(String, u64)>>,
}

impl Challenges {
    /// `session.challenge` by `device_id`, with 32 fresh random bytes.
    pub fn issue(
        &mut self,
        state: &AccountState,
        device_id: &str,
        random: [u8; 32],
        ctx: Ctx,
    ) -> Result<ChallengeResult, RelayError> {
        relay_schemas::ids::check_id("device_id", device_id)?;
        if !state.is_registered() {
            return Err(RelayError::not_found("unknown account"));
        }
        serving(state, ctx)?;
        if !state.device_valid(device_id, ctx.now) {
            return Err(RelayError::device_unknown("unknown or revoked device"));
        }
        let challenge = b64_encode(&random);
        let expires_at = ctx.now.plus(ctx.policy.challenge_ttl).0;
        let list = self.by_device.entry(device_id.to_owned()).or_default();
        list.retain(|(_, exp)| *exp > ctx.now);
        if list.len() >= PER_DEVICE {
            list.remove(0);
        }
        list.push((challenge.clone(), expires_at));
        Ok(ChallengeResult { challenge, expires_at })
    }

    /// `session.open`: the challenge must be outstanding and signed by the
    /// device's valid key over (account, device, challenge, this relay). A
    /// challenge answers once.
    pub fn answer(&mut self, state: &AccountState, p: &SessionOpenParams, ctx: Ctx) -> Result<Grant, RelayError> {
        relay_schemas::ids::check_id("device_id", &p.device_id)?;
        if p.account_id != state.account_id || !state.is_registered() {
            return Err(RelayError::not_found("unknown account"));
        }
        serving(state, ctx)?;
        let key = state
            .device_key(&p.device_id, ctx.now)
            .ok_or_else(|| RelayError::device_unknown("unknown or revoked device"))?;
        // Constant time: how much of a guess matched must not show in timing.
        let matches = |c: &str| bool::from(c.as_bytes().ct_eq(p.challenge.as_bytes()));
        let unknown = || RelayError::unauthorized("unknown or expired challenge");
        let list = self.by_device.get_mut(&p.device_id).ok_or_else(unknown)?;
        let pos = list.iter().position(|(c, exp)| matches(c) && *exp > ctx.now).ok_or_else(unknown)?;
        let proof = SessionProof {
            account_id: &p.account_id,
            device_id: &p.device_id,
            challenge: &p.challenge,
            relay_id: &ctx.policy.relay_id,
        };
        verify_bytes(key, &proof.signed_bytes()?, &p.signature)?;
        list.remove(pos);
        Ok(Grant {
            account_id: p.account_id.clone(),
            device_id: p.device_id.clone(),
            expires_at: ctx.now.plus(ctx.policy.session_ttl).0,
        })
    }

    /// Forgets expired challenges; `now` in seconds.
    pub fn expire(&mut self, now: UnixSecs) {
        self.by_device.retain(|_, list| {
            list.retain(|(_, exp)| *exp > now);
            !list.is_empty()
        });
        self.by_device.shrink_to_fit();
    }

    /// None outstanding: the actor may passivate without losing any.
    pub fn is_empty(&self) -> bool {
        self.by_device.is_empty()
    }
}

/// Whether a session expiring at `expires_at` (Unix seconds) has expired
/// at `now`: from its `expires_at` on, its token is refused and the sweep
/// drops it.
pub fn expired(expires_at: u64, now: UnixSecs) -> bool {
    expires_at <= now.0
}

/// Which of a device's sessions (an id, issued at ms) to drop so that one
/// more fits under `max_per_device`: the oldest ones (ties by id, so the
/// choice does not depend on the order they were read in).
pub fn over_cap<Id: Ord>(mut existing: Vec<(Id, u64)>, max_per_device: usize) -> Vec<Id> {
    let keep = max_per_device.saturating_sub(1);
    if existing.len() <= keep {
        return vec![];
    }
    existing.sort_by(|(a, at_a), (b, at_b)| (at_a, a).cmp(&(at_b, b)));
    let drop = existing.len() - keep;
    existing.into_iter().take(drop).map(|(id, _)| id).collect()
}

/// New sessions open only at a relay the account's route names: one the
/// account left keeps what it had (an old copy, perhaps without the
/// revocations made since) but admits no device.
fn serving(state: &AccountState, ctx: Ctx) -> Result<(), RelayError> {
    match state.route() {
        Some(route) if !route.lists_relay(&ctx.policy.relay_id) => Err(super::shared::not_served_here(Some(route))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::method::account_register::register;
    use crate::policy::Policy;
    use relay_schemas::client::{Account, Device};
    use relay_schemas::ErrorCode;
    use serde_json::json;

    const NOW: u64 = 1_764_400_000;
    const RELAY: &str = "relay-a";

    fn policy() -> Policy {
        Policy::with_relay_id(RELAY)
    }

    fn alice() -> Account {
        Account::from_seed([1; 32])
    }

    fn phone() -> Device {
        Device::from_seed("phone", [11; 32])
    }

    /// Alice registered here with her phone.
    fn registered() -> AccountState {
        let (a, d) = (alice(), phone());
        let route = a.route(1, &[(RELAY, "https://a.example")], NOW - 60);
        let params = a.register_params(&route, &a.certificate(&d, NOW - 60, None), RELAY, false, NOW - 60);
        let p = serde_json::from_str(&params.to_string()).unwrap();
        let policy = policy();
        let mut state = AccountState::new(&a.id);
        for e in register(&state, &p, "digest", None, Ctx::new(UnixSecs(NOW), &policy)).unwrap() {
            state.apply(&e);
        }
        state
    }

    fn open_params(challenge: &str, signer: &Device, relay: &str) -> SessionOpenParams {
        let v = json!({"account_id": alice().id, "device_id": "phone", "challenge": challenge,
                       "signature": signer.session_proof(&alice().id, challenge, relay)});
        serde_json::from_value(v).unwrap()
    }

    fn code<T: std::fmt::Debug>(r: Result<T, RelayError>) -> ErrorCode {
        r.expect_err("refused").code
    }

    #[test]
    fn a_challenge_is_refused_for_an_unregistered_account_or_an_unknown_device() {
        let policy = policy();
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut c = Challenges::default();
        let unregistered = AccountState::new(alice().id);
        assert_eq!(code(c.issue(&unregistered, "phone", [1; 32], ctx)), ErrorCode::NotFound);
        assert_eq!(code(c.issue(&registered(), "laptop", [1; 32], ctx)), ErrorCode::DeviceUnknown);
        assert!(c.is_empty(), "a refused request leaves no challenge");
    }

    #[test]
    fn a_signed_challenge_opens_a_session_once_until_the_session_ttl() {
        let (policy, state) = (policy(), registered());
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut c = Challenges::default();
        let issued = c.issue(&state, "phone", [7; 32], ctx).unwrap();
        assert_eq!(issued.expires_at, NOW + policy.challenge_ttl);
        let p = open_params(&issued.challenge, &phone(), RELAY);
        let grant = c.answer(&state, &p, ctx).unwrap();
        assert_eq!(
            grant,
            Grant { account_id: alice().id, device_id: "phone".into(), expires_at: NOW + policy.session_ttl }
        );
        assert_eq!(code(c.answer(&state, &p, ctx)), ErrorCode::Unauthorized, "a challenge answers once");
    }

    #[test]
    fn a_challenge_signed_by_another_key_or_for_another_relay_opens_nothing_and_stays() {
        let (policy, state) = (policy(), registered());
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut c = Challenges::default();
        let issued = c.issue(&state, "phone", [7; 32], ctx).unwrap();
        let stranger = Device::from_seed("phone", [99; 32]);
        assert_eq!(
            code(c.answer(&state, &open_params(&issued.challenge, &stranger, RELAY), ctx)),
            ErrorCode::InvalidSignature
        );
        assert_eq!(
            code(c.answer(&state, &open_params(&issued.challenge, &phone(), "relay-b"), ctx)),
            ErrorCode::InvalidSignature
        );
        assert!(c.answer(&state, &open_params(&issued.challenge, &phone(), RELAY), ctx).is_ok());
    }

    #[test]
    fn an_expired_challenge_opens_nothing_and_is_forgotten() {
        let (policy, state) = (policy(), registered());
        let mut c = Challenges::default();
        let issued = c.issue(&state, "phone", [7; 32], Ctx::new(UnixSecs(NOW), &policy)).unwrap();
        let later = Ctx::new(UnixSecs(issued.expires_at), &policy);
        let p = open_params(&issued.challenge, &phone(), RELAY);
        assert_eq!(code(c.answer(&state, &p, later)), ErrorCode::Unauthorized);
        assert!(!c.is_empty());
        c.expire(UnixSecs(issued.expires_at));
        assert!(c.is_empty(), "the actor may passivate now");
    }

    #[test]
    fn a_device_keeps_only_its_latest_challenges() {
        let (policy, state) = (policy(), registered());
        let ctx = Ctx::new(UnixSecs(NOW), &policy);
        let mut c = Challenges::default();
        let issued: Vec<_> = (0..=PER_DEVICE as u8).map(|i| c.issue(&state, "phone", [i; 32], ctx).unwrap()).collect();
        let oldest = open_params(&issued[0].challenge, &phone(), RELAY);
        assert_eq!(code(c.answer(&state, &oldest, ctx)), ErrorCode::Unauthorized, "the oldest was dropped");
        for i in &issued[1..] {
            assert!(c.answer(&state, &open_params(&i.challenge, &phone(), RELAY), ctx).is_ok());
        }
    }

    #[test]
    fn a_session_expires_at_its_expires_at() {
        assert!(!expired(100, UnixSecs(99)));
        assert!(expired(100, UnixSecs(100)));
        assert!(expired(100, UnixSecs(101)));
    }

    #[test]
    fn the_cap_drops_the_oldest_sessions_to_make_room_for_one() {
        let h = |n: u8| [n; 32];
        assert_eq!(over_cap(vec![(h(1), 10), (h(2), 20)], 3), Vec::<[u8; 32]>::new());
        assert_eq!(over_cap(vec![(h(2), 20), (h(1), 10), (h(3), 30)], 3), vec![h(1)]);
        assert_eq!(over_cap(vec![(h(3), 30), (h(2), 20), (h(1), 10), (h(4), 40)], 2), vec![h(1), h(2), h(3)]);
        assert_eq!(over_cap(vec![(h(1), 10)], 1), vec![h(1)]);
    }

    #[test]
    fn sessions_issued_in_the_same_millisecond_drop_in_id_order() {
        assert_eq!(over_cap(vec![(3, 10), (1, 10), (2, 10)], 2), vec![1, 2]);
    }

    #[test]
    fn a_cap_of_zero_drops_every_session_like_a_cap_of_one() {
        assert_eq!(over_cap(vec![(1, 10), (2, 20)], 0), vec![1, 2]);
    }
}
