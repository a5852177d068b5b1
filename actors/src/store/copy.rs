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
//! **No `fdatasync` per group.** The log is durable, the copy need not be:
//! its groups are laid with barriers that only order them
//! (`SledEngine::with_unsynced_barriers`), which a crash of the process
//! cannot undo (the kernel still writes the page cache out) but a power
//! cut or a crash of the machine can. So before the first such group a
//! copy's directory gets a marker (`unsynced-since-boot`, synced) naming
//! the machine's boot (`/proc/sys/kernel/random/boot_id`); a clean close
//! syncs every segment and checkpoints, then removes it. A copy opened
//! with the marker of another boot may have lost writes a barrier had
//! covered: it is not read, but started again in the next generation, and
//! catches up (or bootstraps) as a node without a copy does. Where the
//! boot cannot be read, every barrier syncs as in a standalone relay.
//! Measured at 3 shards (performance journal, 2026-12-06): `fdatasync`
//! was ~45 % of the following copies' CPU samples, and the relay nodes
//! spent 8 % less CPU per send without it.
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
use super::sled_engine::{write_aside, SledEngine};
use super::types::StoreError;

const META: u8 = 0;
const APPLIED: &[u8] = b"\x00relay-copy/applied";
/// The log this is a copy of (its name and creation time): a stream
/// deleted and created again under the same name is another log.
const STREAM: &[u8] = b"\x00relay-copy/stream";
/// In a copy's directory while groups may be laid on it unsynced: the
/// boot they were laid in (module doc).
const UNSYNCED: &str = "unsynced-since-boot";

