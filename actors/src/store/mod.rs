//! The durable, hash-chained, group-committed event store.
//!
//! Every actor's events live in one ordered key space (layout in
//! `codec.rs`), so one [`Batch`] can atomically append to several streams
//! and write snapshots and kv entries (projections, indexes) with them. Each
//! event stores `blake3(prev_hash ‖ body)`, which makes the log
//! tamper-evident ([`verify_chain`]). The key space lives in an [`Engine`]
//! (`engine.rs`): [`SledEngine`] by default, [`ModelEngine`] in tests.
//!
//! # Write path
//! 1. The stream's only writer builds a [`Batch`] with the head it tracks;
//!    the events are encoded and chained there, outside any lock.
//! 2. [`Store::commit`] takes the commit lock (no IO under it), checks each
//!    appended stream's head against the heads kept in memory (a stream not
//!    kept is read before taking the lock), takes the next [`Ticket`], lays
//!    the writes in the overlay (`overlay.rs`) and queues them. From now on
//!    every read sees them; nothing is durable yet.
//! 3. The writer thread (`writer.rs`) takes everything queued as one group
//!    and hands it to the engine: for sled, one record appended to the
//!    current segment of the store's log (`wal.rs`, `sled_engine.rs`).
//! 4. One barrier per group: `fdatasync` of the segment. The writer
//!    publishes the group's last ticket, then the group goes into sled
//!    (plain inserts, no batch, no flush; an event as a pointer to its bytes
//!    in the segment) and leaves the overlay.
//! 5. [`Store::durable`] resolves once the published ticket covers its own;
//!    only then may the actor reply or call out (persist before effect). A
//!    failed write or barrier is published too and is sticky: no waiter is
//!    told Ok for what was not synced, and no commit is taken after it.
//! 6. Every 64 MiB of log, and on open and close, a checkpoint: sled's
//!    flush, fsync of its files and directories, then a new segment starts
//!    and the next open replays from there (a store opened to read, whose
//!    open and use changed nothing, skips it: [`Store::open_to_read`]).
//!    Older segments whose values are
//!    mostly dead are compacted between groups and removed behind a later
//!    checkpoint (`sled_engine.rs`, step 7).
//!
//! # Recovery (open)
//! 1. sled recovers its own files: everything up to the last checkpoint,
//!    and possibly some of what followed.
//! 2. The log's records are synced, then read in order up to the first one
//!    that is torn, fails its checksum or does not parse; those groups are
//!    inserted into sled again in order (puts and removes: replaying them is
//!    idempotent).
//!    Only groups behind a barrier ever reached sled, so sled holds no part
//!    of a group the log lacks, and every acknowledged commit is in the log
//!    or behind a checkpoint: a commit is recovered whole or not at all, and
//!    every `durable` one is.
//! 3. A checkpoint starts a new segment. Stream heads are read from the data as
//!    commits need them. The event encoding and hash chain are unchanged
//!    (sled now holds a pointer to the bytes instead of the bytes), so a data
//!    directory written before the log existed opens as is.

mod checkpoint;
mod codec;
mod compact;
mod consumer;
mod copy;
mod engine;
mod filter;
mod format;
mod jetstream;
mod model;
mod overlay;
mod sled_engine;
mod tail;
mod types;
mod verify;
mod wal;
mod writer;

use std::collections::hash_map::{Entry, HashMap};
use std::future::Future;
use std::path::Path;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use relay_schemas::UnixSecs;

pub use checkpoint::Mark as CheckpointMark;
pub use compact::{LogSpace, SegmentSpace};
pub use engine::{BackupPoint, Engine, KvIter, Visit, Write};
pub use format::FORMAT_VERSION;
pub use jetstream::{
    fence_violations, server_addrs, CatchUp, FenceViolation, JetStreamConfig, JetStreamEngine, NatsAuth, CHUNK_BYTES,
    COPY_RECORD_TTL, SHARD_CACHE_BYTES, SNAPSHOT_BYTES,
};
pub use model::ModelEngine;
use overlay::Merged;
pub use sled_engine::{SledEngine, CHECKPOINT_BYTES};
pub use tail::Follower;
pub use types::{
    Hash, Head, NewEvent, Pruned, RawEvent, Snapshot, StoreError, StoreStats, StoredEvent, Ticket, VisitEvent,
    ZERO_HASH,
};
pub use verify::{verify_chain, verify_chain_from, ChainCheck, ChainFinding, ChainProblem};
pub use writer::GroupReport;
use writer::{block_on, lock, Shared};

