//! The in-memory model engine: two ordered maps, what reads see and what a
//! power cut would leave. For property tests of the store.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use super::engine::{Engine, KvIter, Write};
use super::types::StoreError;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

#[derive(Default)]
struct State {
    /// Every group applied.
    visible: Map,
    /// Every group behind a barrier.
    durable: Map,
    /// Groups applied since the last barrier, in order.
    pending: Vec<Vec<Write>>,
}

/// An engine in memory whose "disk" is what the last barrier covered.
#[derive(Default)]
pub struct ModelEngine {
    state: Mutex<State>,
    barriers: AtomicU64,
}

impl ModelEngine {
    pub fn new() -> ModelEngine {
        ModelEngine::default()
    }

    /// What a power cut right now would leave: everything behind the last
    /// barrier, plus the first `keep` groups applied after it (a real disk
    /// may have kept some later writes, but only in order and whole).
    pub fn power_cut(&self, keep: usize) -> ModelEngine {
        let st = self.lock();
        let mut durable = st.durable.clone();
        for group in st.pending.iter().take(keep) {
            apply_to(&mut durable, group);
        }
        let state = State { visible: durable.clone(), durable, pending: Vec::new() };
        ModelEngine { state: Mutex::new(state), barriers: AtomicU64::new(0) }
    }

    /// Groups applied and not yet behind a barrier.
    pub fn pending_groups(&self) -> usize {
        self.lock().pending.len()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn apply_to(map: &mut Map, group: &[Write]) {
    for w in group {
        match w {
            Write::Put(k, v) => map.insert(k.clone(), v.clone()),
            Write::Remove(k) => map.remove(k),
        };
    }
}

impl Engine for ModelEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.lock().visible.get(key).cloned())
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        let end = end.map_or(Bound::Unbounded, Bound::Excluded);
        let st = self.lock();
        let pairs: Vec<_> = st
            .visible
            .range::<[u8], _>((Bound::Included(start), end))
            .map(|(k, v)| Ok((k.clone(), v.clone())))
            .collect();
        Box::new(pairs.into_iter())
    }

    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        let mut st = self.lock();
        apply_to(&mut st.visible, &group);
        st.pending.push(group);
        Ok(())
    }

    fn barrier(&self) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let st = &mut *guard;
        for group in st.pending.drain(..) {
            apply_to(&mut st.durable, &group);
        }
        self.barriers.fetch_add(1, Relaxed);
        Ok(())
    }

    fn bytes_written(&self) -> u64 {
        0
    }

    fn barriers(&self) -> u64 {
        self.barriers.load(Relaxed)
    }
}
