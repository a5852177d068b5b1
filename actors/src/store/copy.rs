//! A node's local copy of a shard (`jetstream.rs`): the shard's pairs on
//! this node's disk, in the sled engine of a standalone relay
//! (`sled_engine.rs`: events and blobs in its own log, sled holding
//! pointers to them, so sled's memory follows the number of keys, not
//! their bytes), and the last stream sequence they reflect.
//!
//! Every group laid on the copy also writes the applied sequence, and the
//! sled engine keeps a group whole or not at all, and groups in order: the
//! copy is always the shard as of some sequence of its log. The log
//! (JetStream) is what makes a commit durable; a copy that a crash left
//! behind simply catches up from its sequence.
//!
//! Its own records (the applied sequence, the log it is a copy of) are
//! keys under [`META`], below every key the store writes (`codec.rs`:
//! `b`, `e`, `k`, `p`, `s`), and never shown to reads.
//!
//! A copy started again ([`LocalCopy::restart`]) is laid in a directory of
//! its own, the next *generation* (`copy-<n>` under the copy's directory;
//! the newest is the copy), never in the old one emptied: an engine of the
//! old copy can outlive its close while a read still holds it, and it
//! writes its files as it goes; written into the old copy's emptied and
//! remade directory, they corrupted the new copy's sled (`Read corrupted
//! data`, seen after a `kill -9` in the cluster's fault tests). Older
//! generations are removed as far as they can be, the rest at the next
//! restart or open. A copy laid before generations (its files right in the
//! directory) is generation 0, the directory itself.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use super::engine::{Engine, KvIter, Write};
use super::sled_engine::SledEngine;
use super::types::StoreError;

const META: u8 = 0;
const APPLIED: &[u8] = b"\x00relay-copy/applied";
/// The log this is a copy of (its name and creation time): a stream
/// deleted and created again under the same name is another log.
const STREAM: &[u8] = b"\x00relay-copy/stream";

/// Clones share the one copy (a checkpoint reads it beside the writer).
#[derive(Clone)]
pub(crate) struct LocalCopy {
    /// `None` once closed: the directory (sled's lock) is free for the
    /// next open, even while something still holds the store.
    engine: Arc<RwLock<Option<Arc<SledEngine>>>>,
    /// The copy's directory, its generations under it; `None`: temporary.
    dir: Option<PathBuf>,
    cache_bytes: u64,
}

/// Writes to lay on a copy, in order.
#[derive(Default)]
pub(crate) struct Pending {
    writes: Vec<Write>,
    /// Bytes of keys and values.
    pub bytes: usize,
}

impl Pending {
    pub fn push(&mut self, w: Write) {
        self.bytes += match &w {
            Write::Put(k, v) => k.len() + v.len(),
            Write::Remove(k) => k.len(),
        };
        self.writes.push(w);
    }
}

fn open_engine(dir: Option<&Path>, cache_bytes: u64) -> Result<SledEngine, StoreError> {
    match dir {
        Some(dir) => SledEngine::open(dir, Some(cache_bytes)),
        None => SledEngine::temporary(),
    }
}

/// A generation's directory name: this, then its number.
const GENERATION: &str = "copy-";

fn io(what: &str, e: std::io::Error) -> StoreError {
    StoreError::Io(format!("{what}: {e}"))
}

/// The newest generation under `dir` (number and directory): `None` when
/// there is none, whether `dir` is empty or holds a copy laid before
/// generations.
fn newest(dir: &Path) -> Result<Option<(u64, PathBuf)>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("read the local copy's directory", e)),
    };
    let mut newest = None;
    for entry in entries {
        let entry = entry.map_err(|e| io("read the local copy's directory", e))?;
        let n = entry.file_name().to_str().and_then(|name| name.strip_prefix(GENERATION)?.parse::<u64>().ok());
        if let Some(n) = n.filter(|n| newest.as_ref().is_none_or(|(m, _)| n > m)) {
            newest = Some((n, entry.path()));
        }
    }
    Ok(newest)
}

/// Makes generation `n` under `dir`, its entry durable before the copy
/// lives in it.
fn make_generation(dir: &Path, n: u64) -> Result<PathBuf, StoreError> {
    let at = dir.join(format!("{GENERATION}{n}"));
    std::fs::create_dir_all(&at).map_err(|e| io("make the local copy's directory", e))?;
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| io("make the local copy's directory", e))?;
    Ok(at)
}

/// Removes what `dir` holds besides generation `keep`, as far as it can
/// (an engine of an older generation may still be writing in its own
/// directory); what is left goes next time.
fn remove_others(dir: &Path, keep: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let path = entry.path();
        if path == keep {
            continue;
        }
        let removed = match entry.file_type() {
            Ok(t) if t.is_dir() => std::fs::remove_dir_all(&path),
            _ => std::fs::remove_file(&path),
        };
        if let Err(e) = removed {
            tracing::debug!(path = %path.display(), error = %e, "an older local copy is left for next time");
        }
    }
}

