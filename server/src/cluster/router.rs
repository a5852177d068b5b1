//! The front of a cluster: every node answers `relay.listen` and passes
//! each request on, over HTTP, to the node that owns the shard of the
//! request's account, on that node's internal address (module doc of
//! `cluster`, and [`shard_of`] for the rules; with one shard, every
//! request goes to its owner).
//!
//! Most requests name their account in their params. Those with a session
//! do not have to: a session token says which shard issued it (`s3.…`,
//! `relay_core::shard::token_prefix`), because that shard alone holds the
//! session, and the account of a session can be any account of that shard.
//! So a front routes with what it reads in the request, asking no one.
//!
//! A request that reaches no owner waits up to [`FRONT_WAIT`] for one (a
//! takeover); one that may have reached its owner is never sent twice: the
//! client retries, which the protocol's idempotency makes safe. A WebSocket
//! is routed by its `Authorization` header or else by its first frame, then
//! its frames are passed on both ways as they are (pings and pongs too, so
//! the owner's flow control and idle timeout see the client).
//!
//! A method call (`POST /v1/rpc/…`, `/v1/relay/…`) whose shard this very
//! node serves is not sent to its own internal address: the shard's core
//! answers it in process (`local.rs`), with the same handlers, limits and
//! lease check. WebSockets, other paths, calls with an `Origin` (CORS) and
//! all of them while `log.access` is on still go over HTTP.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::SizedStream;
use actix_web::dev::{Server, Service};
use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use actix_ws::{AggregatedMessage, AggregatedMessageStream, CloseReason, ProtocolError, Session};
use awc::error::{SendRequestError, WsClientError};
use awc::ws::{Frame, Message};
use futures_util::future::Either;
use futures_util::{Sink, SinkExt, Stream, StreamExt};
use relay_core::shard;
use relay_schemas::{ErrorCode, RelayError};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::time::{timeout, timeout_at, Instant};

use super::local::LocalCores;
use super::metrics::NodeMetrics;
use super::place::{Owners, FRONT_WAIT, OWNER_POLL};
use crate::config::{Config, Websocket};
use crate::http::reply::{bearer, error_and_close, error_response};
use crate::http::webapp::vary_origin;
use crate::http::{over_connection_cap, read_body, BodyTimeout};
use crate::observe::Held;

/// How long an owner has to answer a request, head and body.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(60);

/// A connection to an owner not made within this is a request not sent
/// (tried again, maybe on the next owner).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Close codes: RFC 6455 "try again later", policy violation, message too
/// big, and the relay's own "slow consumer" (`http/ws.rs`).
const TRY_AGAIN: u16 = 1013;
const POLICY: u16 = 1008;
const TOO_BIG: u16 = 1009;
const SLOW: u16 = 4002;

thread_local! {
    /// awc clients are per thread; each keeps a pool of keep-alive
    /// connections to the owners: one plain, one over the cluster hop.
    static UPSTREAM: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
    static UPSTREAM_HOP: std::cell::OnceCell<awc::Client> = const { std::cell::OnceCell::new() };
}

/// The client to the owners, and the URL scheme it speaks (`http` or, over
/// the cluster hop, `https`).
fn upstream(hop: Option<&Arc<rustls::ClientConfig>>) -> (awc::Client, &'static str) {
    // No pool-wide cap: the front's own connection limits bound it.
    // No redirects and no default headers: answers and requests pass as they are.
    let build = |connector: awc::Connector<_>| {
        awc::Client::builder()
            .timeout(ANSWER_TIMEOUT)
            .disable_redirects()
            .no_default_headers()
            .connector(connector.timeout(CONNECT_TIMEOUT).limit(0))
            .finish()
    };
    match hop {
        Some(hop) => (
            UPSTREAM_HOP.with(|c| c.get_or_init(|| build(awc::Connector::new().rustls_0_23(hop.clone()))).clone()),
            "https",
        ),
        None => (UPSTREAM.with(|c| c.get_or_init(|| build(awc::Connector::new())).clone()), "http"),
    }
}

/// The shard a request goes to, of `shards`:
///
/// 1. a `Bearer` token that names a shard of this cluster decides, whatever
///    the path (a session lives in the shard that issued it);
/// 2. otherwise the account in the params: `POST /v1/rpc/account.register`
///    by `route.account_id`; `/v1/rpc/` `session.challenge`, `session.open`
///    and `route.get` by `account_id`; `POST /v1/relay/message.deliver` by
///    `envelope.to` (the recipient); `/v1/relay/` `route.get`,
///    `account.devices.get` and `timeline.replicate` by `account_id`;
///    `/v1/relay/message.delivery.peer_status` by `from`;
/// 3. anything else (no account found, a body that does not parse, other
///    paths: `/healthz`, `/metrics`, the web client, `push.vapid_key`) goes
///    to shard 0, whose owner answers it, with the proper error if need be.
pub(crate) fn shard_of(path: &str, authorization: Option<&str>, body: &[u8], shards: u32) -> u32 {
    if shards == 1 {
        return 0;
    }
    let token = authorization.and_then(|a| a.strip_prefix("Bearer ")).map(str::trim);
    if let Some(shard) = token.and_then(|t| named(t, shards)) {
        return shard;
    }
    let at: &[&str] = match (path.strip_prefix("/v1/rpc/"), path.strip_prefix("/v1/relay/")) {
        (Some("account.register"), _) => &["route", "account_id"],
        (Some("session.challenge" | "session.open" | "route.get"), _) => &["account_id"],
        (_, Some("message.deliver")) => &["envelope", "to"],
        (_, Some("route.get" | "account.devices.get" | "timeline.replicate")) => &["account_id"],
        (_, Some("message.delivery.peer_status")) => &["from"],
        _ => return 0,
    };
    let account = std::str::from_utf8(body).ok().and_then(|json| string_at(json, at));
    account.map_or(0, |account| shard::of(&account, shards))
}

