//! Deliveries: one event stream and one short-lived actor per accepted
//! cross-account message, until a terminal state. The actor reaches the rest
//! of the relay only through [`Env`] and [`Ports`], so this module depends
//! on neither the accounts nor whoever starts it.

pub mod actor;
pub mod transport;

pub use self::transport::{NoPeers, PeerRoute, RouteLookup, Transport};
// The rules are relay-core's, named from outside by their one path
// (`relay_core::delivery::…`); these short names are for this crate only.
pub(crate) use relay_core::delivery::aggregate::{self, DeliveryEvent};
pub(crate) use relay_core::delivery::outcome::AttemptOutcome;

use self::actor::DeliveryActor;
use self::transport::LocalFuture;
use crate::clock::SharedClock;
use crate::metrics::{Metrics, OutcomeLabels, StatusLabels};
use crate::policy::Policy;
use crate::routes::RouteBook;
use crate::store::{Head, NewEvent, Store};
use relay_schemas::methods::DeliverParams;
use relay_schemas::{DeliveryStatus, MessageId, RelayError, UnixMillis, UnixSecs};
use std::sync::Arc;
use tokio::sync::Semaphore;

/// The shared handles a delivery reads directly (cheap to clone).
#[derive(Clone)]
pub struct Env {
    pub store: Store,
    pub clock: SharedClock,
    pub policy: Arc<Policy>,
    pub routes: RouteBook,
    pub transport: Arc<dyn Transport>,
    pub metrics: Arc<Metrics>,
}

/// What a delivery asks of the rest of the relay: the accounts (local
/// recipients, the sender's record), route lookups, timers and the
/// per-destination slots. A narrow port, so deliveries never call back into
/// the service that starts them.
pub trait Ports: Send + Sync + 'static {
    /// `message.deliver` to local account `to`, answered at once: the
    /// outcome reaches the sender's client only after the sender's account
    /// has written it durably, a later commit that covers this receipt.
    /// (An account of a sibling shard is reached through the transport.)
    fn deliver_local(&self, to: &str, params: DeliverParams, digest: String) -> LocalFuture<AttemptOutcome>;
    /// Records an outcome in the sender `from`'s account (idempotent),
    /// answered once durable.
    fn report(&self, from: &str, outcome: ReportOutcome) -> LocalFuture<Result<Recorded, RelayError>>;
    /// The best route known for `account_id`; with `fresh`, the peers are
    /// asked first, bypassing the cache.
    fn lookup_route(&self, account_id: &str, fresh: bool) -> LocalFuture<RouteLookup>;
    /// Arms the timer of `stream`'s next attempt at `destinations` (relay
    /// ids; empty when no route is known): a destination heard from again
    /// makes it due at once.
    fn schedule_to(&self, stream: String, due_ms: UnixMillis, destinations: Vec<String>);
    /// Actor `addr` of `stream` is stopping: the next start of `stream`
    /// gets a new actor (it reads what this one wrote).
    fn stopping(&self, stream: &str, addr: &actix::Addr<DeliveryActor>);
    /// The actor of `stream` has stopped.
    fn stopped(&self, stream: &str);
    /// The attempt slots of destination `relay_id`
    /// (`limits.max_in_flight_per_destination`).
    fn destination(&self, relay_id: &str) -> Arc<Semaphore>;
    /// Peer `relay_id` answered: its waiting deliveries may start now.
    fn peer_seen(&self, relay_id: &str);
    /// Whether the sender `from`'s account here records the message
    /// `target_accepted` while this delivery has not ended: its other home
    /// delivered it (learned by `timeline.replicate`).
    fn delivered_by_other_home(&self, from: &str, message_id: &str) -> bool;
}

/// An outcome for the sender's account: the delivery's status of
/// `message_id`; with a settlement, the delivery's own last events and
/// index removal go in the same commit.
#[derive(Debug)]
pub struct ReportOutcome {
    pub message_id: MessageId,
    pub status: DeliveryStatus,
    pub settlement: Option<Settlement>,
}

