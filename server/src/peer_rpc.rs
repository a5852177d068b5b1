//! Peer authentication for the relay methods of PROTOCOL §5 (`POST
//! /v1/relay/{method}`): the `Relay-Id` must be a configured peer,
//! `Relay-Timestamp` within the clock tolerance, and `Relay-Signature` the
//! peer key's signature of the request digest, not seen before in its
//! window ([`relay_core::peer_auth`]). [`crate::rpc::call_relay`] then
//! dispatches the call.

use ed25519_dalek::VerifyingKey;

use relay_core::peer_auth::{self, Admission, Authenticated, RelayHeaders, ReplayWindow};
use relay_schemas::RelayError;
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
    /// A sibling shard of this relay, over the cluster's hop (unsigned:
    /// `cluster::hop::SIBLING_HEADER`); its id is the relay's own.
    Sibling(String),
}

impl Admitted {
    /// The calling peer.
    pub fn peer(&self) -> &str {
        match self {
            Admitted::New { peer, .. } | Admitted::Again { peer, .. } | Admitted::Sibling(peer) => peer,
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
