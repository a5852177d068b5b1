//! The route book: the highest valid revision of every account's signed
//! Route this relay knows (its own accounts' and those fetched from peers).
//! Stored in the kv space (`route/{account_id}`) so it survives restarts;
//! read through a bounded in-memory cache (a million accounts' routes would
//! not fit; a miss costs one kv read). Which route wins is the core's rule
//! (`relay_core::account::method::route_update::offer`); this file keeps
//! the winner.

use crate::store::{Store, StoreError};
use quick_cache::sync::{Cache, EntryAction, EntryResult};
use relay_core::account::method::route_update::{offer, Offer};
use relay_core::account::method::timeline_replicate::pull;
use relay_schemas::objects::Route;
use relay_schemas::objects::Wire;
use std::sync::{Arc, Mutex};

/// Routes kept in memory; past this the least used leave.
const CACHE_ROUTES: usize = 65_536;

fn route_cache() -> Cache<String, Wire<Route>> {
    Cache::new(CACHE_ROUTES)
}

fn key(account_id: &str) -> Vec<u8> {
    format!("route/{account_id}").into_bytes()
}

#[derive(Clone)]
pub struct RouteBook {
    store: Store,
    /// Sharded: every send looks its recipient's route up here.
    cache: Arc<Cache<String, Wire<Route>>>,
    write: Arc<Mutex<()>>,
}

impl RouteBook {
    pub fn new(store: Store) -> Self {
        RouteBook { store, cache: Arc::new(route_cache()), write: Default::default() }
    }

    /// The best known route of `account_id`.
    pub fn get(&self, account_id: &str) -> Result<Option<Wire<Route>>, StoreError> {
        if let Some(r) = self.cache.get(account_id) {
            return Ok(Some(r));
        }
        let Some(bytes) = self.store.kv_get(&key(account_id))? else { return Ok(None) };
        let route = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| Wire::<Route>::parse(s).ok())
            .ok_or_else(|| StoreError::Invalid(format!("stored route of {account_id} is unreadable")))?;
        self.remember(route.clone());
        Ok(Some(route))
    }

    /// Caches a route unless a higher revision is cached already (a reader
    /// that missed may come back after an `offer` cached a newer one).
    fn remember(&self, route: Wire<Route>) {
        let cached = self.cache.entry(route.account_id.as_str(), None, |_, known| {
            if offer(Some(known), &route) == Offer::Newer {
                *known = route.clone();
            }
            EntryAction::Retain(())
        });
        if let EntryResult::Vacant(slot) = cached {
            let _ = slot.insert(route);
        }
    }

    /// Makes `route` the cached copy when the cache holds the same bytes:
    /// an account actor loaded from its events parsed a route of its own,
    /// and sharing the book's leaves one copy in memory, not two.
    pub fn share(&self, route: &mut Wire<Route>) {
        if let Some(known) = self.cache.get(&route.account_id) {
            if known.raw().get() == route.raw().get() {
                *route = known.clone();
            }
        }
    }

    /// Every account whose known route names this relay (`own_id`) and one
    /// more, with that other home: the accounts kept in step with a
    /// partner by `timeline.replicate`.
    pub fn shared_homes(&self, own_id: &str) -> impl Iterator<Item = Result<(String, String), StoreError>> + '_ {
        let own_id = own_id.to_owned();
        self.store.kv_scan_prefix(b"route/").filter_map(move |kv| {
            let (_, bytes) = match kv {
                Ok(kv) => kv,
                Err(e) => return Some(Err(e)),
            };
            let route = std::str::from_utf8(&bytes).ok().and_then(|s| Wire::<Route>::parse(s).ok())?;
            let partner = pull::partner(&route, &own_id)?;
            Some(Ok((route.account_id.clone(), partner.to_owned())))
        })
    }

    /// Compares a route (already checked valid by the caller) with the
    /// known one, by `relay_core`'s route rule.
    pub fn compare(&self, route: &Wire<Route>) -> Result<Offer, StoreError> {
        Ok(offer(self.get(&route.account_id)?.as_ref(), route))
    }

    /// Keeps a route (already checked valid by the caller) if it is newer
    /// than the known one. Offers are serialized so an older route never
    /// overwrites a newer one.
    pub fn offer(&self, route: &Wire<Route>) -> Result<Offer, StoreError> {
        let _write = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let offer = self.compare(route)?;
        if offer == Offer::Newer {
            let mut batch = self.store.batch();
            batch.kv_put(&key(&route.account_id), route.raw().get().as_bytes());
            self.store.commit(batch)?;
            self.remember(route.clone());
        }
        Ok(offer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::client::Account;

    #[test]
    fn a_hot_route_survives_a_full_cache() {
        let route: Wire<Route> =
            Wire::from_value(&Account::from_seed([5; 32]).route(1, &[("relay-b", "http://b")], 1)).unwrap();
        let cache = route_cache();
        cache.insert("hot".into(), route.clone());
        for n in 0..CACHE_ROUTES * 2 {
            cache.insert(format!("cold-{n}"), route.clone());
            assert!(cache.get("hot").is_some(), "evicted after {n} others");
        }
        assert!(cache.len() <= CACHE_ROUTES, "{} routes kept", cache.len());
    }
}
