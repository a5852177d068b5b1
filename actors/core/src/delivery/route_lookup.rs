//! What asking the configured peers for an account's route means
//! (PROTOCOL §4 *Route resolution at acceptance*): the peers' answers
//! together ([`RouteLookup::from_answers`]), whether a send is refused
//! ([`RouteLookup::check_send`]), what an attempt without a route records,
//! and how long a lookup that found nothing is remembered ([`MISS_TTL_MS`]).
//! The transport asks the peers; the supervisor shares one lookup per
//! account among its callers and keeps the misses.

use relay_schemas::objects::{Route, Wire};
use relay_schemas::{RelayError, UnixMillis};

/// How long a lookup that found no route is remembered: long enough that
/// repeated asks for one unknown account cost the peers one question, short
/// enough that an account registered elsewhere is found by the next send.
/// A fresh lookup (after a route error) does not read it.
pub const MISS_TTL_MS: u64 = 5_000;

/// Until when a miss looked up at `now_ms` is remembered.
pub fn miss_remembered_until(now_ms: UnixMillis) -> UnixMillis {
    now_ms.plus(MISS_TTL_MS)
}

/// Whether a miss remembered `until` still answers a lookup at `now_ms`.
pub fn miss_remembered(until: UnixMillis, now_ms: UnixMillis) -> bool {
    until > now_ms
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

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::Account;
    use relay_schemas::ErrorCode;

    #[test]
    fn a_lookup_that_found_no_route_is_remembered_for_the_miss_ttl_only() {
        let until = miss_remembered_until(UnixMillis(1_000));
        assert!(miss_remembered(until, UnixMillis(1_000 + MISS_TTL_MS - 1)));
        assert!(!miss_remembered(until, UnixMillis(1_000 + MISS_TTL_MS)), "asked again from then on");
    }

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
