//! Device sessions: bearer tokens from `session.open`.
//!
//! A token is 256 random bits. The relay keeps only `blake3(token)`, in the
//! store (so sessions survive restarts) and in a cache; looking a token up
//! by its hash leaks nothing through timing about other tokens.
//!
//! Sessions do not pile up: a device holds at most `max_per_device` (opening
//! one more drops its oldest), a revoked device's are dropped, and a sweep
//! ([`Sessions::sweep`]) removes expired ones from the cache and the store.
//! When a session expires and which ones the cap drops are rules of
//! `relay_core::account::session`; this file keeps them in the store.
//! The kv space holds `sess/{hash}` → the session and a per-device index
//! `sessd/{account}/{device}/{hash}` → when it was issued (ms), written in the
//! same batch. Sessions stored before the index existed are only swept.

use crate::store::{Batch, Store, StoreError};
use relay_core::account::session::{expired, over_cap};
use relay_schemas::{UnixMillis, UnixSecs};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub account_id: String,
    pub device_id: String,
    pub expires_at: u64,
}

const PREFIX: &[u8] = b"sess/";
const DEVICE_PREFIX: &str = "sessd/";

fn key(token_hash: &[u8; 32]) -> Vec<u8> {
    [PREFIX, token_hash.as_slice()].concat()
}

/// Device ids are `[A-Za-z0-9_-]`, account ids hex: `/` separates them.
fn device_prefix(account_id: &str, device_id: &str) -> Vec<u8> {
    format!("{DEVICE_PREFIX}{account_id}/{device_id}/").into_bytes()
}

fn device_key(session: &Session, token_hash: &[u8; 32]) -> Vec<u8> {
    [device_prefix(&session.account_id, &session.device_id).as_slice(), token_hash.as_slice()].concat()
}