/// The shard of a WebSocket whose first frame is `frame`: `session.attach`
/// by its token; any other request as the same call over HTTP would go
/// (`session.challenge` by its account, say); else shard 0.
pub(crate) fn frame_shard(frame: &[u8], shards: u32) -> u32 {
    #[derive(Deserialize)]
    struct Request<'a> {
        method: String,
        #[serde(borrow)]
        params: Option<&'a RawValue>,
    }
    if shards == 1 {
        return 0;
    }
    let Ok(request) = serde_json::from_slice::<Request>(frame) else { return 0 };
    let params = request.params.map_or("{}", RawValue::get);
    if request.method == "session.attach" {
        return string_at(params, &["token"]).and_then(|t| named(&t, shards)).unwrap_or(0);
    }
    shard_of(&format!("/v1/rpc/{}", request.method), None, params.as_bytes(), shards)
}

/// The shard a session token names, if it is one of this cluster's.
fn named(token: &str, shards: u32) -> Option<u32> {
    shard::of_token(token).filter(|&s| s < shards)
}

/// The string at `path` (object keys) in `json`, reading only the objects
/// on the way (the other values stay raw text).
fn string_at(json: &str, path: &[&str]) -> Option<String> {
    let (key, rest) = path.split_first()?;
    let object: HashMap<String, &RawValue> = serde_json::from_str(json).ok()?;
    let value = object.get(*key)?.get();
    if rest.is_empty() {
        serde_json::from_str(value).ok()
    } else {
        string_at(value, rest)
    }
}

/// Where a front finds each shard's core: its owner's internal address,
/// over the hop if there is one, or this node's own core in process.
pub(crate) struct Owned {
    pub(crate) owners: Owners,
    pub(crate) local: LocalCores,
    /// TLS to the owners with the cluster's key (`hop.rs`), or plain HTTP.
    pub(crate) hop: Option<Arc<rustls::ClientConfig>>,
}

/// What every worker of the front shares.
struct Front {
    owners: Owners,
    /// The cores this node serves, called in process.
    local: LocalCores,
    /// `log.access`: the cores log each request they answer over HTTP.
    access: bool,
    shards: u32,
    max_body_bytes: usize,
    body_timeout: BodyTimeout,
    ws: Websocket,
    /// The largest frame taken from an owner: a `message.timeline.sync`
    /// page (`limits.max_page_bytes`, and the one record that may pass it)
    /// can be larger than what clients may send.
    owner_frame_bytes: usize,
    metrics: NodeMetrics,
    /// `metrics.listen` is set: the relay's metrics are not for the
    /// public address, so the front answers `/metrics` itself (404).
    metrics_private: bool,
    /// TLS to the owners with the cluster's key (`hop.rs`), or plain HTTP.
    hop: Option<Arc<rustls::ClientConfig>>,
}

/// Serves the front on `listener`, routing to `to` (`shards` of them).
/// Connection limits as the relay's own server (`crate::run`); the node
/// handles signals.
pub(crate) fn start(
    listener: std::net::TcpListener,
    to: Owned,
    shards: u32,
    cfg: &Config,
    metrics: NodeMetrics,
) -> Result<Server, String> {
    let limits = &cfg.limits;
    let Owned { owners, local, hop } = to;
    let front = web::Data::new(Front {
        owners,
        local,
        access: cfg.log.access,
        shards,
        max_body_bytes: limits.max_body_bytes,
        body_timeout: BodyTimeout(cfg.http.body_timeout),
        ws: cfg.websocket.clone(),
        owner_frame_bytes: cfg
            .websocket
            .max_frame_bytes
            .max(limits.max_page_bytes.saturating_add(2 * limits.max_body_bytes)),
        metrics,
        metrics_private: cfg.metrics.listen.is_some(),
        hop,
    });
    let h = &cfg.http;
    let mut server = HttpServer::new(move || {
        App::new()
            .app_data(front.clone())
            .wrap_fn(|req, srv| match over_connection_cap(req.request()) {
                Some(refused) => Either::Left(std::future::ready(Ok(req.into_response(refused)))),
                None => Either::Right(srv.call(req)),
            })
            .default_service(web::to(route))
    })
    .on_connect(crate::http::conn::PerIp::new(h.max_connections_per_ip).on_connect())
    .max_connections(h.max_connections)
    .client_request_timeout(h.request_timeout)
    .keep_alive(h.keep_alive)
    .shutdown_timeout(h.shutdown_timeout.as_secs())
    .disable_signals();
    if h.workers > 0 {
        server = server.workers(h.workers);
    }
    Ok(server.listen(listener).map_err(|e| format!("cluster front: {e}"))?.run())
}

