//! sled 0.34 behind a log of our own, which also holds the events' bytes.
//!
//! sled 0.34 never calls fsync on its write path (`Db::flush` is a `pwrite`
//! and `sync_file_range`, which a power cut can undo), and every
//! `apply_batch` seals its log buffer, so a batch per group would still cost
//! a synced write per group. So sled is not asked for durability at all:
//!
//! 1. `apply` encodes the group as one record (`wal.rs`) and appends it to
//!    the current segment of the log (`log/<16 hex digits>` in sled's
//!    directory) with one `write`.
//! 2. `barrier` calls `fdatasync` on the segment; `install` then inserts the
//!    groups' writes into sled one by one, without a batch and without a
//!    flush. sled only ever holds groups that are already behind a barrier,
//!    so whatever part of them sled itself keeps after a crash, the log has
//!    them whole. (A cluster's local copy, durable elsewhere, has barriers
//!    without the `fdatasync`: [`SledEngine::with_unsynced_barriers`].)
//! 3. **Values stay in the log.** An event's value (`hash ‖ body`, the bulk
//!    of what a send writes) goes into sled as a 20-byte pointer to its bytes
//!    in the segment (`segment ‖ offset ‖ len`, big-endian), read back with
//!    `pread`. sled 0.34 logs every insert and rewrites a leaf whole every
//!    few updates to it, with values inline: leaves of pointers keep those
//!    rewrites small (the disk bytes per send in docs/performance-journal.md). Every event
//!    installed from a segment is a pointer; a store written before the
//!    value log has its events inline, and those are never 20 bytes long
//!    (a 32-byte hash and a body), so the length tells them apart and such a
//!    store opens as it is. Blobs (`codec.rs`: kv entries read by key
//!    alone, the idempotency ledger) are pointers by the same rule; no store
//!    from before the value log has any. Other values (kv entries scanned by
//!    range, snapshots) are small or overwritten, and stay inline. A store
//!    written by this version cannot be read by an earlier one.
//! 4. A checkpoint, when the segment passes [`CHECKPOINT_BYTES`], on open
//!    and on close: a new segment is started (its directory entry synced),
//!    then `Db::flush`, fsync of every file of sled's and of its
//!    directories, then `log/replay-from` names the new segment (written
//!    aside, synced, renamed). Past the size, only the new segment is
//!    started on the writer; the rest runs on a thread beside it, so
//!    commits do not wait for it. A segment before `replay-from` is only
//!    read through pointers, and removed by compaction (step 7) once none
//!    points into it. A crash before the rename replays segments
//!    whose effects sled already has: puts and removes replayed in order
//!    end in the same state.
//! 5. Open: sled recovers; a store's `wal` file from before segments is
//!    replayed into sled (values inline) and removed at the checkpoint; the
//!    segments from `replay-from` on are synced (a crash may have left an
//!    unsynced tail, which must be durable before sled points into it) and
//!    replayed in order up to the first torn or checksum-bad record; then a
//!    checkpoint, which starts a new segment when the last one is not empty
//!    (so nothing is ever appended after a torn record). A log that no crash
//!    of this engine could leave (a missing or skipped segment, records
//!    after a damaged one, records in both `wal` and segments) is refused
//!    rather than replayed out of order.
//! 6. A blob lookup that misses (a new message's ledger entry) is answered
//!    by a filter of the blob keys sled holds (`filter.rs`) when it can: the
//!    keys replayed and installed go in as sled gets them, those already in
//!    sled by a scan that starts when the open ends and runs beside the
//!    writer. Until it ends, every lookup goes to sled.
//! 7. **Compaction**: retention removes events and blobs, so old segments
//!    fill with dead values. The engine knows each segment's live bytes,
//!    the value bytes sled's pointers name (`compact.rs`: `install` learns
//!    what each insert or remove replaced from sled's return value; what
//!    sled held at open is counted by a scan beside the writer, and nothing
//!    is compacted before it ends). A victim is a segment before
//!    `replay-from` (never replayed, so no replay points into it again)
//!    with no live bytes, or with dead bytes over half its length and at
//!    least `CHECKPOINT_BYTES / 64` (1 MiB: a copy must pay for itself);
//!    the lowest live share first. On the writer thread:
//!    1. After each group's install, one step within `Budget::TURN` (256
//!       lookups in sled, 256 KiB copied, 64 records read: the pause it
//!       adds to the next group) walks the victim's records in order. A
//!       put whose key sled still points at that very place is live: it is
//!       copied as a put of the same key with the same bytes.
//!    2. The copies go to the log as one ordinary record, appended at that
//!       point, where every record before it is installed in sled and none
//!       after it: each copy is its key's value as of its place in the log.
//!       Every write after it, such as a commit's `Remove` of that key
//!       (applied next, or already in the overlay), comes after it in the
//!       log, in sled and in any replay, so a removal is never undone by a
//!       copy of the old value: the copy just dies with it.
//!    3. The record rides in the next group's barrier and is installed
//!       before that group, as any group is (the pointers then name the
//!       copies; the old ones count as dead).
//!    4. When the walk reaches the victim's end (or a torn record, after
//!       which nothing was ever installed) and its last copies are in sled,
//!       no pointer names it: a pointer only ever names the record it was
//!       installed from. It waits for a checkpoint that starts after that:
//!       its flush makes sled's state without such pointers durable, and
//!       once replay-from is synced the victim is removed, then the log's
//!       directory synced. Victims holding a quarter of `CHECKPOINT_BYTES`
//!       start a checkpoint early.
//!
//!    A crash before the copies' record is synced loses only copies; one
//!    before the checkpoint moved replay-from either replays the copies or
//!    finds their pointers durable, with the victim still there; one after
//!    it finds no pointer into the victim, and a victim left behind has no
//!    live bytes at the next open. A read that took a pointer just before
//!    its value moved and its file went asks sled again.
//! 8. **Backup** ([`SledEngine::backup`]), while commits go on: a fuzzy
//!    copy of sled made whole by the log, as an open after a crash is.
//!    1. No checkpoint starts until the copy ends, so no segment is
//!       started or removed but by one already running. That one only
//!       moves replay-from forward to a segment that stays (replaying from
//!       the replay-from read here, or from the later one, ends the same),
//!       and removes victims drained before it began, which no pointer
//!       names any more: the copy skips a segment gone meanwhile.
//!    2. Closed segments are never written again: hard-linked into the
//!       copy (copied across filesystems).
//!    3. Every pair sled holds is inserted into a fresh sled in the copy,
//!       while installs go on: each key is seen with its value at some
//!       moment of the walk, a pointer into the log or a value inline.
//!    4. The point: under the log's lock (between two groups), where the
//!       first group not yet installed starts in the current segment.
//!       Everything before it is behind a barrier, and every pointer the
//!       walk saw names bytes before it.
//!    5. The current segment up to the point is copied; the copy's
//!       replay-from is the store's. Its open replays every group from
//!       replay-from to the point over the walked pairs, in order: a key
//!       written in that span ends with its last write there, one not
//!       written was seen by the walk with its value as of replay-from.
//!       So the copy is the store exactly as of the point, and every
//!       commit durable before the backup started is in it.
//! 9. **sled rewritten** ([`SledEngine::rewrite_now`]): sled 0.34 reclaims
//!    little of what removals free and its file never shrinks (it grew
//!    ~6 KB per send in the retention soaks, docs/performance-journal.md),
//!    while a fresh sled holding the same pairs is several times smaller.
//!    Once its `db` file passes [`REWRITE_GROWTH`] times its size after the
//!    last rewrite (and [`REWRITE_FLOOR`]), a thread beside the writer
//!    builds a fresh sled in `tree.<n>` and swaps it in, as a backup is
//!    made whole (step 8), with checkpoints held throughout so
//!    replay-from stays put:
//!    1. every pair of the live sled is copied in, installs going on;
//!    2. the log from replay-from to the point P1 (where the first group
//!       not yet installed starts) is replayed over the copy, beside the
//!       writer;
//!    3. under the log's lock (between two groups): the log from P1 to
//!       the point now is replayed, the copy flushed, and it becomes the
//!       engine's sled; groups installed from here go into it alone;
//!    4. its files are synced, `FORMAT` says at least 2, and the file `tree` names
//!       it (written aside, synced, renamed, directory synced);
//!    5. the old sled's files are removed.
//!
//!    A crash before 4 opens the old sled, whose state is at least the
//!    checkpoint's that wrote replay-from, and replays every group since:
//!    what the copy got after the swap is in the log. One after opens the
//!    copy, durable as of the swap, and replays the same groups, whose
//!    effects it may already have. An open removes whatever `tree` does not
//!    name (a copy never swapped in, the old sled's files).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write as _};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use memmap2::Mmap;

use super::compact::{parse_pointer, pointed, pointer, Accounts, Budget, LogSpace, Walk, POINTER_LEN, SCAN_CHUNK};
use super::engine::{BackupPoint, Engine, KvIter, Visit, Write};
use super::filter::{KeyFilter, FILTER_BYTES};
use super::types::StoreError;
use super::writer::lock;
use super::{codec, format, wal};

/// A segment is closed by a checkpoint past this size: it bounds the replay
/// on open.
pub const CHECKPOINT_BYTES: u64 = 64 << 20;

