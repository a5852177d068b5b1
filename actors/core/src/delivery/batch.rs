//! Deliveries to one peer coalesced into `message.deliver.batch` calls
//! (PROTOCOL §5), without adding a wait: a delivery goes out at once while
//! fewer than `in_flight` calls to its peer are under way
//! ([`goes_at_once`]); past that, deliveries queue, and each call that ends
//! takes what queued meanwhile as its next call ([`next_call`]: up to
//! [`DeliverBatchParams::MAX_ITEMS`] items and the body limit). Light load
//! thus sends single `message.deliver` calls with no added latency, and
//! heavy load sends batches, as the store's writer groups commits.
//!
//! A batch the peer refuses as a whole is sent again as single calls
//! ([`on_refusal`]); a peer that answers the batch method `not_found` (a
//! relay without it) gets single calls only for [`NO_BATCH_FOR`], then is
//! tried again ([`may_batch`]).
//!
//! The peer client (the server's `peer_batch.rs` and `peers.rs`) keeps the
//! queues and makes the calls.

use relay_schemas::methods::DeliverBatchParams;
use relay_schemas::ErrorCode;
use std::time::Duration;

/// How long a peer without the batch method gets single calls only.
pub const NO_BATCH_FOR: Duration = Duration::from_secs(600);

/// A batch body's bytes besides its items: `{"items":[` and `]}`.
pub const ENVELOPE_BYTES: usize = 12;

/// Whether a delivery queued for a peer with `busy` calls under way starts
/// a call of its own now (else the next call that ends takes it).
pub fn goes_at_once(busy: usize, in_flight: usize) -> bool {
    busy < in_flight
}

/// How many of the waiting deliveries (their `message.deliver` bodies'
/// lengths, oldest first) the next call takes: as many as fit in
/// `max_bytes` as one batch body, at most `MAX_ITEMS`, and always the
/// first (alone, it goes as a single call whatever its size).
pub fn next_call(waiting: impl IntoIterator<Item = usize>, max_bytes: usize) -> usize {
    let mut taken = 0;
    let mut bytes = ENVELOPE_BYTES;
    for len in waiting {
        let fits = bytes + len < max_bytes;
        if taken > 0 && (!fits || taken == DeliverBatchParams::MAX_ITEMS) {
            break;
        }
        // Each item is followed by a comma (or the closing bracket).
        bytes += len + 1;
        taken += 1;
    }
    taken
}

/// Whether a call of `items` goes as one batch: several items, to a peer
/// not known to lack the batch method (`no_batch_until`, from
/// [`on_refusal`]; tried again from then on). One item goes as a single
/// `message.deliver`, whatever the load.
pub fn may_batch<T: Ord>(items: usize, no_batch_until: Option<T>, now: T) -> bool {
    items > 1 && no_batch_until.is_none_or(|until| now >= until)
}

/// What a refusal of a whole batch call means for its items.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The peer lacks the batch method: these items go as single calls,
    /// and so does every call to it for [`NO_BATCH_FOR`].
    NoBatchMethod,
    /// The body was over the peer's limit (lower than ours): these items
    /// go as single calls; the next batch is tried as usual.
    TooLarge,
    /// Anything else (a refusal of our authentication, `rate_limited`, …)
    /// ends each item alike, as it would a single call.
    EachItem,
}

/// How a batch call the peer answered with `code` is carried on.
pub fn on_refusal(code: ErrorCode) -> Refused {
    match code {
        ErrorCode::NotFound => Refused::NoBatchMethod,
        ErrorCode::PayloadTooLarge => Refused::TooLarge,
        _ => Refused::EachItem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_delivery_goes_out_at_once_while_fewer_than_in_flight_calls_are_under_way() {
        assert!(goes_at_once(0, 2));
        assert!(goes_at_once(1, 2));
        assert!(!goes_at_once(2, 2), "past in_flight, it waits for a call to end");
        assert!(!goes_at_once(0, 0), "0: never batched, each alone (the client calls at once)");
    }

    #[test]
    fn the_next_call_takes_what_waits_up_to_the_body_limit() {
        // 12 + (10 + 1) * 3 = 45 < 50; a fourth would need 56.
        assert_eq!(next_call([10, 10, 10, 10, 10], 50), 3);
        assert_eq!(next_call([], 50), 0);
    }

    #[test]
    fn the_first_waiting_delivery_goes_even_alone_over_the_body_limit() {
        assert_eq!(next_call([100, 1], 50), 1);
    }

    #[test]
    fn the_next_call_takes_at_most_the_batch_methods_item_limit() {
        let many = std::iter::repeat_n(1, DeliverBatchParams::MAX_ITEMS + 5);
        assert_eq!(next_call(many, usize::MAX), DeliverBatchParams::MAX_ITEMS);
    }

    #[test]
    fn a_peer_without_the_batch_method_gets_single_calls_until_the_pause_ends() {
        assert!(may_batch(2, None, 5));
        assert!(!may_batch(2, Some(10), 9));
        assert!(may_batch(2, Some(10), 10), "tried again once the pause is over");
    }

    #[test]
    fn a_call_of_one_delivery_goes_as_a_single_message_deliver() {
        assert!(!may_batch(1, None, 5));
        assert!(!may_batch(0, None, 5));
    }

    #[test]
    fn a_batch_answered_not_found_falls_back_to_single_calls_for_a_while() {
        assert_eq!(on_refusal(ErrorCode::NotFound), Refused::NoBatchMethod);
        assert_eq!(on_refusal(ErrorCode::PayloadTooLarge), Refused::TooLarge);
        assert_eq!(on_refusal(ErrorCode::RateLimited), Refused::EachItem);
        assert_eq!(on_refusal(ErrorCode::Forbidden), Refused::EachItem);
    }
}
