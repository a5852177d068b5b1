//! The relay-to-relay client: signed `POST /v1/relay/{method}` calls to the
//! configured `[[peers]]`, with connection reuse (one pooled client per
//! worker thread) and the attempt timeout. Implements the delivery
//! [`Transport`].

use crate::config::Peer;
use crate::observe::{Direction, PeerObserver};
use crate::peer_batch::{Batcher, Batching, Dest, Item, Slot};
use actix_web::http::StatusCode;
use awc::error::{ConnectError, SendRequestError};
use ed25519_dalek::SigningKey;
use relay_actors::delivery::{LocalFuture, Transport};
use relay_core::clock::SharedClock;
use relay_core::delivery::batch::{self, Refused};
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::{PeerRoute, RouteLookup};
use relay_schemas::methods::Method;
use relay_schemas::methods::{AccountIdParams, DeliverBatchResult, DeliverParams, PeerStatusParams, PeerStatusResult};
use relay_schemas::objects::{DeliveryStatus, RelayRef, Route, Wire};
use relay_schemas::sign::sign_relay_request;
use relay_schemas::{ErrorCode, RelayError, RemoteError, RemoteErrorBody};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

thread_local! {
    /// awc clients are per thread; each keeps its own connection pool.
    static HTTP: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
    /// Calls to sibling shards over the cluster hop.
    static HOP_HTTP: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
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

/// How calls reach a peer: the attempt timeout (connect and answer), the
/// TLS of `https://` peers, which verifies their certificates
/// ([`crate::http::tls::client_config`]), and how deliveries are batched.
pub struct Connect {
    pub timeout: Duration,
    pub tls: Arc<rustls::ClientConfig>,
    /// How deliveries to one peer are grouped into batches.
    pub batching: Batching,
}

struct Inner {
    observer: Arc<PeerObserver>,
    relay_id: String,
    key: SigningKey,
    peers: HashMap<String, Peer>,
    timeout: Duration,
    tls: Arc<rustls::ClientConfig>,
    clock: SharedClock,
    clock_tolerance: u64,
    /// A peer's routes are signed objects like a client's (PROTOCOL §1).
    max_object_bytes: usize,
    /// In a cluster of several shards: the other shards of this relay,
    /// reached at their owners' internal addresses under our own id.
    siblings: Option<crate::cluster::place::ShardPlace>,
    /// Deliveries to each peer, grouped into batches under load.
    batcher: Batcher,
}

/// One `route.get` asked during a lookup: who, and the answer.
type Asked<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = (String, Result<actix_web::web::Bytes, CallError>)> + 'a>>;

/// Whom a call goes to.
enum To<'a> {
    /// A configured peer.
    Peer(&'a str),
    /// A sibling shard of this relay, by its number.
    Shard(u32),
}

#[derive(Clone)]
pub struct PeerClient {
    inner: Arc<Inner>,
}

impl PeerClient {
    pub fn new(
        relay_id: &str,
        key: SigningKey,
        peers: &[Peer],
        connect: Connect,
        clock: SharedClock,
        policy: &relay_core::policy::Policy,
        siblings: Option<crate::cluster::place::ShardPlace>,
    ) -> Self {
        let (clock_tolerance, max_object_bytes) = (policy.clock_tolerance, policy.max_object_bytes);
        let peers: HashMap<_, _> = peers.iter().map(|p| (p.id.clone(), p.clone())).collect();
        let observer = Arc::new(PeerObserver::new(peers.keys().cloned()));
        let inner = Inner {
            observer,
            relay_id: relay_id.into(),
            key,
            peers,
            timeout: connect.timeout,
            tls: connect.tls,
            clock,
            clock_tolerance,
            max_object_bytes,
            siblings,
            batcher: Batcher::new(connect.batching),
        };
        PeerClient { inner: Arc::new(inner) }
    }

    /// Whether this relay is a cluster of several shards.
    pub fn sharded(&self) -> bool {
        self.inner.siblings.is_some()
    }

    /// Whether `account_id` lives in another shard of this relay.
    pub fn in_sibling_shard(&self, account_id: &str) -> bool {
        self.inner.siblings.as_ref().is_some_and(|s| !s.is_mine(account_id))
    }

    /// A signed call of relay method `method` at the owner of the shard
    /// holding `account_id` (a sibling shard of this relay).
    /// While that shard has no reachable owner (a takeover or hand-over
    /// under way, a few seconds) the call waits for one, up to the
    /// attempt timeout: nothing was sent, so trying again is safe.
    pub async fn call_sibling(
        &self,
        account_id: &str,
        method: Method,
        body: Vec<u8>,
    ) -> Result<actix_web::web::Bytes, CallError> {
        match &self.inner.siblings {
            Some(s) => self.call_shard(s.shard_of(account_id), method, body).await,
            None => self.send_call(To::Shard(0), method.as_str(), body).await,
        }
    }

    /// [`PeerClient::call_sibling`] by the shard's number. It tries again
    /// on a new owner and every `OWNER_POLL`: a node that took the lease
    /// listens only once it has fenced and caught up the shard, which no
    /// change of the lease announces (a wait for one failed the attempt,
    /// and the delivery waited for its next slot of the timetable, 5
    /// minutes after its second).
    async fn call_shard(&self, k: u32, method: Method, body: Vec<u8>) -> Result<actix_web::web::Bytes, CallError> {
        use tokio::time::{timeout_at, Instant};
        let deadline = Instant::now() + self.inner.timeout;
        loop {
            let mut owners = self.inner.siblings.as_ref().map(|s| s.owners.clone());
            // Before the try: a new owner listed while it runs is not missed.
            if let Some(owners) = &mut owners {
                owners.mark_unchanged();
            }
            let answer = self.send_call(To::Shard(k), method.as_str(), body.clone()).await;
            let (Err(CallError::NotSent(_)), Some(mut owners)) = (&answer, owners) else { return answer };
            if Instant::now() >= deadline {
                return answer;
            }
            let changed = async {
                if owners.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            let _ = timeout_at(deadline.min(Instant::now() + crate::cluster::place::OWNER_POLL), changed).await;
        }
    }

    /// Counts and logs relay-to-relay requests, both directions.
    pub fn observer(&self) -> &Arc<PeerObserver> {
        &self.inner.observer
    }

    fn http(&self) -> awc::Client {
        let timeout = self.inner.timeout;
        let tls = self.inner.tls.clone();
        HTTP.with(|c| {
            c.get_or_init(|| {
                // No pool-wide cap: attempts are bounded per destination
                // (limits.max_in_flight_per_destination), so a dead relay
                // cannot take every pooled connection.
                awc::Client::builder()
                    .timeout(timeout)
                    .connector(awc::Connector::new().timeout(timeout).limit(0).rustls_0_23(tls))
                    .finish()
            })
            .clone()
        })
    }

    /// The cluster hop's TLS to sibling shards' owners, when it has a secret.
    fn sibling_hop(&self) -> Option<&Arc<rustls::ClientConfig>> {
        self.inner.siblings.as_ref()?.hop.as_ref()
    }

    /// The client for sibling shards over the cluster hop (`cluster/hop.rs`).
    fn hop_http(&self, hop: &Arc<rustls::ClientConfig>) -> awc::Client {
        let timeout = self.inner.timeout;
        HOP_HTTP.with(|c| {
            c.get_or_init(|| {
                awc::Client::builder()
                    .timeout(timeout)
                    .connector(awc::Connector::new().timeout(timeout).limit(0).rustls_0_23(hop.clone()))
                    .finish()
            })
            .clone()
        })
    }

    /// A signed call of relay method `method` at peer `peer_id`; the result
    /// body on HTTP 200. Counted in `relay_peer_requests_total`; a refusal of
    /// our authentication, no answer or a 5xx answer is logged (WARN).
    pub async fn call(&self, peer_id: &str, method: Method, body: Vec<u8>) -> Result<actix_web::web::Bytes, CallError> {
        let method = method.as_str();
        let result = self.send_call(To::Peer(peer_id), method, body).await;
        if self.inner.peers.contains_key(peer_id) {
            self.observe(peer_id, method, &result);
        }
        result
    }

    fn observe(&self, peer: &str, method: &str, result: &Result<actix_web::web::Bytes, CallError>) {
        let o = &self.inner.observer;
        let (outcome, error) = match result {
            Ok(_) => ("ok", None),
            Err(CallError::Answered { code, error }) => (crate::observe::outcome_of_code(code), Some(error)),
            // An HTTP error status without an error object (a proxy's 502, say).
            Err(CallError::Unknown(e)) if e.code == ErrorCode::BadGateway => ("bad_gateway", Some(e)),
            Err(CallError::NotSent(e) | CallError::Unknown(e)) => ("unreachable", Some(e)),
        };
        o.count(peer, Direction::Out, outcome);
        let Some(error) = error else { return };
        let kind = match outcome {
            "unauthorized" => "unauthorized",
            "unreachable" => "unreachable",
            _ if error.http_status() >= 500 => "server_error",
            _ => return,
        };
        let Some(suppressed) = o.may_warn(peer, kind) else { return };
        let why = error.message.as_str();
        match kind {
            "unauthorized" => tracing::warn!(
                peer,
                method,
                reason = why,
                suppressed,
                "peer refused our relay authentication (does it list this relay, with this key, in its [[peers]]?)"
            ),
            "unreachable" => {
                tracing::warn!(peer = %peer, method = %method, error = why, suppressed, "peer unreachable")
            }
            _ => tracing::warn!(peer = %peer, method = %method, outcome = %outcome, error = why, suppressed,
                "peer answered with a server error"),
        }
    }

    async fn send_call(&self, to: To<'_>, method: &str, body: Vec<u8>) -> Result<actix_web::web::Bytes, CallError> {
        let (peer_id, base) = match to {
            To::Peer(id) => match self.inner.peers.get(id) {
                Some(peer) => (id, peer.url.trim_end_matches('/').to_owned()),
                None => {
                    return Err(CallError::NotSent(RelayError::new(
                        ErrorCode::BadGateway,
                        format!("relay {id} is not a configured peer"),
                    )))
                }
            },
            To::Shard(k) => {
                let own = self.inner.relay_id.as_str();
                match self.inner.siblings.as_ref().map(|s| s.owner(k)) {
                    Some(Ok(at)) => {
                        let scheme = if self.sibling_hop().is_some() { "https" } else { "http" };
                        (own, format!("{scheme}://{at}"))
                    }
                    Some(Err(shard)) => {
                        let why = format!("{own}: shard {shard} has no owner now");
                        return Err(CallError::NotSent(RelayError::unavailable(why)));
                    }
                    None => {
                        let why = format!("{own}: not a cluster of several shards");
                        return Err(CallError::NotSent(RelayError::internal(why)));
                    }
                }
            }
        };
        let url = format!("{base}/v1/relay/{method}");
        let request = match (&to, self.sibling_hop()) {
            // Over the cluster's hop the handshake proved who we are: no
            // signature per call (`cluster::hop::SIBLING_HEADER`).
            (To::Shard(_), Some(hop)) => {
                self.hop_http(hop).post(url).insert_header((crate::cluster::hop::SIBLING_HEADER, "1"))
            }
            _ => {
                let ts = self.inner.clock.now().0;
                let sig = sign_relay_request(&self.inner.key, method, peer_id, ts, &body);
                self.http()
                    .post(url)
                    .insert_header(("Relay-Timestamp", ts.to_string()))
                    .insert_header(("Relay-Signature", sig))
            }
        };
        let sent = request
            .content_type("application/json")
            .insert_header(("Relay-Id", self.inner.relay_id.as_str()))
            .send_body(body)
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            // rustls's handshake errors (a certificate that does not verify):
            // nothing was sent, and the operator needs the reason.
            Err(SendRequestError::Connect(ConnectError::Io(e))) if e.kind() == std::io::ErrorKind::InvalidData => {
                let why = format!("{peer_id}: TLS handshake failed: {e}");
                return Err(CallError::NotSent(RelayError::unavailable(why)));
            }
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
        match serde_json::from_slice::<RemoteErrorBody>(&bytes) {
            Ok(RemoteErrorBody { error: e }) => {
                let error = RelayError::from_remote(&e.code, &e.message, e.data);
                Err(CallError::Answered { code: e.code, error })
            }
            Err(_) => Err(CallError::Unknown(RelayError::new(
                ErrorCode::BadGateway,
                format!("{peer_id}: HTTP {} without an error object", resp.status()),
            ))),
        }
    }

    pub(crate) fn batcher(&self) -> &Batcher {
        &self.inner.batcher
    }

    /// `message.deliver` with `body` alone at `to`.
    pub(crate) async fn deliver_one(&self, to: &Dest, body: Vec<u8>) -> AttemptOutcome {
        Self::deliver_outcome(self.call_to(to, Method::MessageDeliver, body).await)
    }

    /// A call at a configured peer ([`PeerClient::call`]) or a sibling shard.
    async fn call_to(&self, to: &Dest, method: Method, body: Vec<u8>) -> Result<actix_web::web::Bytes, CallError> {
        match to {
            Dest::Peer(id) => self.call(id, method, body).await,
            Dest::Shard(k) => self.call_shard(*k, method, body).await,
        }
    }

    /// What an answer to `message.deliver` (or to one item of a batch)
    /// means for the attempt.
    pub(crate) fn deliver_outcome(answer: Result<actix_web::web::Bytes, CallError>) -> AttemptOutcome {
        match answer {
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
        let body = match serde_json::to_vec(&AccountIdParams { account_id: account_id.clone() }) {
            Ok(body) => body,
            Err(e) => return RouteLookup::Unknown(format!("cannot encode route.get: {e}")),
        };
        let calls = self.inner.peers.keys().map(|id| {
            let (me, body) = (&self, body.clone());
            Box::pin(async move { (id.clone(), me.call(id, Method::RelayRouteGet, body).await) }) as Asked<'_>
        });
        // An account of another shard of this relay: that shard knows its route.
        let sibling = self.in_sibling_shard(&account_id).then(|| {
            let (me, account_id, body) = (&self, account_id.clone(), body.clone());
            Box::pin(async move {
                (me.inner.relay_id.clone(), me.call_sibling(&account_id, Method::RelayRouteGet, body).await)
            }) as Asked<'_>
        });
        let answers = futures_util::future::join_all(calls.chain(sibling)).await;
        let (now, tolerance, max_bytes) =
            (self.inner.clock.now(), self.inner.clock_tolerance, self.inner.max_object_bytes);
        RouteLookup::from_answers(answers.into_iter().map(|(id, answer)| {
            // Why a peer gave no definitive answer, said once per peer
            // (the call's own message often starts with the peer id).
            let why = |e: &RelayError| e.message.strip_prefix(&format!("{id}: ")).unwrap_or(&e.message).to_owned();
            match answer {
                Ok(bytes) => std::str::from_utf8(&bytes)
                    .ok()
                    .and_then(|s| Wire::<Route>::parse(s).ok())
                    .filter(|r| r.account_id == account_id && r.check(now, tolerance, max_bytes).is_ok())
                    .map_or_else(|| PeerRoute::NoAnswer(format!("{id} answered an invalid route")), PeerRoute::Found),
                Err(CallError::Answered { error, .. })
                    if matches!(error.code, ErrorCode::NotFound | ErrorCode::RouteNotFound) =>
                {
                    PeerRoute::NotFound
                }
                Err(CallError::Answered { code, error }) => {
                    PeerRoute::NoAnswer(format!("{id} answered {code} ({})", why(&error)))
                }
                Err(CallError::NotSent(e)) => PeerRoute::NoAnswer(format!("{id} unreachable ({})", why(&e))),
                Err(CallError::Unknown(e)) => PeerRoute::NoAnswer(format!("{id} gave no answer ({})", why(&e))),
            }
        }))
    }
}

impl Transport for PeerClient {
    fn deliver(&self, target: &RelayRef, params: &DeliverParams) -> LocalFuture<AttemptOutcome> {
        // The params go out exactly as stored: the signed objects' original bytes.
        let body = serde_json::to_vec(params);
        let me = self.clone();
        // An account of a sibling shard of this relay: that shard's owner,
        // batched like a peer's deliveries (one queue per shard).
        let to = match &self.inner.siblings {
            Some(s) if target.id == self.inner.relay_id => Dest::Shard(s.shard_of(&params.envelope.to)),
            _ => Dest::Peer(target.id.clone()),
        };
        let batched = matches!(to, Dest::Shard(_)) || self.is_peer(&target.id);
        Box::pin(async move {
            let body = match body {
                Ok(body) => body,
                Err(e) => return AttemptOutcome::NotAttempted(RelayError::internal(e.to_string())),
            };
            match batched {
                true => deliver_batched(me, to, body).await,
                // Not a configured peer: refused unsent, by `call`.
                false => me.deliver_one(&to, body).await,
            }
        })
    }

    fn fetch_route(&self, account_id: &str) -> LocalFuture<RouteLookup> {
        Box::pin(self.clone().fetch_route(account_id.to_owned()))
    }

    fn is_peer(&self, relay_id: &str) -> bool {
        self.inner.peers.contains_key(relay_id)
    }

    fn in_sibling_shard(&self, account_id: &str) -> bool {
        PeerClient::in_sibling_shard(self, account_id)
    }

    fn peer_status(&self, relay: &RelayRef, from: &str, message_id: &str) -> LocalFuture<Option<DeliveryStatus>> {
        let params = PeerStatusParams { from: from.to_owned(), message_id: message_id.to_owned() };
        let body = serde_json::to_vec(&params).unwrap_or_default();
        let (me, id) = (self.clone(), relay.id.clone());
        Box::pin(async move {
            let bytes = me.call(&id, Method::MessageDeliveryPeerStatus, body).await.ok()?;
            let answer: PeerStatusResult = serde_json::from_slice(&bytes).ok()?;
            answer.known.then_some(answer.status).flatten()
        })
    }
}

// Batched delivery: this client's calls drive the queues of
// `crate::peer_batch`.

/// `message.deliver` with `body` at `peer` (a configured peer or a
/// sibling shard), alone or in a batch.
async fn deliver_batched(client: PeerClient, peer: Dest, body: Vec<u8>) -> AttemptOutcome {
    let batcher = client.batcher();
    if batcher.batching.in_flight == 0 {
        return client.deliver_one(&peer, body).await;
    }
    let (done, outcome) = oneshot::channel();
    let start = {
        let mut peers = batcher.lock();
        let q = peers.entry(peer.clone()).or_default();
        q.waiting.push_back(Item { body, done });
        let start = batch::goes_at_once(q.busy, batcher.batching.in_flight);
        q.busy += usize::from(start);
        start
    };
    if start {
        // Spawned, not awaited here: deliveries arriving before it runs
        // join its first call, and it outlives this caller if need be.
        actix_rt::spawn(drain(client, peer));
    }
    outcome.await.unwrap_or_else(|_| {
        AttemptOutcome::Unknown(RelayError::internal("the batch carrying this delivery was dropped"))
    })
}

/// One call's worth of `peer`'s queue at a time, until it is empty.
async fn drain(client: PeerClient, peer: Dest) {
    let mut slot = Slot { batcher: client.batcher(), peer: &peer, held: true };
    loop {
        let (items, batch) = client.batcher().next(&peer);
        match items.len() {
            0 => {
                // `next` gave the slot back.
                slot.held = false;
                return;
            }
            _ if !batch => singly(&client, &peer, items).await,
            _ => as_batch(&client, &peer, items).await,
        }
    }
}

async fn singly(client: &PeerClient, peer: &Dest, items: Vec<Item>) {
    let calls = items.into_iter().map(|Item { body, done }| async move {
        let _ = done.send(client.deliver_one(peer, body).await);
    });
    futures_util::future::join_all(calls).await;
}

async fn as_batch(client: &PeerClient, peer: &Dest, items: Vec<Item>) {
    let mut body = Vec::with_capacity(batch::ENVELOPE_BYTES + items.iter().map(|i| i.body.len() + 1).sum::<usize>());
    body.extend_from_slice(br#"{"items":["#);
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(&item.body);
    }
    body.extend_from_slice(b"]}");
    let outcomes = match client.call_to(peer, Method::MessageDeliverBatch, body).await {
        Ok(bytes) => match serde_json::from_slice::<DeliverBatchResult>(&bytes) {
            Ok(r) if r.results.len() == items.len() => r.results.iter().map(|raw| item_outcome(raw.get())).collect(),
            Ok(r) => {
                let why = format!("{peer}: {} results for a batch of {}", r.results.len(), items.len());
                vec![AttemptOutcome::Unknown(RelayError::new(ErrorCode::BadGateway, why)); items.len()]
            }
            Err(e) => {
                let why = format!("{peer}: unreadable batch answer: {e}");
                vec![AttemptOutcome::Unknown(RelayError::new(ErrorCode::BadGateway, why)); items.len()]
            }
        },
        // A relay without the batch method, or a callee whose body limit
        // is lower than ours: the same deliveries, one by one.
        Err(CallError::Answered { error, .. }) if batch::on_refusal(error.code) != Refused::EachItem => {
            if batch::on_refusal(error.code) == Refused::NoBatchMethod {
                client.batcher().no_batch(peer);
            }
            return singly(client, peer, items).await;
        }
        // Whatever ended the whole call (unreachable, no answer, a refusal
        // of our authentication, rate_limited) ends each item alike.
        Err(e) => {
            let outcome = PeerClient::deliver_outcome(Err(e));
            vec![outcome; items.len()]
        }
    };
    for (item, outcome) in items.into_iter().zip(outcomes) {
        let _ = item.done.send(outcome);
    }
}

/// A batch item's answer: a `DeliveryStatus`, or `{"error": …}` (an object
/// without `status`), read as the same answer to a single call would be.
fn item_outcome(raw: &str) -> AttemptOutcome {
    #[derive(serde::Deserialize)]
    struct ErrorItem {
        status: Option<serde::de::IgnoredAny>,
        error: RemoteError,
    }
    match serde_json::from_str::<ErrorItem>(raw) {
        Ok(ErrorItem { status: None, error: e }) => {
            let error = RelayError::from_remote(&e.code, &e.message, e.data);
            PeerClient::deliver_outcome(Err(CallError::Answered { code: e.code, error }))
        }
        _ => PeerClient::deliver_outcome(Ok(actix_web::web::Bytes::copy_from_slice(raw.as_bytes()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An HTTP/1.1 answer `200 {}` to the one request on `conn`, once read.
    async fn answer_ok(mut conn: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            let n = conn.read(&mut buf).await.expect("read");
            assert!(n > 0, "the request ended early");
            got.extend_from_slice(&buf[..n]);
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut request = httparse::Request::new(&mut headers);
            let httparse::Status::Complete(head) = request.parse(&got).expect("an HTTP/1.1 request") else { continue };
            let length = request.headers.iter().find(|h| h.name.eq_ignore_ascii_case("content-length"));
            let length: usize =
                length.and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok()).unwrap_or(0);
            if got.len() >= head + length {
                break;
            }
        }
        let answer =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";
        conn.write_all(answer).await.expect("write");
    }

    #[actix_rt::test]
    async fn a_sibling_call_reaches_an_owner_that_starts_listening_after_taking_the_lease() {
        // The shard's lease names its owner's address, bound but not yet
        // listening (it is fencing and catching the shard up).
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("bind");
        let at = socket.local_addr().expect("addr");
        let (_lease, owners) = tokio::sync::watch::channel(Arc::new(vec![None, Some(at)]));
        let place = crate::cluster::place::ShardPlace { index: 0, shards: 2, owners, hop: None };
        let account = (0u64..).map(|i| format!("{i:032x}")).find(|id| !place.is_mine(id)).expect("an account");
        let connect = Connect {
            timeout: Duration::from_secs(10),
            tls: Arc::new(crate::http::tls::client_config(None).expect("tls")),
            batching: Batching { in_flight: 0, max_bytes: 1 << 20 },
        };
        let policy = relay_core::policy::Policy::with_relay_id("r");
        let clock: SharedClock = Arc::new(relay_core::clock::SystemClock);
        let key = SigningKey::from_bytes(&[7; 32]);
        let client = PeerClient::new("r", key, &[], connect, clock, &policy, Some(place));
        let body = serde_json::to_vec(&serde_json::json!({ "account_id": account })).expect("json");
        let mut call = std::pin::pin!(client.call_sibling(&account, Method::RelayRouteGet, body));
        // Refused while nothing listens: the call waits (no lease change comes).
        let waited = tokio::time::timeout(Duration::from_secs(1), &mut call).await;
        assert!(waited.is_err(), "the call ended while no owner listened: {:?}", waited.map(|a| a.map(|_| ())));
        // The owner serves: the call reaches it, within the attempt timeout.
        let listener = socket.listen(16).expect("listen");
        actix_rt::spawn(async move { answer_ok(listener.accept().await.expect("accept").0).await });
        let answer = call.await.map(|b| b.to_vec());
        assert_eq!(answer.as_deref().ok(), Some(&b"{}"[..]), "{answer:?}");
    }

    #[test]
    fn a_batch_item_reads_as_the_same_answer_to_a_single_call_would() {
        let accepted = serde_json::to_string(&DeliveryStatus::target_accepted(7)).unwrap();
        assert!(matches!(item_outcome(&accepted), AttemptOutcome::Answered(s) if s.accepted_at == 7));
        // A failed status carries `error` too, and stays a status.
        let failed = serde_json::to_string(&DeliveryStatus::failed(8, RelayError::invalid_params("x"))).unwrap();
        assert!(matches!(item_outcome(&failed), AttemptOutcome::Answered(s) if s.accepted_at == 8));
        let refused = r#"{"error":{"code":"forbidden","message":"no"}}"#;
        assert!(matches!(item_outcome(refused), AttemptOutcome::Rejected(e) if e.code == ErrorCode::Forbidden));
        let unknown = r#"{"error":{"code":"something_new","message":"?"}}"#;
        assert!(matches!(item_outcome(unknown), AttemptOutcome::Unrecognized(_)));
        assert!(matches!(item_outcome("[]"), AttemptOutcome::Unknown(_)));
    }
}
