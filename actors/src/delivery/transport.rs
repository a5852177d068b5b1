//! How a delivery reaches a destination relay. The actors crate does no
//! HTTP: the binary supplies a [`Transport`] (signed relay RPC); local
//! recipients are reached through their account actor directly.

use relay_core::delivery::outcome::AttemptOutcome;
use relay_schemas::methods::DeliverParams;
use relay_schemas::objects::{RelayRef, Route};
use relay_schemas::{DeliveryStatus, RelayError, Wire};
use std::future::Future;
use std::pin::Pin;

pub type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

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
    /// (connection refused, timeout, 5xx, `unauthorized`, `rate_limited`):
    /// which, and why (e.g. `relay-b unreachable (cannot connect)`).
    Unknown(String),
}

/// One configured peer's answer to `route.get`.
#[derive(Clone, Debug)]
pub enum PeerRoute {
    /// A route of the account, its signature already checked.
    Found(Wire<Route>),
    /// `not_found` or `route_not_found`: this peer knows no route.
    NotFound,
    /// Anything else: refused connection, timeout, 5xx, `unauthorized`,
    /// `rate_limited`, an unreadable answer; with the peer and why.
    NoAnswer(String),
}

impl RouteLookup {
    /// The peers' answers together: the highest revision found; without
    /// one, `Absent` only when every peer answered a definitive not-found
    /// (with no peer at all, none serves the account).
    pub fn from_answers(answers: impl IntoIterator<Item = PeerRoute>) -> RouteLookup {
        let mut best: Option<Wire<Route>> = None;
        let mut silent = vec![];
        for answer in answers {
            match answer {
                PeerRoute::Found(r) if best.as_ref().is_none_or(|b| r.revision > b.revision) => best = Some(r),
                PeerRoute::Found(_) | PeerRoute::NotFound => {}
                PeerRoute::NoAnswer(why) => silent.push(why),
            }
        }
        silent.sort();
        match best {
            Some(route) => RouteLookup::Found(route),
            None if silent.is_empty() => RouteLookup::Absent,
            None => RouteLookup::Unknown(silent.join("; ")),
        }
    }

    /// PROTOCOL §4 *Route resolution at acceptance*: finding the route is
    /// part of delivery, so a `message.send` to an account not served here
    /// is refused only when the lookup proves that no relay serves it;
    /// otherwise it is accepted and the route resolved at every attempt.
    pub fn check_send(&self, to: &str) -> Result<(), RelayError> {
        match self {
            RouteLookup::Absent => Err(RelayError::new(
                relay_schemas::ErrorCode::RouteNotFound,
                format!("no relay knows a route for account {to}"),
            )),
            RouteLookup::Found(_) | RouteLookup::Unknown(_) => Ok(()),
        }
    }

    /// The error of an attempt that found no route, saying why (kept in
    /// the delivery's log: `relay audit message` shows it); `None` when a
    /// route was found.
    pub fn no_route_error(&self) -> Option<RelayError> {
        let why = match self {
            RouteLookup::Found(_) => return None,
            RouteLookup::Absent => "no peer knows the account".to_owned(),
            RouteLookup::Unknown(why) => format!("not every peer could be asked: {why}"),
        };
        Some(RelayError::new(
            relay_schemas::ErrorCode::RouteNotFound,
            format!("no route known for the recipient: {why}"),
        ))
    }

    pub fn route(self) -> Option<Wire<Route>> {
        match self {
            RouteLookup::Found(r) => Some(r),
            _ => None,
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::Account;
    use relay_schemas::ErrorCode;

    fn route(revision: u64) -> Wire<Route> {
        Wire::from_value(&Account::from_seed([5; 32]).route(revision, &[("relay-b", "http://b")], 1)).unwrap()
    }

    fn revision(l: &RouteLookup) -> Option<u64> {
        match l {
            RouteLookup::Found(r) => Some(r.revision),
            _ => None,
        }
    }

    #[test]
    fn a_send_is_refused_only_when_every_peer_answered_not_found() {
        let l = RouteLookup::from_answers([PeerRoute::NotFound, PeerRoute::NotFound]);
        assert!(matches!(l, RouteLookup::Absent));
        assert_eq!(l.check_send("b").unwrap_err().code, ErrorCode::RouteNotFound);
        // No peer to ask: no relay we know of serves the account.
        assert!(matches!(RouteLookup::from_answers([]), RouteLookup::Absent));
    }

    #[test]
    fn a_peer_that_could_not_be_asked_makes_the_send_accepted() {
        for answers in [vec![down("relay-c")], vec![PeerRoute::NotFound, down("relay-c")]] {
            let l = RouteLookup::from_answers(answers);
            assert!(matches!(l, RouteLookup::Unknown(_)), "{l:?}");
            l.check_send("b").unwrap();
        }
    }

    fn down(peer: &str) -> PeerRoute {
        PeerRoute::NoAnswer(format!("{peer} unreachable (cannot connect)"))
    }

    #[test]
    fn an_attempt_without_a_route_says_which_peers_could_not_be_asked() {
        let l = RouteLookup::from_answers([down("relay-c"), PeerRoute::NotFound, down("relay-b")]);
        let e = l.no_route_error().unwrap();
        assert_eq!(e.code, ErrorCode::RouteNotFound);
        assert_eq!(
            e.message,
            "no route known for the recipient: not every peer could be asked: \
             relay-b unreachable (cannot connect); relay-c unreachable (cannot connect)"
        );
        let e = RouteLookup::from_answers([PeerRoute::NotFound]).no_route_error().unwrap();
        assert_eq!(e.message, "no route known for the recipient: no peer knows the account");
        assert!(RouteLookup::from_answers([PeerRoute::Found(route(1))]).no_route_error().is_none());
    }

    #[test]
    fn a_found_route_makes_the_send_accepted_and_the_highest_revision_wins() {
        let l = RouteLookup::from_answers([PeerRoute::Found(route(2)), down("relay-c"), PeerRoute::Found(route(3))]);
        assert_eq!(revision(&l), Some(3));
        l.check_send("b").unwrap();
        let l = RouteLookup::from_answers([PeerRoute::Found(route(4)), PeerRoute::Found(route(1))]);
        assert_eq!(revision(&l), Some(4));
    }
}
