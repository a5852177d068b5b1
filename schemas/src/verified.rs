//! A memo of signed objects already verified: `Wire::verify` of the same
//! bytes under the same tag and key succeeds again without the JSON parse,
//! the JCS and the Ed25519 check (~40 µs). A local send verifies its
//! envelope at the sender and again at the recipient, and a device's
//! certificate is checked with every message it sends.
//!
//! Sound because verification is a pure function of (tag, key, raw bytes):
//! the memo key is blake3 of all three, and only successes are kept.
//! Bounded: sharded sets, each cleared whole when it reaches its capacity
//! (a miss only costs a verification again). Shards keep the lock short
//! and uncontended across worker threads.

use crate::sign::Tag;
use ed25519_dalek::VerifyingKey;
use std::collections::HashSet;
use std::sync::Mutex;

const SHARDS: usize = 16;
const PER_SHARD: usize = 4096;

type Shard = Mutex<Option<HashSet<[u8; 32]>>>;

pub(crate) struct Memo {
    shards: [Shard; SHARDS],
}

/// The process-wide memo `Wire::verify` consults.
pub(crate) static MEMO: Memo = Memo::new();

/// The memo key of one verification.
pub(crate) fn key(tag: Tag, key: &VerifyingKey, raw: &str) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(tag.as_str().as_bytes());
    h.update(b"\n");
    h.update(key.as_bytes());
    h.update(raw.as_bytes());
    *h.finalize().as_bytes()
}

impl Memo {
    const fn new() -> Self {
        Memo { shards: [const { Mutex::new(None) }; SHARDS] }
    }

    fn shard(&self, k: &[u8; 32]) -> std::sync::MutexGuard<'_, Option<HashSet<[u8; 32]>>> {
        self.shards[k[0] as usize % SHARDS].lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn contains(&self, k: &[u8; 32]) -> bool {
        self.shard(k).as_ref().is_some_and(|s| s.contains(k))
    }

    pub(crate) fn insert(&self, k: [u8; 32]) {
        let mut shard = self.shard(&k);
        let set = shard.get_or_insert_with(HashSet::new);
        if set.len() >= PER_SHARD {
            set.clear();
        }
        set.insert(k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::Wire;
    use crate::sign::sign_object;
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
        assert!(MEMO.contains(&key(Tag::DeviceCertificate, &k.verifying_key(), w.raw().get())));
        let other = SigningKey::from_bytes(&[22; 32]).verifying_key();
        assert!(w.verify(Tag::DeviceCertificate, &other).is_err());
        assert!(!MEMO.contains(&key(Tag::DeviceCertificate, &other, w.raw().get())));
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
    fn a_full_shard_starts_over_instead_of_growing() {
        let memo = Memo::new();
        for i in 0..(PER_SHARD * SHARDS * 2) as u32 {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            memo.insert(k);
        }
        for s in &memo.shards {
            assert!(s.lock().unwrap().as_ref().map_or(0, HashSet::len) <= PER_SHARD);
        }
    }
}
