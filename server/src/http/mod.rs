//! The actix-web transport: `POST /v1/rpc/{method}` (clients),
//! `POST /v1/relay/{method}` (peers), `GET /v1/ws` (client WebSocket) and
//! `GET /healthz`, and the web client at `/` ([`webapp`]).
//! Protocol logic is in [`crate::app`]; this module only maps HTTP to it.

pub mod client_addr;
pub mod conn;
pub mod reply;
pub mod tls;
pub mod webapp;
pub mod ws;

use crate::app::App;
use crate::config::Websocket;
use crate::observe::{shown_id, Direction, PeerObserver};
use crate::peer_rpc::Admitted;
use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{web, HttpRequest, HttpResponse};
use relay_core::peer_auth::RelayHeaders;
use relay_schemas::methods::{Caller, Method};
use relay_schemas::RelayError;
use reply::{bearer, error_and_close, error_response, over_cap};
use std::time::Duration;

/// How long a request body may take to arrive (`http.body_timeout`).
#[derive(Clone, Copy, Debug)]
pub struct BodyTimeout(pub Duration);

/// The whole body, or `payload_too_large` past `limits.max_body_bytes`, or
/// `temporarily_unavailable` when it does not arrive within `http.body_timeout`
/// (a retryable code: a peer's delivery must not end on a slow network).
pub(crate) async fn read_body(body: web::Payload, limit: usize, within: BodyTimeout) -> Result<web::Bytes, RelayError> {
    match actix_web::rt::time::timeout(within.0, body.to_bytes_limited(limit)).await {
        Ok(Ok(Ok(b))) => Ok(b),
        Ok(Ok(Err(e))) => Err(RelayError::invalid_params(format!("request body: {e}"))),
        Ok(Err(_)) => Err(RelayError::over_limit("limits.max_body_bytes", "request body over limits.max_body_bytes")),
        Err(_) => Err(RelayError::unavailable(format!(
            "request body not received within http.body_timeout ({})",
            humantime::format_duration(within.0)
        ))),
    }
}

async fn rpc_call(
    relay: web::Data<App>,
    method: web::Path<String>,
    req: HttpRequest,
    body: web::Payload,
    within: web::Data<BodyTimeout>,
) -> HttpResponse {
    rpc_call_named(&method, relay, req, body, within).await
}

async fn rpc_call_named(
    method: &str,
    relay: web::Data<App>,
    req: HttpRequest,
    body: web::Payload,
    within: web::Data<BodyTimeout>,
) -> HttpResponse {
    let body = match read_body(body, relay.max_body_bytes(), **within).await {
        Ok(b) => b,
        Err(e) => return error_and_close(&e),
    };
    rpc_answer(&relay, method, bearer(&req), client_addr::client_ip(&req), &body).await
}

