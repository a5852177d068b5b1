//! The durable, hash-chained, group-committed event store.
//!
//! Every actor's events live in one sled tree (layout in `codec.rs`), so one
//! [`Batch`] can atomically append to several streams and write snapshots and
//! kv entries (projections, indexes) with them. Each event stores
//! `blake3(prev_hash ‖ body)`, which makes the log tamper-evident
//! ([`verify_chain`]).
//!
//! Write path:
//! 1. The stream's only writer builds a [`Batch`] with the head it tracks.
//! 2. [`Store::commit`] checks the heads and applies the batch atomically; the
//!    events are visible now but not yet durable. It returns a [`Ticket`].
//! 3. [`Store::durable`] resolves once a flush covering the ticket finished;
//!    only then may the actor reply or call out (persist before effect).
//!    Flushes are shared between commits (see `group.rs`).
//!
//! Recovery is sled's: a batch is recovered whole or not at all, and every
//! acknowledged (`durable`) commit is recovered.

mod codec;
mod group;
mod verify;

use std::fmt;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use serde_json::value::RawValue;

use group::{block_on, lock, Shared};
pub use verify::{verify_chain, ChainFinding, ChainProblem};

pub type Hash = [u8; 32];
pub const ZERO_HASH: Hash = [0; 32];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    #[error("corrupt record in stream {stream:?} at seq {seq}: {what}")]
    Corrupt { stream: String, seq: u64, what: String },
    #[error("hash mismatch in stream {stream:?} at seq {seq}")]
    HashMismatch { stream: String, seq: u64 },
    #[error("stream {stream:?}: expected head {expected}, found {found}")]
    HeadMismatch { stream: String, expected: Head, found: Head },
    /// The batch was built with bad input (stream id, event data, seq overflow).
    #[error("invalid batch: {0}")]
    Invalid(String),
    /// A flush failed: nothing committed since the last good flush can be
    /// trusted to be durable, and the store takes no more commits.
    #[error("flush failed: {0}")]
    Flush(String),
    #[error("store closed")]
    Closed,
}

/// Position of the last event of a stream; (0, ZERO_HASH) for an empty stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Head {
    pub seq: u64,
    pub hash: Hash,
}

impl fmt::Display for Head {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.seq, hex::encode(&self.hash[..8]))
    }
}

/// What a caller appends. `data` is the event's JSON (must be valid JSON).
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub event_type: String,
    pub version: u32,
    /// Unix seconds.
    pub at: u64,
    pub data: Vec<u8>,
}

/// A stored event as read back (its hash already checked against its bytes).
#[derive(Clone, Debug)]
pub struct StoredEvent {
    pub stream: String,
    pub seq: u64,
    pub event_type: String,
    pub version: u32,
    pub at: u64,
    pub data: Box<RawValue>,
    pub prev: Hash,
    pub hash: Hash,
}

impl StoredEvent {
    /// `blake3(prev ‖ body)` with the body encoded again from the fields;
    /// equal to the stored bytes' hash because encoding is deterministic.
    pub fn compute_hash(&self) -> Result<Hash, StoreError> {
        let body = codec::encode_body(
            &self.stream,
            self.seq,
            &self.event_type,
            self.version,
            self.at,
            &self.prev,
            &self.data,
        )?;
        Ok(codec::chain_hash(&self.prev, &body))
    }

    /// The stream's head right after this event.
    pub fn head(&self) -> Head {
        Head { seq: self.seq, hash: self.hash }
    }
}

/// A stream's folded state at `seq`/`hash`, so loading replays only the tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub seq: u64,
    pub hash: Hash,
    pub state: Vec<u8>,
}

/// Durability ticket: a commit's position in the global write order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ticket(pub u64);

/// Counters for benchmarks and tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StoreStats {
    /// Non-empty batches committed.
    pub commits: u64,
    /// Flushes done by the flusher thread (not counting [`Store::flush`]).
    pub flushes: u64,
    pub events_appended: u64,
    /// Commits made durable per flush, on average.
    pub mean_commits_per_flush: f64,
}