fn token_hash(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

/// Sessions kept in memory by default (`sessions.cache_entries`).
pub const CACHE_ENTRIES: usize = 65_536;

#[derive(Clone)]
pub struct Sessions {
    store: Store,
    cache: Arc<Mutex<HashMap<[u8; 32], Session>>>,
    /// Sessions the cache holds at most; past this it starts over (the
    /// store has them all: a miss is one kv read).
    cache_entries: usize,
}

impl Sessions {
    pub fn new(store: Store) -> Self {
        Sessions::with_cache_entries(store, CACHE_ENTRIES)
    }

    pub fn with_cache_entries(store: Store, cache_entries: usize) -> Self {
        Sessions { store, cache: Default::default(), cache_entries: cache_entries.max(1) }
    }

    /// Caches `session`, starting the cache over when it is full.
    fn cache_insert(&self, cache: &mut HashMap<[u8; 32], Session>, hash: [u8; 32], session: Session) {
        if cache.len() >= self.cache_entries && !cache.contains_key(&hash) {
            cache.clear();
        }
        cache.insert(hash, session);
    }

    fn cache(&self) -> MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `token` (fresh, from the account's decision), its session written into `batch` with its device index
    /// entry, and the device's oldest sessions removed in the same batch so
    /// that it holds at most `max_per_device`. The caller commits the batch
    /// and then calls [`Sessions::remember_issued`]. Only the
    /// account's actor issues its sessions, so the index cannot change
    /// between the read here and the commit.
    pub fn issue(
        &self,
        batch: &mut Batch,
        session: &Session,
        token: String,
        now_ms: UnixMillis,
        max_per_device: usize,
    ) -> Result<Issued, StoreError> {
        let mut existing = vec![];
        for kv in self.store.kv_scan_prefix(&device_prefix(&session.account_id, &session.device_id)) {
            let (k, v) = kv?;
            let (Some(hash), Ok(issued)) = (k.get(k.len().saturating_sub(32)..), <[u8; 8]>::try_from(v.as_slice()))
            else {
                continue;
            };
            if let Ok(hash) = <[u8; 32]>::try_from(hash) {
                existing.push((hash, u64::from_be_bytes(issued)));
            }
        }
        let dropped = over_cap(existing, max_per_device);
        for hash in &dropped {
            batch.kv_remove(&key(hash));
            batch.kv_remove(&device_key(session, hash));
        }
        let hash = token_hash(&token);
        batch.kv_put(&key(&hash), &serde_json::to_vec(session).expect("session serializes"));
        batch.kv_put(&device_key(session, &hash), &now_ms.0.to_be_bytes());
        Ok(Issued { token, hash, dropped })
    }

    /// Once the batch of [`Sessions::issue`] is committed: the new session
    /// joins the cache, the dropped ones leave it.
    pub fn remember_issued(&self, issued: &Issued, session: Session) {
        let mut cache = self.cache();
        for h in &issued.dropped {
            cache.remove(h);
        }
        self.cache_insert(&mut cache, issued.hash, session);
    }

    /// The live session of `token`, if any.
    pub fn lookup(&self, token: &str, now: UnixSecs) -> Option<Session> {
        let hash = token_hash(token);
        // A miss reads the store under the lock, so a session dropped
        // meanwhile (store, then cache) cannot come back into the cache.
        let session = {
            let mut cache = self.cache();
            match cache.get(&hash) {
                Some(s) => s.clone(),
                None => {
                    let bytes = self.store.kv_get(&key(&hash)).ok()??;
                    let s: Session = serde_json::from_slice(&bytes).ok()?;
                    self.cache_insert(&mut cache, hash, s.clone());
                    s
                }
            }
        };
        (!expired(session.expires_at, now)).then_some(session)
    }

    /// Drops a revoked device's sessions: from the cache at once, and from
    /// the store (through its device index; the account refuses them anyway,
    /// since it checks the device on every call).
    pub fn forget_device(&self, account_id: &str, device_id: &str) -> Result<(), StoreError> {
        let mut batch = self.store.batch();
        for kv in self.store.kv_scan_prefix(&device_prefix(account_id, device_id)) {
            let (k, _) = kv?;
            if let Some(hash) = k.get(k.len().saturating_sub(32)..).and_then(|h| <[u8; 32]>::try_from(h).ok()) {
                batch.kv_remove(&key(&hash));
            }
            batch.kv_remove(&k);
        }
        let committed = if batch.is_empty() { Ok(()) } else { self.store.commit(batch).map(|_| ()) };
        // Store first, then cache: a lookup in between cannot bring one back.
        self.cache().retain(|_, s| !(s.account_id == account_id && s.device_id == device_id));
        committed
    }

    /// Removes every session expired at `now` from the store and the cache;
    /// returns how many were removed from the store.
    pub fn sweep(&self, now: UnixSecs) -> Result<usize, StoreError> {
        let mut batch = self.store.batch();
        let mut removed = 0;
        for kv in self.store.kv_scan_prefix(PREFIX) {
            let (k, v) = kv?;
            let Ok(session) = serde_json::from_slice::<Session>(&v) else { continue };
            let Some(hash) = k.get(PREFIX.len()..).and_then(|h| <[u8; 32]>::try_from(h).ok()) else { continue };
            if expired(session.expires_at, now) {
                batch.kv_remove(&k);
                batch.kv_remove(&device_key(&session, &hash));
                removed += 1;
            }
        }
        if !batch.is_empty() {
            self.store.commit(batch)?;
        }
        self.cache().retain(|_, s| !expired(s.expires_at, now));
        Ok(removed)
    }

    /// Sessions in the cache (for tests and metrics).
    pub fn cached(&self) -> usize {
        self.cache().len()
    }
}

/// A token issued by [`Sessions::issue`].
pub struct Issued {
    pub token: String,
    pub hash: [u8; 32],
    /// The device's sessions dropped to make room (oldest first).
    pub dropped: Vec<[u8; 32]>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_core::clock::{Clock, ManualClock};
    use relay_schemas::encoding::b64_encode;

    fn session(device: &str, expires_at: u64) -> Session {
        Session { account_id: "a".repeat(32), device_id: device.into(), expires_at }
    }

    fn issue(s: &Sessions, session: &Session, now_ms: UnixMillis, max: usize) -> Issued {
        let mut batch = s.store.batch();
        let token = b64_encode(&rand::random::<[u8; 32]>());
        let issued = s.issue(&mut batch, session, token, now_ms, max).unwrap();
        s.store.commit(batch).unwrap();
        s.remember_issued(&issued, session.clone());
        issued
    }

    fn stored(s: &Sessions, prefix: &[u8]) -> usize {
        s.store.kv_scan_prefix(prefix).count()
    }

    #[test]
    fn the_sweep_drops_expired_sessions_from_cache_and_store_by_the_injected_clock() {
        let s = Sessions::new(Store::temporary().unwrap());
        let clock = ManualClock::at_ms(1_000_000);
        let short = issue(&s, &session("phone", clock.now().plus(60).0), clock.now_ms(), 16);
        let long = issue(&s, &session("laptop", clock.now().plus(3600).0), clock.now_ms(), 16);
        assert_eq!(s.sweep(clock.now()).unwrap(), 0);
        assert_eq!((s.cached(), stored(&s, PREFIX), stored(&s, DEVICE_PREFIX.as_bytes())), (2, 2, 2));

        clock.advance_ms(60_000);
        assert_eq!(s.sweep(clock.now()).unwrap(), 1);
        assert_eq!((s.cached(), stored(&s, PREFIX), stored(&s, DEVICE_PREFIX.as_bytes())), (1, 1, 1));
        assert_eq!(s.lookup(&short.token, clock.now()), None);
        assert!(s.lookup(&long.token, clock.now()).is_some());
        assert_eq!(s.cached(), 1, "a lookup of a swept token brings nothing back");
    }

    #[test]
    fn opening_one_more_than_the_cap_drops_the_devices_oldest_session() {
        let s = Sessions::new(Store::temporary().unwrap());
        let tokens: Vec<Issued> =
            (0..3).map(|i| issue(&s, &session("phone", 10_000), UnixMillis(1000 + i), 2)).collect();
        let other = issue(&s, &session("laptop", 10_000), UnixMillis(500), 2);
        assert_eq!(tokens[2].dropped, vec![tokens[0].hash]);
        assert_eq!(s.lookup(&tokens[0].token, UnixSecs(0)), None, "the oldest is gone");
        assert!(s.lookup(&tokens[1].token, UnixSecs(0)).is_some());
        assert!(s.lookup(&tokens[2].token, UnixSecs(0)).is_some());
        assert!(s.lookup(&other.token, UnixSecs(0)).is_some(), "another device's sessions are not counted");
        assert_eq!((stored(&s, PREFIX), stored(&s, DEVICE_PREFIX.as_bytes())), (3, 3));
    }

    /// 40 sessions, a cache of 16: it never holds more, and every token
    /// still opens its session (from the store when the cache lost it).
    #[test]
    fn the_sessions_cache_holds_at_most_its_configured_entries() {
        let s = Sessions::with_cache_entries(Store::temporary().unwrap(), 16);
        let mut issued = vec![];
        for i in 0..40 {
            issued.push(issue(&s, &session(&format!("d{i}"), 10_000), UnixMillis(1), 16));
            assert!(s.cached() <= 16, "{} cached after {} issued", s.cached(), i + 1);
        }
        for (i, t) in issued.iter().enumerate() {
            let found = s.lookup(&t.token, UnixSecs(0)).unwrap();
            assert_eq!(found.device_id, format!("d{i}"));
            assert!(s.cached() <= 16);
        }
        assert!(s.cached() > 0);
    }

    #[test]
    fn a_revoked_devices_sessions_leave_cache_and_store() {
        let s = Sessions::new(Store::temporary().unwrap());
        let phone = issue(&s, &session("phone", 10_000), UnixMillis(1), 16);
        let laptop = issue(&s, &session("laptop", 10_000), UnixMillis(1), 16);
        s.forget_device(&"a".repeat(32), "phone").unwrap();
        assert_eq!(s.lookup(&phone.token, UnixSecs(0)), None);
        assert!(s.lookup(&laptop.token, UnixSecs(0)).is_some());
        assert_eq!((stored(&s, PREFIX), stored(&s, DEVICE_PREFIX.as_bytes())), (1, 1));
    }
}
