//! The cache of a remote home's answers to reads this relay passes on for
//! its clients (`account.devices.get` of an account served elsewhere): how
//! long an answer is used again and how much is kept are the core's rules
//! ([`relay_core::remote_read`]); this holds them in a bounded LRU cache.

use quick_cache::unsync::Cache;
use quick_cache::Weighter;
use relay_core::remote_read::{self as rules, MAX_BYTES, MAX_ENTRIES};
use relay_schemas::UnixMillis;
use std::sync::Mutex;

pub struct RemoteReads {
    inner: Mutex<Cache<String, (UnixMillis, String), Bytes>>,
}

impl Default for RemoteReads {
    fn default() -> Self {
        RemoteReads { inner: Mutex::new(Cache::with_weighter(MAX_ENTRIES, MAX_BYTES as u64, Bytes)) }
    }
}

/// An answer weighs what the core's [`rules::weight`] says.
#[derive(Clone)]
struct Bytes;

impl Weighter<String, (UnixMillis, String)> for Bytes {
    fn weight(&self, account_id: &String, (_, answer): &(UnixMillis, String)) -> u64 {
        rules::weight(account_id, answer)
    }
}

impl RemoteReads {
    /// The answer kept for `account_id`, if still fresh at `now`.
    pub fn get(&self, account_id: &str, now: UnixMillis) -> Option<String> {
        let entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(account_id).filter(|(until, _)| rules::fresh(*until, now)).map(|(_, a)| a.clone())
    }

    /// Keeps the home's answer for `account_id` (its device lists) until
    /// [`rules::kept_until`], if [`rules::may_keep`].
    pub fn put(&self, account_id: &str, answer: String, now: UnixMillis) {
        if !rules::may_keep(account_id, &answer) {
            return;
        }
        let mut entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(account_id.to_owned(), (rules::kept_until(now), answer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_answers_until_the_answers_time_is_up() {
        use relay_core::remote_read::TTL_MS;
        let c = RemoteReads::default();
        c.put("a", "{}".into(), UnixMillis(1_000));
        assert_eq!(c.get("a", UnixMillis(1_000 + TTL_MS - 1)).unwrap(), "{}");
        assert!(c.get("a", UnixMillis(1_000 + TTL_MS)).is_none());
        assert!(c.get("b", UnixMillis(1_000)).is_none());
    }

    #[test]
    fn the_cache_keeps_at_most_its_byte_bound() {
        let c = RemoteReads::default();
        let big = "x".repeat(MAX_BYTES / 2);
        c.put("a", big.clone(), UnixMillis(0));
        c.put("b", big, UnixMillis(0));
        assert!(c.get("a", UnixMillis(1)).is_none(), "dropped to make room");
        assert!(c.get("b", UnixMillis(1)).is_some());
        c.put("c", "x".repeat(MAX_BYTES + 1), UnixMillis(0));
        assert!(c.get("c", UnixMillis(1)).is_none(), "larger than the whole cache");
    }

    #[test]
    fn a_hot_answer_survives_a_full_cache() {
        let c = RemoteReads::default();
        c.put("hot", "{}".into(), UnixMillis(0));
        for n in 0..MAX_ENTRIES * 2 {
            c.put(&format!("cold-{n}"), "{}".into(), UnixMillis(0));
            assert!(c.get("hot", UnixMillis(1)).is_some(), "evicted after {n} others");
        }
        let kept = c.inner.lock().unwrap().len();
        assert!(kept <= MAX_ENTRIES, "{kept} answers kept");
    }
}
