//! What a call costs against the request rate limits, and what a refused
//! one is told: a client's call is charged to its session (or, without
//! one, to its address); a relay's to the budget of its kind, so that
//! route lookups, proxied reads and replication neither starve nor are
//! starved by deliveries; a batch of deliveries costs one per item. Over a
//! budget a call gets `rate_limited` with `data.retry_after`. The server's
//! limiters (`server/src/limits.rs`, token buckets) hold the budgets.

use std::time::Duration;

/// The budget a relay's call is charged to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerBudget {
    /// `route.get`.
    Lookups,
    /// Reads passed on for the peer's clients (`account.devices.get`).
    Reads,
    /// `timeline.replicate` pulls of a partner home.
    Replicate,
    /// Everything else: deliveries.
    Deliveries,
}

/// The budget a relay's call of `method` is charged to when it arrives;
/// `None`: charged per item by its handler ([`batch_cost`]).
pub fn peer_budget(method: &str) -> Option<PeerBudget> {
    Some(match method {
        "message.deliver.batch" => return None,
        "route.get" => PeerBudget::Lookups,
        "account.devices.get" => PeerBudget::Reads,
        "timeline.replicate" => PeerBudget::Replicate,
        _ => PeerBudget::Deliveries,
    })
}

/// What a batch of `n` deliveries costs its peer's delivery budget: the
/// same as `n` single `message.deliver` calls, so batching buys no extra
/// rate; one larger than the whole `burst` costs the whole burst (it could
/// never pass otherwise).
pub fn batch_cost(n: usize, burst: u32) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX).clamp(1, burst.max(1))
}

/// `data.retry_after` of a refused call that may pass after `wait`: whole
/// seconds, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relays_call_is_charged_to_the_budget_of_its_kind() {
        assert_eq!(peer_budget("route.get"), Some(PeerBudget::Lookups));
        assert_eq!(peer_budget("account.devices.get"), Some(PeerBudget::Reads));
        assert_eq!(peer_budget("timeline.replicate"), Some(PeerBudget::Replicate));
        assert_eq!(peer_budget("message.deliver"), Some(PeerBudget::Deliveries));
        assert_eq!(peer_budget("audit.checkpoint"), Some(PeerBudget::Deliveries));
        assert_eq!(peer_budget("message.deliver.batch"), None, "charged per item");
    }

    #[test]
    fn a_batch_costs_one_delivery_per_item_and_at_most_the_whole_burst() {
        assert_eq!(batch_cost(3, 5), 3);
        assert_eq!(batch_cost(0, 5), 1, "an empty batch still costs one call");
        assert_eq!(batch_cost(256, 5), 5);
        assert_eq!(batch_cost(usize::MAX, 5), 5);
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up_and_at_least_one() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(10)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(2)), 2);
        assert_eq!(retry_after_secs(Duration::from_millis(2_001)), 3);
    }
}
