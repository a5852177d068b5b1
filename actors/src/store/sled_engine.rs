//! sled 0.34 behind a write-ahead log of our own.
//!
//! sled 0.34 never calls fsync on its write path (`Db::flush` is a `pwrite`
//! and `sync_file_range`, which a power cut can undo), and every
//! `apply_batch` seals its log buffer, so a batch per group would still cost
//! a synced write per group. So sled is not asked for durability at all:
//!
//! 1. `apply` encodes the group as one record (`wal.rs`) and appends it to
//!    `wal` in sled's directory with one `write`.
//! 2. `barrier` calls `fdatasync` on the log, then inserts the groups'
//!    writes into sled one by one, without a batch and without a flush.
//!    sled only ever holds groups that are already behind a barrier, so
//!    whatever part of them sled itself keeps after a crash, the log has
//!    them whole.
//! 3. A checkpoint, when the log passes [`CHECKPOINT_BYTES`], on open and
//!    on close: `Db::flush`, fsync of every file of sled's and of its
//!    directories, then the log is truncated (and synced). A crash between
//!    the two replays a log whose effects sled already has: puts and removes
//!    replayed in order end in the same state.
//! 4. Open: sled recovers, the log's valid prefix is replayed into it in
//!    order (a torn or checksum-bad record ends it), then a checkpoint.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};

use super::engine::{Engine, KvIter, Write};
use super::{wal, StoreError};

/// The log is folded into sled and truncated past this size: it bounds both
/// the replay on open and the disk the log takes.
pub const CHECKPOINT_BYTES: u64 = 64 << 20;

const WAL_FILE: &str = "wal";

pub struct SledEngine {
    db: sled::Db,
    dir: PathBuf,
    log: Mutex<Log>,
    bytes: AtomicU64,
    barriers: AtomicU64,
}

struct Log {
    file: File,
    len: u64,
    /// Groups in the log, not yet in sled.
    pending: Vec<Vec<Write>>,
    buf: Vec<u8>,
}

/// How long an open waits for sled's file lock before reporting it held.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Opens sled, retrying while its file lock is held. Dropping a `Db` does
/// not release the lock at once: sled's background pool may still hold the
/// page cache for a moment (sled's own tests block on the lock for this
/// reason), so a reopen in the same process right after a close can find it
/// taken. Another running relay still holds it after the wait:
/// [`StoreError::InUse`]. (sled says so only in its error's text.)
fn open_waiting_for_lock(config: &sled::Config) -> Result<sled::Db, StoreError> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::InUse(e.to_string()));
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            other => return Ok(other?),
        }
    }
}

impl SledEngine {
    /// Opens sled in `dir` (created if missing) and replays the log.
    pub fn open(dir: &Path, cache_bytes: Option<u64>) -> Result<SledEngine, StoreError> {
        SledEngine::open_inner(dir, cache_bytes, false)
    }

    /// A store in a fresh directory that sled removes on drop (tests): in
    /// `/dev/shm` where it exists, as sled's own temporary databases.
    pub fn temporary() -> Result<SledEngine, StoreError> {
        use std::sync::atomic::AtomicUsize;
        static N: AtomicUsize = AtomicUsize::new(0);
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let dir = base.join(format!("relay-store.{}.{nanos}.{}", std::process::id(), N.fetch_add(1, Relaxed)));
        SledEngine::open_inner(&dir, None, true)
    }

    fn open_inner(dir: &Path, cache_bytes: Option<u64>, temporary: bool) -> Result<SledEngine, StoreError> {
        let mut config = sled::Config::new().path(dir).temporary(temporary).flush_every_ms(None);
        if let Some(bytes) = cache_bytes {
            config = config.cache_capacity(bytes);
        }
        let db = open_waiting_for_lock(&config)?;
        let path = dir.join(WAL_FILE);
        let mut file = OpenOptions::new().read(true).append(true).create(true).open(&path).map_err(io("open log"))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io("read log"))?;
        let decoded = wal::decode(&bytes);
        if decoded.valid_len < bytes.len() {
            tracing::warn!(
                valid = decoded.valid_len,
                len = bytes.len(),
                "event store log ends in a torn or damaged record; replaying the records before it"
            );
        }
        for group in &decoded.groups {
            insert_all(&db, group)?;
        }
        let engine = SledEngine {
            db,
            dir: dir.to_path_buf(),
            log: Mutex::new(Log { file, len: bytes.len() as u64, pending: Vec::new(), buf: Vec::new() }),
            bytes: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
        };
        // Also makes the log file's own directory entry durable.
        engine.checkpoint(&mut engine.lock())?;
        Ok(engine)
    }

    pub fn db(&self) -> &sled::Db {
        &self.db
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Step 3 of the module doc. The caller holds the log, so no group is
    /// between the log and sled.
    fn checkpoint(&self, log: &mut Log) -> Result<(), StoreError> {
        debug_assert!(log.pending.is_empty());
        self.db.flush()?;
        let synced = sync_tree(&self.dir).map_err(io("sync sled's files"))?;
        log.file.set_len(0).map_err(io("truncate log"))?;
        log.file.sync_all().map_err(io("sync log"))?;
        log.len = 0;
        self.barriers.fetch_add(synced + 1, Relaxed);
        Ok(())
    }
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> StoreError {
    move |e| StoreError::Io(format!("{what}: {e}"))
}

fn insert_all(db: &sled::Db, group: &[Write]) -> Result<(), StoreError> {
    for w in group {
        match w {
            Write::Put(k, v) => db.insert(k.as_slice(), v.as_slice())?,
            Write::Remove(k) => db.remove(k.as_slice())?,
        };
    }
    Ok(())
}

/// fsync of every file and directory under `dir` except the log; returns
/// how many were synced.
fn sync_tree(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        if kind.is_dir() {
            n += sync_tree(&entry.path())?;
        } else if kind.is_file() && entry.file_name() != WAL_FILE {
            File::open(entry.path())?.sync_all()?;
            n += 1;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(n + 1)
}

impl Engine for SledEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db.get(key)?.map(|v| v.to_vec()))
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        let iter = match end {
            Some(end) => self.db.range(start..end),
            None => self.db.range(start..),
        };
        Box::new(iter.map(|kv| {
            let (k, v) = kv?;
            Ok((k.to_vec(), v.to_vec()))
        }))
    }

    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let log = &mut *guard;
        log.buf.clear();
        wal::encode(&group, &mut log.buf);
        log.file.write_all(&log.buf).map_err(io("append to log"))?;
        log.len += log.buf.len() as u64;
        self.bytes.fetch_add(log.buf.len() as u64, Relaxed);
        log.pending.push(group);
        Ok(())
    }

    fn barrier(&self) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let log = &mut *guard;
        log.file.sync_data().map_err(io("sync log"))?;
        self.barriers.fetch_add(1, Relaxed);
        Ok(())
    }

    /// sled only ever receives groups behind a barrier (module doc).
    fn install(&self) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let log = &mut *guard;
        for group in log.pending.drain(..) {
            insert_all(&self.db, &group)?;
        }
        if log.len > CHECKPOINT_BYTES {
            self.checkpoint(log)?;
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.checkpoint(&mut self.lock())
    }

    fn bytes_written(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn barriers(&self) -> u64 {
        self.barriers.load(Relaxed)
    }
}
