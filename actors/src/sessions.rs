//! Device sessions: bearer tokens from `session.open`.
//!
//! A token is 256 random bits. The relay keeps only `blake3(token)`, in the
//! store (so sessions survive restarts) and in a cache; looking a token up
//! by its hash leaks nothing through timing about other tokens.

use crate::store::{Batch, Store};
use relay_schemas::encoding::b64_encode;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Session {
    pub account_id: String,
    pub device_id: String,
    pub expires_at: u64,
}

const PREFIX: &[u8] = b"sess/";

fn key(token_hash: &[u8; 32]) -> Vec<u8> {
    [PREFIX, token_hash.as_slice()].concat()
}

fn token_hash(token: &str) -> [u8; 32] {
    *blake3::hash(token.as_bytes()).as_bytes()
}

#[derive(Clone)]
pub struct Sessions {
    store: Store,
    cache: Arc<Mutex<HashMap<[u8; 32], Session>>>,
}

impl Sessions {
    pub fn new(store: Store) -> Self {
        Sessions { store, cache: Default::default() }
    }

    /// A fresh token, its session written into `batch`. The caller commits
    /// the batch and calls [`Sessions::remember`] once it is durable.
    pub fn issue(&self, batch: &mut Batch, session: &Session) -> (String, [u8; 32]) {
        let token = b64_encode(&rand::random::<[u8; 32]>());
        let hash = token_hash(&token);
        batch.kv_put(&key(&hash), &serde_json::to_vec(session).expect("session serializes"));
        (token, hash)
    }

    pub fn remember(&self, hash: [u8; 32], session: Session) {
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(hash, session);
    }

    /// The live session of `token`, if any.
    pub fn lookup(&self, token: &str, now: u64) -> Option<Session> {
        let hash = token_hash(token);
        let cached = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(&hash).cloned();
        let session = match cached {
            Some(s) => s,
            None => {
                let bytes = self.store.kv_get(&key(&hash)).ok()??;
                let s: Session = serde_json::from_slice(&bytes).ok()?;
                self.remember(hash, s.clone());
                s
            }
        };
        (session.expires_at > now).then_some(session)
    }

    /// Forgets the cached sessions of a revoked device (their stored entries
    /// are refused by the account, which checks the device on every call).
    pub fn forget_device(&self, account_id: &str, device_id: &str) {
        self.cache
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, s| !(s.account_id == account_id && s.device_id == device_id));
    }
}