/// What the sender's account recorded: its status of the message and,
/// when a settlement was written, the delivery stream's head after it.
#[derive(Debug)]
pub struct Recorded {
    pub status: DeliveryStatus,
    pub head: Option<Head>,
}

/// A delivery's last events and its due-index removal, written in the
/// sender's account commit that records its final status.
#[derive(Clone, Debug)]
pub struct Settlement {
    pub stream: String,
    /// The delivery stream's head the events follow.
    pub head: Head,
    pub events: Vec<NewEvent>,
    pub remove_due: Option<Vec<u8>>,
}

/// A delivery event as the store writes it.
pub fn encode(event: &DeliveryEvent, at: UnixSecs) -> Result<NewEvent, serde_json::Error> {
    NewEvent::new(event.event_type(), DeliveryEvent::VERSION, at, event)
}

/// Counts an attempt's outcome (`relay_delivery_attempts_total`).
pub fn count_attempt(metrics: &Metrics, outcome: &AttemptOutcome) {
    let kind = match outcome {
        AttemptOutcome::Answered(_) => "answered",
        AttemptOutcome::Rejected(_) => "rejected",
        AttemptOutcome::Unrecognized(_) => "unrecognized",
        AttemptOutcome::Unknown(_) => "unknown",
        AttemptOutcome::NotAttempted(_) => "not_attempted",
    };
    metrics.attempts.get_or_create(&OutcomeLabels { outcome: kind.into() }).inc();
}

/// Which message a delivery carries.
#[derive(Clone, Copy)]
pub struct Ids<'a> {
    pub from: &'a str,
    pub message_id: &'a str,
    pub to: &'a str,
}

/// A delivery ended: the finished metric and log lines. Who wrote to whom
/// is logged only at DEBUG (docs/operate/logs.md): a failure is a WARN
/// with the message id (the sender's), the relays and the error, not the
/// accounts.
/// `target`: the relays tried, comma-separated.
pub fn finished(metrics: &Metrics, m: Ids, target: &str, attempts: u32, elapsed_s: u64, status: &DeliveryStatus) {
    let Ids { from, message_id, to } = m;
    let outcome = status.status.as_str();
    match &status.error {
        None => {
            tracing::debug!(from = %from, message_id = %message_id, to = %to, target = %target, attempts, elapsed_s,
            status = %outcome, "delivery finished")
        }
        Some(e) => {
            tracing::warn!(message_id = %message_id, target = %target, attempts, elapsed_s, status = %outcome,
                error = %e.code.as_str(), reason = e.message.as_str(), "delivery failed");
            tracing::debug!(from = %from, message_id = %message_id, to = %to, target = %target, status = %outcome,
                "delivery failed")
        }
    }
    let labels = StatusLabels {
        status: status.status.as_str().to_owned(),
        error: status.error.as_ref().map(|e| e.code.as_str().to_owned()).unwrap_or_default(),
    };
    metrics.deliveries_finished.get_or_create(&labels).inc();
}

/// The stream of the delivery of `(from, message_id)`.
pub fn stream_id(from: &str, message_id: &str) -> String {
    format!("delivery/{from}/{message_id}")
}

/// Prefix of the in-flight index: `due/{due_ms BE}{stream}` → "". One entry
/// per non-terminal delivery (or one finished but not yet reported to the
/// sender's account), so a restart re-arms exactly these timers.
pub const DUE_PREFIX: &[u8] = b"due/";

pub fn due_key(due: UnixMillis, stream: &str) -> Vec<u8> {
    [DUE_PREFIX, &due.0.to_be_bytes(), stream.as_bytes()].concat()
}

pub fn parse_due_key(key: &[u8]) -> Option<(UnixMillis, String)> {
    let rest = key.strip_prefix(DUE_PREFIX)?;
    let due = UnixMillis(u64::from_be_bytes(rest.get(..8)?.try_into().ok()?));
    let stream = std::str::from_utf8(&rest[8..]).ok()?.to_owned();
    Some((due, stream))
}