/// sled's file is rewritten (step 9) once it is this many times its size
/// after the last rewrite: it stays within this factor of a fresh copy,
/// and a rewrite (a walk of every pair) is paid once per this much growth.
pub const REWRITE_GROWTH: u64 = 3;
/// ... and never below this size, where a rewrite would not pay.
pub const REWRITE_FLOOR: u64 = 256 << 20;
/// A rewrite's copy is flushed (not synced) once per this many pairs.
const COPY_FLUSH_EVERY: u64 = 1 << 16;
/// The writer looks at sled's file size once per this many installs.
const REWRITE_LOOK_EVERY: u64 = 512;
/// The file naming the directory sled lives in, once rewritten (step 9).
const TREE_FILE: &str = "tree";
/// Directories of rewritten trees: `tree.<n>`.
const TREE_PREFIX: &str = "tree.";
/// The format of a store whose sled is in `tree.<n>` (step 9).
const TREE_FORMAT: u32 = 2;

/// The write-ahead log of stores written before segments.
const LEGACY_WAL: &str = "wal";
const LOG_DIR: &str = "log";
const REPLAY_FROM: &str = "replay-from";
/// Open segment files kept for reads; past it the least used are closed.
const READERS_KEPT: usize = 128;

type Readers = quick_cache::unsync::Cache<u64, Arc<Reader>>;

fn readers() -> Mutex<Readers> {
    Mutex::new(Readers::new(READERS_KEPT))
}

pub struct SledEngine {
    /// sled, and the directory it lives in (step 9 swaps both).
    tree: Arc<RwLock<Tree>>,
    dir: PathBuf,
    cache_bytes: Option<u64>,
    segments: Arc<Segments>,
    log: Arc<Mutex<Log>>,
    checkpoint_bytes: u64,
    bytes: AtomicU64,
    barriers: Arc<AtomicU64>,
    /// The checkpoint running beside the writer (`checkpoint_beside`).
    checkpointing: Mutex<Option<JoinHandle<Result<(), StoreError>>>>,
    hold: Option<Arc<dyn Fn() + Send + Sync>>,
    /// The blob keys sled holds (step 6).
    blobs: Arc<KeyFilter>,
    /// Live bytes per segment (step 7); `install` holds it while it
    /// inserts, the open's scan while it counts a chunk. Taken after `log`.
    accounts: Arc<Mutex<Accounts>>,
    /// The scans beside the writer that started when the open ended (the
    /// blob filter's, the live bytes'): told to stop and joined on drop.
    scans: Vec<(Arc<AtomicBool>, JoinHandle<()>)>,
    /// Value bytes compaction copied.
    compacted: AtomicU64,
    /// The longest step the writer took between groups, in µs.
    longest_step_us: AtomicU64,
    /// A backup (step 8) or a rewrite of sled (step 9) runs: no checkpoint
    /// starts, and no other of the two.
    maintenance: Arc<AtomicU8>,
    /// The rewrite running beside the writer (step 9), told to stop by
    /// `stop_rewrite`.
    rewriting: Mutex<Option<JoinHandle<Rewritten>>>,
    rewrite_stop: Arc<AtomicBool>,
    /// sled's file size that starts a rewrite: at least this, and
    /// [`REWRITE_GROWTH`] times its size after the last one.
    rewrite_floor: u64,
    fresh_bytes: AtomicU64,
    rewrites: AtomicU64,
    installs: AtomicU64,
    /// A rewrite is due and waits for the checkpoint started for it.
    rewrite_after_checkpoint: AtomicBool,
    /// Barriers call `fdatasync` (the default); without, a cluster's local
    /// copy ([`SledEngine::with_unsynced_barriers`]).
    sync_barriers: bool,
}

/// sled and its directory: the store's own, or `tree.<n>` in it once sled
/// was rewritten (step 9).
#[derive(Clone)]
struct Tree {
    db: sled::Db,
    dir: PathBuf,
}

const IDLE: u8 = 0;
const BACKUP: u8 = 1;
const REWRITE: u8 = 2;

struct Log {
    file: File,
    segment: u64,
    len: u64,
    /// Groups in the log, not yet in sled, in log order.
    pending: Vec<Pending>,
    buf: Vec<u8>,
    /// The victim being compacted (step 7).
    walk: Option<Walk>,
    /// Victims (segment, length) walked whole with their last copies in
    /// sled: removed by the next checkpoint that starts.
    drained: Vec<(u64, u64)>,
}

struct Pending {
    group: Vec<Write>,
    /// Where its record starts.
    segment: u64,
    at: u64,
    /// A compaction group, and the victim it finishes, if it does.
    compaction: bool,
    drains: Option<(u64, u64)>,
}

/// The segment files, for reading values through pointers.
struct Segments {
    dir: PathBuf,
    readers: Mutex<Readers>,
    /// What `replay-from` names on disk (synced): segments before it are
    /// never replayed, so compaction may take them.
    replay_from: AtomicU64,
    /// Segments removed after compaction.
    removed: AtomicU64,
    /// Closed segments mapped read-only, when the engine was opened to read
    /// ([`SledEngine::open_to_read`]): a value is then a copy out of the
    /// page cache, not a `pread` (a system call per value was a quarter of
    /// the audit's CPU). Not bounded like `readers`: a mapping costs only
    /// address space once its file is closed.
    maps: Option<Mutex<HashMap<u64, Arc<Mmap>>>>,
}

/// An open segment and the length it was last seen to have: a pointer
/// past it is checked against the file before anything is allocated.
struct Reader {
    file: File,
    len: AtomicU64,
}

impl Segments {
    fn path(&self, segment: u64) -> PathBuf {
        self.dir.join(format!("{segment:016x}"))
    }

