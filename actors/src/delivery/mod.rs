//! Deliveries: one event stream and one short-lived actor per accepted
//! cross-account message, until a terminal state.

pub mod actor;
pub mod core;
pub mod timetable;
pub mod transport;

pub use self::core::{DeliveryEvent, DeliveryState};
pub use self::transport::{AttemptOutcome, NoPeers, RouteLookup, Transport};

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
