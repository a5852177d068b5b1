//! The relay methods of PROTOCOL §5 (`POST /v1/relay/{method}`), called by
//! peers. Every request is authenticated first: the `Relay-Id` must be a
//! configured peer, `Relay-Timestamp` within the clock tolerance, and
//! `Relay-Signature` the peer key's signature of the request digest.
//! Each method's handler is its own file in [`crate::method`].

use crate::rpc::Relay;
use ed25519_dalek::VerifyingKey;
use relay_actors::account::{AccountCmd, Reply};
use relay_schemas::ids::check_account_id;
use relay_schemas::sign::{relay_request_bytes, verify_bytes};
use relay_schemas::{Method, RelayError};
use std::collections::HashMap;

/// The request headers of a relay call.
pub struct RelayHeaders<'a> {
    pub relay_id: Option<&'a str>,
    pub timestamp: Option<&'a str>,
    pub signature: Option<&'a str>,
}

/// Who may call: configured peers and their keys.
pub struct PeerKeys {
    own_id: String,
    keys: HashMap<String, VerifyingKey>,
    clock_tolerance: u64,
}

impl PeerKeys {
    pub fn new(own_id: &str, keys: HashMap<String, VerifyingKey>, clock_tolerance: u64) -> Self {
        PeerKeys { own_id: own_id.into(), keys, clock_tolerance }
    }

    /// The calling peer's id, or `unauthorized`.
    pub fn authenticate(&self, h: &RelayHeaders, method: &str, body: &[u8], now: u64) -> Result<String, RelayError> {
        let deny = |why: &str| RelayError::unauthorized(format!("relay authentication: {why}"));
        let id = h.relay_id.ok_or_else(|| deny("Relay-Id missing"))?;
        let key = self.keys.get(id).ok_or_else(|| deny("not a configured peer"))?;
        // Digits only: `u64::from_str` would also take a leading `+`.
        let ts: u64 = h
            .timestamp
            .filter(|t| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|t| t.parse().ok())
            .ok_or_else(|| deny("Relay-Timestamp missing or malformed"))?;
        if ts.abs_diff(now) > self.clock_tolerance {
            return Err(deny("Relay-Timestamp outside clock tolerance"));
        }
        let sig = h.signature.ok_or_else(|| deny("Relay-Signature missing"))?;
        verify_bytes(key, &relay_request_bytes(method, &self.own_id, ts, body), sig)
            .map_err(|_| deny("bad signature"))?;
        Ok(id.to_owned())
    }
}

impl Relay {
    /// Where an account this relay does not serve lives now: `route_stale`
    /// with the newer route when one is known, else `target_not_local`.
    fn not_served_here(&self, account_id: &str) -> RelayError {
        relay_actors::account::decide::not_served_here(
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
                Some(m) => crate::method::relay(self, m, peer, body).await,
                None => Err(RelayError::not_found(format!("unknown relay method {method:?}"))),
            },
            Err(e) => Err(e),
        };
        self.observe(&format!("relay/{method}"), started, &result);
        result
    }
}
