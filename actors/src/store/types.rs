//! What the store's modules share: the event, head, snapshot, marker and
//! ticket types and the one error. A leaf: the store's parts import these
//! from here, and `store` re-exports them at the paths callers use.

use std::borrow::Cow;
use std::fmt;

use relay_schemas::UnixSecs;
use serde_json::value::RawValue;

pub type Hash = [u8; 32];
pub const ZERO_HASH: Hash = [0; 32];

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("sled: {0}")]
    Sled(#[from] sled::Error),
    /// Another process holds the store's directory (sled's file lock).
    #[error("in use by another process: {0}")]
    InUse(String),
    #[error("corrupt record in stream {stream:?} at seq {seq}: {what}")]
    Corrupt { stream: String, seq: u64, what: String },
    #[error("hash mismatch in stream {stream:?} at seq {seq}")]
    HashMismatch { stream: String, seq: u64 },
    #[error("stream {stream:?}: expected head {expected}, found {found}")]
    HeadMismatch { stream: String, expected: Head, found: Head },
    /// The batch was built with bad input (stream id, event data, seq overflow).
    #[error("invalid batch: {0}")]
    Invalid(String),
    /// A write or barrier failed: nothing committed since the last good
    /// barrier can be trusted to be durable, and the store takes no more
    /// commits.
    #[error("flush failed: {0}")]
    Flush(String),
    /// The store's own files (the write-ahead log, syncing sled's files).
    #[error("io: {0}")]
    Io(String),
    #[error("store closed")]
    Closed,
    /// The store's `FORMAT` names a data format this release does not
    /// open (`format.rs`).
    #[error(
        "data format version {found} of this store is not one this release opens (it opens 1 to {supported}); \
         run the release that wrote it, or restore a backup made by this release"
    )]
    Format { found: String, supported: u32 },
    /// What this engine cannot do (a backup of a store kept elsewhere).
    #[error("unsupported: {0}")]
    Unsupported(&'static str),
}

/// A request to NATS JetStream that failed (the cluster engine, its
/// checkpoints and consumers): what was asked, and why.
pub(super) fn jetstream_err(what: &str, e: impl fmt::Display) -> StoreError {
    StoreError::Io(format!("jetstream: {what}: {e}"))
}

impl StoreError {
    /// What a client is told. A store that can no longer make writes
    /// durable (a full disk, a failed fsync) or is closing is one cause
    /// however it shows: the wait for a barrier failing, or a later commit
    /// refused. Both are `temporarily_unavailable` (503, retry: another
    /// home, or this relay once restarted); anything else is `internal_error`.
    pub fn to_relay_error(&self) -> relay_schemas::RelayError {
        match self {
            StoreError::Flush(_) | StoreError::Closed => {
                relay_schemas::RelayError::unavailable(format!("store: {self}"))
            }
            _ => relay_schemas::RelayError::internal(format!("store: {self}")),
        }
    }
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

/// What a caller appends. `data` is JSON by its type: serialized once by
/// the caller ([`NewEvent::new`]), never parsed again by the store.
#[derive(Clone, Debug)]
pub struct NewEvent {
    pub event_type: String,
    pub version: u32,
    /// Unix seconds.
    pub at: u64,
    pub data: Box<RawValue>,
}

impl NewEvent {
    /// Serializes `data` (one pass, no re-parse).
    pub fn new<T: serde::Serialize + ?Sized>(
        event_type: &str,
        version: u32,
        at: UnixSecs,
        data: &T,
    ) -> Result<NewEvent, serde_json::Error> {
        let data = serde_json::value::to_raw_value(data)?;
        Ok(NewEvent { event_type: event_type.into(), version, at: at.0, data })
    }
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
    /// The stream's head right after this event.
    pub fn head(&self) -> Head {
        Head { seq: self.seq, hash: self.hash }
    }
}

/// A stored event as the chain check reads it ([`Store::read_raw`](super::Store::read_raw)): its
/// hash checked over the bytes as stored, its key and body agreeing, and
/// its data left as text for the caller to decode (or not).
#[derive(Clone, Debug)]
pub struct RawEvent<'a> {
    pub seq: u64,
    pub event_type: String,
    pub version: u32,
    pub at: u64,
    pub prev: Hash,
    pub hash: Hash,
    /// Whether the body is the encoding of its own fields (always, unless
    /// its layout was altered: a hash mismatch, as [`StoredEvent::compute_hash`]
    /// would find).
    pub sound: bool,
    /// Borrowed from the engine's bytes on a walk ([`Store::visit_raw_range`](super::Store::visit_raw_range)).
    pub(super) body: Cow<'a, str>,
    pub(super) data: std::ops::Range<usize>,
}

impl<'a> RawEvent<'a> {
    /// The event with its body its own.
    pub fn into_owned(self) -> RawEvent<'static> {
        let RawEvent { seq, event_type, version, at, prev, hash, sound, body, data } = self;
        RawEvent { seq, event_type, version, at, prev, hash, sound, body: Cow::Owned(body.into_owned()), data }
    }

    /// The event's data as stored (JSON, not parsed here).
    pub fn data(&self) -> &str {
        &self.body[self.data.clone()]
    }

    /// The stream's head right after this event.
    pub fn head(&self) -> Head {
        Head { seq: self.seq, hash: self.hash }
    }

    /// The event as [`Store::read`](super::Store::read) gives it; `Err` when its data is not JSON.
    pub fn to_stored(&self, stream: &str) -> Result<StoredEvent, StoreError> {
        let data = RawValue::from_string(self.data().to_owned()).map_err(|e| StoreError::Corrupt {
            stream: stream.to_owned(),
            seq: self.seq,
            what: format!("body: {e}"),
        })?;
        Ok(StoredEvent {
            stream: stream.to_owned(),
            seq: self.seq,
            event_type: self.event_type.clone(),
            version: self.version,
            at: self.at,
            data,
            prev: self.prev,
            hash: self.hash,
        })
    }
}

/// What [`Store::visit_raw_range`](super::Store::visit_raw_range) hands each event to, with its stream.
pub type VisitEvent<'a> = dyn FnMut(Result<(&str, Result<RawEvent<'_>, StoreError>), StoreError>) + 'a;

/// A stream's folded state at `seq`/`hash`, so loading replays only the tail.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub seq: u64,
    pub hash: Hash,
    pub state: Vec<u8>,
}

/// What is left of a stream's deleted prefix (retention, PROTOCOL §10): the
/// position of the last deleted event, so the chain is checked on from its
/// hash; when it was deleted; and the stream's state folded through it
/// (opaque to the store; empty where the stream keeps none), so replay
/// starts there. A stream deleted whole keeps its marker and no events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pruned {
    pub head: Head,
    /// Unix seconds.
    pub at: u64,
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
    /// Groups written by the writer, each made durable by one barrier.
    pub flushes: u64,
    /// Real barriers (fsync/fdatasync), checkpoints included.
    pub barriers: u64,
    /// Bytes the engine wrote (the write-ahead log for sled; not what sled
    /// itself writes at checkpoints).
    pub bytes_written: u64,
    pub events_appended: u64,
    /// Commits made durable per group, on average.
    pub mean_commits_per_flush: f64,
}
