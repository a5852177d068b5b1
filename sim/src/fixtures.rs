//! What the clients sign that is the same in every seed, made once per
//! process: the accounts' keys, their devices and certificates, and the
//! routes and registrations a seed asks for again (Ed25519 signing is
//! deterministic, so a signed object reused is the object signed anew).
//! The relays still verify every object they are handed, through
//! relay-schemas' memo as a relay does.

use relay_schemas::client;
use relay_schemas::objects::Route;
use relay_schemas::objects::Wire;
use serde_json::Value;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, OnceLock};

/// The most accounts a seed has (6 relays, 4 accounts each).
pub const MAX_ACCOUNTS: usize = 24;

/// Objects kept per memo at most: past it the memo starts again (a miss
/// only signs again).
const MEMO_CAP: usize = 4096;

/// An account's client side: its key, its two devices, their certificates.
pub struct Client {
    pub keys: client::Account,
    pub devices: [client::Device; 2],
    pub certs: [Value; 2],
}

/// Account `a`'s client (`a < MAX_ACCOUNTS`); `t0`: the world's start
/// (Unix seconds), the same in every seed.
pub fn client(a: usize, t0: u64) -> &'static Client {
    static ALL: OnceLock<Vec<Client>> = OnceLock::new();
    let all = ALL.get_or_init(|| (0..MAX_ACCOUNTS).map(|a| make_client(a, t0)).collect());
    &all[a]
}

fn make_client(a: usize, t0: u64) -> Client {
    let keys = client::Account::from_seed([a as u8 + 1; 32]);
    let devices = [0u8, 1].map(|d| {
        let mut seed = [0x5e; 32];
        (seed[0], seed[1]) = (a as u8 + 1, d + 1);
        client::Device::from_seed(&format!("d{d}"), seed)
    });
    let certs = [0, 1].map(|d| keys.certificate(&devices[d], t0 - 86_400, None));
    Client { keys, devices, certs }
}

/// A process-wide memo of signed objects by what they are made of.
struct Memo<K, V>(Mutex<Option<HashMap<K, V>>>);

impl<K: Eq + Hash, V: Clone> Memo<K, V> {
    const fn new() -> Self {
        Memo(Mutex::new(None))
    }

    fn get_or(&self, key: K, make: impl FnOnce() -> V) -> V {
        if let Some(v) = self.0.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_default().get(&key) {
            return v.clone();
        }
        let v = make();
        let mut memo = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let map = memo.get_or_insert_default();
        if map.len() >= MEMO_CAP {
            map.clear();
        }
        map.insert(key, v.clone());
        v
    }
}

/// What a route is made of: its account, revision, relays (id, url) and
/// issue time.
type RouteKey = (usize, u64, Vec<(String, String)>, u64);

/// Account `a`'s route of `revision` naming `relays` (id, url), issued at
/// `issued_at`.
pub fn route(a: usize, revision: u64, relays: &[(String, String)], issued_at: u64, t0: u64) -> Wire<Route> {
    static MEMO: Memo<RouteKey, Wire<Route>> = Memo::new();
    MEMO.get_or((a, revision, relays.to_vec(), issued_at), || {
        let relays: Vec<(&str, &str)> = relays.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        let v = client(a, t0).keys.route(revision, &relays, issued_at);
        Wire::from_value(&v).expect("a route the sim signs parses")
    })
}

/// Account `a`'s `account.register` params at `relay` under `route` (its
/// JSON text), made at `now`, with its first device's certificate.
pub fn register_params(a: usize, route: &str, relay: &str, now: u64, t0: u64) -> Value {
    static MEMO: Memo<(usize, String, String, u64), Value> = Memo::new();
    MEMO.get_or((a, route.to_owned(), relay.to_owned(), now), || {
        let c = client(a, t0);
        let route: Value = serde_json::from_str(route).expect("a route's text is JSON");
        c.keys.register_params(&route, &c.certs[0], relay, true, now)
    })
}