/// This boot of the machine, or `None` where the kernel does not say
/// (not Linux): then copies sync every barrier.
fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// Clones share the one copy (a checkpoint reads it beside the writer).
#[derive(Clone)]
pub(crate) struct LocalCopy {
    /// `None` once closed: the directory (sled's lock) is free for the
    /// next open, even while something still holds the store.
    engine: Arc<RwLock<Option<Arc<SledEngine>>>>,
    /// The copy's directory, its generations under it; `None`: temporary.
    dir: Option<PathBuf>,
    cache_bytes: u64,
    /// The machine's boot, when groups are laid without `fdatasync`.
    boot: Option<String>,
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

/// Opens the copy's engine in generation `dir`; with `boot`, its barriers
/// unsynced once the marker naming that boot is durable.
fn open_engine(dir: Option<&Path>, cache_bytes: u64, boot: Option<&str>) -> Result<SledEngine, StoreError> {
    let Some(dir) = dir else { return SledEngine::temporary() };
    let engine = SledEngine::open(dir, Some(cache_bytes))?;
    match boot {
        Some(boot) => {
            write_aside(dir, UNSYNCED, boot).map_err(|e| io("write the local copy's boot marker", e))?;
            Ok(engine.with_unsynced_barriers())
        }
        None => Ok(engine),
    }
}

/// Whether the copy in generation `at` was laid unsynced in another boot
/// than `boot` and not closed since: writes its barriers covered may be
/// lost. A marker that cannot be read counts as another boot's.
fn laid_in_another_boot(at: &Path, boot: Option<&str>) -> bool {
    match std::fs::read_to_string(at.join(UNSYNCED)) {
        Ok(laid_in) => boot != Some(laid_in.trim()),
        Err(e) => e.kind() != std::io::ErrorKind::NotFound,
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

/// Makes the generation after the newest under `dir` and removes the
/// others as far as it can.
fn next_generation(dir: &Path) -> Result<PathBuf, StoreError> {
    let next = newest(dir)?.map_or(1, |(n, _)| n + 1);
    let at = make_generation(dir, next)?;
    remove_others(dir, &at);
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
        LocalCopy::open_in_boot(dir, cache_bytes, boot_id())
    }

    /// [`LocalCopy::open`] in the machine's boot `boot` (tests give their own).
    pub(crate) fn open_in_boot(
        dir: Option<&Path>,
        cache_bytes: u64,
        boot: Option<String>,
    ) -> Result<LocalCopy, StoreError> {
        let mut at = dir.map(generation_dir).transpose()?;
        if let (Some(dir), Some(laid)) = (dir, &at) {
            if laid_in_another_boot(laid, boot.as_deref()) {
                tracing::warn!(copy = %laid.display(),
                    "the local copy was laid without fsync before the machine restarted: started again");
                at = Some(next_generation(dir)?);
            }
        }
        let engine = open_engine(at.as_deref(), cache_bytes, boot.as_deref())?;
        let engine = Arc::new(RwLock::new(Some(Arc::new(engine))));
        Ok(LocalCopy { engine, dir: dir.map(Path::to_path_buf), cache_bytes, boot })
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
        let at = self.dir.as_deref().map(next_generation).transpose()?;
        let engine = Arc::new(open_engine(at.as_deref(), self.cache_bytes, self.boot.as_deref())?);
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
        let Some(engine) = engine else { return Ok(()) };
        engine.close()?;
        // Closed, the copy is durable whole: a reboot may come.
        if self.boot.is_some() && self.dir.is_some() {
            let marker = engine.dir().join(UNSYNCED);
            match std::fs::remove_file(&marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io("remove the local copy's boot marker", e));
                }
                _ => std::fs::File::open(engine.dir())
                    .and_then(|d| d.sync_all())
                    .map_err(|e| io("remove the local copy's boot marker", e))?,
            }
        }
        Ok(())
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

    /// Laid without `fdatasync`, a copy is read again after its process
    /// died (the kernel kept its writes), but not after the machine
    /// restarted (a power cut may have taken writes its barriers covered):
    /// then it starts again, empty, in the next generation, and catches up
    /// as a new copy does. Closed cleanly, it is durable whole and read
    /// again after a reboot.
    #[test]
    fn an_unsynced_copy_outlives_its_process_but_not_a_reboot_unless_it_was_closed() {
        let dir = tempfile::tempdir().unwrap();
        let open = |boot: &str| LocalCopy::open_in_boot(Some(dir.path()), 1 << 20, Some(boot.to_owned())).unwrap();
        let lay = |copy: &mut LocalCopy| {
            copy.restart(b"S0 at 1").unwrap();
            let mut p = Pending::default();
            p.push(put(b"a", b"1"));
            copy.install(p, 5).unwrap();
        };
        let held = |copy: &LocalCopy| {
            (copy.applied().unwrap(), copy.stream().unwrap().is_some(), copy.range(b"", None).count())
        };
        let mut copy = open("boot-a");
        lay(&mut copy);
        drop(copy); // the process ends without closing it
        let copy = open("boot-a");
        assert_eq!(held(&copy), (5, true, 1), "the same boot: kept");
        drop(copy);
        let copy = open("boot-b");
        assert_eq!(held(&copy), (0, false, 0), "another boot: started again");
        drop(copy);

        let mut copy = open("boot-b");
        lay(&mut copy);
        copy.close().unwrap();
        drop(copy);
        let copy = open("boot-c");
        assert_eq!(held(&copy), (5, true, 1), "closed, then another boot: kept");
    }

    /// The barrier of an unsynced engine makes no `fdatasync` (the sled
    /// engine counts those), yet orders the groups for sled as any
    /// barrier does; its close syncs.
    #[test]
    fn an_unsynced_engines_barriers_make_no_fdatasync_and_its_close_does() {
        let dir = tempfile::tempdir().unwrap();
        let engine = SledEngine::open(dir.path(), Some(1 << 20)).unwrap().with_unsynced_barriers();
        let opened = engine.barriers();
        for i in 0..10u8 {
            engine.apply(vec![put(&[b'k', i], b"v")]).unwrap();
            engine.barrier().unwrap();
            engine.install().unwrap();
        }
        assert_eq!(engine.barriers(), opened, "no fdatasync for ten groups");
        assert_eq!(engine.get(&[b'k', 9]).unwrap().as_deref(), Some(&b"v"[..]));
        engine.close().unwrap();
        assert!(engine.barriers() > opened, "the close syncs");
        drop(engine);
        let again = SledEngine::open(dir.path(), Some(1 << 20)).unwrap();
        assert_eq!(again.range(b"k", None).count(), 10);
    }
}
