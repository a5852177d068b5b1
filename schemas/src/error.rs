//! `RelayError`: the protocol's error object and its codes (PROTOCOL §2).
//!
//! Every failure a client or a peer can see is one of these codes; the HTTP
//! status and the `{"error":…}` body are derived here and nowhere else.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;

/// The protocol's error codes, in the order of the PROTOCOL table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    InvalidParams,
    InvalidSignature,
    Unauthorized,
    Forbidden,
    NotFound,
    RouteNotFound,
    StateConflict,
    InvalidState,
    RouteStale,
    TargetNotLocal,
    DeviceUnknown,
    ClockSkew,
    MessageExpired,
    PayloadTooLarge,
    RateLimited,
    InternalError,
    BadGateway,
    TemporarilyUnavailable,
}

/// What the source relay does with a delivery when the destination answers
/// with a code (the seed's "Error Handling and Retries" table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeliveryHandling {
    /// Retry, keeping `delivering`.
    Retry,
    /// Refresh the route bypassing caches, then retry.
    RefreshRouteAndRetry,
    /// End the delivery with this error.
    End,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 18] = [
        Self::InvalidParams,
        Self::InvalidSignature,
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::RouteNotFound,
        Self::StateConflict,
        Self::InvalidState,
        Self::RouteStale,
        Self::TargetNotLocal,
        Self::DeviceUnknown,
        Self::ClockSkew,
        Self::MessageExpired,
        Self::PayloadTooLarge,
        Self::RateLimited,
        Self::InternalError,
        Self::BadGateway,
        Self::TemporarilyUnavailable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidParams => "invalid_params",
            Self::InvalidSignature => "invalid_signature",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden => "forbidden",
            Self::NotFound => "not_found",
            Self::RouteNotFound => "route_not_found",
            Self::StateConflict => "state_conflict",
            Self::InvalidState => "invalid_state",
            Self::RouteStale => "route_stale",
            Self::TargetNotLocal => "target_not_local",
            Self::DeviceUnknown => "device_unknown",
            Self::ClockSkew => "clock_skew",
            Self::MessageExpired => "message_expired",
            Self::PayloadTooLarge => "payload_too_large",
            Self::RateLimited => "rate_limited",
            Self::InternalError => "internal_error",
            Self::BadGateway => "bad_gateway",
            Self::TemporarilyUnavailable => "temporarily_unavailable",
        }
    }

    /// Parses a code received from a peer; `None` for a code this protocol
    /// version does not define (the seed maps those to `bad_gateway`).
    pub fn parse(code: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }

    pub fn http_status(self) -> u16 {
        match self {
            Self::InvalidParams | Self::InvalidSignature => 400,
            Self::Unauthorized => 401,
            Self::Forbidden => 403,
            Self::NotFound | Self::RouteNotFound => 404,
            Self::StateConflict | Self::InvalidState => 409,
            Self::RouteStale | Self::TargetNotLocal => 421,
            Self::DeviceUnknown | Self::ClockSkew | Self::MessageExpired => 422,
            Self::PayloadTooLarge => 413,
            Self::RateLimited => 429,
            Self::InternalError => 500,
            Self::BadGateway => 502,
            Self::TemporarilyUnavailable => 503,
        }
    }

    pub fn delivery_handling(self) -> DeliveryHandling {
        match self {
            Self::InternalError | Self::BadGateway | Self::RateLimited | Self::TemporarilyUnavailable => {
                DeliveryHandling::Retry
            }
            Self::RouteStale | Self::TargetNotLocal | Self::RouteNotFound | Self::NotFound | Self::InvalidState => {
                DeliveryHandling::RefreshRouteAndRetry
            }
            _ => DeliveryHandling::End,
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `{"code":…,"message":…,"data":…?}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct RelayError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RelayError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RelayError { code, message: message.into(), data: None }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// The HTTP body of a failed call: `{"error":RelayError}`.
    pub fn to_body(&self) -> Value {
        serde_json::json!({ "error": self })
    }

    pub fn invalid_params(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidParams, m)
    }
    pub fn invalid_signature(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidSignature, m)
    }
    pub fn unauthorized(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, m)
    }
    pub fn forbidden(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, m)
    }
    pub fn state_conflict(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::StateConflict, m)
    }
    pub fn invalid_state(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidState, m)
    }
    pub fn device_unknown(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::DeviceUnknown, m)
    }
    pub fn internal(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::InternalError, m)
    }
    pub fn payload_too_large(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::PayloadTooLarge, m)
    }
    /// `payload_too_large` past the size setting `limit`, named in
    /// `data.limit` by its configuration key (PROTOCOL §1 *Size bounds*),
    /// so the caller knows which bound it met.
    pub fn over_limit(limit: &str, m: impl Into<String>) -> Self {
        Self::payload_too_large(m).with_data(serde_json::json!({ "limit": limit }))
    }
    pub fn unavailable(m: impl Into<String>) -> Self {
        Self::new(ErrorCode::TemporarilyUnavailable, m)
    }

    /// How the source handles a code answered by a destination: a code this
    /// version does not define ends the delivery (as `bad_gateway`), even
    /// though a real `bad_gateway` answer is retried.
    pub fn remote_handling(code: &str) -> DeliveryHandling {
        ErrorCode::parse(code).map_or(DeliveryHandling::End, ErrorCode::delivery_handling)
    }

    /// A remote error as the source must record it: codes this version does
    /// not define become `bad_gateway` (seed error table). A peer's text is
    /// kept on every attempt and shown by `relay audit`, so what is kept is
    /// bounded here, at the source: the message to 512 bytes
    /// with control characters replaced, and of `data` only the members
    /// PROTOCOL defines (`route`, `retry_after`, `limit`), each bounded.
    pub fn from_remote(code: &str, message: &str, data: Option<Value>) -> Self {
        match ErrorCode::parse(code) {
            Some(code) => RelayError { code, message: remote_text(message), data: data.and_then(remote_data) },
            None => RelayError::new(
                ErrorCode::BadGateway,
                format!("peer answered unrecognized code {:?}", remote_text(code)),
            ),
        }
    }
}

/// Bytes of a peer's error message a relay keeps (PROTOCOL §2 *RelayError*
/// is "human text"; anything longer is a peer making this relay hold it).
const REMOTE_MESSAGE_BYTES: usize = 512;

/// Bytes of a peer's `data.route` kept: a signed route is bounded by
/// `limits.max_object_bytes` (16 KiB by default) on every relay; this is
/// room for a peer configured with four times that, and no more.
const REMOTE_ROUTE_BYTES: usize = 64 << 10;

/// `text` cut to [`REMOTE_MESSAGE_BYTES`] at a character boundary, with
/// every control character (C0, DEL, C1) replaced by U+FFFD: nothing a peer
/// writes can move a terminal's cursor or start a line of its own.
fn remote_text(text: &str) -> String {
    let mut kept = String::with_capacity(text.len().min(REMOTE_MESSAGE_BYTES));
    for c in text.chars().map(|c| if c.is_control() { '\u{fffd}' } else { c }) {
        if kept.len() + c.len_utf8() > REMOTE_MESSAGE_BYTES {
            break;
        }
        kept.push(c);
    }
    kept
}

/// The members of a peer's `data` this relay acts on, each bounded; `None`
/// when none is left.
fn remote_data(data: Value) -> Option<Value> {
    let Value::Object(mut map) = data else { return None };
    let mut kept = serde_json::Map::new();
    if let Some(v) = map.remove("retry_after").filter(Value::is_u64) {
        kept.insert("retry_after".into(), v);
    }
    if let Some(Value::String(limit)) = map.remove("limit") {
        kept.insert("limit".into(), Value::String(remote_text(&limit).chars().take(64).collect()));
    }
    if let Some(route) = map.remove("route") {
        if serde_json::to_vec(&route).is_ok_and(|b| b.len() <= REMOTE_ROUTE_BYTES) {
            kept.insert("route".into(), route);
        }
    }
    (!kept.is_empty()).then_some(Value::Object(kept))
}

/// A peer's `{"error":…}` answer as read: the code stays text, as it may
/// be one this version does not define ([`RelayError::from_remote`]).
#[derive(Clone, Debug, Deserialize)]
pub struct RemoteErrorBody {
    pub error: RemoteError,
}

#[derive(Clone, Debug, Deserialize)]
pub struct RemoteError {
    pub code: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub data: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_round_trips_through_its_wire_name() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str());
            assert_eq!(ErrorCode::parse(code.as_str()), Some(code));
        }
    }

    #[test]
    fn http_status_follows_the_protocol_table() {
        let table = [
            ("invalid_params", 400),
            ("invalid_signature", 400),
            ("unauthorized", 401),
            ("forbidden", 403),
            ("not_found", 404),
            ("route_not_found", 404),
            ("state_conflict", 409),
            ("invalid_state", 409),
            ("route_stale", 421),
            ("target_not_local", 421),
            ("device_unknown", 422),
            ("clock_skew", 422),
            ("message_expired", 422),
            ("payload_too_large", 413),
            ("rate_limited", 429),
            ("internal_error", 500),
            ("bad_gateway", 502),
            ("temporarily_unavailable", 503),
        ];
        for (name, status) in table {
            assert_eq!(ErrorCode::parse(name).unwrap().http_status(), status, "{name}");
        }
    }

    #[test]
    fn unrecognized_remote_code_ends_delivery_with_bad_gateway() {
        let e = RelayError::from_remote("teapot", "short and stout", None);
        assert_eq!(e.code, ErrorCode::BadGateway);
        assert_eq!(RelayError::remote_handling("teapot"), DeliveryHandling::End);
        assert_eq!(RelayError::remote_handling("bad_gateway"), DeliveryHandling::Retry);
    }

    #[test]
    fn a_peers_error_text_is_kept_bounded_and_without_control_characters() {
        let long = format!("\u{1b}[2J\u{1b}]0;owned\u{7}line\nforged\u{9b}{}", "é".repeat(4 << 20));
        let e = RelayError::from_remote("forbidden", &long, None);
        assert_eq!(e.code, ErrorCode::Forbidden);
        assert!(e.message.len() <= REMOTE_MESSAGE_BYTES, "{} bytes kept", e.message.len());
        assert!(!e.message.chars().any(char::is_control), "{:?}", &e.message[..40]);
        assert!(e.message.starts_with("\u{fffd}[2J"));
        let e = RelayError::from_remote(&"x".repeat(1 << 20), "", None);
        assert!(e.message.len() < REMOTE_MESSAGE_BYTES + 64, "{} bytes kept", e.message.len());
    }

    #[test]
    fn a_peers_error_data_keeps_only_the_members_the_protocol_defines() {
        let big = "a".repeat(REMOTE_ROUTE_BYTES + 1);
        let data = serde_json::json!({"retry_after": 7, "limit": "limits.max_devices", "junk": big});
        let e = RelayError::from_remote("rate_limited", "wait", Some(data));
        assert_eq!(e.data, Some(serde_json::json!({"retry_after": 7, "limit": "limits.max_devices"})));
        let e = RelayError::from_remote("route_stale", "newer", Some(serde_json::json!({"route": {"pad": big}})));
        assert_eq!(e.data, None, "an oversized route is dropped, not kept");
        let e = RelayError::from_remote("route_stale", "newer", Some(serde_json::json!({"route": {"revision": 2}})));
        assert_eq!(e.data, Some(serde_json::json!({"route": {"revision": 2}})));
        let e = RelayError::from_remote("rate_limited", "wait", Some(serde_json::json!({"retry_after": "soon"})));
        assert_eq!(e.data, None);
    }

    #[test]
    fn error_body_has_code_message_and_optional_data() {
        let e = RelayError::new(ErrorCode::RateLimited, "slow down").with_data(serde_json::json!({"retry_after": 3}));
        assert_eq!(
            e.to_body(),
            serde_json::json!({"error":{"code":"rate_limited","message":"slow down","data":{"retry_after":3}}})
        );
    }
}