/// Where the copy under `dir` lives, made if need be: its newest
/// generation; `dir` itself for a copy laid before generations; a first
/// generation for a new copy.
fn generation_dir(dir: &Path) -> Result<PathBuf, StoreError> {
    if let Some((_, at)) = newest(dir)? {
        remove_others(dir, &at);
        return Ok(at);
    }
    let holds_files = std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    match holds_files {
        true => Ok(dir.to_path_buf()),
        false => {
            std::fs::create_dir_all(dir).map_err(|e| io("make the local copy's directory", e))?;
            make_generation(dir, 1)
        }
    }
}

impl LocalCopy {
    /// Opens the copy in `dir` (created if missing), or, without one, a
    /// temporary copy that is removed when dropped (a read-only open: the
    /// audit; tests). sled's page cache is bounded by `cache_bytes`.
    pub fn open(dir: Option<&Path>, cache_bytes: u64) -> Result<LocalCopy, StoreError> {
        let at = dir.map(generation_dir).transpose()?;
        let engine = Arc::new(RwLock::new(Some(Arc::new(open_engine(at.as_deref(), cache_bytes)?))));
        Ok(LocalCopy { engine, dir: dir.map(Path::to_path_buf), cache_bytes })
    }

    fn engine(&self) -> Result<Arc<SledEngine>, StoreError> {
        self.engine.read().unwrap_or_else(|e| e.into_inner()).clone().ok_or(StoreError::Closed)
    }

    /// The last stream sequence the pairs reflect (0: none, an empty copy).
    pub fn applied(&self) -> Result<u64, StoreError> {
        Ok(self.engine()?.get(APPLIED)?.map_or(0, |v| v.as_slice().try_into().map_or(0, u64::from_be_bytes)))
    }

    /// The log this copy follows, as [`LocalCopy::restart`] named it.
    pub fn stream(&self) -> Result<Option<Vec<u8>>, StoreError> {
        self.engine()?.get(STREAM)
    }

    /// Starts the copy again, empty, in the next generation, and names the
    /// log it will follow, at sequence 0. A crash before the copy is filled
    /// again leaves a copy at 0 or with no log: it is started again.
    pub fn restart(&mut self, stream: &[u8]) -> Result<(), StoreError> {
        self.close()?;
        let at = match &self.dir {
            Some(dir) => {
                let next = newest(dir)?.map_or(1, |(n, _)| n + 1);
                let at = make_generation(dir, next)?;
                remove_others(dir, &at);
                Some(at)
            }
            None => None,
        };
        let engine = Arc::new(open_engine(at.as_deref(), self.cache_bytes)?);
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = Some(engine);
        let mut named = Pending::default();
        named.push(Write::Put(STREAM.to_vec(), stream.to_vec()));
        self.install(named, 0)
    }

    /// Lays `pending` on the copy, with the sequence it brings it to, as one
    /// group: after a crash the copy has it whole or not at all. `applied`
    /// 0 writes the pairs without moving the sequence (a bootstrap's pairs,
    /// consistent only once the log after it is laid on them too). Called
    /// by one thread at a time (the engine's writer, or its open).
    pub fn install(&self, mut pending: Pending, applied: u64) -> Result<(), StoreError> {
        if applied != 0 {
            pending.push(Write::Put(APPLIED.to_vec(), applied.to_be_bytes().to_vec()));
        }
        if pending.writes.is_empty() {
            return Ok(());
        }
        let engine = self.engine()?;
        engine.apply(pending.writes)?;
        engine.barrier()?;
        engine.install()
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.engine()?.get(key)
    }

