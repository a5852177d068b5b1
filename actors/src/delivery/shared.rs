//! What a delivery shares with the accounts, the send process and the
//! supervisor: its stream's id, the due index's keys, what it hands the
//! sender's account to record (its settlement, written in that account's
//! commit), the metrics and log line of an attempt and an end, and the
//! [`Transport`] an attempt at another relay goes through. A leaf: the
//! delivery actor and everyone else import these from here.

use crate::metrics::{Metrics, OutcomeLabels, StatusLabels};
use crate::store::{Head, NewEvent};
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::route_lookup::RouteLookup;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{DeliveryStatus, RelayRef};
use relay_schemas::{MessageId, RelayError, UnixMillis, UnixSecs};
use std::future::Future;
use std::pin::Pin;

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

/// The log target of a delivery's end, as docs/operate/logs.md names it
/// (`RUST_LOG=…,relay_actors::delivery=debug`), whichever file writes it.
const LOG_TARGET: &str = "relay_actors::delivery";

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
            tracing::debug!(target: LOG_TARGET, from = %from, message_id = %message_id, to = %to, target = %target,
                attempts, elapsed_s, status = %outcome, "delivery finished")
        }
        Some(e) => {
            tracing::warn!(target: LOG_TARGET, message_id = %message_id, target = %target, attempts, elapsed_s,
                status = %outcome, error = %e.code.as_str(), reason = e.message.as_str(), "delivery failed");
            tracing::debug!(target: LOG_TARGET, from = %from, message_id = %message_id, to = %to, target = %target,
                status = %outcome, "delivery failed")
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

// How a delivery reaches a destination relay. The actors crate does no
// HTTP: the server supplies a [`Transport`] (signed relay RPC); local
// recipients are reached through their account actor directly. What a
// route lookup's answers mean is the core's
// (`relay_core::delivery::route_lookup`).

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

pub trait Transport: Send + Sync + 'static {
    /// `message.deliver` at `target` with the unchanged params. `target`
    /// is this relay only for an account of a sibling shard
    /// ([`Transport::in_sibling_shard`]): the call goes to that shard's owner.
    fn deliver(&self, target: &RelayRef, params: &DeliverParams) -> LocalFuture<AttemptOutcome>;
    /// `route.get` for `account_id` from the configured peers: the highest
    /// valid revision any of them knows (signature already checked), or
    /// whether their answers prove that none does.
    fn fetch_route(&self, account_id: &str) -> LocalFuture<RouteLookup>;
    /// Whether `relay_id` is a configured peer (only those get metric
    /// labels and attempt slots: any relay id can appear in a signed route).
    fn is_peer(&self, relay_id: &str) -> bool;
    /// `message.delivery.peer_status` at the sender's other home relay.
    fn peer_status(&self, relay: &RelayRef, from: &str, message_id: &str) -> LocalFuture<Option<DeliveryStatus>>;
    /// In a cluster of several shards: whether `account_id`, served by this
    /// relay, lives in another shard than this core's. Its receipts are
    /// then delivered, as to a peer, to that shard's owner.
    fn in_sibling_shard(&self, _account_id: &str) -> bool {
        false
    }
}

/// A transport for a relay with no peers: every remote target is
/// unreachable (the request is never sent).
pub struct NoPeers;

impl Transport for NoPeers {
    fn deliver(&self, target: &RelayRef, _: &DeliverParams) -> LocalFuture<AttemptOutcome> {
        let e = RelayError::new(relay_schemas::ErrorCode::BadGateway, format!("no peer configured for {}", target.id));
        Box::pin(async move { AttemptOutcome::NotAttempted(e) })
    }
    fn fetch_route(&self, _: &str) -> LocalFuture<RouteLookup> {
        // No peer to ask: none can serve the account.
        Box::pin(async { RouteLookup::Absent })
    }
    fn is_peer(&self, _: &str) -> bool {
        false
    }
    fn peer_status(&self, _: &RelayRef, _: &str, _: &str) -> LocalFuture<Option<DeliveryStatus>> {
        Box::pin(async { None })
    }
}