/// A handle to the store: cheap to clone, shared by all actors on all threads.
/// The last clone to drop closes it (final flush, flusher stopped).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Inner {
    fn close(&self) -> Result<(), StoreError> {
        {
            let _g = lock(&self.shared.commit_lock);
            self.shared.closing.store(true, SeqCst);
        }
        self.shared.wake_flusher();
        if let Some(handle) = lock(&self.flusher).take() {
            let _ = handle.join();
        }
        match &self.shared.flushed.borrow().failed {
            Some(e) => Err(StoreError::Flush(e.to_string())),
            None => Ok(()),
        }
    }
}

impl Store {
    /// Opens (or creates) the sled database in `dir` and starts the flusher.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::with_config(sled::Config::new().path(dir))
    }

    /// Like [`Store::open`], with sled's page cache limited to `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
        Store::with_config(sled::Config::new().path(dir).cache_capacity(cache_bytes))
    }

    /// A store in a temporary sled database, removed on drop (tests).
    pub fn temporary() -> Result<Store, StoreError> {
        Store::with_config(sled::Config::new().temporary(true))
    }

    fn with_config(config: sled::Config) -> Result<Store, StoreError> {
        // Our flusher syncs whenever something was committed; sled's own
        // timer would only add syncs.
        let db = config.flush_every_ms(None).open()?;
        let (shared, tx) = Shared::new(db);
        let for_thread = shared.clone();
        let flusher = std::thread::Builder::new()
            .name("store-flusher".into())
            .spawn(move || for_thread.run_flusher(tx))
            .map_err(|e| StoreError::Sled(e.into()))?;
        Ok(Store { inner: Arc::new(Inner { shared, flusher: Mutex::new(Some(flusher)) }) })
    }

    /// Sets the group-commit window: flushes start at most this often
    /// (`group.rs`, default 500 µs). Zero flushes back to back.
    pub fn set_group_commit_window(&self, window: std::time::Duration) {
        self.inner.shared.interval_us.store(window.as_micros().min(u64::MAX as u128) as u64, SeqCst);
    }

    fn db(&self) -> &sled::Db {
        &self.inner.shared.db
    }

    /// The last event's seq and hash (from the stream's last key).
    pub fn head(&self, stream: &str) -> Result<Head, StoreError> {
        codec::check_stream(stream)?;
        let Some((start, end)) = codec::event_range(stream, 0) else {
            return Ok(Head::default());
        };
        let Some(last) = self.db().range(start..end).next_back() else {
            return Ok(Head::default());
        };
        let (key, value) = last?;
        let (_, seq) = codec::parse_event_key(&key)?;
        let hash = value.get(..32).and_then(|h| h.try_into().ok());
        let hash = hash.ok_or_else(|| StoreError::Corrupt {
            stream: stream.to_owned(),
            seq,
            what: "value shorter than a hash".into(),
        })?;
        Ok(Head { seq, hash })
    }

    /// Events of `stream` with seq > `after`, ascending. Each event's hash is
    /// checked against its stored bytes (`StoreError::HashMismatch`).
    pub fn read(
        &self,
        stream: &str,
        after: u64,
    ) -> impl Iterator<Item = Result<StoredEvent, StoreError>> + Send + 'static {
        let (bad, range) = match codec::check_stream(stream) {
            Ok(()) => (None, codec::event_range(stream, after)),
            Err(e) => (Some(Err(e)), None),
        };
        let iter = range.map(|(start, end)| self.db().range(start..end));
        bad.into_iter().chain(iter.into_iter().flatten().map(|kv| {
            let (key, value) = kv?;
            codec::decode_event(&key, &value)
        }))
    }

    /// Every stream id that has events, in key order (for audit).
    pub fn streams(&self) -> impl Iterator<Item = Result<String, StoreError>> + Send + 'static {
        let db = self.db().clone();
        let mut from = vec![codec::EVENT];
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let next = db.range(from.clone()..vec![codec::EVENT + 1]).next();
            let stream = match next {
                None => Err(None),
                Some(Err(e)) => Err(Some(e.into())),
                Some(Ok((key, _))) => codec::parse_event_key(&key).map_err(Some),
            };
            match stream {
                Ok((stream, _)) => {
                    // Skip the rest of this stream: its keys all sort below this.
                    from = codec::stream_end(&stream);
                    Some(Ok(stream))
                }
                Err(e) => {
                    done = true;
                    e.map(Err)
                }
            }
        })
    }

    pub fn batch(&self) -> Batch {
        Batch::default()
    }

    /// Applies the batch as ONE atomic sled batch after checking every
    /// appended stream's head. Visible at once, durable only after
    /// [`Store::durable`]. An invalid batch or stale head writes nothing.
    pub fn commit(&self, batch: Batch) -> Result<Ticket, StoreError> {
        if let Some(e) = batch.error {
            return Err(e);
        }
        let sh = &self.inner.shared;
        let ticket = {
            let _g = lock(&sh.commit_lock);
            if sh.closing.load(SeqCst) {
                return Err(StoreError::Closed);
            }
            if let Some(e) = &sh.flushed.borrow().failed {
                return Err(StoreError::Flush(e.to_string()));
            }
            for check in &batch.heads {
                let found = self.head(&check.stream)?;
                if found != check.expected {
                    return Err(StoreError::HeadMismatch {
                        stream: check.stream.clone(),
                        expected: check.expected,
                        found,
                    });
                }
            }
            if batch.writes == 0 {
                return Ok(Ticket(sh.committed.load(SeqCst)));
            }
            sh.db.apply_batch(batch.ops)?;
            // After the apply: a ticket seen by the flusher is already applied.
            Ticket(sh.committed.fetch_add(1, SeqCst) + 1)
        };
        sh.events.fetch_add(batch.events, SeqCst);
        sh.wake_flusher();
        Ok(ticket)
    }

    /// Resolves once a flush covering `ticket` completed; `Err` if a flush
    /// failed or the store closed before that.
    pub fn durable(&self, ticket: Ticket) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let mut rx = self.inner.shared.flushed.clone();
        async move {
            loop {
                {
                    let f = rx.borrow_and_update();
                    if f.upto >= ticket.0 {
                        return Ok(());
                    }
                    if let Some(e) = &f.failed {
                        return Err(StoreError::Flush(e.to_string()));
                    }
                }
                if rx.changed().await.is_err() {
                    return Err(StoreError::Closed);
                }
            }
        }
    }

    /// Commit and wait until durable, blocking the thread (CLI, tests; not
    /// on an async executor thread).
    pub fn commit_durable_blocking(&self, batch: Batch) -> Result<(), StoreError> {
        let ticket = self.commit(batch)?;
        block_on(self.durable(ticket))
    }

    /// Synchronous flush of everything applied so far (shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db().flush()?;
        Ok(())
    }

    /// Stops taking commits, flushes what was committed and stops the
    /// flusher. Other clones get `Closed` from `commit` afterwards.
    pub fn close(&self) -> Result<(), StoreError> {
        self.inner.close()
    }

    pub fn load_snapshot(&self, stream: &str) -> Result<Option<Snapshot>, StoreError> {
        codec::check_stream(stream)?;
        match self.db().get(codec::snapshot_key(stream))? {
            Some(v) => codec::decode_snapshot(stream, &v).map(Some),
            None => Ok(None),
        }
    }

    pub fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.db().get(codec::kv_key(key))?.map(|v| v.to_vec()))
    }

    /// kv entries whose key starts with `prefix`, in key order.
    pub fn kv_scan_prefix(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        self.db().scan_prefix(codec::kv_key(prefix)).map(|kv| {
            let (k, v) = kv?;
            Ok((k[1..].to_vec(), v.to_vec()))
        })
    }

    /// kv entries with key `>= from` that still start with `prefix`, in key
    /// order (pagination over a projection).
    pub fn kv_scan_from(
        &self,
        prefix: &[u8],
        from: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        let prefix = codec::kv_key(prefix);
        self.db()
            .range(codec::kv_key(from)..)
            .take_while(move |kv| kv.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix)))
            .map(|kv| {
                let (k, v) = kv?;
                Ok((k[1..].to_vec(), v.to_vec()))
            })
    }

    /// False once a flush failed or the store was closed: nothing more can
    /// be made durable (the readiness check reports it).
    pub fn is_healthy(&self) -> bool {
        let sh = &self.inner.shared;
        sh.flushed.borrow().failed.is_none() && !sh.closing.load(SeqCst)
    }

    /// Installs the one function told (commits covered, duration) after
    /// each flush, for metrics. Later calls are ignored.
    pub fn set_flush_observer(&self, observe: impl Fn(u64, std::time::Duration) + Send + Sync + 'static) {
        let _ = self.inner.shared.observer.set(Box::new(observe));
    }

    pub fn stats(&self) -> StoreStats {
        let sh = &self.inner.shared;
        let flushes = sh.flushes.load(SeqCst);
        let flushed = sh.flushed.borrow().upto;
        StoreStats {
            commits: sh.committed.load(SeqCst),
            flushes,
            events_appended: sh.events.load(SeqCst),
            mean_commits_per_flush: if flushes == 0 { 0.0 } else { flushed as f64 / flushes as f64 },
        }
    }

    /// The raw sled handle, for tests that corrupt records on purpose.
    #[doc(hidden)]
    pub fn raw_db(&self) -> &sled::Db {
        self.db()
    }

    /// The raw key of an event, for tests that corrupt records on purpose.
    #[doc(hidden)]
    pub fn raw_event_key(stream: &str, seq: u64) -> Vec<u8> {
        codec::event_key(stream, seq)
    }
}