    /// Pairs with `start <= key < end`, as the sled engine reads them (it
    /// sees writes installed while it runs); never the copy's records.
    pub fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        if end.is_some_and(|end| end <= start) {
            return Box::new(std::iter::empty());
        }
        let pairs = match self.engine() {
            Ok(engine) => engine.range(start, end),
            Err(e) => return Box::new(std::iter::once(Err(e))),
        };
        if start.first().is_some_and(|b| *b > META) {
            return pairs;
        }
        Box::new(pairs.filter(|kv| !kv.as_ref().is_ok_and(|(k, _)| k.first() == Some(&META))))
    }

    /// Leaves the copy in its quickest state to open (the sled engine's
    /// close) and lets it go: reads and writes fail from here on, and the
    /// directory opens again once the last read under way has ended.
    pub fn close(&self) -> Result<(), StoreError> {
        let engine = self.engine.write().unwrap_or_else(|e| e.into_inner()).take();
        match engine {
            Some(engine) => engine.close(),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &[u8], v: &[u8]) -> Write {
        Write::Put(k.to_vec(), v.to_vec())
    }

    #[test]
    fn a_copys_pairs_and_its_applied_sequence_are_installed_together_and_reads_never_see_its_records() {
        let dir = tempfile::tempdir().unwrap();
        let mut copy = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(copy.applied().unwrap(), 0);
        copy.restart(b"S0 at 1").unwrap();
        let mut p = Pending::default();
        p.push(put(b"a", b"1"));
        p.push(put(b"b", b"2"));
        p.push(Write::Remove(b"a".to_vec()));
        copy.install(p, 7).unwrap();
        assert_eq!(copy.applied().unwrap(), 7);
        assert_eq!(copy.get(b"a").unwrap(), None);
        assert_eq!(copy.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        let all: Vec<_> = copy.range(b"", None).map(Result::unwrap).collect();
        assert_eq!(all, [(b"b".to_vec(), b"2".to_vec())]);
        let rev: Vec<_> = copy.range(b"", Some(b"c")).rev().map(|kv| kv.unwrap().0).collect();
        assert_eq!(rev, [b"b".to_vec()]);
        assert_eq!(copy.range(b"b", Some(b"a")).count(), 0, "crossed ends hold nothing");
        // A bootstrap's pairs do not move the sequence.
        let mut p = Pending::default();
        p.push(put(b"c", b"3"));
        copy.install(p, 0).unwrap();
        assert_eq!(copy.applied().unwrap(), 7);
        assert_eq!(copy.stream().unwrap().as_deref(), Some(&b"S0 at 1"[..]));
        // Opened again: the same copy.
        copy.close().unwrap();
        drop(copy);
        let mut copy = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!((copy.applied().unwrap(), copy.range(b"", None).count()), (7, 2));
        copy.restart(b"S0 at 2").unwrap();
        assert_eq!((copy.applied().unwrap(), copy.range(b"", None).count()), (0, 0));
        assert_eq!(copy.stream().unwrap().as_deref(), Some(&b"S0 at 2"[..]));
        // Closed, it lets the directory go while a clone is still held.
        let held = copy.clone();
        copy.close().unwrap();
        assert!(matches!(held.get(b"b"), Err(StoreError::Closed)));
        let again = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(again.stream().unwrap().as_deref(), Some(&b"S0 at 2"[..]));
    }

    /// An engine of the old copy that a read still holds when the copy
    /// starts again writes on, and closes, in its own generation: the new
    /// copy opens again with exactly what was laid on it.
    #[test]
    fn a_copy_started_again_is_laid_apart_from_an_old_engine_still_writing() {
        let dir = tempfile::tempdir().unwrap();
        let mut copy = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        copy.restart(b"S0 at 1").unwrap();
        let mut p = Pending::default();
        p.push(put(b"a", b"old"));
        copy.install(p, 5).unwrap();
        let old = copy.engine().unwrap();

        copy.restart(b"S0 at 2").unwrap();
        let mut p = Pending::default();
        p.push(put(b"b", b"new"));
        copy.install(p, 3).unwrap();
        // The old engine goes on as far as it can (its generation may be
        // removed under it already: what it writes is lost either way).
        for i in 0..200u32 {
            let _ = old.apply(vec![put(&i.to_be_bytes(), &[7; 1024])]).and_then(|()| old.barrier());
            let _ = old.install();
        }
        let _ = old.close();
        drop(old);
        copy.close().unwrap();
        drop(copy);

        let again = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(again.stream().unwrap().as_deref(), Some(&b"S0 at 2"[..]));
        assert_eq!(again.applied().unwrap(), 3);
        let keys: Vec<_> = again.range(b"", None).map(|kv| kv.unwrap().0).collect();
        assert_eq!(keys, [b"b".to_vec()]);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["copy-3"], "the older generations went");
    }

    /// A copy laid before generations (its files right in the directory)
    /// opens as it is, and its first restart leaves only the new generation.
    #[test]
    fn a_copy_laid_before_generations_opens_and_its_restart_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let engine = SledEngine::open(dir.path(), Some(1 << 20)).unwrap();
        engine.apply(vec![put(STREAM, b"S0 at 1"), put(APPLIED, &9u64.to_be_bytes()), put(b"a", b"1")]).unwrap();
        engine.barrier().unwrap();
        engine.install().unwrap();
        engine.close().unwrap();
        drop(engine);

        let mut copy = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!((copy.applied().unwrap(), copy.range(b"", None).count()), (9, 1));
        copy.restart(b"S0 at 2").unwrap();
        assert_eq!((copy.applied().unwrap(), copy.range(b"", None).count()), (0, 0));
        copy.close().unwrap();
        drop(copy);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["copy-1"]);
        let again = LocalCopy::open(Some(dir.path()), 1 << 20).unwrap();
        assert_eq!(again.stream().unwrap().as_deref(), Some(&b"S0 at 2"[..]));
    }
}
