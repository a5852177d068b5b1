//! The relay methods of PROTOCOL §5 (`POST /v1/relay/{method}`), called by
//! peers. Every request is authenticated first: the `Relay-Id` must be a
//! configured peer, `Relay-Timestamp` within the clock tolerance, and
//! `Relay-Signature` the peer key's signature of the request digest, not
//! seen before in its window ([`relay_core::peer_auth`]).
//! Each method's handler is its own file in [`crate::method`].

use crate::rpc::Relay;
use ed25519_dalek::VerifyingKey;
use relay_actors::account::{AccountCmd, Reply};
pub use relay_core::peer_auth::RelayHeaders;
use relay_core::peer_auth::{self, Admission, Authenticated, ReplayWindow};
use relay_schemas::ids::check_account_id;
use relay_schemas::{Method, RelayError};
use std::collections::HashMap;
use std::sync::Mutex;

/// Who may call (the rule is [`peer_auth`]'s), and the signatures seen in
/// the current window with their small answers. Verification runs outside
/// the lock; the lock covers one map lookup and insert.
pub struct PeerKeys {
    keys: peer_auth::PeerKeys,
    replays: Mutex<ReplayWindow<Answer>>,
}

/// What a relay method answered: the result's JSON, or the error.
pub type Answer = Result<String, RelayError>;

/// A relay request that passed authentication.
#[derive(Debug)]
pub enum Admitted {
    /// New: carry it out, then [`PeerKeys::answered`] with `request`.
    New { peer: String, request: Authenticated },
    /// The same signed request again: answer what the first got.
    Again { peer: String, answer: Answer },
}

impl Admitted {
    /// The calling peer.
    pub fn peer(&self) -> &str {
        match self {
            Admitted::New { peer, .. } | Admitted::Again { peer, .. } => peer,
        }
    }
}

impl PeerKeys {
    /// `window_cap`: signatures remembered at most (see [`replay_window_cap`]).
    pub fn new(own_id: &str, keys: HashMap<String, VerifyingKey>, clock_tolerance: u64, window_cap: usize) -> Self {
        PeerKeys {
            keys: peer_auth::PeerKeys::new(own_id, keys, clock_tolerance),
            replays: Mutex::new(ReplayWindow::new(clock_tolerance, window_cap)),
        }
    }

    /// The calling peer and whether its request is new; `unauthorized`,
    /// or `rate_limited` for a signature already received in its window
    /// whose answer is not kept.
    pub fn authenticate(&self, h: &RelayHeaders, method: &str, body: &[u8], now: u64) -> Result<Admitted, RelayError> {
        let a = self.keys.authenticate(h, method, body, now)?;
        Ok(match self.window().admit(&a, now)? {
            Admission::New => Admitted::New { peer: a.peer.clone(), request: a },
            Admission::Again(answer) => Admitted::Again { peer: a.peer, answer },
        })
    }

    /// `request` was answered `answer`: its duplicates get the same.
    pub fn answered(&self, request: &Authenticated, answer: &Answer) {
        let bytes = match answer {
            Ok(json) => json.len(),
            Err(e) => e.message.len() + e.data.as_ref().map_or(0, |d| d.to_string().len()),
        };
        if bytes <= peer_auth::MAX_KEPT_ANSWER {
            self.window().answered(request, answer.clone(), bytes);
        }
    }

    fn window(&self) -> std::sync::MutexGuard<'_, ReplayWindow<Answer>> {
        self.replays.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Signatures the replay window holds at most: what `peers` peers may send
/// in one window at their configured rates (each remembered signature costs
/// 20–40 bytes), and never fewer than 65,536.
pub fn replay_window_cap(peers: usize, requests_per_second: u64, clock_tolerance: u64) -> usize {
    let per_window = requests_per_second.saturating_mul(clock_tolerance.saturating_add(1));
    usize::try_from(per_window.saturating_mul(peers.max(1) as u64)).unwrap_or(usize::MAX).max(65_536)
}

impl Relay {
    /// Where an account this relay does not serve lives now: `route_stale`
    /// with the newer route when one is known, else `target_not_local`.
    fn not_served_here(&self, account_id: &str) -> RelayError {
        relay_actors::account::shared::not_served_here(
            self.supervisor().routes().get(account_id).ok().flatten().as_ref(),
        )
    }

    /// A command to a local account named by a peer; an account not served
    /// here gets where it lives now.
    pub(crate) async fn on_local(&self, account_id: &str, cmd: AccountCmd) -> Result<Reply, RelayError> {
        check_account_id("account_id", account_id)?;
        if self.peers().in_sibling_shard(account_id) {
            // Reached through an owner address that changed hands: not a
            // statement about the account, so nothing the caller acts on.
            return Err(RelayError::unavailable("the account's shard is not served here now"));
        }
        if !self.supervisor().account_exists(account_id)? {
            return Err(self.not_served_here(account_id));
        }
        self.supervisor().ask(account_id, cmd).await
    }

    pub async fn call_relay(&self, method: &str, peer: &str, body: &[u8]) -> Result<String, RelayError> {
        let started = std::time::Instant::now();
        // A sibling shard of this relay (same id and key) is not a
        // stranger to rate-limit: its calls are this relay's own sends.
        let limited = if peer == self.supervisor().policy().relay_id.as_str() {
            Ok(())
        } else {
            self.limits().peer(peer, method)
        };
        let result = match limited {
            Ok(()) => match Method::from_relay_wire(method) {
                Some(m) => self.under_lease(crate::method::relay(self, m, peer, body)).await,
                None => Err(RelayError::not_found(format!("unknown relay method {method:?}"))),
            },
            Err(e) => Err(e),
        };
        self.observe(&format!("relay/{method}"), started, &result);
        result
    }
}
