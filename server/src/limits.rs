//! Request rate limits: per session for clients, per peer for relays. Over
//! the limit a call gets `rate_limited` with `data.retry_after`, which a
//! well-behaved client or source relay waits. What a call is charged and
//! what a refused one is told are the core's rules ([`relay_core::rate`]);
//! these are the token buckets that hold the budgets.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use relay_core::rate::{self, PeerBudget};
use relay_schemas::{ErrorCode, RelayError};
use std::net::IpAddr;
use std::num::NonZeroU32;

pub struct RateLimits {
    sessions: DefaultKeyedRateLimiter<String>,
    peers: DefaultKeyedRateLimiter<String>,
    /// Route lookups per peer: their own budget, so a flood of lookups
    /// cannot spend the budget a peer's deliveries need.
    lookups: DefaultKeyedRateLimiter<String>,
    /// Reads a peer passes on for its clients (`account.devices.get`): a
    /// stranger's loop of them spends this, not the delivery budget.
    reads: DefaultKeyedRateLimiter<String>,
    /// `timeline.replicate` pulls of a partner home: replication rounds of
    /// many accounts neither starve nor are starved by deliveries.
    replicate: DefaultKeyedRateLimiter<String>,
    /// Session-less calls per client address.
    anonymous: DefaultKeyedRateLimiter<IpAddr>,
    /// The deliveries budget's burst: what one batch may cost at most.
    peer_burst: u32,
    clock: DefaultClock,
}

/// Keys a limiter keeps before it forgets those whose budget is full again.
const MAX_KEYS: usize = 65_536;

/// Requests per second (sustained) and burst of each budget.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    pub session: (u32, u32),
    pub peer: (u32, u32),
    pub peer_lookup: (u32, u32),
    pub peer_read: (u32, u32),
    pub peer_replicate: (u32, u32),
    pub anonymous: (u32, u32),
}

fn quota(rate: u32, burst: u32) -> Quota {
    let nz = |n: u32| NonZeroU32::new(n.max(1)).expect("positive");
    Quota::per_second(nz(rate)).allow_burst(nz(burst))
}

impl RateLimits {
    pub fn new(r: Rates) -> Self {
        RateLimits {
            sessions: RateLimiter::keyed(quota(r.session.0, r.session.1)),
            peers: RateLimiter::keyed(quota(r.peer.0, r.peer.1)),
            lookups: RateLimiter::keyed(quota(r.peer_lookup.0, r.peer_lookup.1)),
            reads: RateLimiter::keyed(quota(r.peer_read.0, r.peer_read.1)),
            replicate: RateLimiter::keyed(quota(r.peer_replicate.0, r.peer_replicate.1)),
            anonymous: RateLimiter::keyed(quota(r.anonymous.0, r.anonymous.1)),
            peer_burst: r.peer.1.max(1),
            clock: DefaultClock::default(),
        }
    }

    fn check<K: Clone + Eq + std::hash::Hash>(
        &self,
        limiter: &DefaultKeyedRateLimiter<K>,
        key: &K,
        who: &str,
    ) -> Result<(), RelayError> {
        self.check_n(limiter, key, who, NonZeroU32::MIN)
    }

