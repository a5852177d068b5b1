//! The storage seam: what the store needs from the engine underneath.
//!
//! An engine is an ordered key-value space with three write-side promises:
//! a group given to [`Engine::apply`] survives a crash whole or not at all;
//! groups survive in the order they were applied (a crash keeps a prefix);
//! and after [`Engine::barrier`] returns, every group applied before it
//! survives a power cut; after [`Engine::install`] reads see it. Reads may
//! or may not see a group before that: the store never asks (its overlay
//! answers for writes not yet installed).
//!
//! Engines: [`SledEngine`](super::SledEngine), the embedded default, and
//! [`ModelEngine`](super::ModelEngine), an in-memory model whose power cut
//! drops what follows the last barrier (property tests).

use std::any::Any;
use std::path::Path;

use super::types::StoreError;

/// One write of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    Put(Vec<u8>, Vec<u8>),
    Remove(Vec<u8>),
}

impl Write {
    pub fn key(&self) -> &[u8] {
        match self {
            Write::Put(k, _) | Write::Remove(k) => k,
        }
    }
}

/// Where a backup's copy of the store stands ([`Engine::backup`]; for
/// sled, `sled_engine.rs` step 8): everything the log held before `offset`
/// in `segment`, replayed from `replay_from`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackupPoint {
    pub replay_from: u64,
    pub segment: u64,
    pub offset: u64,
    /// Pairs copied from sled.
    pub pairs: u64,
    /// Segments hard-linked, and bytes copied (segments not linked).
    pub linked: u64,
    pub copied_bytes: u64,
    /// The data format of the copy (`format.rs`).
    pub format: u32,
}

/// Key-value pairs in key order (or reverse key order after `.rev()`).
pub type KvIter = Box<dyn DoubleEndedIterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send>;

/// What [`Engine::visit_range`] hands each pair to: `false` stops the walk.
pub type Visit<'a> = dyn FnMut(Result<(&[u8], &[u8]), StoreError>) -> bool + 'a;

pub trait Engine: Any + Send + Sync {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError>;

    /// Whether `key` has a value, without reading it (an event pointer is
    /// not followed into the log).
    fn contains(&self, key: &[u8]) -> Result<bool, StoreError> {
        Ok(self.get(key)?.is_some())
    }

    /// Pairs with `start <= key < end` (no upper bound when `end` is `None`).
    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter;

    /// The pairs of [`Engine::range`] in ascending key order, each handed
    /// to `visit` with its value lent rather than copied where the engine
    /// can (sled: the bytes of a mapped log segment); `visit` returns
    /// `false` to stop. For a reader of every value once (the audit), whose
    /// CPU a fresh buffer per value raised by about 6 %. An item's `Err` is
    /// what `range` would yield there; the walk goes on after it.
    fn visit_range(&self, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        for kv in self.range(start, end) {
            let go = match kv {
                Ok((k, v)) => visit(Ok((&k, &v))),
                Err(e) => visit(Err(e)),
            };
            if !go {
                break;
            }
        }
        Ok(())
    }

    /// Writes one group: atomic, ordered after every group applied before,
    /// not yet durable. Only the store's writer thread calls this.
    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError>;

    /// One real durability barrier covering every group applied so far.
    /// Only the store's writer thread calls this.
    fn barrier(&self) -> Result<(), StoreError>;

    /// After a barrier: makes the groups it covered visible to reads. Split
    /// from the barrier so the store can report them durable first (its
    /// overlay answers reads until this returns). Only the writer calls it.
    fn install(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Called once by the writer when the store closes, after the last
    /// barrier: leave the data in its quickest state to open.
    fn close(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Reclaims the space of values no longer referenced now rather than
    /// bit by bit between groups (tests, benches). Any thread may call it:
    /// the engine orders it with the writer's calls. Nothing to do for an
    /// engine without a value log.
    fn compact_now(&self) -> Result<(), StoreError> {
        Ok(())
    }

    /// Writes a copy of the store, as of a moment between two groups, into
    /// the new directory `out`, while commits go on; the copy opens as a
    /// store of its own. Any thread may call it.
    fn backup(&self, _out: &Path) -> Result<BackupPoint, StoreError> {
        Err(StoreError::Unsupported("this engine keeps no files of its own to back up"))
    }

    /// Bytes this engine wrote for groups and barriers so far (its own
    /// log; what the engine underneath adds is not seen here).
    fn bytes_written(&self) -> u64;

    /// Real barriers (fsync/fdatasync) so far, checkpoints included.
    fn barriers(&self) -> u64;
}
