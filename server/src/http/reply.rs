//! The answers every handler shares (an error as its HTTP status and
//! body, the per-address cap's refusal) and the caller's session token.
//! A leaf: the WebSocket handler, the web app and a cluster front use it
//! without the routes of [`super`].

use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};
use relay_schemas::RelayError;

/// A `RelayError` as its HTTP status and JSON body.
pub fn error_response(e: &RelayError) -> HttpResponse {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    HttpResponse::build(status).json(e.to_body())
}

/// An error answer after which the connection is closed: the rest of a
/// body that timed out is not worth reading.
pub(crate) fn error_and_close(e: &RelayError) -> HttpResponse {
    let mut resp = error_response(e);
    resp.head_mut().set_connection_type(actix_web::http::ConnectionType::Close);
    resp
}

/// The session token of `Authorization: Bearer`, if any.
pub(crate) fn bearer(req: &HttpRequest) -> Option<&str> {
    req.headers()
        .get(header::AUTHORIZATION)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
}

/// The refusal of a connection over `http.max_connections_per_ip` (also
/// a cluster front's, `crate::cluster`).
pub fn over_cap() -> RelayError {
    RelayError::new(
        relay_schemas::ErrorCode::RateLimited,
        "too many connections from this address (http.max_connections_per_ip)",
    )
    .with_data(serde_json::json!({ "retry_after": 1 }))
}