    /// Segment numbers in the directory, ascending.
    fn list(&self) -> std::io::Result<Vec<u64>> {
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            if name.len() == 16 {
                if let Ok(n) = u64::from_str_radix(&name, 16) {
                    found.push(n);
                }
            }
        }
        found.sort_unstable();
        Ok(found)
    }

    /// The segment `replay-from` names; 0 before the first checkpoint.
    fn replay_from(&self) -> Result<u64, StoreError> {
        match std::fs::read_to_string(self.dir.join(REPLAY_FROM)) {
            Ok(text) => u64::from_str_radix(text.trim(), 16)
                .map_err(|_| StoreError::Io(format!("{REPLAY_FROM}: not a segment number: {text:?}"))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(io("read replay-from")(e)),
        }
    }

    /// Names `segment` as where the next open's replay starts, atomically.
    fn set_replay_from(&self, segment: u64) -> std::io::Result<()> {
        write_aside(&self.dir, REPLAY_FROM, &format!("{segment:016x}\n"))?;
        self.replay_from.store(segment, Relaxed);
        Ok(())
    }

    /// Removes compacted `victims` (step 7, after a checkpoint), then
    /// syncs the directory. Returns the fsyncs made.
    fn remove(&self, victims: &[(u64, u64)]) -> std::io::Result<u64> {
        if victims.is_empty() {
            return Ok(0);
        }
        crate::crash::engine_point("compact.before_remove");
        for (i, &(segment, _)) in victims.iter().enumerate() {
            lock(&self.readers).remove(&segment);
            if let Some(maps) = &self.maps {
                lock(maps).remove(&segment);
            }
            match std::fs::remove_file(self.path(segment)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
            self.removed.fetch_add(1, Relaxed);
            if i == 0 {
                crate::crash::engine_point("compact.during_remove");
            }
        }
        File::open(&self.dir)?.sync_all()?;
        Ok(1)
    }

    fn reader(&self, segment: u64) -> std::io::Result<Arc<Reader>> {
        if let Some(r) = lock(&self.readers).get(&segment) {
            return Ok(r.clone());
        }
        let file = File::open(self.path(segment))?;
        let len = AtomicU64::new(file.metadata()?.len());
        let mut readers = lock(&self.readers);
        // Another reader may have opened it meanwhile: one Reader a segment.
        if let Some(r) = readers.get(&segment) {
            return Ok(r.clone());
        }
        let reader = Arc::new(Reader { file, len });
        readers.insert(segment, reader.clone());
        Ok(reader)
    }

    /// `segment` mapped, when this engine maps segments and `segment` is
    /// closed (before `replay-from`: no record is appended to it again);
    /// `None`: read it with `pread`.
    fn mapped(&self, segment: u64) -> std::io::Result<Option<Arc<Mmap>>> {
        let Some(maps) = &self.maps else { return Ok(None) };
        if segment >= self.replay_from.load(Relaxed) {
            return Ok(None);
        }
        if let Some(map) = lock(maps).get(&segment) {
            return Ok(Some(map.clone()));
        }
        let file = File::open(self.path(segment))?;
        // SAFETY: reading a mapping faults if its file shrinks meanwhile.
        // Only this engine writes the log (sled's lock keeps other relays
        // out), it only appends, and only to the current segment, which is
        // at or past replay-from; a closed segment is never written again,
        // and compaction removes it whole, which leaves a mapping valid
        // (the file's pages live until it is unmapped). Populated: the page
        // table is filled in one call, not a fault per 64 KiB as a walk in
        // key order touches it (every page is read).
        let map = Arc::new(unsafe { memmap2::MmapOptions::new().populate().map(&file)? });
        Ok(Some(lock(maps).entry(segment).or_insert(map).clone()))
    }

    /// The value stored under `key` as sled holds it: inline, or the bytes
    /// a pointer names. A pointer that names no bytes of a segment is
    /// reported as a corrupt record of its stream.
    fn resolve(&self, key: &[u8], value: &[u8]) -> Result<Vec<u8>, StoreError> {
        if !pointed(key) || value.len() != POINTER_LEN {
            return Ok(value.to_vec());
        }
        let (segment, offset, len) = parse_pointer(value);
        let corrupt = |what: String| {
            let (stream, seq) =
                codec::parse_event_key(key).unwrap_or_else(|_| (format!("key {}", hex::encode(key)), 0));
            StoreError::Corrupt {
                stream,
                seq,
                what: format!("value at {offset}+{len} in log segment {segment:016x}: {what}"),
            }
        };
        let end = offset.checked_add(len).ok_or_else(|| corrupt("past any file".into()))?;
        if let Some(map) = self.mapped(segment).map_err(|e| corrupt(e.to_string()))? {
            let bytes = usize::try_from(offset).ok().zip(usize::try_from(end).ok()).and_then(|(o, e)| map.get(o..e));
            return bytes.map(<[u8]>::to_vec).ok_or_else(|| corrupt(format!("past the segment's end ({})", map.len())));
        }
        let mut bytes = Vec::new();
        self.read_into(segment, offset, len, &mut bytes).map_err(corrupt)?;
        Ok(bytes)
    }

    /// The `len` bytes at `offset` in `segment`, with `pread`, into `buf`.
    /// A read past the length last seen looks at the file again first: the
    /// segment may have grown since it was opened.
    fn read_into(&self, segment: u64, offset: u64, len: u64, buf: &mut Vec<u8>) -> Result<(), String> {
        let reader = self.reader(segment).map_err(|e| e.to_string())?;
        let end = offset.saturating_add(len);
        if end > reader.len.load(Relaxed) {
            let now = reader.file.metadata().map_err(|e| e.to_string())?.len();
            reader.len.store(now, Relaxed);
            if end > now {
                return Err(format!("past the segment's end ({now})"));
            }
        }
        buf.resize(len as usize, 0);
        reader.file.read_exact_at(buf, offset).map_err(|e| e.to_string())
    }
}

/// Which segments an open replays, given `replay-from` (0 when absent) and
/// the segment numbers found: those from it on, which must be consecutive
/// and start at the one it names. Anything else is not a log this engine
/// wrote, and guessing could replay groups out of order.
fn to_replay(from: u64, found: &[u64]) -> Result<Vec<u64>, String> {
    let replay: Vec<u64> = found.iter().copied().filter(|&s| s >= from).collect();
    if from > 0 && replay.first() != Some(&from) {
        return Err(format!("{REPLAY_FROM} names segment {from:016x}, which is missing"));
    }
    if let Some(w) = replay.windows(2).find(|w| w[1] != w[0] + 1) {
        return Err(format!("log segments {:016x} to {:016x} are missing", w[0] + 1, w[1] - 1));
    }
    Ok(replay)
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
        SledEngine::open_inner(dir, cache_bytes, false, false)
    }

    /// Opens a stopped relay's store to read it whole (the audit), as
    /// [`SledEngine::open`] does, except that values in closed segments
    /// (all of them, after the open's checkpoint) are read from a mapping
    /// of the segment instead of a `pread` each, and the scans that serve
    /// only a writing relay are not started: blob lookups all go to sled
    /// (step 6) and nothing is compacted (step 7, which waits for the live
    /// bytes' count), and a checkpoint that would make nothing durable is
    /// skipped at open and close (`checkpoint_if_changed`).
    /// Writes are still correct, only slower.
    pub fn open_to_read(dir: &Path) -> Result<SledEngine, StoreError> {
        SledEngine::open_inner(dir, None, false, true)
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
        SledEngine::open_inner(&dir, None, true, false)
    }

    fn open_inner(
        dir: &Path,
        cache_bytes: Option<u64>,
        temporary: bool,
        to_read: bool,
    ) -> Result<SledEngine, StoreError> {
        // Before anything is written: a newer format is refused untouched.
        let (version, marked) = format::check(dir)?;
        let named = tree_named(dir)?;
        if !to_read && !temporary {
            remove_stale_trees(dir, named.as_deref())?;
        }
        let tree_dir = named.as_ref().map_or_else(|| dir.to_path_buf(), |name| dir.join(name));
        let mut config = sled::Config::new().path(&tree_dir).temporary(temporary).flush_every_ms(None);
        if let Some(bytes) = cache_bytes {
            config = config.cache_capacity(bytes);
        }
        let db = open_waiting_for_lock(&config)?;
        if !to_read && (!marked || version < format::FORMAT_VERSION) {
            format::write(dir, format::FORMAT_VERSION)?;
        }
        let blobs = Arc::new(KeyFilter::new(FILTER_BYTES));
        let legacy = read_or_empty(&dir.join(LEGACY_WAL))?;
        replay(&db, &blobs, &legacy, None, "write-ahead log")?;
        let segments = Arc::new(Segments {
            dir: dir.join(LOG_DIR),
            readers: readers(),
            replay_from: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            maps: to_read.then(Mutex::default),
        });
        std::fs::create_dir_all(&segments.dir).map_err(io("create log directory"))?;
        let from = segments.replay_from()?;
        segments.replay_from.store(from, Relaxed);
        let found = segments.list().map_err(io("list log segments"))?;
        let mut accounts = Vec::with_capacity(found.len());
        for &segment in &found {
            accounts.push((segment, std::fs::metadata(segments.path(segment)).map_err(io("open log segment"))?.len()));
        }
        let bad_log = |what: String| StoreError::Io(format!("{}: {what}; refusing to open", segments.dir.display()));
        let replayed = to_replay(from, &found).map_err(bad_log)?;
        let mut lens = Vec::with_capacity(replayed.len());
        for &segment in &replayed {
            lens.push(std::fs::metadata(segments.path(segment)).map_err(io("open log segment"))?.len());
        }
        if !legacy.is_empty() && lens.iter().any(|&len| len > 0) {
            // Only a binary from before segments, run after this one, leaves both.
            return Err(bad_log(format!("both {LEGACY_WAL} and log segments hold records")));
        }
        let mut synced = 0;
        for (i, &segment) in replayed.iter().enumerate() {
            let path = segments.path(segment);
            // What a crash left unsynced at the tail becomes durable before
            // sled points into it (and before replay-from passes it).
            let mut file = File::open(&path).map_err(io("open log segment"))?;
            file.sync_data().map_err(io("sync log segment"))?;
            synced += 1;
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(io("read log segment"))?;
            if !replay(&db, &blobs, &bytes, Some((segment, 0)), "log segment")? {
                // Only the last segment with records can end torn: a bad
                // record with records after it is damage, not a crash.
                if let Some(j) = lens[i + 1..].iter().position(|&len| len > 0) {
                    let later = replayed[i + 1 + j];
                    return Err(bad_log(format!(
                        "segment {segment:016x} has a damaged record and segment {later:016x} after it holds records"
                    )));
                }
                break;
            }
        }
        let segment = found.last().copied().unwrap_or(1).max(from);
        let path = segments.path(segment);
        let file = OpenOptions::new().append(true).create(true).open(&path).map_err(io("open log segment"))?;
        let len = file.metadata().map_err(io("open log segment"))?.len();
        let mut engine = SledEngine {
            tree: Arc::new(RwLock::new(Tree { db, dir: tree_dir })),
            dir: dir.to_path_buf(),
            cache_bytes,
            segments,
            log: Arc::new(Mutex::new(Log {
                file,
                segment,
                len,
                pending: Vec::new(),
                buf: Vec::new(),
                walk: None,
                drained: Vec::new(),
            })),
            checkpoint_bytes: CHECKPOINT_BYTES,
            bytes: AtomicU64::new(0),
            barriers: Arc::new(AtomicU64::new(synced)),
            checkpointing: Mutex::default(),
            hold: None,
            blobs,
            accounts: Arc::new(Mutex::new(Accounts::new(accounts))),
            scans: Vec::new(),
            compacted: AtomicU64::new(0),
            longest_step_us: AtomicU64::new(0),
            maintenance: Arc::new(AtomicU8::new(IDLE)),
            rewriting: Mutex::default(),
            rewrite_stop: Arc::new(AtomicBool::new(false)),
            // A temporary sled is removed by sled itself, with its directory.
            rewrite_floor: if temporary || to_read { u64::MAX } else { REWRITE_FLOOR },
            fresh_bytes: AtomicU64::new(0),
            rewrites: AtomicU64::new(0),
            installs: AtomicU64::new(0),
            rewrite_after_checkpoint: AtomicBool::new(false),
            sync_barriers: true,
        };
        // Also makes the segment's own directory entry durable (a segment
        // created just now needs it, whatever else holds).
        match found.contains(&segment) {
            true => engine.checkpoint_if_changed(&mut engine.lock())?,
            false => engine.checkpoint(&mut engine.lock())?,
        }
        if !to_read {
            engine.scans.push(engine.scan_blob_keys()?);
            engine.scans.push(engine.count_live_bytes()?);
        }
        Ok(engine)
    }

    /// Step 6: puts the blob keys sled holds into the filter, on a thread
    /// of its own, then lets the filter answer. Keys installed meanwhile go
    /// in as they are installed; a key the scan passes is in sled already.
    /// A scan that fails leaves the filter unasked: lookups go to sled.
    fn scan_blob_keys(&self) -> Result<(Arc<AtomicBool>, JoinHandle<()>), StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (db, blobs, stopped) = (self.db(), self.blobs.clone(), stop.clone());
        let job = std::thread::Builder::new()
            .name("store-filter".into())
            .spawn(move || {
                for key in db.scan_prefix([codec::BLOB]).keys() {
                    if stopped.load(Relaxed) {
                        return;
                    }
                    match key {
                        Ok(key) => blobs.insert(&key),
                        Err(e) => {
                            tracing::warn!(error = %e, "scanning the blob keys failed; every blob lookup goes to sled");
                            return;
                        }
                    }
                }
                blobs.set_ready();
            })
            .map_err(io("start the filter's scan"))?;
        Ok((stop, job))
    }

    /// Step 7: counts the value bytes that the pointers sled held at open
    /// name, chunk by chunk beside the writer (`compact.rs`). A scan that
    /// fails leaves compaction off until the next open.
    fn count_live_bytes(&self) -> Result<(Arc<AtomicBool>, JoinHandle<()>), StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (db, accounts, stopped) = (self.db(), self.accounts.clone(), stop.clone());
        let job = std::thread::Builder::new()
            .name("store-live-bytes".into())
            .spawn(move || {
                while !stopped.load(Relaxed) {
                    match lock(&accounts).scan_chunk(&db, SCAN_CHUNK) {
                        Ok(false) => {}
                        Ok(true) => return,
                        Err(e) => {
                            tracing::warn!(error = %e, "counting the log's live bytes failed; no compaction until reopened");
                            return;
                        }
                    }
                }
            })
            .map_err(io("start the live bytes' scan"))?;
        Ok((stop, job))
    }

    /// The log's space per segment (live value bytes and file length),
    /// whether the open's count has ended, value bytes compaction copied
    /// and segments it removed (tests, benches).
    #[doc(hidden)]
    pub fn log_space(&self) -> LogSpace {
        let accounts = lock(&self.accounts);
        LogSpace {
            counted: accounts.is_counted(),
            segments: accounts.space(),
            compacted_bytes: self.compacted.load(Relaxed),
            removed_segments: self.segments.removed.load(Relaxed),
            longest_step: std::time::Duration::from_micros(self.longest_step_us.load(Relaxed)),
            replay_from: self.segments.replay_from.load(Relaxed),
        }
    }

    /// Whether the blob filter answers lookups yet (step 6), and how many
    /// it answered "absent" (tests, benches).
    #[doc(hidden)]
    pub fn blob_filter(&self) -> (bool, u64) {
        (self.blobs.is_ready(), self.blobs.skipped())
    }

    /// A blob key the filter knows sled lacks (step 6).
    fn surely_lacks(&self, key: &[u8]) -> bool {
        key.first() == Some(&codec::BLOB) && !self.blobs.may_contain(key)
    }

    /// Closes segments past `bytes` instead of [`CHECKPOINT_BYTES`] (tests
    /// that cross segments without writing 64 MiB).
    #[doc(hidden)]
    pub fn with_checkpoint_bytes(mut self, bytes: u64) -> SledEngine {
        self.checkpoint_bytes = bytes;
        self
    }

    /// Barriers only order groups (a group is still whole or absent, and
    /// sled still gets only what the log has) without `fdatasync`: what
    /// they cover survives a crash of the process, which leaves the page
    /// cache to the kernel, not a power cut. For a store whose durability
    /// is elsewhere and which is discarded after a reboot: a cluster's local
    /// copy (`copy.rs`). Closing still makes everything durable.
    pub fn with_unsynced_barriers(mut self) -> SledEngine {
        self.sync_barriers = false;
        self
    }

    /// The directory the engine was opened in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// sled as it is now (a rewrite swaps it, step 9).
    pub fn db(&self) -> sled::Db {
        self.current().db
    }

    fn current(&self) -> Tree {
        current(&self.tree)
    }

    fn lock(&self) -> MutexGuard<'_, Log> {
        lock(&self.log)
    }

    /// Step 4 of the module doc, on the caller's thread (open and close).
    /// The caller holds the log, so no group is between the log and sled.
    fn checkpoint(&self, log: &mut Log) -> Result<(), StoreError> {
        debug_assert!(log.pending.is_empty());
        self.finish_checkpoint(true)?;
        let victims = std::mem::take(&mut log.drained);
        let mut synced = self.rotate(log)?;
        let tree = self.current();
        synced += settle(&tree.db, &tree.dir, &self.segments, log.segment, &victims)?;
        let legacy = self.dir.join(LEGACY_WAL);
        if legacy.exists() {
            std::fs::remove_file(&legacy).map_err(io("remove the old write-ahead log"))?;
            File::open(&self.dir).and_then(|d| d.sync_all()).map_err(io("sync store directory"))?;
            synced += 1;
        }
        self.barriers.fetch_add(synced, Relaxed);
        Ok(())
    }

    /// [`SledEngine::checkpoint`], except that an engine opened to read
    /// whose open and use made nothing durable skips it: its current
    /// segment is empty and is the one replay-from names, nothing was
    /// compacted, and sled's flush wrote nothing (no replayed group, no
    /// write). Then the checkpoint would only repeat the last one: an
    /// audit run made 18 fsyncs at its open and close, now 2.
    fn checkpoint_if_changed(&self, log: &mut Log) -> Result<(), StoreError> {
        let unchanged = self.segments.maps.is_some()
            && log.len == 0
            && log.pending.is_empty()
            && log.drained.is_empty()
            && self.segments.replay_from.load(Relaxed) == log.segment
            && !self.dir.join(LEGACY_WAL).exists();
        if unchanged && self.finish_checkpoint(true)? && self.current().db.flush()? == 0 {
            return Ok(());
        }
        self.checkpoint(log)
    }

    /// Step 4 beside the writer: the segment is closed at once and the rest
    /// (sled's flush and a dozen fsyncs) runs on a thread of its own, so
    /// commits meanwhile wait for nothing but their own barrier. Every
    /// group of the closed segments is already in sled, which is all the
    /// flush needs; groups installed while it runs are in the new segment,
    /// which replay-from names, so they are replayed if the flush missed
    /// them. The caller starts one only when none runs: meanwhile the
    /// segment just grows past the limit.
    fn checkpoint_beside(&self, log: &mut Log) -> Result<(), StoreError> {
        debug_assert!(log.pending.is_empty());
        self.barriers.fetch_add(self.rotate(log)?, Relaxed);
        let Tree { db, dir } = self.current();
        let (segments, barriers) = (self.segments.clone(), self.barriers.clone());
        let (from, hold) = (log.segment, self.hold.clone());
        // Drained before this checkpoint's flush, which so has no pointer
        // into them (step 7).
        let victims = std::mem::take(&mut log.drained);
        let job = std::thread::Builder::new()
            .name("store-checkpoint".into())
            .spawn(move || {
                if let Some(hold) = hold {
                    hold();
                }
                barriers.fetch_add(settle(&db, &dir, &segments, from, &victims)?, Relaxed);
                Ok(())
            })
            .map_err(io("start the checkpoint thread"))?;
        *lock(&self.checkpointing) = Some(job);
        Ok(())
    }

    /// Collects the checkpoint running beside the writer, if it ended or
    /// `wait`; its error is the store's. Whether none runs now.
    fn finish_checkpoint(&self, wait: bool) -> Result<bool, StoreError> {
        let mut running = lock(&self.checkpointing);
        match running.take() {
            Some(job) if wait || job.is_finished() => {
                job.join().map_err(|_| StoreError::Io("the checkpoint thread panicked".into()))??;
                Ok(true)
            }
            Some(job) => {
                *running = Some(job);
                Ok(false)
            }
            None => Ok(true),
        }
    }

    /// Starts a new segment when the current one holds records. Its
    /// directory entry is synced before any record in it can be
    /// acknowledged: a power cut must not take the file with it. Returns
    /// the fsyncs made.
    fn rotate(&self, log: &mut Log) -> Result<u64, StoreError> {
        if log.len == 0 {
            return Ok(0);
        }
        let next = log.segment + 1;
        let path = self.segments.path(next);
        log.file = OpenOptions::new().append(true).create_new(true).open(&path).map_err(io("start log segment"))?;
        File::open(&self.segments.dir).and_then(|d| d.sync_all()).map_err(io("sync log directory"))?;
        let mut accounts = lock(&self.accounts);
        accounts.set_len(log.segment, log.len);
        accounts.set_len(next, 0);
        drop(accounts);
        (log.segment, log.len) = (next, 0);
        Ok(1)
    }

    /// Puts the pending groups into sled in log order, telling the live
    /// bytes what each insert replaced. The caller made them durable.
    fn install_pending(&self, log: &mut Log) -> Result<(), StoreError> {
        if log.pending.iter().any(|p| p.compaction) {
            crate::crash::engine_point("compact.before_install");
        }
        let mut drained = false;
        let db = self.db();
        let mut accounts = lock(&self.accounts);
        for p in std::mem::take(&mut log.pending) {
            insert_all(&db, &self.blobs, &p.group, Some((p.segment, p.at)), Some(&mut accounts))?;
            if let Some(victim) = p.drains {
                accounts.forget(victim.0);
                log.drained.push(victim);
                drained = true;
            }
        }
        accounts.set_len(log.segment, log.len);
        drop(accounts);
        if drained {
            crate::crash::engine_point("compact.before_checkpoint");
        }
        Ok(())
    }

    /// Value bytes below which a segment's dead bytes are not worth a copy
    /// (step 7): 1 MiB at the default checkpoint size.
    fn min_dead(&self) -> u64 {
        self.checkpoint_bytes / 64
    }

    /// One step of compaction (step 7) within `budget`, on the writer, with
    /// every group so far installed: walks the victim (choosing one if
    /// none is being walked) and appends what is still live in it to the
    /// log as one record, pending until the next barrier. Whether it found
    /// a victim to walk.
    fn compact_step(&self, log: &mut Log, budget: Budget) -> Result<bool, StoreError> {
        debug_assert!(log.pending.is_empty());
        if log.walk.is_none() {
            let before = self.segments.replay_from.load(Relaxed);
            let Some(victim) = lock(&self.accounts).victim(before, self.min_dead()) else {
                return Ok(false);
            };
            match Walk::open(&self.segments.path(victim), victim) {
                Ok(walk) => log.walk = Some(walk),
                // Removed already (a crash after its removal, before the
                // directory's sync, may list it again).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    lock(&self.accounts).forget(victim);
                    return Ok(true);
                }
                Err(e) => return Err(io("open a segment to compact")(e)),
            }
        }
        let Some(walk) = log.walk.as_mut() else { unreachable!() };
        let mut group = Vec::new();
        let done = walk.step(&self.db(), budget, &mut group)?;
        let drains = done.then_some((walk.segment, walk.len));
        if done {
            log.walk = None;
        }
        if group.is_empty() {
            // Nothing to install first: drained as it is.
            if let Some(victim) = drains {
                lock(&self.accounts).forget(victim.0);
                log.drained.push(victim);
                crate::crash::engine_point("compact.before_checkpoint");
            }
            return Ok(true);
        }
        log.buf.clear();
        wal::encode(&group, &mut log.buf);
        log.file.write_all(&log.buf).map_err(io("append to log"))?;
        let copied: usize = group.iter().map(|w| if let Write::Put(_, v) = w { v.len() } else { 0 }).sum();
        self.compacted.fetch_add(copied as u64, Relaxed);
        log.pending.push(Pending { group, segment: log.segment, at: log.len, compaction: true, drains });
        log.len += log.buf.len() as u64;
        self.bytes.fetch_add(log.buf.len() as u64, Relaxed);
        Ok(true)
    }

    /// The barrier: `fdatasync` of the current segment, unless the engine
    /// was opened [`SledEngine::with_unsynced_barriers`].
    fn sync_log(&self, log: &Log) -> Result<(), StoreError> {
        if self.sync_barriers {
            log.file.sync_data().map_err(io("sync log"))?;
            self.barriers.fetch_add(1, Relaxed);
        }
        Ok(())
    }

    /// Syncs the log and installs what is pending (a compaction group at
    /// most, or a group the writer applied and has not yet installed).
    fn sync_and_install(&self, log: &mut Log) -> Result<(), StoreError> {
        if log.pending.is_empty() {
            return Ok(());
        }
        self.sync_log(log)?;
        self.install_pending(log)
    }

    /// Step 8: a copy of the store as of a moment between two groups, in
    /// the new directory `out` (0700), while commits go on. The writer is
    /// held only while the segments and the point are read; the walk of
    /// sled and the copies run on the caller's thread.
    pub fn backup(&self, out: &Path) -> Result<BackupPoint, StoreError> {
        loop {
            match self.maintenance.compare_exchange(IDLE, BACKUP, Relaxed, Relaxed) {
                Ok(_) => break,
                Err(BACKUP) => return Err(StoreError::Io("a backup of this store is already running".into())),
                // A rewrite of sled (step 9) ends on its own, in about a
                // walk of sled: the backup starts after it.
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
        let _running = Idle(&self.maintenance);
        // 1. From here no checkpoint starts.
        let (replay_from, segment, closed) = {
            let log = self.lock();
            let found = self.segments.list().map_err(io("list log segments"))?;
            let closed: Vec<u64> = found.into_iter().filter(|&s| s < log.segment).collect();
            (self.segments.replay_from.load(Relaxed), log.segment, closed)
        };
        use std::os::unix::fs::DirBuilderExt;
        let log_dir = out.join(LOG_DIR);
        std::fs::DirBuilder::new().mode(0o700).create(out).map_err(io("create the backup's store directory"))?;
        std::fs::DirBuilder::new().mode(0o700).create(&log_dir).map_err(io("create the backup's log directory"))?;
        // The copy's sled is in its own directory, as before step 9.
        format::write(out, format::FORMAT_VERSION)?;
        // 2. Closed segments.
        let (mut linked, mut copied_bytes) = (0, 0);
        for &s in &closed {
            let (from, to) = (self.segments.path(s), log_dir.join(format!("{s:016x}")));
            let done = match std::fs::hard_link(&from, &to) {
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => copy_prefix(&from, &to, u64::MAX).map(|n| {
                    copied_bytes += n;
                }),
                linked_now => linked_now.map(|()| linked += 1),
            };
            match done {
                // Removed by the checkpoint that was running (step 8.1).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                other => other.map_err(io("link a log segment"))?,
            }
        }
        // 3. sled's pairs, installs going on.
        let copy = sled::Config::new().path(out).flush_every_ms(None).open()?;
        let mut pairs = 0;
        for kv in self.db().iter() {
            let (k, v) = kv?;
            copy.insert(k, v)?;
            pairs += 1;
        }
        copy.flush()?;
        drop(copy);
        // 4. The point.
        let offset = {
            let log = self.lock();
            if log.segment != segment {
                return Err(StoreError::Io("the log moved to a new segment during the backup".into()));
            }
            log.pending.first().map_or(log.len, |p| p.at)
        };
        // 5. The current segment up to the point, and where to replay from.
        let current = log_dir.join(format!("{segment:016x}"));
        copied_bytes += copy_prefix(&self.segments.path(segment), &current, offset).map_err(io("copy the log"))?;
        if replay_from > 0 {
            let copied = Segments {
                dir: log_dir.clone(),
                readers: readers(),
                replay_from: AtomicU64::new(0),
                removed: AtomicU64::new(0),
                maps: None,
            };
            copied.set_replay_from(replay_from).map_err(io("write the backup's replay-from"))?;
        }
        File::open(&log_dir).and_then(|d| d.sync_all()).map_err(io("sync the backup's log directory"))?;
        sync_tree(out).map_err(io("sync the backup's files"))?;
        Ok(BackupPoint { replay_from, segment, offset, pairs, linked, copied_bytes, format: format::FORMAT_VERSION })
    }

    /// Step 9, looked at by the writer between groups when nothing else
    /// runs: a rewrite of sled is due once sled's file has grown past its
    /// due size and the open's scans (which hold the old sled) have ended.
    fn rewrite_due(&self) -> bool {
        let size = db_bytes(&self.current().dir);
        let due = self.rewrite_floor.max(REWRITE_GROWTH.saturating_mul(self.fresh_bytes.load(Relaxed)));
        size >= due && self.scans.iter().all(|(_, job)| job.is_finished())
    }

    fn start_rewrite(&self) -> Result<(), StoreError> {
        if self.maintenance.compare_exchange(IDLE, REWRITE, Relaxed, Relaxed).is_err() {
            return Ok(());
        }
        tracing::info!("rewriting the store's sled, which passed {REWRITE_GROWTH}× its last fresh size");
        let job = self.rewrite_job();
        let spawned = std::thread::Builder::new().name("store-rewrite".into()).spawn(move || job.run());
        match spawned {
            Ok(handle) => *lock(&self.rewriting) = Some(handle),
            Err(e) => {
                self.maintenance.store(IDLE, Relaxed);
                return Err(io("start the rewrite thread")(e));
            }
        }
        Ok(())
    }

    fn rewrite_job(&self) -> Rewrite {
        let current = self.current();
        let number = current
            .dir
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix(TREE_PREFIX)?.parse::<u64>().ok())
            .map_or(1, |n| n + 1);
        Rewrite {
            dir: self.dir.clone(),
            name: format!("{TREE_PREFIX}{number}"),
            cache_bytes: self.cache_bytes,
            tree: self.tree.clone(),
            log: self.log.clone(),
            segments: self.segments.clone(),
            blobs: self.blobs.clone(),
            stop: self.rewrite_stop.clone(),
            maintenance: self.maintenance.clone(),
        }
    }

    /// Collects the rewrite beside the writer, if it ended or `wait`.
    /// Whether none runs now. A rewrite that failed before its swap leaves
    /// the old sled in place (a warning; the next is due at the next
    /// growth); one that failed after it is the store's error, since the
    /// old sled no longer gets what is installed.
    fn finish_rewrite(&self, wait: bool) -> Result<bool, StoreError> {
        let mut running = lock(&self.rewriting);
        let job = match running.take() {
            Some(job) if wait || job.is_finished() => job,
            Some(job) => {
                *running = Some(job);
                return Ok(false);
            }
            None => return Ok(true),
        };
        match job.join().unwrap_or_else(|_| Rewritten::Failed(StoreError::Io("the rewrite thread panicked".into()))) {
            Rewritten::Done { pairs, bytes, took } => {
                self.rewritten(bytes);
                tracing::info!(pairs, bytes, took_ms = took.as_millis() as u64, "the store's sled was rewritten");
            }
            Rewritten::Abandoned(e) => {
                // Not again before the same growth from here.
                self.fresh_bytes.store(db_bytes(&self.current().dir), Relaxed);
                if !self.rewrite_stop.load(Relaxed) {
                    tracing::warn!(error = %e, "rewriting the store's sled failed; the old one stays");
                }
            }
            Rewritten::Failed(e) => return Err(e),
        }
        Ok(true)
    }

    /// Stops a rewrite that has not swapped yet, waits for one that has.
    fn stop_rewrite(&self) -> Result<(), StoreError> {
        self.rewrite_stop.store(true, Relaxed);
        let done = self.finish_rewrite(true);
        self.rewrite_stop.store(false, Relaxed);
        done.map(drop)
    }

    /// Step 9 at once, on the caller's thread, while commits go on (tests,
    /// and an operator's tool). Returns the pairs copied.
    #[doc(hidden)]
    pub fn rewrite_now(&self) -> Result<u64, StoreError> {
        while !self.finish_rewrite(true)? || self.maintenance.compare_exchange(IDLE, REWRITE, Relaxed, Relaxed).is_err()
        {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // The open's scans count what the old sled holds.
        while !self.scans.iter().all(|(_, job)| job.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        {
            // The copy replays from replay-from: a checkpoint keeps it short.
            let mut log = self.lock();
            self.sync_and_install(&mut log)?;
            self.checkpoint(&mut log)?;
        }
        let pairs = match self.rewrite_job().run() {
            Rewritten::Done { pairs, bytes, .. } => {
                self.rewritten(bytes);
                pairs
            }
            Rewritten::Abandoned(e) | Rewritten::Failed(e) => return Err(e),
        };
        Ok(pairs)
    }

    /// A rewrite ended with sled's file at `bytes`: the next is due at
    /// [`REWRITE_GROWTH`] times that.
    fn rewritten(&self, bytes: u64) {
        self.rewrites.fetch_add(1, Relaxed);
        self.fresh_bytes.store(bytes, Relaxed);
    }

    /// Rewrites of sled so far, and the size of its file after the last.
    #[doc(hidden)]
    pub fn rewrites(&self) -> (u64, u64) {
        (self.rewrites.load(Relaxed), self.fresh_bytes.load(Relaxed))
    }

    /// Rewrites sled once its file passes `bytes` (and the growth) instead
    /// of [`REWRITE_FLOOR`] (tests).
    #[doc(hidden)]
    pub fn with_rewrite_floor(mut self, bytes: u64) -> SledEngine {
        self.rewrite_floor = bytes;
        self
    }

    /// Runs `hold` at the start of each checkpoint beside the writer (tests
    /// that hold one open while commits go on).
    #[doc(hidden)]
    pub fn with_checkpoint_hold(mut self, hold: impl Fn() + Send + Sync + 'static) -> SledEngine {
        self.hold = Some(Arc::new(hold));
        self
    }
}

impl Drop for SledEngine {
    /// The scan holds a handle on sled: it ends before the engine is gone,
    /// so sled's files are released when the store closes.
    fn drop(&mut self) {
        if let Err(e) = self.stop_rewrite() {
            tracing::error!(error = %e, "the rewrite of sled failed after its swap");
        }
        for (stop, _) in &self.scans {
            stop.store(true, Relaxed);
        }
        for (_, job) in self.scans.drain(..) {
            let _ = job.join();
        }
    }
}

fn current(tree: &RwLock<Tree>) -> Tree {
    tree.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
}

/// Sets the maintenance state back to idle when dropped.
struct Idle<'a>(&'a AtomicU8);
impl Drop for Idle<'_> {
    fn drop(&mut self) {
        self.0.store(IDLE, Relaxed);
    }
}