/// A handle to the store: cheap to clone, shared by all actors on all threads.
/// The last clone to drop closes it (writes what is queued, then the
/// engine's `close`).
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    /// Says whether the writer closed the engine when it ended.
    writer: Mutex<Option<JoinHandle<bool>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.close();
    }
}

impl Inner {
    fn close(&self) -> Result<(), StoreError> {
        let wake = {
            let mut st = self.shared.lock();
            st.closing = true;
            std::mem::take(&mut st.writer_idle)
        };
        if wake {
            self.shared.wake_writer();
        }
        if let Some(handle) = lock(&self.writer).take() {
            // A writer stopped by a failed write did not close the engine:
            // closed here, or a clone held anywhere (an actor not dropped
            // yet) keeps the engine's files locked (issue 40: a node could
            // never open its copy of a shard again after being fenced).
            if !handle.join().unwrap_or(false) {
                if let Err(e) = self.shared.engine.close() {
                    tracing::warn!(error = %e, "closing the store after a failed write");
                }
            }
        }
        match self.shared.failed() {
            Some(e) => Err(StoreError::Flush(e.to_string())),
            None => Ok(()),
        }
    }
}

impl Store {
    /// Opens (or creates) the sled database in `dir`, replays its
    /// write-ahead log and starts the writer.
    pub fn open(dir: &Path) -> Result<Store, StoreError> {
        Store::with_engine(Arc::new(SledEngine::open(dir, None)?))
    }

    /// Opens a stopped relay's store to read it whole, as the audit does
    /// ([`SledEngine::open_to_read`]: values read from mapped segments, no
    /// scans that only serve writing, and no checkpoint at open or close
    /// when there is nothing to make durable).
    pub fn open_to_read(dir: &Path) -> Result<Store, StoreError> {
        Store::with_engine(Arc::new(SledEngine::open_to_read(dir)?))
    }

    /// Like [`Store::open`], with sled's page cache limited to `cache_bytes`.
    pub fn open_with_cache(dir: &Path, cache_bytes: u64) -> Result<Store, StoreError> {
        Store::with_engine(Arc::new(SledEngine::open(dir, Some(cache_bytes))?))
    }

    /// A store in a temporary sled database, removed on drop (tests).
    pub fn temporary() -> Result<Store, StoreError> {
        Store::with_engine(Arc::new(SledEngine::temporary()?))
    }

    /// A store over any engine (the model engine in property tests).
    pub fn with_engine(engine: Arc<dyn Engine>) -> Result<Store, StoreError> {
        let (shared, tx) = Shared::new(engine);
        let for_thread = shared.clone();
        let writer = std::thread::Builder::new()
            .name("store-writer".into())
            .spawn(move || for_thread.run_writer(tx))
            .map_err(|e| StoreError::Io(format!("start the writer: {e}")))?;
        Ok(Store { inner: Arc::new(Inner { shared, writer: Mutex::new(Some(writer)) }) })
    }

    /// Sets the group-commit window: groups start at most this often
    /// (default 500 µs). A lone commit someone asks for is written at once;
    /// under load the rest of the window is spent gathering; a commit
    /// nobody asks for waits at most a window for one that is asked for
    /// (`writer.rs`). Zero writes back to back.
    pub fn set_group_commit_window(&self, window: std::time::Duration) {
        self.inner.shared.window_us.store(window.as_micros().min(u64::MAX as u128) as u64, SeqCst);
    }

    fn engine(&self) -> &dyn Engine {
        &*self.inner.shared.engine
    }

