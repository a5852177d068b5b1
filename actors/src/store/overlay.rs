//! Writes committed but not yet in the engine, so that they are readable at
//! once, and the merge of them with the engine's ordered reads.
//!
//! A commit puts its writes here (under the commit lock, in ticket order);
//! the writer removes them once their group is behind a barrier and in the
//! engine, unless a later commit wrote the key again. Readers look here
//! first and then in the engine, in that order: an entry that is gone from
//! here is already in the engine.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::engine::{KvIter, Write};
use super::types::StoreError;

/// The latest write of a key, and the ticket of the commit that made it.
struct Entry {
    ticket: u64,
    value: Option<Vec<u8>>,
}

#[derive(Default)]
pub(super) struct Overlay {
    map: RwLock<BTreeMap<Vec<u8>, Entry>>,
}

/// A key and its value, `None` for a removed key.
pub(super) type Change = (Vec<u8>, Option<Vec<u8>>);

impl Overlay {
    fn read(&self) -> RwLockReadGuard<'_, BTreeMap<Vec<u8>, Entry>> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, BTreeMap<Vec<u8>, Entry>> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The commit `ticket`'s writes, in order.
    pub fn insert(&self, ticket: u64, writes: &[Write]) {
        let mut map = self.write();
        for w in writes {
            let value = match w {
                Write::Put(_, v) => Some(v.clone()),
                Write::Remove(_) => None,
            };
            map.insert(w.key().to_vec(), Entry { ticket, value });
        }
    }

    /// Drops the entries of tickets up to `upto`, now in the engine; a key
    /// written again by a later commit stays. The overlay holds only what
    /// is queued or being written, so a pass over it costs about a group.
    pub fn remove_applied(&self, upto: u64) {
        self.write().retain(|_, e| e.ticket > upto);
    }

    /// `Some(value or None if removed)` when the overlay knows the key.
    pub fn get(&self, key: &[u8]) -> Option<Option<Vec<u8>>> {
        self.read().get(key).map(|e| e.value.clone())
    }

    /// `Some(whether it has a value)` when the overlay knows the key.
    pub fn contains(&self, key: &[u8]) -> Option<bool> {
        self.read().get(key).map(|e| e.value.is_some())
    }

    /// A copy of the changes in `start..end`, in key order.
    pub fn range(&self, start: &[u8], end: Option<&[u8]>) -> Vec<Change> {
        let end = end.map_or(Bound::Unbounded, Bound::Excluded);
        self.read().range::<[u8], _>((Bound::Included(start), end)).map(|(k, e)| (k.clone(), e.value.clone())).collect()
    }
}

/// The engine's pairs with the overlay's changes laid over them. Both
/// inputs in ascending key order, or both descending with `descending`.
pub(super) struct Merged {
    overlay: std::iter::Peekable<std::vec::IntoIter<Change>>,
    engine: std::iter::Peekable<KvIter>,
    descending: bool,
}

impl Merged {
    pub fn new(overlay: Vec<Change>, engine: KvIter, descending: bool) -> Merged {
        Merged { overlay: overlay.into_iter().peekable(), engine: engine.peekable(), descending }
    }
}

impl Iterator for Merged {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        use std::cmp::Ordering::*;
        loop {
            let order = match (self.overlay.peek(), self.engine.peek()) {
                (None, None) => return None,
                (Some(_), None) => Less,
                (None, Some(_)) | (Some(_), Some(Err(_))) => Greater,
                (Some((ok, _)), Some(Ok((ek, _)))) if self.descending => ek.cmp(ok),
                (Some((ok, _)), Some(Ok((ek, _)))) => ok.cmp(ek),
            };
            if order == Greater {
                return self.engine.next();
            }
            if order == Equal {
                self.engine.next(); // shadowed by the newer write
            }
            if let Some((k, Some(v))) = self.overlay.next() {
                return Some(Ok((k, v)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(pairs: &[(&str, &str)]) -> KvIter {
        let v: Vec<_> = pairs.iter().map(|(k, v)| Ok((k.as_bytes().to_vec(), v.as_bytes().to_vec()))).collect();
        Box::new(v.into_iter())
    }

    fn change(k: &str, v: Option<&str>) -> Change {
        (k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()))
    }

    fn keys(m: Merged) -> Vec<(String, String)> {
        m.map(|kv| {
            let (k, v) = kv.unwrap();
            (String::from_utf8(k).unwrap(), String::from_utf8(v).unwrap())
        })
        .collect()
    }

    #[test]
    fn overlay_changes_shadow_the_engine_and_removes_hide_keys() {
        let over = vec![change("a", Some("A2")), change("c", None), change("d", Some("D"))];
        let m = Merged::new(over, engine(&[("a", "A1"), ("b", "B"), ("c", "C")]), false);
        let want = [("a", "A2"), ("b", "B"), ("d", "D")];
        assert_eq!(keys(m), want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    #[test]
    fn descending_merge_yields_the_same_pairs_reversed() {
        let over = vec![change("d", Some("D")), change("c", None), change("a", Some("A2"))];
        let e = engine(&[("c", "C"), ("b", "B"), ("a", "A1")]);
        let want = [("d", "D"), ("b", "B"), ("a", "A2")];
        assert_eq!(keys(Merged::new(over, e, true)), want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    #[test]
    fn an_entry_rewritten_by_a_later_commit_stays_when_the_earlier_is_applied() {
        let o = Overlay::default();
        let w = |v: &str| vec![Write::Put(b"k".to_vec(), v.as_bytes().to_vec())];
        o.insert(1, &w("1"));
        o.insert(2, &w("2"));
        o.remove_applied(1);
        assert_eq!(o.get(b"k"), Some(Some(b"2".to_vec())));
        o.remove_applied(2);
        assert_eq!(o.get(b"k"), None);
    }
}
