//! Deliveries: one event stream and one short-lived actor per accepted
//! cross-account message, until a terminal state.

pub mod actor;
pub mod transport;

// The rules live in the core crate; their paths stay `delivery::core` etc.
pub use self::transport::{NoPeers, PeerRoute, RouteLookup, Transport};
pub use relay_core::delivery::{core, timetable, AttemptOutcome, DeliveryEvent, DeliveryState};

/// A delivery event as the store writes it.
pub fn encode(event: &DeliveryEvent, at: u64) -> Result<crate::store::NewEvent, serde_json::Error> {
    crate::store::NewEvent::new(event.event_type(), DeliveryEvent::VERSION, at, event)
}

use crate::metrics::{OutcomeLabels, StatusLabels};
use crate::supervisor::Supervisor;
use relay_schemas::DeliveryStatus;

/// Counts an attempt's outcome (`relay_delivery_attempts_total`).
pub fn count_attempt(sup: &Supervisor, outcome: &AttemptOutcome) {
    let kind = match outcome {
        AttemptOutcome::Answered(_) => "answered",
        AttemptOutcome::Rejected(_) => "rejected",
        AttemptOutcome::Unrecognized(_) => "unrecognized",
        AttemptOutcome::Unknown(_) => "unknown",
        AttemptOutcome::NotAttempted(_) => "not_attempted",
    };
    sup.metrics().attempts.get_or_create(&OutcomeLabels { outcome: kind.into() }).inc();
}

/// Which message a delivery carries.
#[derive(Clone, Copy)]
pub struct Ids<'a> {
    pub from: &'a str,
    pub message_id: &'a str,
    pub to: &'a str,
}

/// A delivery ended: one log line (INFO when accepted, WARN when failed)
/// and the finished metric. `target`: the relays tried, comma-separated.
pub fn finished(sup: &Supervisor, m: Ids, target: &str, attempts: u32, elapsed_s: u64, status: &DeliveryStatus) {
    let Ids { from, message_id, to } = m;
    match &status.error {
        None => tracing::info!(from = %from, message_id = %message_id, to = %to, target = %target, attempts, elapsed_s,
            status = %status.status.as_str(), "delivery finished"),
        Some(e) => {
            tracing::warn!(from = %from, message_id = %message_id, to = %to, target = %target, attempts, elapsed_s,
            status = %status.status.as_str(), error = %e.code.as_str(), reason = e.message.as_str(),
            "delivery failed")
        }
    }
    let labels = StatusLabels {
        status: status.status.as_str().to_owned(),
        error: status.error.as_ref().map(|e| e.code.as_str().to_owned()).unwrap_or_default(),
    };
    sup.metrics().deliveries_finished.get_or_create(&labels).inc();
}

/// The stream of the delivery of `(from, message_id)`.
pub fn stream_id(from: &str, message_id: &str) -> String {
    format!("delivery/{from}/{message_id}")
}

/// Prefix of the in-flight index: `due/{due_ms BE}{stream}` → "". One entry
/// per non-terminal delivery (or one finished but not yet reported to the
/// sender's account), so a restart re-arms exactly these timers.
pub const DUE_PREFIX: &[u8] = b"due/";

pub fn due_key(due_ms: u64, stream: &str) -> Vec<u8> {
    [DUE_PREFIX, &due_ms.to_be_bytes(), stream.as_bytes()].concat()
}

pub fn parse_due_key(key: &[u8]) -> Option<(u64, String)> {
    let rest = key.strip_prefix(DUE_PREFIX)?;
    let due = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let stream = std::str::from_utf8(&rest[8..]).ok()?.to_owned();
    Some((due, stream))
}
