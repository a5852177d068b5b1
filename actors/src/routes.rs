//! The route book: the highest valid revision of every account's signed
//! Route this relay knows (its own accounts' and those fetched from peers).
//! Stored in the kv space (`route/{account_id}`) so it survives restarts;
//! read through an in-memory cache.

use crate::store::{Store, StoreError};
use relay_schemas::objects::Route;
use relay_schemas::Wire;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

fn key(account_id: &str) -> Vec<u8> {
    format!("route/{account_id}").into_bytes()
}

/// What offering a route did.
#[derive(Debug, PartialEq, Eq)]
pub enum Offer {
    /// Newer than what we had (or the first): now the account's route.
    Newer,
    /// Same revision and content, or older: nothing changes.
    Known,
    /// Same revision, other content (`state_conflict`): ignored.
    Conflict,
}

#[derive(Clone)]
pub struct RouteBook {
    store: Store,
    cache: Arc<Mutex<HashMap<String, Wire<Route>>>>,
    write: Arc<Mutex<()>>,
}

impl RouteBook {
    pub fn new(store: Store) -> Self {
        RouteBook { store, cache: Default::default(), write: Default::default() }
    }

    /// The best known route of `account_id`.
    pub fn get(&self, account_id: &str) -> Result<Option<Wire<Route>>, StoreError> {
        if let Some(r) = self.cache.lock().unwrap_or_else(|e| e.into_inner()).get(account_id) {
            return Ok(Some(r.clone()));
        }
        let Some(bytes) = self.store.kv_get(&key(account_id))? else { return Ok(None) };
        let route = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| Wire::<Route>::parse(s).ok())
            .ok_or_else(|| StoreError::Invalid(format!("stored route of {account_id} is unreadable")))?;
        self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(account_id.to_owned(), route.clone());
        Ok(Some(route))
    }

    /// Compares a route (already checked valid by the caller) with the known one.
    pub fn compare(&self, route: &Wire<Route>) -> Result<Offer, StoreError> {
        Ok(match self.get(&route.account_id)? {
            None => Offer::Newer,
            Some(known) if route.revision > known.revision => Offer::Newer,
            Some(known) if route.revision == known.revision && known != *route => Offer::Conflict,
            Some(_) => Offer::Known,
        })
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
            self.cache.lock().unwrap_or_else(|e| e.into_inner()).insert(route.account_id.clone(), route.clone());
        }
        Ok(offer)
    }
}
