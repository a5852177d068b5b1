//! The relay-to-relay client: signed `POST /v1/relay/{method}` calls to the
//! configured `[[peers]]`, with connection reuse (one pooled client per
//! worker thread) and the attempt timeout. Implements the delivery
//! [`Transport`].

use crate::config::Peer;
use actix_web::http::StatusCode;
use awc::error::{ConnectError, SendRequestError};
use ed25519_dalek::SigningKey;
use relay_actors::delivery::transport::{AttemptOutcome, LocalFuture, RouteLookup, Transport};
use relay_actors::SharedClock;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{RelayRef, Route};
use relay_schemas::sign::sign_relay_request;
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, Wire};
use serde::Deserialize;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

thread_local! {
    /// awc clients are per thread; each keeps its own connection pool.
    static HTTP: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
}

/// How a call to a peer ended, before any protocol interpretation.
#[derive(Debug)]
pub enum CallError {
    /// The request was never sent (no such peer, connection refused).
    NotSent(RelayError),
    /// It may have arrived: timeout, reset, unreadable answer.
    Unknown(RelayError),
    /// The peer answered with an error object.
    Answered { code: String, error: RelayError },
}

struct Inner {
    relay_id: String,
    key: SigningKey,
    peers: HashMap<String, Peer>,
    timeout: Duration,
    clock: SharedClock,
    clock_tolerance: u64,
}

#[derive(Clone)]
pub struct PeerClient {
    inner: Arc<Inner>,
}

#[derive(Deserialize)]
struct ErrorBody {
    error: WireError,
}

#[derive(Deserialize)]
struct WireError {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    data: Option<serde_json::Value>,
}

impl PeerClient {
    pub fn new(
        relay_id: &str,
        key: SigningKey,
        peers: &[Peer],
        timeout: Duration,
        clock: SharedClock,
        clock_tolerance: u64,
    ) -> Self {
        let peers = peers.iter().map(|p| (p.id.clone(), p.clone())).collect();
        PeerClient { inner: Arc::new(Inner { relay_id: relay_id.into(), key, peers, timeout, clock, clock_tolerance }) }
    }

    fn http(&self) -> awc::Client {
        let timeout = self.inner.timeout;
        HTTP.with(|c| {
            c.get_or_init(|| {
                // No pool-wide cap: attempts are bounded per destination
                // (limits.max_in_flight_per_destination), so a dead relay
                // cannot take every pooled connection.
                awc::Client::builder()
                    .timeout(timeout)
                    .connector(awc::Connector::new().timeout(timeout).limit(0))
                    .finish()
            })
            .clone()
        })
    }