    /// `n` units of `key`'s budget; `n` is at most the budget's burst.
    fn check_n<K: Clone + Eq + std::hash::Hash>(
        &self,
        limiter: &DefaultKeyedRateLimiter<K>,
        key: &K,
        who: &str,
        n: NonZeroU32,
    ) -> Result<(), RelayError> {
        // Memory stays bounded whoever calls: keys back at a full budget
        // carry no state worth keeping.
        if limiter.len() > MAX_KEYS {
            limiter.retain_recent();
        }
        let not_until = match limiter.check_key_n(key, n) {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(not_until)) => not_until,
            Err(e) => return Err(RelayError::internal(format!("rate limit: {e}"))),
        };
        let secs = rate::retry_after_secs(not_until.wait_time_from(self.clock.now()));
        Err(RelayError::new(ErrorCode::RateLimited, format!("too many requests from this {who}"))
            .with_data(serde_json::json!({ "retry_after": secs })))
    }

    /// One client call on the session of `account/device`.
    pub fn session(&self, account_id: &str, device_id: &str) -> Result<(), RelayError> {
        self.check(&self.sessions, &format!("{account_id}/{device_id}"), "session")
    }

    /// One relay call of `method` from peer `peer_id`, charged to the
    /// budget of its kind ([`rate::peer_budget`]; a batch is charged per
    /// item by its handler, [`RateLimits::deliveries`]).
    pub fn peer(&self, peer_id: &str, method: &str) -> Result<(), RelayError> {
        let limiter = match rate::peer_budget(method) {
            None => return Ok(()),
            Some(PeerBudget::Lookups) => &self.lookups,
            Some(PeerBudget::Reads) => &self.reads,
            Some(PeerBudget::Replicate) => &self.replicate,
            Some(PeerBudget::Deliveries) => &self.peers,
        };
        self.check(limiter, &peer_id.to_owned(), "relay")
    }

    /// `n` deliveries from peer `peer_id` in one batch, charged to its
    /// delivery budget ([`rate::batch_cost`]).
    pub fn deliveries(&self, peer_id: &str, n: usize) -> Result<(), RelayError> {
        let n = rate::batch_cost(n, self.peer_burst);
        self.check_n(&self.peers, &peer_id.to_owned(), "relay", NonZeroU32::new(n).expect("at least 1"))
    }

    /// One session-less client call from address `ip` (unknown: shared).
    pub fn anonymous(&self, ip: Option<IpAddr>) -> Result<(), RelayError> {
        let ip = ip.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
        self.check(&self.anonymous, &ip, "address")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(session: (u32, u32), peer: (u32, u32)) -> Rates {
        Rates { session, peer, peer_lookup: (1, 2), peer_read: (1, 2), peer_replicate: (1, 2), anonymous: (1, 2) }
    }

    #[test]
    fn a_session_over_its_burst_is_rate_limited_with_retry_after() {
        let l = RateLimits::new(rates((1, 3), (100, 100)));
        for _ in 0..3 {
            l.session("a", "phone").unwrap();
        }
        let e = l.session("a", "phone").unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(e.data.unwrap()["retry_after"].as_u64().unwrap() >= 1);
        // Other sessions and peers have their own budgets.
        l.session("a", "laptop").unwrap();
        l.peer("relay-b", "message.deliver").unwrap();
    }

    #[test]
    fn a_peer_over_its_burst_is_rate_limited() {
        let l = RateLimits::new(rates((100, 100), (1, 2)));
        l.peer("relay-b", "message.deliver").unwrap();
        l.peer("relay-b", "message.deliver").unwrap();
        assert_eq!(l.peer("relay-b", "message.deliver").unwrap_err().code, ErrorCode::RateLimited);
        l.peer("relay-c", "message.deliver").unwrap();
    }

    #[test]
    fn a_batch_costs_its_peer_one_delivery_per_item() {
        let l = RateLimits::new(rates((100, 100), (1, 5)));
        // The request itself is free; its items are charged by the handler.
        l.peer("relay-b", "message.deliver.batch").unwrap();
        l.deliveries("relay-b", 3).unwrap();
        l.peer("relay-b", "message.deliver").unwrap();
        l.peer("relay-b", "message.deliver").unwrap();
        assert_eq!(l.deliveries("relay-b", 1).unwrap_err().code, ErrorCode::RateLimited);
        // A batch larger than the burst costs the whole burst, once it is full.
        let l = RateLimits::new(rates((100, 100), (1, 5)));
        l.deliveries("relay-c", 256).unwrap();
        assert_eq!(l.peer("relay-c", "message.deliver").unwrap_err().code, ErrorCode::RateLimited);
    }

    #[test]
    fn route_lookups_of_a_peer_do_not_spend_its_delivery_budget() {
        let l = RateLimits::new(rates((100, 100), (1, 2)));
        l.peer("relay-b", "route.get").unwrap();
        l.peer("relay-b", "route.get").unwrap();
        assert_eq!(l.peer("relay-b", "route.get").unwrap_err().code, ErrorCode::RateLimited);
        l.peer("relay-b", "message.deliver").unwrap();
    }

    #[test]
    fn proxied_reads_and_replication_of_a_peer_do_not_spend_its_delivery_budget() {
        let l = RateLimits::new(rates((100, 100), (1, 2)));
        for method in ["account.devices.get", "timeline.replicate"] {
            l.peer("relay-b", method).unwrap();
            l.peer("relay-b", method).unwrap();
            assert_eq!(l.peer("relay-b", method).unwrap_err().code, ErrorCode::RateLimited, "{method}");
        }
        l.peer("relay-b", "message.deliver").unwrap();
        l.peer("relay-b", "message.deliver").unwrap();
        assert_eq!(l.peer("relay-b", "message.deliver").unwrap_err().code, ErrorCode::RateLimited);
        // And a flood of deliveries leaves reads and replication their own.
        l.peer("relay-c", "message.deliver").unwrap();
    }

    #[test]
    fn session_less_calls_are_limited_per_address() {
        let l = RateLimits::new(rates((100, 100), (100, 100)));
        let a = Some("127.0.0.2".parse().unwrap());
        l.anonymous(a).unwrap();
        l.anonymous(a).unwrap();
        assert_eq!(l.anonymous(a).unwrap_err().code, ErrorCode::RateLimited);
        l.anonymous(Some("127.0.0.3".parse().unwrap())).unwrap();
    }
}
