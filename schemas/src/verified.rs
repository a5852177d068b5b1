//! Memos of pure work on public bytes, process-wide.
//!
//! - [`MEMO`]: signed objects already verified. `Wire::verify` of the same
//!   bytes under the same tag and key succeeds again without the JSON
//!   parse, the JCS and the Ed25519 check (~40 µs). A local send verifies
//!   its envelope at the sender and again at the recipient, and a device's
//!   certificate is checked with every message it sends. Sound because
//!   verification is a pure function of (tag, key, raw bytes): the memo
//!   key is blake3 of all three, and only successes are kept.
//! - [`KEYS`]: public keys already parsed. An Ed25519 key is a compressed
//!   point; parsing it takes a field square root (~5 µs), and every send
//!   parses the same keys again (its certificate's account and device keys
//!   at the recipient, the route's at a cross-relay destination). Keyed by
//!   the 32 bytes themselves; only keys that parsed and are not weak are
//!   kept.
//!
//! Bounded: sharded maps, each cleared whole when it reaches its capacity
//! (a miss only costs the work again): at most 65,536 signatures (~2.5 MB)
//! and 16,384 keys (~4 MB; a parsed key is 192 bytes). Shards keep the
//! lock short and uncontended across worker threads.

use ed25519_dalek::VerifyingKey;
use std::collections::HashMap;
use std::sync::Mutex;

const SHARDS: usize = 16;

type Shard<V> = Mutex<Option<HashMap<[u8; 32], V>>>;

/// At most `SHARDS * PER_SHARD` entries of `V`.
pub(crate) struct Memo<V, const PER_SHARD: usize> {
    shards: [Shard<V>; SHARDS],
}

/// Signatures `Wire::verify` found good, by [`key`].
pub(crate) static MEMO: Memo<(), 4096> = Memo::new();

/// Public keys `parse_public_key` accepted, by their bytes.
pub(crate) static KEYS: Memo<VerifyingKey, 1024> = Memo::new();

/// The memo key of one verification, `tag` the signing domain's text
/// (`sign::Tag::as_str`: taken as text, so that this memo needs nothing of
/// the signing module, which uses [`KEYS`]).
pub(crate) fn key(tag: &str, key: &VerifyingKey, raw: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(tag.as_bytes());
    h.update(b"\n");
    h.update(key.as_bytes());
    h.update(raw.as_bytes());
    *h.finalize().as_bytes()
}

impl<V: Copy, const PER_SHARD: usize> Memo<V, PER_SHARD> {
    const fn new() -> Self {
        Memo { shards: [const { Mutex::new(None) }; SHARDS] }
    }

    fn shard(&self, k: &[u8; 32]) -> std::sync::MutexGuard<'_, Option<HashMap<[u8; 32], V>>> {
        self.shards[k[0] as usize % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn get(&self, k: &[u8; 32]) -> Option<V> {
        self.shard(k).as_ref().and_then(|s| s.get(k).copied())
    }

    pub(crate) fn contains(&self, k: &[u8; 32]) -> bool {
        self.get(k).is_some()
    }

    pub(crate) fn insert(&self, k: [u8; 32], v: V) {
        let mut shard = self.shard(&k);
        let map = shard.get_or_insert_with(HashMap::new);
        if map.len() >= PER_SHARD {
            map.clear();
        }
        map.insert(k, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Wire;
    use crate::sign::{sign_object, Tag};
    use ed25519_dalek::SigningKey;
    use serde_json::json;

    fn signed(key: &SigningKey, device: &str) -> Wire<serde_json::Value> {
        let mut o = json!({"device_id": device}).as_object().unwrap().clone();
        sign_object(Tag::DeviceCertificate, &mut o, key);
        Wire::from_value(&serde_json::Value::Object(o)).unwrap()
    }

    #[test]
    fn a_verified_object_is_remembered_and_a_failure_is_not() {
        let k = SigningKey::from_bytes(&[21; 32]);
        let w = signed(&k, "memo-1");
        w.verify(Tag::DeviceCertificate, &k.verifying_key()).unwrap();
        assert!(MEMO.contains(&key(Tag::DeviceCertificate.as_str(), &k.verifying_key(), w.raw().get())));
        let other = SigningKey::from_bytes(&[22; 32]).verifying_key();
        assert!(w.verify(Tag::DeviceCertificate, &other).is_err());
        assert!(!MEMO.contains(&key(Tag::DeviceCertificate.as_str(), &other, w.raw().get())));
        // Remembered under its tag only: another tag still fails.
        assert!(w.verify(Tag::Route, &k.verifying_key()).is_err());
    }

    #[test]
    fn a_changed_byte_is_verified_again_and_fails() {
        let k = SigningKey::from_bytes(&[23; 32]);
        let w = signed(&k, "memo-2");
        w.verify(Tag::DeviceCertificate, &k.verifying_key()).unwrap();
        let forged = Wire::<serde_json::Value>::parse(&w.raw().get().replace("memo-2", "memo-3")).unwrap();
        assert!(forged.verify(Tag::DeviceCertificate, &k.verifying_key()).is_err());
    }

    #[test]
    fn a_parsed_key_is_remembered_by_its_bytes_and_read_back_the_same() {
        let k = SigningKey::from_bytes(&[24; 32]).verifying_key();
        let b64 = crate::encoding::b64_encode(k.as_bytes());
        assert_eq!(crate::sign::parse_public_key("k", &b64).unwrap(), k);
        assert_eq!(KEYS.get(k.as_bytes()), Some(k));
        assert_eq!(crate::sign::parse_public_key("k", &b64).unwrap(), k);
    }

    #[test]
    fn a_full_shard_starts_over_instead_of_growing() {
        const PER_SHARD: usize = 64;
        let memo = Memo::<(), PER_SHARD>::new();
        for i in 0..(PER_SHARD * SHARDS * 2) as u32 {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            memo.insert(k, ());
        }
        for s in &memo.shards {
            assert!(s.lock().unwrap().as_ref().map_or(0, HashMap::len) <= PER_SHARD);
        }
    }
}
