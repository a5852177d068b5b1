//! Request rate limits: per session for clients, per peer for relays. Over
//! the limit a call gets `rate_limited` with `data.retry_after` (whole
//! seconds, at least 1), which a well-behaved client or source relay waits.

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use relay_schemas::{ErrorCode, RelayError};
use std::num::NonZeroU32;

pub struct RateLimits {
    sessions: DefaultKeyedRateLimiter<String>,
    peers: DefaultKeyedRateLimiter<String>,
    clock: DefaultClock,
}

fn quota(rate: u32, burst: u32) -> Quota {
    let nz = |n: u32| NonZeroU32::new(n.max(1)).expect("positive");
    Quota::per_second(nz(rate)).allow_burst(nz(burst))
}

impl RateLimits {
    pub fn new(session_rate: u32, session_burst: u32, peer_rate: u32, peer_burst: u32) -> Self {
        RateLimits {
            sessions: RateLimiter::keyed(quota(session_rate, session_burst)),
            peers: RateLimiter::keyed(quota(peer_rate, peer_burst)),
            clock: DefaultClock::default(),
        }
    }

    fn check(&self, limiter: &DefaultKeyedRateLimiter<String>, key: &str, who: &str) -> Result<(), RelayError> {
        limiter.check_key(&key.to_owned()).map_err(|not_until| {
            let wait = not_until.wait_time_from(self.clock.now());
            let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
            RelayError::new(ErrorCode::RateLimited, format!("too many requests from this {who}"))
                .with_data(serde_json::json!({ "retry_after": secs.max(1) }))
        })
    }

    /// One client call on the session of `account/device`.
    pub fn session(&self, account_id: &str, device_id: &str) -> Result<(), RelayError> {
        self.check(&self.sessions, &format!("{account_id}/{device_id}"), "session")
    }

    /// One relay call from peer `peer_id`.
    pub fn peer(&self, peer_id: &str) -> Result<(), RelayError> {
        self.check(&self.peers, peer_id, "relay")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_over_its_burst_is_rate_limited_with_retry_after() {
        let l = RateLimits::new(1, 3, 100, 100);
        for _ in 0..3 {
            l.session("a", "phone").unwrap();
        }
        let e = l.session("a", "phone").unwrap_err();
        assert_eq!(e.code, ErrorCode::RateLimited);
        assert!(e.data.unwrap()["retry_after"].as_u64().unwrap() >= 1);
        // Other sessions and peers have their own budgets.
        l.session("a", "laptop").unwrap();
        l.peer("relay-b").unwrap();
    }

    #[test]
    fn a_peer_over_its_burst_is_rate_limited() {
        let l = RateLimits::new(100, 100, 1, 2);
        l.peer("relay-b").unwrap();
        l.peer("relay-b").unwrap();
        assert_eq!(l.peer("relay-b").unwrap_err().code, ErrorCode::RateLimited);
        l.peer("relay-c").unwrap();
    }
}
