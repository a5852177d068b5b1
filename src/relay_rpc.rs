//! The relay methods of PROTOCOL §5 (`POST /v1/relay/{method}`), called by
//! peers. Every request is authenticated first: the `Relay-Id` must be a
//! configured peer, `Relay-Timestamp` within the clock tolerance, and
//! `Relay-Signature` the peer key's signature of the request digest.

use crate::rpc::{parse, parse_with_digest, Relay};
use ed25519_dalek::VerifyingKey;
use relay_actors::account::decide::{self, Ctx};
use relay_actors::account::{AccountCmd, Reply};
use relay_schemas::ids::{check_account_id, check_message_id};
use relay_schemas::methods::{AccountIdParams, DeliverParams, PeerStatusParams};
use relay_schemas::sign::{relay_request_bytes, verify_bytes};
use relay_schemas::{ErrorCode, RelayError};
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
        match self.supervisor().routes().get(account_id).ok().flatten() {
            Some(route) => RelayError::new(ErrorCode::RouteStale, "the account is served by other relays")
                .with_data(serde_json::json!({ "route": route })),
            None => RelayError::new(ErrorCode::TargetNotLocal, "this relay does not serve the account"),
        }
    }

    /// PROTOCOL §5 *Who may deliver*: `peer` must be a home relay of the
    /// sender under the route the message was accepted with, and when this
    /// relay serves the sender too, the sending device must be valid here.
    async fn may_deliver(&self, peer: &str, p: &DeliverParams) -> Result<(), RelayError> {
        let sup = self.supervisor();
        let env = &p.envelope;
        check_account_id("envelope.from", &env.from)?;
        let known = sup.routes().get(&env.from).map_err(|e| RelayError::internal(e.to_string()))?;
        let policy = sup.policy();
        let ctx = Ctx { now: sup.clock().now(), policy: &policy };
        decide::may_deliver(p.sender_route.as_ref(), known.as_ref(), peer, env, ctx)?;
        let serves_sender = known.as_ref().is_some_and(|r| r.lists_relay(&policy.relay_id));
        if serves_sender && sup.account_exists(&env.from)? {
            let device_id = env.from_device_id.clone();
            sup.ask(&env.from, AccountCmd::CheckSender { device_id }).await?;
        }
        if let Some(route) = &p.sender_route {
            // Checked valid above: the route book keeps it if it is newer.
            let _ = sup.routes().offer(route);
        }
        Ok(())
    }

    async fn on_local(&self, account_id: &str, cmd: AccountCmd) -> Result<Reply, RelayError> {
        check_account_id("account_id", account_id)?;
        if !self.supervisor().account_exists(account_id)? {
            return Err(self.not_served_here(account_id));
        }
        self.supervisor().ask(account_id, cmd).await
    }

    pub async fn call_relay(&self, method: &str, peer: &str, body: &[u8]) -> Result<String, RelayError> {
        let started = std::time::Instant::now();
        let result = match self.limits().peer(peer, method) {
            Ok(()) => self.dispatch_relay(method, peer, body).await,
            Err(e) => Err(e),
        };
        self.observe(&format!("relay/{method}"), started, &result);
        result
    }

    async fn dispatch_relay(&self, method: &str, peer: &str, body: &[u8]) -> Result<String, RelayError> {
        match method {
            "message.deliver" => {
                let (params, digest): (DeliverParams, _) = parse_with_digest(body)?;
                self.may_deliver(peer, &params).await?;
                let to = params.envelope.to.clone();
                Self::json_of(self.on_local(&to, AccountCmd::MessageDeliver { params, digest }).await?)
            }
            "route.get" => {
                let p: AccountIdParams = parse(body)?;
                check_account_id("account_id", &p.account_id)?;
                // Only what this relay knows: no recursion through peers.
                let route =
                    self.supervisor().routes().get(&p.account_id).map_err(|e| RelayError::internal(e.to_string()))?;
                let route = route
                    .ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
                Ok(route.raw().get().to_owned())
            }
            "account.devices.get" => {
                let p: AccountIdParams = parse(body)?;
                Self::json_of(self.on_local(&p.account_id, AccountCmd::AccountDevicesGet).await?)
            }
            "message.delivery.peer_status" => {
                let p: PeerStatusParams = parse(body)?;
                check_message_id("message_id", &p.message_id)?;
                let cmd = AccountCmd::MessageDeliveryPeerStatus { peer: peer.to_owned(), message_id: p.message_id };
                Self::json_of(self.on_local(&p.from, cmd).await?)
            }
            _ => Err(RelayError::not_found(format!("unknown relay method {method:?}"))),
        }
    }
}
