//! The actix-web transport: `POST /v1/rpc/{method}` (clients),
//! `POST /v1/relay/{method}` (peers), `GET /v1/ws` (client WebSocket) and
//! `GET /healthz`, and the web client at `/` ([`webapp`]).
//! Protocol logic is in [`crate::rpc`]; this module only maps HTTP to it.

pub mod webapp;
pub mod ws;

use crate::config::Websocket;
use crate::relay_rpc::RelayHeaders;
use crate::rpc::Relay;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use relay_schemas::RelayError;

pub fn error_response(e: &RelayError) -> HttpResponse {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(e.to_body())
}

pub(crate) fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The whole body, or `payload_too_large` past `limits.max_body_bytes`.
async fn read_body(body: web::Payload, limit: usize) -> Result<web::Bytes, RelayError> {
    match body.to_bytes_limited(limit).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => Err(RelayError::invalid_params(format!("request body: {e}"))),
        Err(_) => Err(RelayError::payload_too_large("request body over limits.max_body_bytes")),
    }
}

async fn rpc_call(
    relay: web::Data<Relay>,
    method: web::Path<String>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    let body = match read_body(body, relay.max_body_bytes()).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let ip = req.peer_addr().map(|a| a.ip());
    match relay.call(&method, bearer(&req), ip, &body).await {
        Ok(json) => HttpResponse::Ok().content_type("application/json").body(json),
        Err(e) => error_response(&e),
    }
}

/// `POST /v1/relay/{method}`: authenticated peer calls.
async fn relay_call(
    relay: web::Data<Relay>,
    method: web::Path<String>,
    req: HttpRequest,
    body: web::Payload,
) -> HttpResponse {
    let body = match read_body(body, relay.max_body_bytes()).await {
        Ok(b) => b,
        Err(e) => return error_response(&e),
    };
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let headers = RelayHeaders {
        relay_id: header("Relay-Id"),
        timestamp: header("Relay-Timestamp"),
        signature: header("Relay-Signature"),
    };
    let now = relay.supervisor().clock().now();
    let peer = match relay.peer_keys().authenticate(&headers, &method, &body, now) {
        Ok(peer) => peer,
        Err(e) => return error_response(&e),
    };
    match relay.call_relay(&method, &peer, &body).await {
        Ok(json) => HttpResponse::Ok().content_type("application/json").body(json),
        Err(e) => error_response(&e),
    }
}

/// Liveness: the process answers.
async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// Readiness: the store can still make writes durable.
async fn readyz(relay: web::Data<Relay>) -> HttpResponse {
    if relay.supervisor().store().is_healthy() {
        HttpResponse::Ok().json(serde_json::json!({"status": "ready"}))
    } else {
        error_response(&RelayError::unavailable("the store cannot make writes durable"))
    }
}

/// Prometheus text exposition.
async fn metrics(relay: web::Data<Relay>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(relay.supervisor().metrics().encode())
}

async fn not_found() -> HttpResponse {
    error_response(&RelayError::not_found("no such endpoint"))
}

pub fn configure(relay: web::Data<Relay>, websocket: web::Data<Websocket>) -> impl FnOnce(&mut web::ServiceConfig) {
    move |cfg: &mut web::ServiceConfig| {
        cfg.app_data(relay)
            .app_data(websocket)
            .route("/v1/ws", web::get().to(ws::upgrade))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .route("/v1/rpc/{method}", web::post().to(rpc_call))
            .route("/v1/relay/{method}", web::post().to(relay_call))
            .default_service(web::to(not_found));
    }
}