/// The answer to client method `method` once its body is read: over HTTP
/// here, or in process at a cluster node's front (`cluster::router`).
pub(crate) async fn rpc_answer(
    relay: &App,
    method: &str,
    token: Option<&str>,
    ip: Option<std::net::IpAddr>,
    body: &[u8],
) -> HttpResponse {
    match crate::rpc::call(relay, method, token, ip, body).await {
        Ok(json) => HttpResponse::Ok().content_type("application/json").body(json),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/relay/{method}`: authenticated peer calls.
async fn relay_call(
    relay: web::Data<App>,
    observer: web::Data<PeerObserver>,
    method: web::Path<String>,
    req: HttpRequest,
    body: web::Payload,
    within: web::Data<BodyTimeout>,
) -> HttpResponse {
    relay_call_named(&method, relay, observer, req, body, within).await
}

async fn relay_call_named(
    method: &str,
    relay: web::Data<App>,
    observer: web::Data<PeerObserver>,
    req: HttpRequest,
    body: web::Payload,
    within: web::Data<BodyTimeout>,
) -> HttpResponse {
    let body = match read_body(body, relay.max_body_bytes(), **within).await {
        Ok(b) => b,
        Err(e) => return error_and_close(&e),
    };
    // A sibling shard's call over the cluster's hop needs no signature.
    let sibling = req.conn_data::<crate::cluster::hop::Verified>().is_some()
        && req.headers().contains_key(crate::cluster::hop::SIBLING_HEADER);
    relay_call_answer(&relay, &observer, method, req.headers(), &body, sibling).await
}

/// The answer to relay method `method` once its body is read: over HTTP
/// here, or in process at a cluster node's front (`cluster::router`).
/// `sibling`: the call came from a sibling shard over the cluster's hop
/// (its client proved it holds the cluster's key), authenticated without a
/// signature when this core is a shard of several.
pub(crate) async fn relay_call_answer(
    relay: &App,
    observer: &PeerObserver,
    method: &str,
    headers: &actix_web::http::header::HeaderMap,
    body: &[u8],
    sibling: bool,
) -> HttpResponse {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let headers = RelayHeaders {
        relay_id: header("Relay-Id"),
        timestamp: header("Relay-Timestamp"),
        signature: header("Relay-Signature"),
    };
    let now = relay.supervisor().clock().now();
    let own = &relay.supervisor().policy().relay_id;
    let admitted = match sibling && relay.peers().sharded() {
        // Nothing to remember against a replay: no signature, and only the
        // cluster's nodes reach this. Its deliveries are idempotent as any.
        true => Ok(Admitted::Sibling(own.to_string())),
        false => relay.peer_keys().authenticate(&headers, method, body, now.0),
    };
    let (peer, request) = match admitted {
        Ok(Admitted::New { peer, request }) => (peer, Some(request)),
        Ok(Admitted::Sibling(peer)) => (peer, None),
        // The same signed request again: nothing is carried out twice.
        Ok(Admitted::Again { peer, answer }) => {
            observer.count(&peer, Direction::In, answer.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok"));
            return relay_answer(answer);
        }
        Err(e) => {
            let claimed = headers.relay_id.unwrap_or("");
            observer.count(claimed, Direction::In, e.code.as_str());
            if let Some(suppressed) = observer.may_warn(claimed, &e.message) {
                let method = if Method::from_relay_wire(method).is_some() { method } else { "unknown" };
                tracing::warn!(peer = %shown_id(claimed), method = %method, reason = e.message.as_str(), suppressed,
                    "refused a relay request (is the caller in [[peers]], with its current key?)");
            }
            return error_response(&e);
        }
    };
    // The peer is up: deliveries to it need not wait for their next slot.
    relay.supervisor().peer_seen(&peer);
    let result = crate::rpc::call_relay(relay, method, &peer, body).await;
    if let Some(request) = &request {
        relay.peer_keys().answered(request, &result);
    }
    observer.count(&peer, Direction::In, result.as_ref().map_or_else(|e| e.code.as_str(), |_| "ok"));
    relay_answer(result)
}

fn relay_answer(answer: crate::peer_rpc::Answer) -> HttpResponse {
    match answer {
        Ok(json) => HttpResponse::Ok().content_type("application/json").body(json),
        Err(e) => error_response(&e),
    }
}

/// The access log (`log.access`): one line per request, after the answer,
/// with the client's address (behind a trusted proxy, the one it names).
/// Never the query string, headers or body (tokens live there).
pub async fn access_log(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = std::time::Instant::now();
    let (method, path) = (req.method().clone(), req.path().to_owned());
    let client = client_addr::client_ip(req.request());
    let res = next.call(req).await;
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let status = match &res {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.as_response_error().status_code().as_u16(),
    };
    let client = client.map_or_else(|| "-".to_owned(), |ip| ip.to_string());
    tracing::info!(target: "relay::access", client = %client, method = %method, path = %path, status,
        ms = format_args!("{ms:.1}"), "request");
    res
}

/// Liveness: the process answers.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Readiness: the store can still make writes durable.
async fn readyz(relay: web::Data<App>) -> HttpResponse {
    if relay.supervisor().store().is_healthy() {
        HttpResponse::Ok().json(serde_json::json!({"status": "ready"}))
    } else {
        error_response(&RelayError::unavailable("the store cannot make writes durable"))
    }
}

/// Prometheus text exposition.
pub async fn metrics(relay: web::Data<App>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(relay.supervisor().metrics().encode())
}

async fn not_found() -> HttpResponse {
    error_response(&RelayError::not_found("no such endpoint"))
}

/// The answer to a request on a connection over `http.max_connections_per_ip`
/// (closing it), if it is one.
pub fn over_connection_cap(req: &HttpRequest) -> Option<HttpResponse> {
    let slot = req.conn_data::<conn::Slot>()?;
    (!slot.within).then(|| error_and_close(&over_cap()))
}

/// Who the clients are: the trusted proxies, and the open WebSockets of
/// each client behind them (`http.max_connections_per_ip` per client).
#[derive(Clone)]
pub struct Clients {
    pub proxies: client_addr::TrustedProxies,
    pub proxied_websockets: conn::PerIp,
}

/// The public listener's routes; `/metrics` only when `with_metrics` (no
/// `[metrics] listen` of its own).
pub fn configure(
    relay: web::Data<App>,
    websocket: web::Data<Websocket>,
    observer: web::Data<PeerObserver>,
    body_timeout: BodyTimeout,
    clients: Clients,
    with_metrics: bool,
) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(relay)
            .app_data(websocket)
            .app_data(observer)
            .app_data(web::Data::new(body_timeout))
            .app_data(clients.proxies)
            .app_data(ws::ProxiedWebsockets(clients.proxied_websockets))
            .route("/v1/ws", web::get().to(ws::upgrade))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz));
        if with_metrics {
            cfg.route("/metrics", web::get().to(metrics));
        }
        // Each method's own path first: actix-router matches a static path
        // by comparing strings and `{method}` with a regex (about 1 % of a
        // local send's CPU). Any other name, a percent-encoded one included,
        // still meets `{method}` and is answered as it always was.
        for m in Method::ALL {
            let name = m.as_str();
            if m.caller() == Caller::Relay {
                cfg.route(
                    &format!("/v1/relay/{name}"),
                    web::post().to(move |relay, observer, req, body, within| {
                        relay_call_named(name, relay, observer, req, body, within)
                    }),
                );
            } else {
                cfg.route(
                    &format!("/v1/rpc/{name}"),
                    web::post().to(move |relay, req, body, within| rpc_call_named(name, relay, req, body, within)),
                );
            }
        }
        cfg.route("/v1/rpc/{method}", web::post().to(rpc_call))
            .route("/v1/relay/{method}", web::post().to(relay_call))
            .default_service(web::to(not_found));
    }
}

/// The separate metrics listener (`[metrics] listen`): `/metrics` only.
pub fn configure_metrics(relay: web::Data<App>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(relay).route("/metrics", web::get().to(metrics)).default_service(web::to(not_found));
    }
}
