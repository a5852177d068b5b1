//! How a delivery reaches a destination relay. The actors crate does no
//! HTTP: the binary supplies a [`Transport`] (signed relay RPC); local
//! recipients are reached through their account actor directly.

use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{RelayRef, Route};
use relay_schemas::{DeliveryStatus, RelayError, Wire};
use std::future::Future;
use std::pin::Pin;

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

/// What one attempt at one destination came to. The distinctions matter
/// for result confirmation and target switching (seed).
#[derive(Clone, Debug)]
pub enum AttemptOutcome {
    /// The destination answered with a `DeliveryStatus`.
    Answered(DeliveryStatus),
    /// The destination answered an error with a code this protocol defines.
    Rejected(RelayError),
    /// The destination answered a code this version does not define; the
    /// delivery ends with `bad_gateway` (seed error table).
    Unrecognized(RelayError),
    /// Receipt unknown: timeout, disconnect or unreadable answer after the
    /// request may have arrived. Confirm with the same target.
    Unknown(RelayError),
    /// Receipt certainly not attempted (e.g. connection refused); the
    /// target may be switched to a higher route revision.
    NotAttempted(RelayError),
}

impl AttemptOutcome {
    pub fn error(&self) -> Option<&RelayError> {
        match self {
            AttemptOutcome::Answered(_) => None,
            AttemptOutcome::Rejected(e)
            | AttemptOutcome::Unrecognized(e)
            | AttemptOutcome::Unknown(e)
            | AttemptOutcome::NotAttempted(e) => Some(e),
        }
    }
}

/// What asking the configured peers for an account's route came to
/// (PROTOCOL §4 *Route resolution at acceptance*).
#[derive(Clone, Debug)]
pub enum RouteLookup {
    /// The highest valid revision any peer knows.
    Found(Wire<Route>),
    /// Every configured peer answered that it knows no route (`not_found`
    /// or `route_not_found`): no relay we know of serves the account.
    Absent,
    /// Some peer could not be asked or gave no definitive answer
    /// (connection refused, timeout, 5xx, `unauthorized`, `rate_limited`).
    Unknown,
}

impl RouteLookup {
    pub fn route(self) -> Option<Wire<Route>> {
        match self {
            RouteLookup::Found(r) => Some(r),
            _ => None,
        }
    }
}

pub trait Transport: Send + Sync + 'static {
    /// `message.deliver` at `target` with the unchanged params.
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