/// How a rewrite of sled (step 9) ended.
enum Rewritten {
    Done {
        pairs: u64,
        bytes: u64,
        took: std::time::Duration,
    },
    /// Before the swap: the old sled is still the store's.
    Abandoned(StoreError),
    /// After the swap: the store cannot go on.
    Failed(StoreError),
}

/// What a rewrite of sled needs of the engine (step 9).
struct Rewrite {
    dir: PathBuf,
    name: String,
    cache_bytes: Option<u64>,
    tree: Arc<RwLock<Tree>>,
    log: Arc<Mutex<Log>>,
    segments: Arc<Segments>,
    blobs: Arc<KeyFilter>,
    stop: Arc<AtomicBool>,
    maintenance: Arc<AtomicU8>,
}

/// Where the first group not yet installed starts: (segment, offset).
fn point(log: &Log) -> (u64, u64) {
    log.pending.first().map_or((log.segment, log.len), |p| (p.segment, p.at))
}

impl Rewrite {
    fn run(self) -> Rewritten {
        let _idle = Idle(&self.maintenance);
        let started = std::time::Instant::now();
        let new_dir = self.dir.join(&self.name);
        let copy = match self.copy(&new_dir) {
            Ok(copy) => copy,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&new_dir);
                return Rewritten::Abandoned(e);
            }
        };
        match self.switch(copy, new_dir) {
            Ok((pairs, bytes)) => Rewritten::Done { pairs, bytes, took: started.elapsed() },
            Err(e) => Rewritten::Failed(e),
        }
    }

    fn stopped(&self) -> Result<(), StoreError> {
        match self.stop.load(Relaxed) {
            true => Err(StoreError::Io("the store is closing".into())),
            false => Ok(()),
        }
    }

    /// Steps 9.1 to 9.3: the copy, made the engine's sled. Returns it with
    /// the old one and the pairs copied.
    fn copy(&self, new_dir: &Path) -> Result<(Tree, Tree, u64), StoreError> {
        let _ = std::fs::remove_dir_all(new_dir);
        let mut config = sled::Config::new().path(new_dir).flush_every_ms(None);
        if let Some(bytes) = self.cache_bytes {
            config = config.cache_capacity(bytes);
        }
        let db = config.open()?;
        let old = current(&self.tree);
        // 1. Every pair, installs going on.
        let mut pairs = 0u64;
        for kv in old.db.iter() {
            let (k, v) = kv?;
            db.insert(k, v)?;
            pairs += 1;
            if pairs.is_multiple_of(4096) {
                self.stopped()?;
            }
            // sled keeps pages it has not written in memory: writing them
            // now and then lets its cache bound the copy's memory.
            if pairs.is_multiple_of(COPY_FLUSH_EVERY) {
                db.flush()?;
            }
        }
        // 2. The log up to P1, beside the writer. No checkpoint runs, so
        // replay-from and the segments from it stay.
        let from = self.segments.replay_from.load(Relaxed);
        let p1 = point(&lock(&self.log));
        self.replay(&db, (from, 0), p1)?;
        self.stopped()?;
        // 3. The rest under the log's lock, and the swap.
        let log = lock(&self.log);
        self.replay(&db, p1, point(&log))?;
        db.flush()?;
        let new = Tree { db, dir: new_dir.to_path_buf() };
        *self.tree.write().unwrap_or_else(std::sync::PoisonError::into_inner) = new.clone();
        drop(log);
        Ok((new, old, pairs))
    }

    /// Replays the log's records from `from` to `to` (segment, offset)
    /// into `db`, event values as pointers.
    fn replay(&self, db: &sled::Db, from: (u64, u64), to: (u64, u64)) -> Result<(), StoreError> {
        for segment in from.0..=to.0 {
            let start = if segment == from.0 { from.1 } else { 0 };
            let mut file = match File::open(self.segments.path(segment)) {
                // Before replay-from's first segment (0 before any checkpoint).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && segment < to.0 => continue,
                other => other.map_err(io("open log segment"))?,
            };
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes).map_err(io("read log segment"))?;
            let end = if segment == to.0 { (to.1 as usize).min(bytes.len()) } else { bytes.len() };
            replay(db, &self.blobs, &bytes[start as usize..end], Some((segment, start)), "log segment")?;
        }
        Ok(())
    }

    /// Steps 9.4 and 9.5.
    /// Returns the pairs copied and the copy's file size.
    fn switch(&self, (new, old, pairs): (Tree, Tree, u64), new_dir: PathBuf) -> Result<(u64, u64), StoreError> {
        crate::crash::engine_point("rewrite.after_swap");
        sync_tree(&new_dir).map_err(io("sync the rewritten sled"))?;
        let (format, _) = format::check(&self.dir)?;
        if format < TREE_FORMAT {
            format::write(&self.dir, TREE_FORMAT)?;
        }
        crate::crash::engine_point("rewrite.before_switch");
        write_aside(&self.dir, TREE_FILE, &format!("{}\n", self.name)).map_err(io("write tree"))?;
        crate::crash::engine_point("rewrite.after_switch");
        // Its last handles go (reads under way keep theirs); then its files.
        let old_dir = old.dir.clone();
        drop(old);
        remove_stale_trees(&self.dir, Some(&self.name))?;
        let bytes = db_bytes(&new_dir);
        drop(new);
        tracing::debug!(from = %old_dir.display(), "the old sled's files were removed");
        Ok((pairs, bytes))
    }
}

