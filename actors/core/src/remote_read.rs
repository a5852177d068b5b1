//! How long and how much of a remote home's answers to the reads this
//! relay passes on for its clients (`account.devices.get` of an account
//! served elsewhere) is kept: a client asking again and again costs the
//! home one call per few seconds, as a route lookup that found nothing is
//! remembered (`delivery::route_lookup::MISS_TTL_MS`). A device added or
//! revoked at the home is seen here at most [`TTL_MS`] late; a sender
//! encrypting to a device revoked meanwhile only writes a box nobody may
//! read. The server's cache keeps the answers by these rules.

use relay_schemas::UnixMillis;

/// How long an answer is used again.
pub const TTL_MS: u64 = 5_000;
/// Answers kept at most, and their bytes at most (memory stays bounded
/// whatever strangers ask); past either the least used answers leave.
pub const MAX_ENTRIES: usize = 65_536;
pub const MAX_BYTES: usize = 16 << 20;

/// Until when an answer got at `now` is used again.
pub fn kept_until(now: UnixMillis) -> UnixMillis {
    now.plus(TTL_MS)
}

/// Whether an answer kept `until` still answers a read at `now`.
pub fn fresh(until: UnixMillis, now: UnixMillis) -> bool {
    until > now
}

/// Whether an answer may be kept at all: one larger than the whole bound
/// is not.
pub fn may_keep(account_id: &str, answer: &str) -> bool {
    size(account_id, answer) <= MAX_BYTES
}

/// What an answer weighs against [`MAX_BYTES`]: its bytes, and at least a
/// [`MAX_ENTRIES`]th of [`MAX_BYTES`], so the one weight bound keeps both.
pub fn weight(account_id: &str, answer: &str) -> u64 {
    size(account_id, answer).max(MAX_BYTES / MAX_ENTRIES) as u64
}

fn size(account_id: &str, answer: &str) -> usize {
    account_id.len() + answer.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_used_again_until_its_time_is_up() {
        let until = kept_until(UnixMillis(1_000));
        assert!(fresh(until, UnixMillis(1_000 + TTL_MS - 1)));
        assert!(!fresh(until, UnixMillis(1_000 + TTL_MS)), "asked again from then on");
    }

    #[test]
    fn an_answer_larger_than_the_whole_bound_is_not_kept() {
        assert!(may_keep("a", &"x".repeat(MAX_BYTES - 1)));
        assert!(!may_keep("a", &"x".repeat(MAX_BYTES)));
    }

    #[test]
    fn an_answer_weighs_its_bytes_and_at_least_its_share_of_the_entry_bound() {
        assert_eq!(weight("a", "{}"), (MAX_BYTES / MAX_ENTRIES) as u64, "small answers count as their share");
        assert_eq!(weight("a", &"x".repeat(MAX_BYTES / 2)), (MAX_BYTES / 2 + 1) as u64);
        // So the byte bound alone never lets more than MAX_ENTRIES in.
        assert!(weight("", "") * MAX_ENTRIES as u64 >= MAX_BYTES as u64);
    }
}