    /// The pairs in `start..end` as committed (durable or not), in key
    /// order, or reversed with `descending`.
    fn scan(&self, start: &[u8], end: Option<&[u8]>, descending: bool) -> Merged {
        // The overlay first: what leaves it after this is in the engine.
        let mut overlay = self.inner.shared.overlay.range(start, end);
        let mut engine = self.engine().range(start, end);
        if descending {
            overlay.reverse();
            engine = Box::new(engine.rev());
        }
        Merged::new(overlay, engine, descending)
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        match self.inner.shared.overlay.get(key) {
            Some(value) => Ok(value),
            None => self.engine().get(key),
        }
    }

    /// Whether `stream` has ever had an event (a pruned stream has). A head
    /// kept in memory past seq 0 says yes (an account that just received,
    /// asked again by every message to it); else a point lookup of its
    /// first event or its pruned marker.
    pub fn has_events(&self, stream: &str) -> Result<bool, StoreError> {
        codec::check_stream(stream)?;
        if self.inner.shared.lock().heads.get(stream).is_some_and(|(head, _)| head.seq > 0) {
            return Ok(true);
        }
        self.has_first_event(stream)
    }

    /// Whether `stream`'s first event (seq 1) or its pruned marker is
    /// there, looked up without reading it: point lookups where `head`
    /// scans backwards and reads the last event. `stream` is checked by
    /// the caller.
    fn has_first_event(&self, stream: &str) -> Result<bool, StoreError> {
        for key in [codec::event_key(stream, 1), codec::pruned_key(stream)] {
            let known = match self.inner.shared.overlay.contains(&key) {
                Some(known) => known,
                None => self.engine().contains(&key)?,
            };
            if known {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The last event's seq and hash (from the stream's last key); a
    /// stream pruned whole has its marker's.
    pub fn head(&self, stream: &str) -> Result<Head, StoreError> {
        codec::check_stream(stream)?;
        let Some((start, end)) = codec::event_range(stream, 0) else {
            return Ok(Head::default());
        };
        let Some(last) = self.scan(&start, Some(&end), true).next() else {
            return Ok(self.pruned(stream)?.map(|p| p.head).unwrap_or_default());
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
        let iter = range.map(|(start, end)| self.scan(&start, Some(&end), false));
        bad.into_iter().chain(iter.into_iter().flatten().map(|kv| {
            let (key, value) = kv?;
            codec::decode_event(&key, &value)
        }))
    }

    /// Like [`Store::read`] for the chain check: each event's hash over the
    /// bytes as stored (`StoreError::HashMismatch`), its key's stream and
    /// seq those of its body, and its data not parsed ([`RawEvent`]): what
    /// `relay audit verify` reads, several times faster than `read`.
    pub fn read_raw(
        &self,
        stream: &str,
        after: u64,
    ) -> impl Iterator<Item = Result<RawEvent<'static>, StoreError>> + Send + 'static {
        let (bad, range) = match codec::check_stream(stream) {
            Ok(()) => (None, codec::event_range(stream, after)),
            Err(e) => (Some(Err(e)), None),
        };
        let iter = range.map(|(start, end)| self.scan(&start, Some(&end), false));
        let stream = stream.to_owned();
        bad.into_iter().chain(iter.into_iter().flatten().map(move |kv| {
            let (key, value) = kv?;
            codec::raw_event(&stream, &key, &value).map(RawEvent::into_owned)
        }))
    }

    /// The events of every stream whose id is in `from..to` (`to`: `None`
    /// for no end), in key order (stream, then seq), read as
    /// [`Store::read_raw`] reads them and handed to `visit` one at a time,
    /// each borrowing the engine's bytes ([`Engine::visit_range`]: no copy
    /// of a value out of a mapped log segment): one pass over the key
    /// space, for checking a whole store in parallel by ranges of stream
    /// ids (an id without NUL never straddles such a bound). Each item
    /// names its stream; the outer `Err` is a pair that names none or
    /// could not be read. Committed writes not yet in the engine are laid
    /// over its pairs, as every read does.
    pub fn visit_raw_range(&self, from: &str, to: Option<&str>, visit: &mut VisitEvent<'_>) -> Result<(), StoreError> {
        let start = codec::spaced(codec::EVENT, from.as_bytes());
        let end = match to {
            Some(to) => codec::spaced(codec::EVENT, to.as_bytes()),
            None => vec![codec::EVENT + 1],
        };
        let mut current = String::new();
        self.visit(&start, Some(&end), &mut |kv| {
            let item = kv.and_then(|(key, value)| {
                let name = key.get(1..key.len().saturating_sub(9)).unwrap_or_default();
                if name != current.as_bytes() {
                    current = codec::parse_event_key(key)?.0;
                }
                Ok((current.as_str(), codec::raw_event(&current, key, value)))
            });
            visit(item);
            true
        })
    }

    /// The pairs in `start..end` as committed, in key order, each handed to
    /// `visit` with its value lent by the engine ([`Engine::visit_range`]),
    /// the overlay's changes laid over them as [`Store::scan`] does;
    /// `visit` returns `false` to stop.
    fn visit(&self, start: &[u8], end: Option<&[u8]>, visit: &mut Visit<'_>) -> Result<(), StoreError> {
        // The overlay first: what leaves it after this is in the engine.
        let mut overlay = self.inner.shared.overlay.range(start, end).into_iter().peekable();
        let mut going = true;
        self.engine().visit_range(start, end, &mut |kv| {
            if let Ok((key, _)) = &kv {
                // Newer writes before this key, or of it (which shadow it).
                while let Some((k, v)) = overlay.next_if(|(k, _)| k.as_slice() <= *key) {
                    let shadows = k.as_slice() == *key;
                    if let Some(v) = v {
                        going = visit(Ok((&k, &v)));
                    }
                    if shadows || !going {
                        return going;
                    }
                }
            }
            going = visit(kv);
            going
        })?;
        for (k, v) in overlay.filter_map(|(k, v)| Some((k, v?))) {
            if !going {
                break;
            }
            going = visit(Ok((&k, &v)));
        }
        Ok(())
    }

    /// Blobs whose key starts with `prefix`, in key order, each handed to
    /// `visit` as [`Store::visit_raw_range`] hands events (no copy of a
    /// value out of a mapped segment); `visit` returns `false` to stop.
    pub fn visit_blob_prefix(&self, prefix: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.visit_space(codec::BLOB, prefix, visit)
    }

    /// kv entries whose key starts with `prefix`, as [`Store::visit_blob_prefix`].
    pub fn visit_kv_prefix(&self, prefix: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        self.visit_space(codec::KV, prefix, visit)
    }

    /// The pairs of key space `space` whose key starts with `prefix`, keys
    /// without the space's byte.
    fn visit_space(&self, space: u8, prefix: &[u8], visit: &mut Visit<'_>) -> Result<(), StoreError> {
        let start = codec::spaced(space, prefix);
        let end = codec::prefix_end(&start);
        self.visit(&start, end.as_deref(), &mut |kv| visit(kv.map(|(k, v)| (&k[1..], v))))
    }

    /// The marker of `stream`'s deleted prefix, if any ([`Pruned`]).
    pub fn pruned(&self, stream: &str) -> Result<Option<Pruned>, StoreError> {
        codec::check_stream(stream)?;
        match self.get(&codec::pruned_key(stream))? {
            Some(v) => codec::decode_pruned(stream, &v).map(Some),
            None => Ok(None),
        }
    }

    /// Every pruned marker, in stream order (for audit and checkpoints: a
    /// stream deleted whole has its marker and no events).
    pub fn pruned_markers(&self) -> impl Iterator<Item = Result<(String, Pruned), StoreError>> + Send + 'static {
        self.scan_space(codec::PRUNED, b"", b"").map(|kv| {
            let (key, value) = kv?;
            let stream = String::from_utf8(key).map_err(|_| StoreError::Corrupt {
                stream: String::new(),
                seq: 0,
                what: "marker key".into(),
            })?;
            let pruned = codec::decode_pruned(&stream, &value)?;
            Ok((stream, pruned))
        })
    }

    /// Every stream id that has events, in key order (for audit; streams
    /// pruned whole are in [`Store::pruned_markers`]).
    pub fn streams(&self) -> impl Iterator<Item = Result<String, StoreError>> + Send + 'static {
        let store = self.clone();
        let mut from = vec![codec::EVENT];
        let mut done = false;
        std::iter::from_fn(move || {
            if done {
                return None;
            }
            let next = store.scan(&from, Some(&[codec::EVENT + 1]), false).next();
            let stream = match next {
                None => Err(None),
                Some(Err(e)) => Err(Some(e)),
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

    /// Checks every appended stream's head and queues the batch for the
    /// writer as one atomic unit. Visible to reads at once, durable only
    /// after [`Store::durable`]. An invalid batch or stale head writes
    /// nothing. No IO under the commit lock: a head not kept in memory is
    /// read before taking it.
    pub fn commit(&self, batch: Batch) -> Result<Ticket, StoreError> {
        if let Some(e) = batch.error {
            return Err(e);
        }
        let sh = &self.inner.shared;
        // Heads read outside the lock, valid while `head_trims` stays at `read_at`.
        let mut read: Vec<Option<Head>> = vec![None; batch.heads.len()];
        let mut read_at = 0;
        let mut st = loop {
            let st = sh.lock();
            if st.closing {
                return Err(StoreError::Closed);
            }
            if let Some(e) = sh.failed() {
                return Err(StoreError::Flush(e.to_string()));
            }
            if sh.head_trims.load(SeqCst) != read_at {
                read.fill(None);
            }
            let missing: Vec<usize> = (0..batch.heads.len())
                .filter(|&i| read[i].is_none() && !st.heads.contains_key(&batch.heads[i].stream))
                .collect();
            if missing.is_empty() {
                break st;
            }
            // Trims happen under the lock, so this value holds until we drop it.
            read_at = sh.head_trims.load(SeqCst);
            drop(st);
            for i in missing {
                let check = &batch.heads[i];
                // A new stream (a delivery's, say) is checked by a point
                // lookup; the backwards scan only to name what was found.
                // Its id was checked by `append`, and its head is not kept
                // (just seen under the lock): `has_events` would only take
                // the lock again.
                let new = check.expected == Head::default() && !self.has_first_event(&check.stream)?;
                read[i] = Some(if new { Head::default() } else { self.head(&check.stream)? });
            }
        };
        for (check, read) in batch.heads.iter().zip(&read) {
            let found = match st.heads.get(&check.stream) {
                Some((head, _)) => *head,
                None => read.unwrap_or_default(),
            };
            if found != check.expected {
                return Err(StoreError::HeadMismatch { stream: check.stream.clone(), expected: check.expected, found });
            }
        }
        if batch.writes.is_empty() {
            return Ok(Ticket(st.last_ticket));
        }
        st.last_ticket += 1;
        let ticket = st.last_ticket;
        for check in &batch.heads {
            st.heads.insert(check.stream.clone(), (check.next, ticket));
        }
        if st.trim_heads(sh.applied.load(SeqCst)) {
            sh.head_trims.fetch_add(1, SeqCst);
        }
        sh.overlay.insert(ticket, &batch.writes);
        st.queue.extend(batch.writes);
        st.queued_commits += 1;
        let wake = std::mem::take(&mut st.writer_idle);
        drop(st);
        if wake {
            sh.wake_writer();
        }
        sh.events.fetch_add(batch.events, SeqCst);
        Ok(Ticket(ticket))
    }

    /// Resolves once a barrier covering `ticket` completed; `Err` if a
    /// write or barrier failed or the store closed before that. Asks for
    /// the barrier: the writer starts a group for it at once.
    pub fn durable(&self, ticket: Ticket) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        self.ask_durable(ticket);
        self.when_durable(ticket)
    }

    /// Asks the writer for a barrier covering `ticket` now rather than
    /// after the group-commit window (`writer.rs`); [`Store::durable`]
    /// asks and waits.
    pub fn ask_durable(&self, ticket: Ticket) {
        let sh = &self.inner.shared;
        if sh.durable.borrow().upto < ticket.0 {
            sh.want(ticket.0);
        }
    }

    /// Like [`Store::durable`], without asking: for a wait that answers no
    /// one (notifications owed for a commit that a later one, asked for,
    /// makes durable). A commit nobody asks for is written within the
    /// group-commit window.
    pub fn when_durable(&self, ticket: Ticket) -> impl Future<Output = Result<(), StoreError>> + Send + 'static {
        let mut rx = self.inner.shared.durable.clone();
        async move {
            loop {
                {
                    let d = rx.borrow_and_update();
                    if d.upto >= ticket.0 {
                        return Ok(());
                    }
                    if let Some(e) = &d.failed {
                        return Err(StoreError::Flush(e.to_string()));
                    }
                }
                if rx.changed().await.is_err() {
                    return Err(StoreError::Closed);
                }
            }
        }
    }

    /// The last commit so far: [`Store::durable`] of it waits for everything
    /// committed before this call.
    pub fn committed(&self) -> Ticket {
        Ticket(self.inner.shared.lock().last_ticket)
    }

    /// Commits not yet durable: how far the writer is behind (the
    /// retention sweep waits while it is far behind).
    pub fn backlog(&self) -> u64 {
        let last = self.inner.shared.lock().last_ticket;
        last.saturating_sub(self.inner.shared.durable.borrow().upto)
    }

    /// Commit and wait until durable, blocking the thread (CLI, tests; not
    /// on an async executor thread).
    pub fn commit_durable_blocking(&self, batch: Batch) -> Result<(), StoreError> {
        let ticket = self.commit(batch)?;
        block_on(self.durable(ticket))
    }

    /// Waits until everything committed so far is durable, blocking the
    /// thread (shutdown).
    pub fn flush(&self) -> Result<(), StoreError> {
        let last = self.inner.shared.lock().last_ticket;
        block_on(self.durable(Ticket(last)))
    }

    /// Writes a consistent copy of the store into the new directory `out`
    /// while commits go on (`sled_engine.rs`, "Backup"): every commit
    /// durable before the call is in it. Blocks the calling thread for the
    /// copy (not the writer).
    pub fn backup(&self, out: &Path) -> Result<BackupPoint, StoreError> {
        self.engine().backup(out)
    }

    /// Stops taking commits, writes what was committed, closes the engine
    /// and stops the writer. Other clones get `Closed` from `commit`
    /// afterwards.
    pub fn close(&self) -> Result<(), StoreError> {
        self.inner.close()
    }

    pub fn load_snapshot(&self, stream: &str) -> Result<Option<Snapshot>, StoreError> {
        codec::check_stream(stream)?;
        match self.get(&codec::snapshot_key(stream))? {
            Some(v) => codec::decode_snapshot(stream, &v).map(Some),
            None => Ok(None),
        }
    }

    pub fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(&codec::kv_key(key))
    }

    /// A blob ([`Batch::blob_put`]): with sled, one `pread` from the log.
    pub fn blob_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.get(&codec::blob_key(key))
    }

    /// Blobs whose key starts with `prefix`, in key order (the audit).
    pub fn blob_scan_prefix(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        self.scan_space(codec::BLOB, prefix, prefix)
    }

    /// kv entries whose key starts with `prefix`, in key order.
    pub fn kv_scan_prefix(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        self.kv_scan_from(prefix, prefix)
    }

    /// kv entries with key `>= from` that still start with `prefix`, in key
    /// order (pagination over a projection).
    pub fn kv_scan_from(
        &self,
        prefix: &[u8],
        from: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        self.scan_space(codec::KV, prefix, from)
    }

    fn scan_space(
        &self,
        space: u8,
        prefix: &[u8],
        from: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        let prefix = codec::spaced(space, prefix);
        let end = codec::prefix_end(&prefix);
        self.scan(&codec::spaced(space, from), end.as_deref(), false)
            .take_while(move |kv| kv.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix)))
            .map(|kv| {
                let (mut k, v) = kv?;
                k.remove(0);
                Ok((k, v))
            })
    }

    /// False once a write or barrier failed or the store was closed:
    /// nothing more can be made durable (the readiness check reports it).
    pub fn is_healthy(&self) -> bool {
        let sh = &self.inner.shared;
        sh.failed().is_none() && !sh.lock().closing
    }

    /// Resolves when a write or barrier fails (the writer publishes that
    /// as it does the durable point): why, from then on the store takes
    /// no commits.
    pub fn failure(&self) -> impl Future<Output = String> + Send + 'static {
        let mut durable = self.inner.shared.durable.clone();
        async move {
            match durable.wait_for(|d| d.failed.is_some()).await {
                Ok(d) => d.failed.as_deref().unwrap_or_default().to_owned(),
                // The writer is gone: the store was closed.
                Err(_) => "store closed".to_owned(),
            }
        }
    }

    /// Installs the one function told what each group cost, after it is
    /// durable, for metrics. Later calls are ignored.
    pub fn set_group_observer(&self, observe: impl Fn(&GroupReport) + Send + Sync + 'static) {
        let _ = self.inner.shared.observer.set(Box::new(observe));
    }

    /// Reclaims the log's dead space now (`sled_engine.rs`, step 7): every
    /// segment but the newest whose live share is low is compacted and
    /// removed behind a checkpoint. Commits wait meanwhile; the writer
    /// otherwise does this a bounded step per group. For tests and
    /// benches; blocks the thread.
    #[doc(hidden)]
    pub fn compact_now(&self) -> Result<(), StoreError> {
        self.inner.shared.engine.compact_now()
    }

    pub fn stats(&self) -> StoreStats {
        let sh = &self.inner.shared;
        let groups = sh.groups.load(SeqCst);
        let durable = sh.durable.borrow().upto;
        StoreStats {
            commits: sh.lock().last_ticket,
            flushes: groups,
            barriers: sh.engine.barriers(),
            bytes_written: sh.engine.bytes_written(),
            events_appended: sh.events.load(SeqCst),
            mean_commits_per_flush: if groups == 0 { 0.0 } else { durable as f64 / groups as f64 },
        }
    }

    /// The raw sled handle, for tests that corrupt records on purpose and
    /// the audit; panics for other engines. It holds events and blobs as
    /// pointers into the log ([`Store::raw_get`] reads their bytes); values
    /// written through it are inline and bypass the log (a 20-byte one under
    /// an event or blob key reads as a pointer): only for a store nobody
    /// else is writing to. Returns once every
    /// durable commit is installed in sled (the writer installs a group
    /// just after reporting it durable).
    #[doc(hidden)]
    pub fn raw_db(&self) -> sled::Db {
        self.wait_installed();
        let engine: &dyn std::any::Any = &*self.inner.shared.engine;
        engine.downcast_ref::<SledEngine>().expect("raw_db needs a sled store").db()
    }

    /// The value under a raw key as the engine resolves it (for sled, an
    /// event's bytes from the log, where sled holds a pointer): for tests
    /// that tamper with records through [`Store::raw_db`], which writes
    /// values inline.
    #[doc(hidden)]
    pub fn raw_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.wait_installed();
        self.inner.shared.engine.get(key)
    }

    /// Blocks until everything committed so far is in the engine and gone
    /// from the overlay: for tests that count what reaches the engine.
    #[doc(hidden)]
    pub fn settle_blocking(&self) -> Result<(), StoreError> {
        self.flush()?;
        self.wait_installed();
        Ok(())
    }

    /// Returns once every durable commit is installed in the engine (the
    /// writer installs a group just after reporting it durable).
    fn wait_installed(&self) {
        let sh = &self.inner.shared;
        while sh.applied.load(SeqCst) < sh.durable.borrow().upto && sh.failed().is_none() {
            std::thread::yield_now();
        }
    }

    /// Raw pairs whose key starts with `prefix`, through the engine (any
    /// engine): for the audit's look at the key spaces themselves.
    #[doc(hidden)]
    pub fn raw_scan_prefix(
        &self,
        prefix: &[u8],
    ) -> impl Iterator<Item = Result<(Vec<u8>, Vec<u8>), StoreError>> + Send + 'static {
        let end = codec::prefix_end(prefix);
        let prefix = prefix.to_vec();
        self.scan(&prefix, end.as_deref(), false)
            .take_while(move |kv| kv.as_ref().map_or(true, |(k, _)| k.starts_with(&prefix)))
    }

    /// The raw key of a stream's snapshot, for tests that rewrite it.
    #[doc(hidden)]
    pub fn raw_snapshot_key(stream: &str) -> Vec<u8> {
        codec::snapshot_key(stream)
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
    writes: Vec<Write>,
    /// Where each kv and blob key is in `writes` (a batch writes a key once).
    written: HashMap<Vec<u8>, usize>,
    heads: Vec<HeadCheck>,
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
            let body = codec::encode_body(stream, seq, &ev.event_type, ev.version, ev.at, &cur.hash, &ev.data)?;
            let hash = codec::chain_hash(&cur.hash, &body);
            let mut value = Vec::with_capacity(32 + body.len());
            value.extend_from_slice(&hash);
            value.extend_from_slice(&body);
            records.push((codec::event_key(stream, seq), value));
            cur = Head { seq, hash };
        }
        self.events += records.len() as u64;
        self.writes.extend(records.into_iter().map(|(key, value)| Write::Put(key, value)));
        self.heads[idx].next = cur;
        Ok(cur)
    }

    /// Deletes `stream`'s events after `after` (its current marker's seq,
    /// or 0) through `through` (an event of the stream: its seq and hash),
    /// and writes the marker of the deleted prefix with `state` folded
    /// through it. Only the stream's writer, or a sweep of a stream whose
    /// writer is gone for good, prunes; the head is unchanged (a stream
    /// pruned through its head keeps it in the marker).
    pub fn prune(&mut self, stream: &str, after: u64, through: Head, at: UnixSecs, state: Vec<u8>) {
        if let Err(e) = codec::check_stream(stream) {
            self.error.get_or_insert(e);
            return;
        }
        if through.seq <= after {
            self.error
                .get_or_insert(StoreError::Invalid(format!("prune {stream:?} through {} after {after}", through.seq)));
            return;
        }
        for seq in after + 1..=through.seq {
            self.kv_write(Write::Remove(codec::event_key(stream, seq)));
        }
        let marker = Pruned { head: through, at: at.0, state };
        self.kv_write(Write::Put(codec::pruned_key(stream), codec::encode_pruned(&marker)));
    }

    /// Removes `stream`'s snapshot (a stream deleted whole).
    pub fn remove_snapshot(&mut self, stream: &str) {
        if let Err(e) = codec::check_stream(stream) {
            self.error.get_or_insert(e);
            return;
        }
        self.kv_write(Write::Remove(codec::snapshot_key(stream)));
    }

    pub fn put_snapshot(&mut self, stream: &str, snap: Snapshot) {
        if let Err(e) = codec::check_stream(stream) {
            self.error.get_or_insert(e);
            return;
        }
        self.writes.push(Write::Put(codec::snapshot_key(stream), codec::encode_snapshot(&snap)));
    }

    /// Projections and indexes, written atomically with the events. A key
    /// written twice in one batch (a ledger entry updated by two of its
    /// events) is written once, with the last value: the batch is atomic,
    /// so nobody can see the first.
    pub fn kv_put(&mut self, key: &[u8], value: &[u8]) {
        self.kv_write(Write::Put(codec::kv_key(key), value.to_vec()));
    }

    pub fn kv_remove(&mut self, key: &[u8]) {
        self.kv_write(Write::Remove(codec::kv_key(key)));
    }

    /// A kv entry read by key alone whose value the sled engine keeps in
    /// its log, as it keeps events, with a 20-byte pointer in sled: sled
    /// 0.34 rewrites a whole leaf every few inserts to it, so what its
    /// leaves carry is what a send costs in disk bytes. Read back with
    /// [`Store::blob_get`]; a key space of its own, apart from `kv_put`'s.
    pub fn blob_put(&mut self, key: &[u8], value: &[u8]) {
        self.kv_write(Write::Put(codec::blob_key(key), value.to_vec()));
    }

    pub fn blob_remove(&mut self, key: &[u8]) {
        self.kv_write(Write::Remove(codec::blob_key(key)));
    }

    fn kv_write(&mut self, w: Write) {
        match self.written.entry(w.key().to_vec()) {
            Entry::Occupied(at) => self.writes[*at.get()] = w,
            Entry::Vacant(at) => {
                at.insert(self.writes.len());
                self.writes.push(w);
            }
        }
    }

    /// True when the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}
