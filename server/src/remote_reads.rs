//! Answers of a remote home to reads this relay passes on for its clients
//! (`account.devices.get` of an account served elsewhere), kept briefly:
//! a client asking again and again costs the home one call per few
//! seconds, as a route lookup that found nothing is remembered
//! (`Supervisor::lookup_route`). A device added or revoked at the home is
//! seen here at most [`TTL_MS`] late; a sender encrypting to a device
//! revoked meanwhile only writes a box nobody may read.

use quick_cache::unsync::Cache;
use quick_cache::Weighter;
use relay_schemas::UnixMillis;
use std::sync::Mutex;

/// How long an answer is used again.
pub const TTL_MS: u64 = 5_000;
/// Answers kept at most, and their bytes at most (memory stays bounded
/// whatever strangers ask); past either the least used answers leave.
const MAX_ENTRIES: usize = 65_536;
const MAX_BYTES: usize = 16 << 20;

pub struct RemoteReads {
    inner: Mutex<Cache<String, (UnixMillis, String), Bytes>>,
}

impl Default for RemoteReads {
    fn default() -> Self {
        RemoteReads { inner: Mutex::new(Cache::with_weighter(MAX_ENTRIES, MAX_BYTES as u64, Bytes)) }
    }
}

/// An answer weighs its bytes, and at least a `MAX_ENTRIES`th of
/// `MAX_BYTES`: the one weight bound keeps both bounds.
#[derive(Clone)]
struct Bytes;

impl Weighter<String, (UnixMillis, String)> for Bytes {
    fn weight(&self, account_id: &String, (_, answer): &(UnixMillis, String)) -> u64 {
        size(account_id, answer).max(MAX_BYTES / MAX_ENTRIES) as u64
    }
}

fn size(account_id: &str, answer: &str) -> usize {
    account_id.len() + answer.len()
}

impl RemoteReads {
    /// The answer kept for `account_id`, if still fresh at `now`.
    pub fn get(&self, account_id: &str, now: UnixMillis) -> Option<String> {
        let entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries.get(account_id).filter(|(until, _)| *until > now).map(|(_, a)| a.clone())
    }

    /// Keeps the home's answer for `account_id` (its device lists) until
    /// `now` + [`TTL_MS`].
    pub fn put(&self, account_id: &str, answer: String, now: UnixMillis) {
        if size(account_id, &answer) > MAX_BYTES {
            return;
        }
        let mut entries = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        entries.insert(account_id.to_owned(), (now.plus(TTL_MS), answer));
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