/// Every request: a WebSocket upgrade at `/v1/ws`, or HTTP passed on.
async fn route(front: web::Data<Front>, req: HttpRequest, body: web::Payload) -> HttpResponse {
    if is_websocket(&req) {
        return websocket(front.into_inner(), req, body).await;
    }
    // A shard's owner serves its metrics at its internal address (rule 3
    // of `shard_of` would send them to shard 0's): never passed on to
    // the public front when `metrics.listen` says they are private.
    if front.metrics_private && req.path() == "/metrics" {
        return error_response(&RelayError::not_found("no /metrics here: see metrics.listen"));
    }
    // Bounded as the relay bounds it.
    let body = match read_body(body, front.max_body_bytes, front.body_timeout).await {
        Ok(body) => body,
        Err(e) => return error_and_close(&e),
    };
    let authorization = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let shard = shard_of(req.path(), authorization, &body, front.shards);
    let held = Held::new(&front.metrics.connections);
    if let Some(answer) = in_process(&front, shard, &req, &body).await {
        front.metrics.in_process.inc();
        return answer;
    }
    match with_owner(front.owners.clone(), shard, |at| send(front.hop.as_ref(), at, &req, body.clone())).await {
        Some(Ok(answer)) => {
            let bodiless = req.method() == Method::HEAD || matches!(answer.status().as_u16(), 204 | 304);
            pass_on(answer, bodiless, held, front.metrics.unserved.clone())
        }
        Some(Err(e)) => unavailable(&front, shard, &e),
        None => unavailable(&front, shard, &"no owner reachable within FRONT_WAIT"),
    }
}

/// The answer of this node's own core of `shard` to a method call, in
/// process (`local.rs`); `None`: the request goes over HTTP (this node does
/// not serve the shard, or the core would do more than call the method:
/// log it, answer CORS, or refuse it as no longer under its lease).
async fn in_process(front: &Front, shard: u32, req: &HttpRequest, body: &Bytes) -> Option<HttpResponse> {
    if front.access || req.method() != Method::POST || req.headers().contains_key(header::ORIGIN) {
        return None;
    }
    let path = req.path();
    let (name, relay) = match (path.strip_prefix("/v1/rpc/"), path.strip_prefix("/v1/relay/")) {
        (Some(name), _) => (name, false),
        (_, Some(name)) => (name, true),
        _ => return None,
    };
    // The paths the core routes to one method (`crate::http::configure`):
    // a name may be a client's method and a relay's (`route.get`).
    let is_relay = |m: &&relay_schemas::methods::Method| (m.caller() == relay_schemas::methods::Caller::Relay) == relay;
    relay_schemas::methods::Method::ALL.iter().filter(is_relay).find(|m| m.as_str() == name)?;
    let core = front.local.get(shard)?;
    if !core.app.serves() {
        return None;
    }
    let entered = core.enter();
    let core = entered.core();
    let mut answer = if relay {
        // A client's call at the front: never a sibling's (its header is dropped).
        crate::http::relay_call_answer(&core.app, &core.observer, name, req.headers(), body, false).await
    } else {
        let ip = core.proxies.client(core.peer, req.headers());
        crate::http::rpc_answer(&core.app, name, bearer(req), Some(ip), body).await
    };
    // What the core's CORS layer adds to an answer to a call without an `Origin`.
    vary_origin(answer.headers_mut());
    Some(answer)
}

