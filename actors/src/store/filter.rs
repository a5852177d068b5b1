//! Which blob keys sled surely lacks, answered without asking sled.
//!
//! Every `message.send` and every receipt first looks up its idempotency
//! ledger entry (a blob), and for a new message that entry is not there.
//! sled 0.34 answers a miss by walking its tree like a hit, about 10 µs
//! each: two per local send, some 5 % of its CPU (docs/performance-journal.md).
//! This blocked Bloom filter answers most misses with one memory read.
//!
//! It never calls a key absent that sled holds: every blob key goes in
//! before sled gets it (replay at open, `install`), and the keys sled held
//! at open go in by a scan beside the writer; only once that scan has
//! ended is the filter asked at all. A key removed from sled stays in it,
//! which costs only a lookup. Its size is fixed, so memory stays bounded
//! however many keys arrive: with 8 million keys in it about one miss in
//! thirty still goes to sled, and past that more and more of them, which
//! is never worse than without it.

use std::hash::Hasher;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};

/// The filter's size: 2^20 words of 64 bits.
pub const FILTER_BYTES: usize = 8 << 20;

pub(super) struct KeyFilter {
    words: Box<[AtomicU64]>,
    ready: AtomicBool,
    /// Lookups answered "absent" (counted so tests and benches can see it work).
    skipped: AtomicU64,
}

impl KeyFilter {
    /// An empty filter of `bytes` (a power of two, at least 8), not yet ready.
    pub fn new(bytes: usize) -> KeyFilter {
        assert!(bytes.is_power_of_two() && bytes >= 8, "a filter of {bytes} bytes");
        let words = (0..bytes / 8).map(|_| AtomicU64::new(0)).collect();
        KeyFilter { words, ready: AtomicBool::new(false), skipped: AtomicU64::new(0) }
    }

    /// Adds `key`, before sled gets it. Relaxed is enough: a reader reaches
    /// the filter only after the store's overlay no longer answers for the
    /// key, which it learns under the lock `install` released after this.
    pub fn insert(&self, key: &[u8]) {
        let (word, bits) = self.probe(key);
        self.words[word].fetch_or(bits, Relaxed);
    }

    /// False only when sled surely lacks `key`.
    pub fn may_contain(&self, key: &[u8]) -> bool {
        if !self.ready.load(Acquire) {
            return true;
        }
        let (word, bits) = self.probe(key);
        let maybe = self.words[word].load(Relaxed) & bits == bits;
        if !maybe {
            self.skipped.fetch_add(1, Relaxed);
        }
        maybe
    }

    /// Every key sled held when the scan began is in: the filter may answer.
    pub fn set_ready(&self) {
        self.ready.store(true, Release);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Acquire)
    }

    pub fn skipped(&self) -> u64 {
        self.skipped.load(Relaxed)
    }

    /// One word and four bits in it, from one 64-bit hash: the low bits pick
    /// the word, four 6-bit fields of the high half the bits. SipHash with
    /// fixed keys: a stranger who aimed keys at one word would only send
    /// their own lookups to sled.
    fn probe(&self, key: &[u8]) -> (usize, u64) {
        let mut h = std::hash::DefaultHasher::new();
        h.write(key);
        let h = h.finish();
        let word = (h as usize) & (self.words.len() - 1);
        let bits = (0..4).fold(0u64, |bits, i| bits | 1 << ((h >> (32 + 6 * i)) & 63));
        (word, bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> Vec<u8> {
        let mut k = b"bl/account/".to_vec();
        k.extend_from_slice(&blake3::hash(&n.to_le_bytes()).as_bytes()[..16]);
        k
    }

    #[test]
    fn a_key_put_in_is_never_called_absent() {
        let f = KeyFilter::new(1 << 12);
        f.set_ready();
        for n in 0..20_000 {
            f.insert(&key(n));
        }
        // 20,000 keys in 512 words: far past full, and still no key lost.
        assert!((0..20_000).all(|n| f.may_contain(&key(n))));
    }

    #[test]
    fn until_ready_every_key_may_be_there() {
        let f = KeyFilter::new(1 << 12);
        assert!(f.may_contain(&key(1)));
        f.set_ready();
        assert!(!f.may_contain(&key(1)));
        assert_eq!(f.skipped(), 1);
    }

    #[test]
    fn at_its_design_load_almost_every_absent_key_is_called_absent() {
        // 8 keys a word, the load of the module doc (one miss in thirty to
        // sled, on average).
        let f = KeyFilter::new(1 << 16);
        f.set_ready();
        let words = (1 << 16) / 8;
        for n in 0..8 * words {
            f.insert(&key(n));
        }
        let absent = (1_000_000..1_020_000).filter(|&n| !f.may_contain(&key(n))).count();
        assert!(absent > 19_000, "only {absent} of 20,000 absent keys called absent");
    }
}