/// The directory `tree` names (step 9), none when sled is in the store's.
fn tree_named(dir: &Path) -> Result<Option<String>, StoreError> {
    match std::fs::read_to_string(dir.join(TREE_FILE)) {
        Ok(text) => {
            let name = text.trim();
            let valid = name.strip_prefix(TREE_PREFIX).is_some_and(|n| n.parse::<u64>().is_ok());
            match valid && dir.join(name).is_dir() {
                true => Ok(Some(name.to_owned())),
                false => Err(StoreError::Io(format!(
                    "{}: names {name:?}, not a tree of this store",
                    dir.join(TREE_FILE).display()
                ))),
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io("read tree")(e)),
    }
}

/// The size of sled's `db` file in `dir` (0 when it cannot be read).
fn db_bytes(dir: &Path) -> u64 {
    std::fs::metadata(dir.join("db")).map_or(0, |m| m.len())
}

/// Whether `name`, in a store's directory, is one of sled's own files.
fn is_sled_file(name: &str) -> bool {
    matches!(name, "db" | "conf" | "blobs") || name.starts_with("snap.")
}

/// Removes every sled in `dir` but the one `current` names (all of the
/// rewritten ones when sled is in `dir` itself): a copy never swapped in,
/// or the old sled of a finished rewrite (step 9). Syncs the directory
/// when it removed anything.
fn remove_stale_trees(dir: &Path, current: Option<&str>) -> Result<(), StoreError> {
    let mut removed = false;
    let entries = match std::fs::read_dir(dir) {
        // A new store: sled makes the directory.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        entries => entries.map_err(io("list the store's directory"))?,
    };
    for entry in entries {
        let entry = entry.map_err(io("list the store's directory"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let stale =
            if name.starts_with(TREE_PREFIX) { Some(name) != current } else { current.is_some() && is_sled_file(name) };
        if !stale {
            continue;
        }
        let path = entry.path();
        let gone = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        match gone {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io("remove an old sled")(e)),
            _ => removed = true,
        }
    }
    if removed {
        File::open(dir).and_then(|d| d.sync_all()).map_err(io("sync store directory"))?;
    }
    Ok(())
}

/// The rest of a checkpoint once `from` is the current segment and every
/// group before it is in sled: sled's files made durable, then replay-from
/// moved to `from`, then the compacted `victims` removed. Returns the
/// fsyncs made.
fn settle(
    db: &sled::Db,
    dir: &Path,
    segments: &Segments,
    from: u64,
    victims: &[(u64, u64)],
) -> Result<u64, StoreError> {
    db.flush()?;
    let synced = sync_tree(dir).map_err(io("sync sled's files"))?;
    segments.set_replay_from(from).map_err(io("write replay-from"))?;
    let removed = segments.remove(victims).map_err(io("remove compacted log segments"))?;
    Ok(synced + 2 + removed)
}

/// Writes `text` as the file `name` in `dir` so that a crash leaves the old
/// file or the new one: written aside, synced, renamed, `dir` synced.
pub(super) fn write_aside(dir: &Path, name: &str, text: &str) -> std::io::Result<()> {
    let aside = dir.join(format!("{name}.new"));
    let mut f = File::create(&aside)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&aside, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// Copies the first `len` bytes of `from` (all of it for `u64::MAX`) into
/// the new file `to`, synced; the bytes copied.
fn copy_prefix(from: &Path, to: &Path, len: u64) -> std::io::Result<u64> {
    let mut out = OpenOptions::new().write(true).create_new(true).open(to)?;
    let copied = std::io::copy(&mut File::open(from)?.take(len), &mut out)?;
    if len != u64::MAX && copied != len {
        return Err(std::io::Error::other(format!("{} is shorter than {len} bytes", from.display())));
    }
    out.sync_all()?;
    Ok(copied)
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> StoreError {
    move |e| StoreError::Io(format!("{what}: {e}"))
}

/// A file's bytes, none when it does not exist (a store's old `wal`).
fn read_or_empty(path: &Path) -> Result<Vec<u8>, StoreError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => f.read_to_end(&mut bytes).map(|_| bytes).map_err(io("read log")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(bytes),
        Err(e) => Err(io("open log")(e)),
    }
}

/// Inserts the valid prefix of a log's records into sled, event values as
/// pointers when the log is a segment: `at` is (segment, offset of
/// `bytes` in it). Returns whether the log was whole.
fn replay(
    db: &sled::Db,
    blobs: &KeyFilter,
    bytes: &[u8],
    at: Option<(u64, u64)>,
    what: &str,
) -> Result<bool, StoreError> {
    let decoded = wal::decode(bytes);
    for (group, &start) in decoded.groups.iter().zip(&decoded.starts) {
        insert_all(db, blobs, group, at.map(|(s, base)| (s, base + start as u64)), None)?;
    }
    let whole = decoded.valid_len == bytes.len();
    if !whole {
        tracing::warn!(
            segment = at.map(|(s, _)| format!("{s:016x}")),
            valid = decoded.valid_len,
            len = bytes.len(),
            "event store {what} ends in a torn or damaged record; replaying the records before it"
        );
    }
    Ok(whole)
}

/// Inserts `group` into sled, its blob keys into `blobs` first; `record`
/// is (segment, offset) of its record when event values are to be pointers
/// into it. `accounts` is told what each write replaced (after the open).
fn insert_all(
    db: &sled::Db,
    blobs: &KeyFilter,
    group: &[Write],
    record: Option<(u64, u64)>,
    mut accounts: Option<&mut Accounts>,
) -> Result<(), StoreError> {
    let offsets = record.map(|(_, at)| wal::value_offsets(group, at));
    let mut offsets = offsets.into_iter().flatten();
    for w in group {
        let at = offsets.next().flatten();
        let (old, new) = match w {
            Write::Put(k, v) => {
                if k.first() == Some(&codec::BLOB) {
                    blobs.insert(k);
                }
                match (record, at) {
                    (Some((segment, _)), Some(at)) if pointed(k) => {
                        let p = pointer(segment, at, v.len());
                        (db.insert(k.as_slice(), &p[..])?, Some(p))
                    }
                    _ => (db.insert(k.as_slice(), v.as_slice())?, None),
                }
            }
            Write::Remove(k) => (db.remove(k.as_slice())?, None),
        };
        if let Some(accounts) = accounts.as_deref_mut() {
            accounts.note(w.key(), old.as_deref(), new.as_ref().map(|p| &p[..]));
        }
    }
    Ok(())
}

/// The value sled holds as `value` under `key`, read through its pointer.
/// A pointer read from sled just before compaction moved the value and
/// removed its segment names a file that is gone: sled as it is now (a
/// rewrite may have swapped it, step 9) is asked again, and a key removed
/// meanwhile is absent.
fn read_current(
    tree: &RwLock<Tree>,
    segments: &Segments,
    key: &[u8],
    mut value: sled::IVec,
) -> Result<Option<Vec<u8>>, StoreError> {
    for _ in 0..3 {
        match segments.resolve(key, &value) {
            Ok(bytes) => return Ok(Some(bytes)),
            Err(e) => match current(tree).db.get(key)? {
                Some(now) if now != value => value = now,
                Some(_) => return Err(e),
                None => return Ok(None),
            },
        }
    }
    segments.resolve(key, &value).map(Some)
}

/// Where the value a walk lends is ([`SledEngine::visit_lent`]): sled's
/// own bytes (inline), a range of a mapping the walk holds, or the walk's
/// buffer (read with `pread`: a segment not mapped).
enum Lent {
    Inline,
    Mapped(usize, std::ops::Range<usize>),
    Read,
}

/// The segments one walk has met: mapped (held, so a value costs no lock
/// and no count on a shared `Arc`), or read with `pread`.
#[derive(Default)]
struct WalkMaps {
    mapped: Vec<(u64, Arc<Mmap>)>,
    unmapped: Vec<u64>,
}

impl WalkMaps {
    /// Starts loading the value `value` points to into the cache, if it
    /// lies in a segment the walk holds mapped (a hint: nothing is read).
    fn prefetch(&self, key: &[u8], value: &[u8]) {
        if !pointed(key) || value.len() != POINTER_LEN {
            return;
        }
        let (segment, offset, len) = parse_pointer(value);
        let Some((_, map)) = self.mapped.iter().find(|(s, _)| *s == segment) else { return };
        let (Ok(offset), Ok(len)) = (usize::try_from(offset), usize::try_from(len.min(4096))) else { return };
        let Some(bytes) = offset.checked_add(len).and_then(|end| map.get(offset..end)) else { return };
        #[cfg(target_arch = "x86_64")]
        for line in bytes.chunks(64) {
            // SAFETY: a prefetch reads nothing and never faults; the
            // address is within the mapping.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.as_ptr().cast()) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = bytes;
    }
}

impl Segments {
    /// Where the value sled holds under `key` is, as [`Segments::resolve`]
    /// finds it, without copying it out of a mapped segment.
    fn lend(&self, key: &[u8], value: &[u8], maps: &mut WalkMaps, buf: &mut Vec<u8>) -> Result<Lent, StoreError> {
        if !pointed(key) || value.len() != POINTER_LEN {
            return Ok(Lent::Inline);
        }
        let (segment, offset, len) = parse_pointer(value);
        let corrupt = |what: String| value_error(key, segment, offset, len, what);
        let end = offset.checked_add(len).ok_or_else(|| corrupt("past any file".into()))?;
        let mut at = maps.mapped.iter().position(|(s, _)| *s == segment);
        if at.is_none() && !maps.unmapped.contains(&segment) {
            match self.mapped(segment).map_err(|e| corrupt(e.to_string()))? {
                Some(map) => {
                    maps.mapped.push((segment, map));
                    at = Some(maps.mapped.len() - 1);
                }
                None => maps.unmapped.push(segment),
            }
        }
        if let Some(i) = at {
            let size = maps.mapped[i].1.len();
            return usize::try_from(offset)
                .ok()
                .zip(usize::try_from(end).ok())
                .filter(|&(_, end)| end <= size)
                .map(|(offset, end)| Lent::Mapped(i, offset..end))
                .ok_or_else(|| corrupt(format!("past the segment's end ({size})")));
        }
        self.read_into(segment, offset, len, buf).map_err(corrupt)?;
        Ok(Lent::Read)
    }
}

/// A pointer under `key` that names no bytes of its segment: a corrupt
/// record of the key's stream.
fn value_error(key: &[u8], segment: u64, offset: u64, len: u64, what: String) -> StoreError {
    let (stream, seq) = codec::parse_event_key(key).unwrap_or_else(|_| (format!("key {}", hex::encode(key)), 0));
    StoreError::Corrupt { stream, seq, what: format!("value at {offset}+{len} in log segment {segment:016x}: {what}") }
}

impl SledEngine {
    /// [`Engine::visit_range`]: sled's pairs in key order, each value lent
    /// from where it lies. A pointer that names no bytes is looked up
    /// again, as [`read_current`] does (compaction may have moved the
    /// value meanwhile).
    fn visit_lent(&self, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        let db = self.db();
        let iter = match end {
            Some(end) => db.range(start..end),
            None => db.range(start..),
        };
        let (mut maps, mut buf) = (WalkMaps::default(), Vec::new());
        let mut iter = iter.peekable();
        while let Some(kv) = iter.next() {
            // The next value asked of memory now, so that it arrives while
            // this one is checked: values in key order lie anywhere in the
            // log, and waiting for each took over a tenth of the audit's CPU.
            if let Some(Ok((key, value))) = iter.peek() {
                maps.prefetch(key, value);
            }
            let (key, mut value) = match kv {
                Ok(kv) => kv,
                Err(e) => match visit(Err(e.into())) {
                    true => continue,
                    false => break,
                },
            };
            let mut place = Some(self.segments.lend(&key, &value, &mut maps, &mut buf));
            for _ in 0..3 {
                if !matches!(place, Some(Err(_))) {
                    break;
                }
                // sled as it is now: a rewrite (step 9) may have swapped it.
                match self.db().get(&key) {
                    Ok(Some(now)) if now != value => {
                        value = now;
                        place = Some(self.segments.lend(&key, &value, &mut maps, &mut buf));
                    }
                    Ok(Some(_)) => break,
                    Ok(None) => place = None,
                    Err(e) => {
                        place = Some(Err(e.into()));
                        break;
                    }
                }
            }
            let go = match place {
                None => true,
                Some(Ok(Lent::Inline)) => visit(Ok((&key[..], &value[..]))),
                Some(Ok(Lent::Mapped(i, range))) => visit(Ok((&key[..], &maps.mapped[i].1[range]))),
                Some(Ok(Lent::Read)) => visit(Ok((&key[..], &buf[..]))),
                Some(Err(e)) => visit(Err(e)),
            };
            if !go {
                break;
            }
        }
        Ok(())
    }
}

/// fsync of every file and directory under `dir` except the log's (its
/// segments are synced as they are written); returns how many were synced.
fn sync_tree(dir: &Path) -> std::io::Result<u64> {
    let mut n = 0;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let name = entry.file_name();
        // The log's segments are synced as written; a rewrite's copy (step
        // 9) is synced by the rewrite before `tree` names it.
        if name == LOG_DIR || name == LEGACY_WAL || name.to_string_lossy().starts_with(TREE_PREFIX) {
            continue;
        }
        if kind.is_dir() {
            n += sync_tree(&entry.path())?;
        } else if kind.is_file() {
            // sled may remove a file meanwhile (an old blob): with the
            // checkpoint beside the writer, inserts go on while it walks.
            // A removed file needs no sync; the directory's covers it.
            match File::open(entry.path()) {
                Ok(f) => f.sync_all()?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e),
            }
            n += 1;
        }
    }
    File::open(dir)?.sync_all()?;
    Ok(n + 1)
}

impl Engine for SledEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        if self.surely_lacks(key) {
            return Ok(None);
        }
        let db = self.db();
        match db.get(key)? {
            Some(v) => read_current(&self.tree, &self.segments, key, v),
            None => Ok(None),
        }
    }

    fn contains(&self, key: &[u8]) -> Result<bool, StoreError> {
        Ok(!self.surely_lacks(key) && self.db().contains_key(key)?)
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        let (db, tree, segments) = (self.db(), self.tree.clone(), self.segments.clone());
        let iter = match end {
            Some(end) => db.range(start..end),
            None => db.range(start..),
        };
        Box::new(iter.filter_map(move |kv| match kv {
            Err(e) => Some(Err(e.into())),
            Ok((k, v)) => read_current(&tree, &segments, &k, v).transpose().map(|v| Ok((k.to_vec(), v?))),
        }))
    }

    fn visit_range(&self, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.visit_lent(start, end, visit)
    }

    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let log = &mut *guard;
        log.buf.clear();
        wal::encode(&group, &mut log.buf);
        log.file.write_all(&log.buf).map_err(io("append to log"))?;
        let (segment, at) = (log.segment, log.len);
        log.pending.push(Pending { group, segment, at, compaction: false, drains: None });
        log.len += log.buf.len() as u64;
        self.bytes.fetch_add(log.buf.len() as u64, Relaxed);
        Ok(())
    }

    fn barrier(&self) -> Result<(), StoreError> {
        self.sync_log(&self.lock())
    }

    /// sled only ever receives groups behind a barrier (module doc).
    fn install(&self) -> Result<(), StoreError> {
        let mut guard = self.lock();
        let log = &mut *guard;
        self.install_pending(log)?;
        // A checkpoint that ended is collected at once: its error, if any,
        // is the store's from this group on. Drained victims waiting for
        // one start it early once they hold a quarter of a segment.
        let drained: u64 = log.drained.iter().map(|&(_, len)| len).sum();
        let due = log.len > self.checkpoint_bytes || drained >= self.checkpoint_bytes / 4;
        let idle = self.finish_rewrite(false)? && self.maintenance.load(Relaxed) == IDLE;
        let checkpoint_done = self.finish_checkpoint(false)?;
        if checkpoint_done && due && idle {
            self.checkpoint_beside(log)?;
        } else if checkpoint_done && idle {
            let look = self.installs.fetch_add(1, Relaxed).is_multiple_of(REWRITE_LOOK_EVERY);
            if self.rewrite_after_checkpoint.swap(false, Relaxed) {
                self.start_rewrite()?;
            } else if look && self.rewrite_due() {
                // The copy replays the log from replay-from: a checkpoint
                // first keeps that short (step 9.2).
                self.checkpoint_beside(log)?;
                self.rewrite_after_checkpoint.store(true, Relaxed);
            }
        }
        let started = std::time::Instant::now();
        if self.compact_step(log, Budget::TURN)? {
            self.longest_step_us.fetch_max(started.elapsed().as_micros() as u64, Relaxed);
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StoreError> {
        self.stop_rewrite()?;
        let mut log = self.lock();
        self.sync_and_install(&mut log)?;
        if !self.sync_barriers {
            // Every segment's records, before the checkpoint has sled
            // point into them for good.
            for segment in self.segments.list().map_err(io("list log segments"))? {
                let file = File::open(self.segments.path(segment)).map_err(io("open log segment"))?;
                file.sync_data().map_err(io("sync log segment"))?;
            }
        }
        self.checkpoint_if_changed(&mut log)
    }

    /// Step 7 at once, under the log's lock (the writer waits): what the
    /// writer applied is synced and installed, the live bytes counted to
    /// the end, a checkpoint makes every segment but the new one a
    /// candidate, each victim is walked whole, and a last checkpoint
    /// removes them.
    fn compact_now(&self) -> Result<(), StoreError> {
        self.stop_rewrite()?;
        let mut guard = self.lock();
        let log = &mut *guard;
        self.sync_and_install(log)?;
        while !lock(&self.accounts).scan_chunk(&self.db(), SCAN_CHUNK)? {}
        self.checkpoint(log)?;
        while self.compact_step(log, Budget::UNBOUNDED)? {
            self.sync_and_install(log)?;
        }
        self.checkpoint(log)
    }

    fn backup(&self, out: &Path) -> Result<BackupPoint, StoreError> {
        SledEngine::backup(self, out)
    }

    fn bytes_written(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn barriers(&self) -> u64 {
        self.barriers.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hot_segment_reader_survives_a_full_cache() {
        let reader = Arc::new(Reader { file: tempfile::tempfile().unwrap(), len: AtomicU64::new(0) });
        let readers = readers();
        let mut readers = lock(&readers);
        readers.insert(0, reader.clone());
        for segment in 1..=READERS_KEPT as u64 * 2 {
            readers.insert(segment, reader.clone());
            assert!(readers.get(&0).is_some(), "closed after {segment} others");
        }
        assert!(readers.len() <= READERS_KEPT, "{} readers kept", readers.len());
    }

    #[test]
    fn an_open_replays_consecutive_segments_from_the_one_replay_from_names() {
        assert_eq!(to_replay(0, &[]), Ok(vec![]));
        assert_eq!(to_replay(0, &[1]), Ok(vec![1]), "before the first replay-from");
        assert_eq!(to_replay(3, &[1, 2, 3, 4]), Ok(vec![3, 4]));
        assert_eq!(to_replay(3, &[3]), Ok(vec![3]));
        assert!(to_replay(3, &[1, 2]).unwrap_err().contains("which is missing"));
        assert!(to_replay(3, &[1, 2, 4]).unwrap_err().contains("which is missing"));
        assert!(to_replay(3, &[3, 5]).unwrap_err().contains("0000000000000004 to 0000000000000004 are missing"));
    }

    #[test]
    fn a_pointer_is_what_its_fields_say() {
        let p = pointer(0x0102, 0x0304, 0x0506);
        assert_eq!(p.len(), POINTER_LEN);
        assert_eq!(p[..8], 0x0102u64.to_be_bytes());
        assert_eq!(p[8..16], 0x0304u64.to_be_bytes());
        assert_eq!(p[16..], 0x0506u32.to_be_bytes());
        assert_eq!(parse_pointer(&p), (0x0102, 0x0304, 0x0506));
    }
}