/// Runs `attempt` on the owner of `shard` until it is done (`Some`), or
/// `None` once [`FRONT_WAIT`] is over. `attempt` answers `None` when
/// nothing reached the owner: it may be gone, and the lease soon moves.
async fn with_owner<T, F: Future<Output = Option<T>>>(
    mut owners: Owners,
    shard: u32,
    mut attempt: impl FnMut(SocketAddr) -> F,
) -> Option<T> {
    let deadline = Instant::now() + FRONT_WAIT;
    loop {
        let at = owners.borrow_and_update().get(shard as usize).copied().flatten();
        if let Some(at) = at {
            if let Some(done) = attempt(at).await {
                return Some(done);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        // A new owner, or a moment for the lease to change (a dead owner
        // stays listed until its lease expires).
        let changed = async {
            if owners.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let _ = timeout_at(deadline.min(Instant::now() + OWNER_POLL), changed).await;
    }
}

/// Sends the request to the owner at `at`; `None` if it was not sent.
async fn send(
    hop: Option<&Arc<rustls::ClientConfig>>,
    at: SocketAddr,
    req: &HttpRequest,
    body: Bytes,
) -> Option<Result<awc::ClientResponse, SendRequestError>> {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let (client, scheme) = upstream(hop);
    let mut request = client.request(req.method().clone(), format!("{scheme}://{at}{path}")).no_decompress();
    for (name, value) in req.headers().iter().filter(|(name, _)| !hop_by_hop(name)) {
        request = request.append_header((name.clone(), value.clone()));
    }
    match request.send_body(body).await {
        Err(SendRequestError::Connect(_)) => None,
        sent => Some(sent),
    }
}

/// Headers of one connection, not of the request (RFC 9110 §7.6.1),
/// those the front sets again for its own (`host`, `content-length`,
/// `expect`), and the sibling shards' mark (`hop::SIBLING_HEADER`), which
/// a client must never get past a front.
fn hop_by_hop(name: &HeaderName) -> bool {
    const HOP: [&str; 10] = [
        super::hop::SIBLING_HEADER,
        "connection",
        "keep-alive",
        "transfer-encoding",
        "upgrade",
        "te",
        "trailer",
        "host",
        "content-length",
        "expect",
    ];
    let name = name.as_str();
    HOP.contains(&name) || name.starts_with("proxy-")
}

/// The owner's answer, streamed to the client as it comes (the request
/// counts as forwarded until its body is through).
fn pass_on(
    answer: awc::ClientResponse,
    bodiless: bool,
    held: Held,
    unserved: prometheus_client::metrics::counter::Counter,
) -> HttpResponse {
    let mut out = HttpResponse::build(answer.status());
    for (name, value) in answer.headers().iter().filter(|(name, _)| !hop_by_hop(name)) {
        out.append_header((name.clone(), value.clone()));
    }
    if bodiless {
        return out.finish();
    }
    let length = answer.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse().ok());
    let body = answer.map(move |chunk| {
        let _ = &held;
        if chunk.is_err() {
            unserved.inc();
        }
        chunk
    });
    match length {
        Some(length) => out.body(SizedStream::new(length, body)),
        None => out.streaming(body),
    }
}

fn unavailable(front: &Front, shard: u32, why: &dyn std::fmt::Display) -> HttpResponse {
    front.metrics.unserved.inc();
    tracing::debug!(shard, error = %why, "front: request not served");
    error_response(&RelayError::unavailable("the node serving this account is not reachable now; try again"))
}

fn is_websocket(req: &HttpRequest) -> bool {
    let upgrade = req.headers().get(header::UPGRADE).and_then(|v| v.to_str().ok());
    req.method() == Method::GET
        && req.path() == "/v1/ws"
        && upgrade.is_some_and(|u| u.eq_ignore_ascii_case("websocket"))
}

/// A WebSocket to an owner (awc's framed connection).
trait OwnerSocket:
    Stream<Item = Result<Frame, ProtocolError>> + Sink<Message, Error = ProtocolError> + Unpin + 'static
{
}
impl<T> OwnerSocket for T where
    T: Stream<Item = Result<Frame, ProtocolError>> + Sink<Message, Error = ProtocolError> + Unpin + 'static
{
}

/// `GET /v1/ws`. A token in the header is checked by the owner at upgrade,
/// so the owner is reached before the client's upgrade is answered, and
/// its refusal is the client's; without one, the client's first frame says
/// where to go.
async fn websocket(front: Arc<Front>, req: HttpRequest, body: web::Payload) -> HttpResponse {
    let held = Held::new(&front.metrics.connections);
    let (response, mut session, stream) = match actix_ws::handle(&req, body) {
        Ok(accepted) => accepted,
        Err(e) => return e.error_response(),
    };
    let path = req.uri().path_and_query().map_or("/v1/ws", |p| p.as_str()).to_owned();
    let owner = match bearer(&req) {
        Some(token) => {
            let (shard, authorization) =
                (named(token, front.shards).unwrap_or(0), req.headers().get(header::AUTHORIZATION));
            match with_owner(front.owners.clone(), shard, |at| connect(&front, at, &path, authorization)).await {
                Some(Ok(owner)) => Some(owner),
                Some(Err(Some(status))) => return refused(status),
                Some(Err(None)) => return unavailable(&front, shard, &"the owner failed the upgrade"),
                None => return unavailable(&front, shard, &"no owner reachable within FRONT_WAIT"),
            }
        }
        None => None,
    };
    if let Some(socket) = req.conn_data::<crate::http::conn::Socket>() {
        socket.set_user_timeout(front.ws.write_timeout);
    }
    let max = front.ws.max_frame_bytes;
    let mut stream = stream.max_frame_size(max).aggregate_continuations().max_continuation_size(max);
    actix_web::rt::spawn(async move {
        let _held = held;
        if let Some(owner) = owner {
            return pump(&front, session, stream, owner, None).await;
        }
        let first = match first_frame(&front.ws, &mut session, &mut stream).await {
            Ok(first) => first,
            Err(reason) => {
                let _ = timeout(front.ws.write_timeout, session.close(reason)).await;
                return;
            }
        };
        let shard = match &first {
            Message::Text(text) => frame_shard(text.as_bytes(), front.shards),
            _ => 0,
        };
        match with_owner(front.owners.clone(), shard, |at| connect(&front, at, &path, None)).await {
            Some(Ok(owner)) => pump(&front, session, stream, owner, Some(first)).await,
            _ => {
                front.metrics.unserved.inc();
                let reason = close(TRY_AGAIN, "no node serves this account now: reconnect later");
                let _ = timeout(front.ws.write_timeout, session.close(reason)).await;
            }
        }
    });
    response
}

/// Opens a WebSocket to the owner at `at`: `None` if it was not reached;
/// the status if it refused the upgrade.
async fn connect(
    front: &Front,
    at: SocketAddr,
    path: &str,
    authorization: Option<&HeaderValue>,
) -> Option<Result<impl OwnerSocket, Option<StatusCode>>> {
    let (client, scheme) = upstream(front.hop.as_ref());
    let scheme = if scheme == "https" { "wss" } else { "ws" };
    let mut request = client.ws(format!("{scheme}://{at}{path}")).max_frame_size(front.owner_frame_bytes);
    if let Some(authorization) = authorization {
        request = request.set_header(header::AUTHORIZATION, authorization.clone());
    }
    match request.connect().await {
        Ok((_, socket)) => Some(Ok(socket)),
        Err(WsClientError::SendRequest(SendRequestError::Connect(_))) => None,
        Err(WsClientError::InvalidResponseStatus(status)) => Some(Err(Some(status))),
        Err(e) => {
            tracing::debug!(error = %e, "front: WebSocket to the owner");
            Some(Err(None))
        }
    }
}

/// An owner's refusal of an upgrade: awc keeps its status, not its body,
/// so the body is the first error of the protocol with that status
/// (`unauthorized` for 401, the usual one).
fn refused(status: StatusCode) -> HttpResponse {
    let code = ErrorCode::ALL.into_iter().find(|c| c.http_status() == status.as_u16());
    let e = RelayError::new(code.unwrap_or(ErrorCode::BadGateway), "the relay refused the WebSocket upgrade");
    HttpResponse::build(status).json(e.to_body())
}

/// The first request frame of a connection without a header token (pings
/// answered meanwhile), or the close to answer it with.
async fn first_frame(
    ws: &Websocket,
    session: &mut Session,
    stream: &mut AggregatedMessageStream,
) -> Result<Message, Option<CloseReason>> {
    let until = Instant::now() + ws.attach_timeout;
    loop {
        let Ok(frame) = timeout_at(until, stream.recv()).await else {
            return Err(close(POLICY, "no session attached within websocket.attach_timeout"));
        };
        match frame {
            Some(Ok(AggregatedMessage::Text(text))) => return Ok(Message::Text(text)),
            Some(Ok(AggregatedMessage::Binary(bytes))) => return Ok(Message::Binary(bytes)),
            Some(Ok(AggregatedMessage::Ping(bytes))) => {
                if !matches!(timeout(ws.write_timeout, session.pong(&bytes)).await, Ok(Ok(()))) {
                    return Err(None);
                }
            }
            Some(Ok(AggregatedMessage::Pong(_))) => {}
            Some(Ok(AggregatedMessage::Close(reason))) => return Err(reason),
            Some(Err(e)) => return Err(close(TOO_BIG, &format!("bad frame: {e}"))),
            None => return Err(None),
        }
    }
}

/// How a proxied WebSocket ended: the close each side gets, and whether
/// it was for want of an owner.
struct End {
    client: Option<CloseReason>,
    owner: Option<CloseReason>,
    failed: bool,
}

impl End {
    /// One side closed: the other gets the same close.
    fn closed(reason: Option<CloseReason>) -> End {
        End { client: reason.clone(), owner: reason, failed: false }
    }

    /// The owner went away: the client reconnects (to the next owner).
    fn owner_lost() -> End {
        End { client: close(TRY_AGAIN, "the relay's node went away: reconnect"), owner: None, failed: true }
    }
}

/// Passes frames both ways until a side closes or fails, then closes both.
/// Each way waits for the other end to take a frame before reading the
/// next, so memory stays at a frame or two a way; a client that takes
/// nothing within `websocket.write_timeout` is closed, as the relay would.
async fn pump(
    front: &Front,
    client: Session,
    mut from_client: AggregatedMessageStream,
    owner: impl OwnerSocket,
    first: Option<Message>,
) {
    let (write, idle) = (front.ws.write_timeout, front.ws.idle_timeout);
    let (mut to_owner, mut from_owner) = owner.split();
    let mut to_client = client.clone();
    let up = async {
        if let Some(first) = first {
            if to_owner.send(first).await.is_err() {
                return End::owner_lost();
            }
        }
        loop {
            let message = match from_client.recv().await {
                Some(Ok(AggregatedMessage::Text(text))) => Message::Text(text),
                Some(Ok(AggregatedMessage::Binary(bytes))) => Message::Binary(bytes),
                Some(Ok(AggregatedMessage::Ping(bytes))) => Message::Ping(bytes),
                Some(Ok(AggregatedMessage::Pong(bytes))) => Message::Pong(bytes),
                Some(Ok(AggregatedMessage::Close(reason))) => return End::closed(reason),
                Some(Err(e)) => {
                    return End { client: close(TOO_BIG, &format!("bad frame: {e}")), owner: None, failed: false }
                }
                None => return End::closed(None),
            };
            if to_owner.send(message).await.is_err() {
                return End::owner_lost();
            }
        }
    };
    let down = async {
        loop {
            // The owner pings every websocket.ping_interval: silence is a dead owner.
            let Ok(Some(Ok(frame))) = timeout(idle, from_owner.next()).await else { return End::owner_lost() };
            let sent = match frame {
                Frame::Text(bytes) => match String::from_utf8(bytes.into()) {
                    Ok(text) => timeout(write, to_client.text(text)).await,
                    Err(_) => return End::owner_lost(),
                },
                Frame::Binary(bytes) => timeout(write, to_client.binary(bytes)).await,
                Frame::Continuation(item) => timeout(write, to_client.continuation(item)).await,
                Frame::Ping(bytes) => timeout(write, to_client.ping(&bytes)).await,
                Frame::Pong(bytes) => timeout(write, to_client.pong(&bytes)).await,
                Frame::Close(reason) => return End::closed(reason),
            };
            match sent {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return End::closed(None),
                Err(_) => {
                    let slow = close(SLOW, "slow consumer: reconnect and sync from your cursor");
                    return End { client: slow, owner: None, failed: false };
                }
            }
        }
    };
    let end = tokio::select! {
        end = up => end,
        end = down => end,
    };
    if end.failed {
        front.metrics.unserved.inc();
    }
    let _ = timeout(write, to_owner.send(Message::Close(end.owner))).await;
    let _ = timeout(write, client.close(end.client)).await;
}

fn close(code: u16, reason: &str) -> Option<CloseReason> {
    Some(CloseReason { code: code.into(), description: Some(reason.to_owned()) })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHARDS: u32 = 8;

    /// An account id in `shard` (of [`SHARDS`]).
    fn account_in(shard: u32) -> String {
        (0..).map(|i| format!("acct-{i}")).find(|a| shard::of(a, SHARDS) == shard).expect("some account")
    }

    fn rpc(method: &str, auth: Option<&str>, body: &str) -> u32 {
        shard_of(&format!("/v1/rpc/{method}"), auth, body.as_bytes(), SHARDS)
    }

    fn relay(method: &str, body: &str) -> u32 {
        shard_of(&format!("/v1/relay/{method}"), None, body.as_bytes(), SHARDS)
    }

    #[test]
    fn a_token_decides_the_shard_whatever_the_params_say() {
        let other = account_in(5);
        let params = format!(r#"{{"account_id":"{other}"}}"#);
        assert_eq!(rpc("route.get", Some("Bearer s3.AbC-_x"), &params), 3);
        assert_eq!(rpc("message.send", Some("Bearer s7.x"), "{}"), 7);
        assert_eq!(shard_of("/healthz", Some("Bearer s2.x"), b"", SHARDS), 2);
    }

    #[test]
    fn a_token_that_names_no_shard_of_this_cluster_leaves_it_to_the_params() {
        let (account, params) = (account_in(6), format!(r#"{{"account_id":"{}"}}"#, account_in(6)));
        for auth in ["Bearer s8.x", "Bearer legacy-token", "Basic czM6eA==", "s3.x"] {
            assert_eq!(rpc("route.get", Some(auth), &params), 6, "{auth} for {account}");
        }
        assert_eq!(rpc("message.send", Some("Bearer s99.x"), "{}"), 0);
    }

    #[test]
    fn calls_without_a_session_go_to_their_accounts_shard() {
        let (a, b) = (account_in(4), account_in(1));
        let register = format!(r#"{{"route":{{"account_id":"{a}","relays":[]}},"account_id":"{b}"}}"#);
        assert_eq!(rpc("account.register", None, &register), 4);
        for method in ["session.challenge", "session.open", "route.get"] {
            assert_eq!(rpc(method, None, &format!(r#"{{"device_id":"d","account_id":"{a}"}}"#)), 4, "{method}");
        }
    }

    #[test]
    fn a_delivery_goes_to_the_recipients_shard() {
        let (to, from) = (account_in(2), account_in(6));
        let deliver = format!(
            r#"{{"envelope":{{"from":"{from}","to":"{to}","message_id":"m"}},"recipient_boxes":[{{"box":"…"}}],
               "sender_route":{{"account_id":"{from}"}}}}"#
        );
        assert_eq!(relay("message.deliver", &deliver), 2);
    }

    #[test]
    fn relay_lookups_go_to_the_accounts_shard_and_a_peer_status_to_the_senders() {
        let a = account_in(3);
        for method in ["route.get", "account.devices.get", "timeline.replicate"] {
            assert_eq!(relay(method, &format!(r#"{{"account_id":"{a}","after":0}}"#)), 3, "{method}");
        }
        assert_eq!(relay("message.delivery.peer_status", &format!(r#"{{"from":"{a}","message_id":"m"}}"#)), 3);
    }

    #[test]
    fn unparseable_input_goes_to_shard_zero() {
        let a = account_in(5);
        let good = format!(r#"{{"account_id":"{a}"}}"#);
        assert_eq!(rpc("route.get", None, &good), 5, "the control case");
        for body in ["", "{", "[]", "null", r#"{"account_id":5}"#, r#"{"account_id":null}"#, r#"{"other":"x"}"#] {
            assert_eq!(rpc("route.get", None, body), 0, "{body}");
        }
        assert_eq!(shard_of("/v1/rpc/route.get", None, b"{\"account_id\":\"\xff\"}", SHARDS), 0);
        assert_eq!(relay("message.deliver", r#"{"envelope":"x"}"#), 0);
        assert_eq!(relay("message.deliver", &good), 0, "the recipient is envelope.to");
        let deep = format!(r#"{{"account_id":{}"#, "[".repeat(100_000));
        assert_eq!(rpc("route.get", None, &deep), 0);
    }

    #[test]
    fn other_paths_and_methods_go_to_shard_zero() {
        let good = format!(r#"{{"account_id":"{}"}}"#, account_in(5));
        for path in ["/healthz", "/metrics", "/", "/app.js", "/v1/rpc/push.vapid_key", "/v1/rpc/route.get/x", "/v1/ws"]
        {
            assert_eq!(shard_of(path, None, good.as_bytes(), SHARDS), 0, "{path}");
        }
        assert_eq!(rpc("account.devices.get", None, &good), 0, "a client call with a session goes by its token");
        assert_eq!(shard_of("/v1/relay/route.get", None, good.as_bytes(), 1), 0, "one shard");
    }

    #[test]
    fn a_websocket_goes_where_its_first_frame_says() {
        let a = account_in(6);
        assert_eq!(frame_shard(br#"{"id":1,"method":"session.attach","params":{"token":"s4.x"}}"#, SHARDS), 4);
        let challenge = format!(r#"{{"id":1,"method":"session.challenge","params":{{"account_id":"{a}"}}}}"#);
        assert_eq!(frame_shard(challenge.as_bytes(), SHARDS), 6);
        for frame in [
            &br#"{"id":1,"method":"session.attach","params":{"token":"s9.x"}}"#[..],
            br#"{"id":1,"method":"session.attach","params":{"token":"legacy"}}"#,
            br#"{"id":1,"method":"session.attach"}"#,
            br#"{"id":1,"method":"message.send","params":{"account_id":"x"}}"#,
            b"not json",
            b"",
        ] {
            assert_eq!(frame_shard(frame, SHARDS), 0, "{}", String::from_utf8_lossy(frame));
        }
    }

    /// A stand-in owner numbered `n`: echoes HTTP requests (status 201,
    /// `x-owner: n`, the request's `relay-signature` and body, `x-sibling`
    /// if it had the sibling shards' mark) and
    /// WebSocket text frames (`n:` before them); refuses upgrades whose
    /// token ends in `.bad`.
    fn owner(n: u32) -> SocketAddr {
        async fn echo(n: web::Data<u32>, req: HttpRequest, body: web::Payload) -> HttpResponse {
            if req.path() == "/v1/ws" {
                if bearer(&req).is_some_and(|t| t.ends_with(".bad")) {
                    return HttpResponse::Unauthorized().finish();
                }
                let (response, mut session, mut stream) = actix_ws::handle(&req, body).expect("upgrade");
                let n = **n;
                actix_web::rt::spawn(async move {
                    while let Some(Ok(actix_ws::Message::Text(text))) = stream.recv().await {
                        let _ = session.text(format!("{n}:{text}")).await;
                    }
                    let _ = session.close(close(4000, "bye")).await;
                });
                return response;
            }
            let body = body.to_bytes().await.expect("body");
            let signature = req.headers().get("relay-signature").cloned();
            let mut answer = HttpResponse::Created();
            answer.insert_header(("x-owner", n.to_string()));
            if req.headers().contains_key(super::super::hop::SIBLING_HEADER) {
                answer.insert_header(("x-sibling", "seen"));
            }
            if let Some(signature) = signature {
                answer.insert_header(("relay-signature", signature));
            }
            answer.body(body)
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = listener.local_addr().expect("addr");
        let server = HttpServer::new(move || App::new().app_data(web::Data::new(n)).default_service(web::to(echo)))
            .workers(1)
            .disable_signals()
            .listen(listener)
            .expect("listen")
            .run();
        actix_web::rt::spawn(server);
        at
    }

    /// A front over two shards; shard 1's owner is up, shard 0's comes later.
    fn front() -> (SocketAddr, tokio::sync::watch::Sender<Arc<Vec<Option<SocketAddr>>>>) {
        front_with(serde_json::json!({}))
    }

    /// [`front`] with the `metrics` section `metrics`.
    fn front_with(
        metrics: serde_json::Value,
    ) -> (SocketAddr, tokio::sync::watch::Sender<Arc<Vec<Option<SocketAddr>>>>) {
        let cfg: Config = serde_json::from_value(serde_json::json!({
            "relay": {"id": "r", "public_url": "http://r", "listen": "127.0.0.1:0", "data_dir": "/nonexistent",
                      "key_file": "/nonexistent/key"},
            "limits": {"max_body_bytes": 1000},
            "http": {"workers": 1},
            "metrics": metrics,
        }))
        .expect("config");
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(vec![None, Some(owner(1))]));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = listener.local_addr().expect("addr");
        let to = Owned { owners: rx, local: LocalCores::new(2), hop: None };
        actix_web::rt::spawn(start(listener, to, 2, &cfg, NodeMetrics::new("test", 2)).expect("front"));
        (at, tx)
    }

    #[actix_rt::test]
    async fn requests_reach_their_shards_owner_as_they_were_sent_and_wait_for_one() {
        let (at, owners) = front();
        let client = awc::Client::new();
        let body = r#"{"account_id":"x"}  "#;
        let mut answer = client
            .post(format!("http://{at}/v1/relay/route.get?q=1"))
            .insert_header(("authorization", "Bearer s1.x"))
            .insert_header(("relay-signature", "sig=="))
            .send_body(body)
            .await
            .expect("answer");
        assert_eq!(answer.status(), StatusCode::CREATED);
        assert_eq!(answer.headers().get("x-owner").map(|v| v.as_bytes()), Some(&b"1"[..]));
        assert_eq!(answer.headers().get("relay-signature").map(|v| v.as_bytes()), Some(&b"sig=="[..]));
        assert_eq!(answer.body().await.expect("body"), body.as_bytes());

        let too_big = client.post(format!("http://{at}/v1/rpc/route.get")).send_body("x".repeat(1001)).await;
        assert_eq!(too_big.expect("answer").status(), StatusCode::PAYLOAD_TOO_LARGE);

        // Shard 0 has no owner yet: the request waits for one.
        let later = owner(0);
        actix_web::rt::spawn(async move {
            actix_web::rt::time::sleep(Duration::from_millis(300)).await;
            let _ = owners.send(Arc::new(vec![Some(later), None]));
        });
        let answer = client.get(format!("http://{at}/healthz")).send().await.expect("answer");
        assert_eq!(answer.headers().get("x-owner").map(|v| v.as_bytes()), Some(&b"0"[..]));
    }

    #[actix_rt::test]
    async fn a_front_never_passes_the_sibling_shards_mark_on() {
        let (at, _owners) = front();
        let call = |marked: bool| {
            let mut request = awc::Client::new()
                .post(format!("http://{at}/v1/relay/route.get"))
                .insert_header(("authorization", "Bearer s1.x"))
                .insert_header(("relay-signature", "sig=="));
            if marked {
                request = request.insert_header((super::super::hop::SIBLING_HEADER, "1"));
            }
            request.send_body("{}")
        };
        for marked in [false, true] {
            let answer = call(marked).await.expect("answer");
            assert_eq!(answer.headers().get("x-owner").map(|v| v.as_bytes()), Some(&b"1"[..]));
            assert_eq!(answer.headers().get("relay-signature").map(|v| v.as_bytes()), Some(&b"sig=="[..]));
            assert!(answer.headers().get("x-sibling").is_none(), "marked: {marked}");
        }
    }

    #[actix_rt::test]
    async fn the_front_never_passes_metrics_on_when_metrics_listen_is_set() {
        let client = awc::Client::new();
        for (metrics, reached) in [(serde_json::json!({}), true), (serde_json::json!({"listen": "127.0.0.1:0"}), false)]
        {
            let (at, owners) = front_with(metrics.clone());
            let _ = owners.send(Arc::new(vec![Some(owner(0)), Some(owner(1))]));
            let answer = client.get(format!("http://{at}/metrics")).send().await.expect("answer");
            let got = answer.headers().get("x-owner").map(|v| v.as_bytes().to_vec());
            assert_eq!(got.is_some(), reached, "{metrics}: {got:?}");
            if !reached {
                assert_eq!(answer.status(), StatusCode::NOT_FOUND);
            }
            // Anything else is passed on as before.
            let health = client.get(format!("http://{at}/healthz")).send().await.expect("answer");
            assert_eq!(health.headers().get("x-owner").map(|v| v.as_bytes()), Some(&b"0"[..]), "{metrics}");
        }
    }

    #[actix_rt::test]
    async fn a_websocket_is_routed_by_its_first_frame_or_header_and_passed_through() {
        let (at, _owners) = front();
        let (_, mut socket) = awc::Client::new().ws(format!("ws://{at}/v1/ws")).connect().await.expect("upgrade");
        let attach = r#"{"id":1,"method":"session.attach","params":{"token":"s1.x"}}"#;
        socket.send(Message::Text(attach.into())).await.expect("send");
        socket.send(Message::Text("second".into())).await.expect("send");
        for expected in [format!("1:{attach}"), "1:second".to_owned()] {
            match socket.next().await {
                Some(Ok(Frame::Text(text))) => assert_eq!(text, expected.as_bytes()),
                other => panic!("{other:?}"),
            }
        }
        socket.send(Message::Close(None)).await.expect("close");
        assert!(matches!(socket.next().await, Some(Ok(Frame::Close(_)))));

        let header = |token: &str| {
            awc::Client::new().ws(format!("ws://{at}/v1/ws")).set_header("authorization", format!("Bearer {token}"))
        };
        let (_, mut socket) = header("s1.x").connect().await.expect("upgrade");
        socket.send(Message::Text("hello".into())).await.expect("send");
        assert!(matches!(socket.next().await, Some(Ok(Frame::Text(t))) if t == "1:hello"));
        match header("s1.bad").connect().await {
            Err(WsClientError::InvalidResponseStatus(status)) => assert_eq!(status, StatusCode::UNAUTHORIZED),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }
}