    /// A signed call of relay method `method` at peer `peer_id`; the result
    /// body on HTTP 200.
    pub async fn call(&self, peer_id: &str, method: &str, body: Vec<u8>) -> Result<actix_web::web::Bytes, CallError> {
        let Some(peer) = self.inner.peers.get(peer_id) else {
            return Err(CallError::NotSent(RelayError::new(
                ErrorCode::BadGateway,
                format!("relay {peer_id} is not a configured peer"),
            )));
        };
        let ts = self.inner.clock.now();
        let sig = sign_relay_request(&self.inner.key, method, peer_id, ts, &body);
        let url = format!("{}/v1/relay/{method}", peer.url.trim_end_matches('/'));
        let sent = self
            .http()
            .post(url)
            .content_type("application/json")
            .insert_header(("Relay-Id", self.inner.relay_id.as_str()))
            .insert_header(("Relay-Timestamp", ts.to_string()))
            .insert_header(("Relay-Signature", sig))
            .send_body(body)
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            Err(SendRequestError::Connect(ConnectError::Timeout))
            | Err(SendRequestError::Connect(ConnectError::Io(_))) => {
                return Err(CallError::NotSent(RelayError::unavailable(format!("{peer_id}: cannot connect"))));
            }
            Err(e) => return Err(CallError::Unknown(RelayError::unavailable(format!("{peer_id}: {e}")))),
        };
        let bytes = resp
            .body()
            .limit(16 << 20)
            .await
            .map_err(|e| CallError::Unknown(RelayError::unavailable(format!("{peer_id}: reading answer: {e}"))))?;
        if resp.status() == StatusCode::OK {
            return Ok(bytes);
        }
        match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(ErrorBody { error: e }) => {
                let error = RelayError::from_remote(&e.code, &e.message, e.data);
                Err(CallError::Answered { code: e.code, error })
            }
            Err(_) => Err(CallError::Unknown(RelayError::new(
                ErrorCode::BadGateway,
                format!("{peer_id}: HTTP {} without an error object", resp.status()),
            ))),
        }
    }

    async fn deliver_to(self, target: RelayRef, body: Vec<u8>) -> AttemptOutcome {
        match self.call(&target.id, "message.deliver", body).await {
            Ok(bytes) => match serde_json::from_slice::<DeliveryStatus>(&bytes) {
                Ok(status) => AttemptOutcome::Answered(status),
                Err(e) => {
                    AttemptOutcome::Unknown(RelayError::new(ErrorCode::BadGateway, format!("unreadable answer: {e}")))
                }
            },
            Err(CallError::NotSent(e)) => AttemptOutcome::NotAttempted(e),
            Err(CallError::Unknown(e)) => AttemptOutcome::Unknown(e),
            Err(CallError::Answered { code, error }) => match ErrorCode::parse(&code) {
                Some(_) => AttemptOutcome::Rejected(error),
                None => AttemptOutcome::Unrecognized(error),
            },
        }
    }

    /// The highest valid revision of `account_id`'s route any peer knows;
    /// without one, `Absent` only when every peer answered that it knows
    /// none (a `rate_limited` or unreachable peer proves nothing).
    pub async fn fetch_route(self, account_id: String) -> RouteLookup {
        let Ok(body) = serde_json::to_vec(&json!({ "account_id": account_id })) else { return RouteLookup::Unknown };
        let calls = self.inner.peers.keys().map(|id| self.call(id, "route.get", body.clone()));
        let answers = futures_util::future::join_all(calls).await;
        let now = self.inner.clock.now();
        let mut best: Option<Wire<Route>> = None;
        let mut absent = true;
        for answer in answers {
            match answer {
                Ok(bytes) => {
                    let route = std::str::from_utf8(&bytes).ok().and_then(|s| Wire::<Route>::parse(s).ok());
                    match route
                        .filter(|r| r.account_id == account_id && r.check(now, self.inner.clock_tolerance).is_ok())
                    {
                        Some(r) if best.as_ref().is_none_or(|b| r.revision > b.revision) => best = Some(r),
                        Some(_) => {}
                        None => absent = false,
                    }
                }
                Err(CallError::Answered { error, .. })
                    if matches!(error.code, ErrorCode::NotFound | ErrorCode::RouteNotFound) => {}
                Err(_) => absent = false,
            }
        }
        match best {
            Some(route) => RouteLookup::Found(route),
            None if absent => RouteLookup::Absent,
            None => RouteLookup::Unknown,
        }
    }
}

impl Transport for PeerClient {
    fn deliver(&self, target: &RelayRef, params: &DeliverParams) -> LocalFuture<AttemptOutcome> {
        // The params go out exactly as stored: the signed objects' original bytes.
        let body = serde_json::to_vec(params);
        let (me, target) = (self.clone(), target.clone());
        Box::pin(async move {
            match body {
                Ok(body) => me.deliver_to(target, body).await,
                Err(e) => AttemptOutcome::NotAttempted(RelayError::internal(e.to_string())),
            }
        })
    }

    fn fetch_route(&self, account_id: &str) -> LocalFuture<RouteLookup> {
        Box::pin(self.clone().fetch_route(account_id.to_owned()))
    }

    fn is_peer(&self, relay_id: &str) -> bool {
        self.inner.peers.contains_key(relay_id)
    }

    fn peer_status(&self, relay: &RelayRef, from: &str, message_id: &str) -> LocalFuture<Option<DeliveryStatus>> {
        let body = serde_json::to_vec(&json!({"from": from, "message_id": message_id})).unwrap_or_default();
        let (me, id) = (self.clone(), relay.id.clone());
        Box::pin(async move {
            #[derive(Deserialize)]
            struct PeerStatus {
                known: bool,
                status: Option<DeliveryStatus>,
            }
            let bytes = me.call(&id, "message.delivery.peer_status", body).await.ok()?;
            let answer: PeerStatus = serde_json::from_slice(&bytes).ok()?;
            answer.known.then_some(answer.status).flatten()
        })
    }
}
