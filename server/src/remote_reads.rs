//! Answers of a remote home to reads this relay passes on for its clients
//! (`account.devices.get` of an account served elsewhere), kept briefly:
//! a client asking again and again costs the home one call per few
//! seconds, as a route lookup that found nothing is remembered
//! (`Supervisor::lookup_route`). A device added or revoked at the home is
//! seen here at most [`TTL_MS`] late; a sender encrypting to a device
//! revoked meanwhile only writes a box nobody may read.

use relay_schemas::UnixMillis;
use std::collections::HashMap;
use std::sync::Mutex;

/// How long an answer is used again.
pub const TTL_MS: u64 = 5_000;
/// Answers kept at most, and their bytes at most; past either the cache
/// starts over (memory stays bounded whatever strangers ask).
const MAX_ENTRIES: usize = 65_536;
const MAX_BYTES: usize = 16 << 20;

#[derive(Default)]
pub struct RemoteReads {
    inner: Mutex<Entries>,
}

#[derive(Default)]
struct Entries {
    by_account: HashMap<String, (UnixMillis, String)>,
    bytes: usize,
}

fn size(account_id: &str, answer: &str) -> usize {
    account_id.len() + answer.len()
}

impl RemoteReads {
    /// The answer kept for `account_id`, if still fresh at `now`.
    pub fn get(&self, account_id: &str, now: UnixMillis) -> Option<String> {
        let entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries.by_account.get(account_id).filter(|(until, _)| *until > now).map(|(_, a)| a.clone())
    }

    /// Keeps the home's answer for `account_id` (its device lists) until
    /// `now` + [`TTL_MS`].
    pub fn put(&self, account_id: &str, answer: String, now: UnixMillis) {
        let mut entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let add = size(account_id, &answer);
        if add > MAX_BYTES {
            return;
        }
        if entries.by_account.len() >= MAX_ENTRIES || entries.bytes + add > MAX_BYTES {
            *entries = Entries::default();
        }
        if let Some((_, old)) = entries.by_account.insert(account_id.to_owned(), (now.plus(TTL_MS), answer)) {
            entries.bytes = entries.bytes.saturating_sub(size(account_id, &old));
        }
        entries.bytes += add;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_used_again_until_its_time_is_up() {
        let c = RemoteReads::default();
        c.put("a", "{}".into(), UnixMillis(1_000));
        assert_eq!(c.get("a", UnixMillis(1_000 + TTL_MS - 1)).unwrap(), "{}");
        assert!(c.get("a", UnixMillis(1_000 + TTL_MS)).is_none());
        assert!(c.get("b", UnixMillis(1_000)).is_none());
    }

    #[test]
    fn the_cache_starts_over_past_its_byte_bound() {
        let c = RemoteReads::default();
        let big = "x".repeat(MAX_BYTES / 2);
        c.put("a", big.clone(), UnixMillis(0));
        c.put("b", big, UnixMillis(0));
        assert!(c.get("a", UnixMillis(1)).is_none(), "dropped to make room");
        assert!(c.get("b", UnixMillis(1)).is_some());
    }
}