/// The head a batch expects a stream to have on disk.
struct HeadCheck {
    stream: String,
    expected: Head,
    /// The head after this batch's appends so far.
    next: Head,
}

/// Writes to apply atomically. Errors found while building are kept and
/// returned by [`Store::commit`], so building never fails or panics.
#[derive(Default)]
pub struct Batch {
    ops: sled::Batch,
    heads: Vec<HeadCheck>,
    writes: usize,
    events: u64,
    error: Option<StoreError>,
}

impl Batch {
    /// Appends events to `stream` whose current head MUST be `head` (the
    /// caller, the stream's only writer, tracks it); several appends to one
    /// stream in a batch must chain. Computes seqs `head.seq + 1..` and the
    /// hash chain; returns the new head (`head` itself if the append was
    /// rejected, the error then comes from `commit`).
    pub fn append(&mut self, stream: &str, head: Head, events: Vec<NewEvent>) -> Head {
        if self.error.is_some() {
            return head;
        }
        match self.try_append(stream, head, events) {
            Ok(next) => next,
            Err(e) => {
                self.error = Some(e);
                head
            }
        }
    }

    fn try_append(&mut self, stream: &str, head: Head, events: Vec<NewEvent>) -> Result<Head, StoreError> {
        codec::check_stream(stream)?;
        let idx = match self.heads.iter().position(|c| c.stream == stream) {
            Some(i) if self.heads[i].next != head => {
                return Err(StoreError::HeadMismatch {
                    stream: stream.to_owned(),
                    expected: head,
                    found: self.heads[i].next,
                })
            }
            Some(i) => i,
            None => {
                self.heads.push(HeadCheck { stream: stream.to_owned(), expected: head, next: head });
                self.heads.len() - 1
            }
        };
        // Encode everything first so a bad event leaves the batch untouched.
        let mut cur = head;
        let mut records = Vec::with_capacity(events.len());
        for ev in &events {
            let seq = cur
                .seq
                .checked_add(1)
                .ok_or_else(|| StoreError::Invalid(format!("stream {stream:?}: seq overflow")))?;
            let data: &RawValue = serde_json::from_slice(&ev.data)
                .map_err(|e| StoreError::Invalid(format!("stream {stream:?} seq {seq}: data is not JSON: {e}")))?;
            let body = codec::encode_body(stream, seq, &ev.event_type, ev.version, ev.at, &cur.hash, data)?;
            let hash = codec::chain_hash(&cur.hash, &body);
            let mut value = Vec::with_capacity(32 + body.len());
            value.extend_from_slice(&hash);
            value.extend_from_slice(&body);
            records.push((codec::event_key(stream, seq), value));
            cur = Head { seq, hash };
        }
        for (key, value) in records {
            self.ops.insert(key, value);
            self.writes += 1;
            self.events += 1;
        }
        self.heads[idx].next = cur;
        Ok(cur)
    }

    pub fn put_snapshot(&mut self, stream: &str, snap: Snapshot) {
        if let Err(e) = codec::check_stream(stream) {
            self.error.get_or_insert(e);
            return;
        }
        self.ops.insert(codec::snapshot_key(stream), codec::encode_snapshot(&snap));
        self.writes += 1;
    }

    /// Projections and indexes, written atomically with the events.
    pub fn kv_put(&mut self, key: &[u8], value: &[u8]) {
        self.ops.insert(codec::kv_key(key), value);
        self.writes += 1;
    }

    pub fn kv_remove(&mut self, key: &[u8]) {
        self.ops.remove(codec::kv_key(key));
        self.writes += 1;
    }

    /// True when the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes == 0
    }
}
