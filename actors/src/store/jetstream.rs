//! The cluster engine: the store's groups as messages of one NATS JetStream
//! stream (a shard), read through an ordered view in memory that is rebuilt
//! from the stream when the engine opens.
//!
//! 1. `apply` queues a group (no IO).
//! 2. `barrier` publishes what is queued, framed as in the sled engine's
//!    write-ahead log (`wal.rs`: length, crc32, writes), as one message on
//!    `<prefix>.g`, or, past [`CHUNK_BYTES`], as one JetStream atomic
//!    batch of messages split between writes. The first message carries
//!    `Nats-Expected-Last-Sequence`: the stream's last sequence as this
//!    owner knows it. The barrier returns on JetStream's acknowledgement,
//!    which with file storage and `sync_interval: always` (R3 in a cluster:
//!    on a quorum) means synced to disk. An append without an answer is
//!    tried again (a message under the same `Nats-Msg-Id`, a batch whole
//!    once it is known not to have landed) for four times `timeout`.
//! 3. `install` lays the acknowledged groups on the view.
//!
//! **Fencing.** Opening appends a fence (`<prefix>.f`, header
//! `Relay-Epoch`) with the expected last sequence it read, then rebuilds
//! the view from every message before the fence. From that point any
//! append by an earlier owner fails on its expected sequence, its store
//! fails (the writer's failure is sticky) and takes no more commits. The
//! epoch is the revision of the owner's lease (`relay_core::lease`);
//! opening refuses a stream whose newest fence has a higher epoch than its
//! own, so an owner whose lease was superseded cannot fence out the newer
//! one (an equal epoch is the same owner opening again after a failure).
//! Every group message also carries the epoch it was written under, so
//! [`fence_violations`] can show that no group follows a newer fence.
//!
//! **Snapshots.** After `snapshot_bytes` of groups (and at least as many
//! as the last snapshot's size, so snapshots never cost more writing than
//! the groups they cover), `install` appends the whole view as a snapshot
//! (`<prefix>.p`, one atomic batch, fenced like a group) and purges the
//! stream below it: an open replays the newest
//! snapshot and the groups after it, so takeover time and the stream's
//! size follow the data, not its history. The view itself still holds the
//! whole shard in memory; a local cache on disk is the next step.

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_EXPECTED_LAST_SEQUENCE, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, context::PublishErrorKind, message::StreamMessage, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::engine::{Engine, KvIter, Write};
use super::types::StoreError;
use super::wal;

/// Group messages are split past this size (JetStream's default
/// `max_payload` is 1 MiB); the parts go in one atomic batch.
pub const CHUNK_BYTES: usize = 512 << 10;

/// The smallest `max_payload` a nats-server may have: one write (an event
/// holding a request of up to `limits.max_body_bytes`, 1 MiB by default) is
/// never split across messages.
const MIN_MAX_PAYLOAD: usize = 4 << 20;

const EPOCH: &str = "Relay-Epoch";
/// On the last message of an append: how many messages it has.
const PARTS: &str = "Relay-Parts";
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_SEQ: &str = "Nats-Batch-Sequence";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// Where a shard lives and how it is kept.
#[derive(Clone, Debug)]
pub struct JetStreamConfig {
    /// NATS server URLs (`nats://127.0.0.1:4222`, ...).
    pub urls: Vec<String>,
    /// The stream's name, e.g. `RELAY_relay_c_S0`.
    pub stream: String,
    /// Subject prefix: groups go to `<prefix>.g`, fences to `<prefix>.f`,
    /// snapshots to `<prefix>.p`.
    pub prefix: String,
    /// Copies JetStream keeps (3 in a cluster, 1 on a single server).
    pub replicas: usize,
    /// How long one request to JetStream may take before it is retried; an
    /// append is retried for four times this long, then the store fails.
    pub timeout: Duration,
    /// A snapshot is written after this many bytes of groups.
    pub snapshot_bytes: u64,
    /// How the engine authenticates to the servers and checks them.
    pub auth: NatsAuth,
}

/// How a node authenticates to the nats-servers, and checks them: without
/// both, anyone who reaches a server can read every event stream, delete
/// streams and write leases and fences.
#[derive(Clone, Default)]
pub struct NatsAuth {
    /// A user and its password (nats-server's `authorization`).
    pub user: Option<(String, String)>,
    /// TLS is required and the servers' certificates are checked against
    /// this CA (PEM).
    pub ca_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for NatsAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the password.
        f.debug_struct("NatsAuth")
            .field("user", &self.user.as_ref().map(|(user, _)| user))
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl NatsAuth {
    /// Connect options carrying these credentials and TLS settings.
    pub fn options(&self) -> async_nats::ConnectOptions {
        let mut options = async_nats::ConnectOptions::new();
        if let Some((user, password)) = &self.user {
            options = options.user_and_password(user.clone(), password.clone());
        }
        if let Some(ca) = &self.ca_file {
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        options
    }
}

/// Default of [`JetStreamConfig::snapshot_bytes`].
pub const SNAPSHOT_BYTES: u64 = 64 << 20;

impl JetStreamConfig {
    pub fn shard(urls: Vec<String>, cluster: &str, shard: u32, replicas: usize) -> JetStreamConfig {
        JetStreamConfig {
            urls,
            stream: format!("RELAY_{cluster}_S{shard}"),
            prefix: format!("relay.{cluster}.s{shard}"),
            replicas,
            timeout: Duration::from_secs(5),
            snapshot_bytes: SNAPSHOT_BYTES,
            auth: NatsAuth::default(),
        }
    }

    fn subject(&self, kind: Kind) -> String {
        let suffix = match kind {
            Kind::Group => "g",
            Kind::Fence => "f",
            Kind::Snapshot => "p",
        };
        format!("{}.{suffix}", self.prefix)
    }

    fn kind(&self, subject: &str) -> Option<Kind> {
        match subject.strip_prefix(self.prefix.as_str())?.strip_prefix('.')? {
            "g" => Some(Kind::Group),
            "f" => Some(Kind::Fence),
            "p" => Some(Kind::Snapshot),
            _ => None,
        }
    }
}

/// What a message of the stream is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Group,
    Fence,
    Snapshot,
}

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

struct Writer {
    /// Groups applied, not yet published.
    queued: Vec<Vec<Write>>,
    /// Groups acknowledged, not yet installed in the view.
    acked: Vec<Vec<Write>>,
    /// The stream's last sequence: this owner's last append.
    last_seq: u64,
    /// Bytes of groups since the last snapshot.
    since_snapshot: u64,
    /// Bytes of the last snapshot.
    snapshot_size: u64,
}

pub struct JetStreamEngine {
    /// Drives the NATS connection; the writer thread blocks on it.
    rt: Option<tokio::runtime::Runtime>,
    js: jetstream::Context,
    client: async_nats::Client,
    cfg: JetStreamConfig,
    /// 0 for a read-only engine, which refuses writes.
    epoch: u64,
    /// Shared with the range iterators, which read it a chunk at a time.
    view: Arc<RwLock<Map>>,
    writer: Mutex<Writer>,
    bytes: AtomicU64,
    barriers: AtomicU64,
}

impl Drop for JetStreamEngine {
    fn drop(&mut self) {
        // Never blocks: a store may be dropped on an async thread.
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Io(format!("jetstream: {what}: {e}"))
}

impl JetStreamEngine {
    /// Connects, creates the stream if missing, fences it with `epoch` and
    /// rebuilds the view from everything before the fence.
    pub fn open(cfg: JetStreamConfig, epoch: u64) -> Result<JetStreamEngine, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-jetstream")
            .enable_all()
            .build()
            .map_err(|e| err("runtime", e))?;
        let (client, js, last_seq, read) = run(&rt, open(cfg.clone(), epoch))?;
        Ok(JetStreamEngine {
            rt: Some(rt),
            js,
            client,
            cfg,
            epoch,
            view: Arc::new(RwLock::new(read.view)),
            writer: Mutex::new(Writer {
                queued: Vec::new(),
                acked: Vec::new(),
                last_seq,
                // Counted on from the stream: a takeover (a crash loop
                // too) snapshots when the groups since the last snapshot
                // call for it, whoever wrote them.
                since_snapshot: read.since_snapshot,
                snapshot_size: read.snapshot_size,
            }),
            bytes: AtomicU64::new(0),
            barriers: AtomicU64::new(0),
        })
    }

    /// Reads the stream as it is, without fencing it (the owner keeps
    /// writing): for `relay audit` on a running cluster. Refuses writes.
    pub fn open_read_only(cfg: JetStreamConfig) -> Result<JetStreamEngine, StoreError> {
        Self::open(cfg, 0)
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    fn run<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> T {
        run(self.rt.as_ref().expect("runtime lives until drop"), fut)
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn view(&self) -> std::sync::RwLockReadGuard<'_, Map> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `parts` after `last_seq` (fenced); the new last sequence.
    fn append(&self, kind: Kind, last_seq: u64, parts: Vec<Bytes>) -> Result<u64, StoreError> {
        let to = Append {
            js: self.js.clone(),
            client: self.client.clone(),
            stream: self.cfg.stream.clone(),
            subject: self.cfg.subject(kind),
            epoch: self.epoch,
            last_seq,
            retry_for: self.cfg.timeout * 4,
        };
        self.run(publish(to, parts))
    }

    /// Appends the whole view (as it is at `w.last_seq`) as a snapshot,
    /// then purges the stream below it. The writer's lock is held, so no
    /// group is installed meanwhile.
    fn snapshot(&self, w: &mut Writer) -> Result<(), StoreError> {
        // Puts made a chunk at a time: only one chunk of copies at once.
        let parts = frame(self.view().iter().map(|(k, v)| Write::Put(k.clone(), v.clone())));
        let total: usize = parts.iter().map(Bytes::len).sum();
        let n = parts.len() as u64;
        let last = self.append(Kind::Snapshot, w.last_seq, parts)?;
        (w.last_seq, w.since_snapshot, w.snapshot_size) = (last, 0, total as u64);
        self.bytes.fetch_add(total as u64, Relaxed);
        let first = last + 1 - n;
        let stream = self.cfg.stream.clone();
        let js = self.js.clone();
        // Not fenced, and harmless when late: it only drops what the
        // snapshot covers (an older owner cannot append past our snapshot).
        let purged = self.run(async move {
            let stream = js.get_stream(&stream).await.map_err(|e| e.to_string())?;
            stream.purge().sequence(first).await.map_err(|e| e.to_string())
        });
        match purged {
            Ok(p) => tracing::info!(first, parts = n, bytes = total, purged = p.purged, "jetstream snapshot written"),
            Err(e) => tracing::warn!(error = %e, first, "jetstream snapshot written; purging below it failed"),
        }
        Ok(())
    }
}

/// Pairs read from the view a chunk at a time, from either end, so a long
/// scan (an audit, an export) holds the view's lock only briefly and never
/// copies the whole range. Like sled's iterators, it sees writes installed
/// while it runs. `low..high` is what no chunk has read yet.
struct Range {
    view: Arc<RwLock<Map>>,
    low: Bound<Vec<u8>>,
    high: Bound<Vec<u8>>,
    /// Read from the low end, ascending.
    front: VecDeque<(Vec<u8>, Vec<u8>)>,
    /// Read from the high end, descending.
    back: VecDeque<(Vec<u8>, Vec<u8>)>,
}

/// Whether `bounds` hold nothing in a way `BTreeMap::range` would panic on
/// (the ends crossed, or met with one of them excluded).
fn crossed((low, high): (Bound<&[u8]>, Bound<&[u8]>)) -> bool {
    match (low, high) {
        (Bound::Included(l), Bound::Included(h)) => l > h,
        (Bound::Included(l) | Bound::Excluded(l), Bound::Included(h) | Bound::Excluded(h)) => l >= h,
        _ => false,
    }
}

/// Pairs a range iterator reads per visit to the view.
const RANGE_CHUNK: usize = 256;

impl Range {
    fn chunk(&mut self, from_back: bool) -> VecDeque<(Vec<u8>, Vec<u8>)> {
        let view = self.view.read().unwrap_or_else(|e| e.into_inner());
        let bounds = (self.low.as_ref().map(Vec::as_slice), self.high.as_ref().map(Vec::as_slice));
        if crossed(bounds) {
            return VecDeque::new();
        }
        let range = view.range::<[u8], _>(bounds);
        let chunk: VecDeque<_> = if from_back {
            range.rev().take(RANGE_CHUNK).map(|(k, v)| (k.clone(), v.clone())).collect()
        } else {
            range.take(RANGE_CHUNK).map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        match (from_back, chunk.back()) {
            (false, Some((k, _))) => self.low = Bound::Excluded(k.clone()),
            (true, Some((k, _))) => self.high = Bound::Excluded(k.clone()),
            (_, None) => {}
        }
        chunk
    }
}

impl Iterator for Range {
    type Item = Result<(Vec<u8>, Vec<u8>), StoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.front.is_empty() {
            self.front = self.chunk(false);
        }
        // Once the ends meet, what is left was read from the back.
        self.front.pop_front().or_else(|| self.back.pop_back()).map(Ok)
    }
}

impl DoubleEndedIterator for Range {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.back.is_empty() {
            self.back = self.chunk(true);
        }
        self.back.pop_front().or_else(|| self.front.pop_back()).map(Ok)
    }
}

/// Frames `writes` (borrowed from a queue, or made on the fly) as records
/// of at most [`CHUNK_BYTES`] each (a write larger than that is a record
/// alone), one per message of an append; always at least one.
fn frame<W: std::borrow::Borrow<Write>>(writes: impl Iterator<Item = W>) -> Vec<Bytes> {
    let (mut parts, mut chunk, mut size) = (Vec::new(), Vec::<W>::new(), 0);
    let encode = |chunk: &mut Vec<W>, size: usize| {
        let mut buf = Vec::with_capacity(size + 8);
        wal::encode_iter(chunk.iter().map(|w| w.borrow()), &mut buf);
        chunk.clear();
        Bytes::from(buf)
    };
    for w in writes {
        let n = wal::encoded_len(w.borrow());
        if size + n > CHUNK_BYTES && !chunk.is_empty() {
            parts.push(encode(&mut chunk, size));
            size = 0;
        }
        size += n;
        chunk.push(w);
    }
    if !chunk.is_empty() || parts.is_empty() {
        parts.push(encode(&mut chunk, size));
    }
    parts
}

/// Runs `fut` on the engine's runtime and waits for it from this thread,
/// which may be any thread, an async one included (the wait blocks it,
/// as a sled write would).
fn run<T: Send + 'static>(rt: &tokio::runtime::Runtime, fut: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the engine's runtime ended a task without an answer")
}

async fn connect(cfg: &JetStreamConfig) -> Result<(async_nats::Client, jetstream::Context), StoreError> {
    let client = cfg
        .auth
        .options()
        .connection_timeout(cfg.timeout)
        .request_timeout(Some(cfg.timeout))
        .retry_on_initial_connect()
        .connect(server_addrs(&cfg.urls).map_err(|e| err("connect", e))?)
        .await
        .map_err(|e| err("connect", e))?;
    let mut js = jetstream::new(client.clone());
    js.set_timeout(cfg.timeout);
    Ok((client, js))
}

/// The servers of a list of URLs (async-nats takes a list, not a
/// comma-separated string).
pub fn server_addrs(urls: &[String]) -> Result<Vec<async_nats::ServerAddr>, String> {
    urls.iter().map(|u| u.parse().map_err(|e| format!("NATS url {u:?}: {e}"))).collect()
}

pub(crate) fn stream_config(cfg: &JetStreamConfig) -> stream::Config {
    stream::Config {
        name: cfg.stream.clone(),
        subjects: [Kind::Group, Kind::Fence, Kind::Snapshot].map(|k| cfg.subject(k)).to_vec(),
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas,
        allow_atomic_publish: true,
        // Retried publishes inside this window are answered as duplicates.
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    }
}

fn epoch_of(headers: Option<&HeaderMap>) -> Option<u64> {
    headers?.get(EPOCH)?.as_str().parse().ok()
}

async fn open(
    cfg: JetStreamConfig,
    epoch: u64,
) -> Result<(async_nats::Client, jetstream::Context, u64, Replayed), StoreError> {
    let (client, js) = connect(&cfg).await?;
    // Connected after this (the connection is made in the background).
    client.flush().await.map_err(|e| err("connect", e))?;
    let max_payload = client.server_info().max_payload;
    if max_payload < MIN_MAX_PAYLOAD {
        return Err(StoreError::Flush(format!(
            "jetstream: the nats-server's max_payload is {max_payload} bytes; a commit may be larger \
             than {MIN_MAX_PAYLOAD}: set max_payload: 8MB in its config"
        )));
    }
    if epoch == 0 {
        let stream = js.get_stream(&cfg.stream).await.map_err(|e| err("get the stream", e))?;
        let read = replay(&stream, &cfg, Through::Last).await?;
        return Ok((client, js, read.through, read));
    }
    let stream = js.get_or_create_stream(stream_config(&cfg)).await.map_err(|e| err("create the stream", e))?;
    let fence_subject = cfg.subject(Kind::Fence);
    // Fence: retried while another writer appends between our read of the
    // last sequence and the fence (its next append then fails).
    let mut tries = 0;
    let fence_seq = loop {
        tries += 1;
        // The last sequence first, the epochs after: a newer owner's fence
        // landing in between is then either seen below, or moves the stream
        // past `last` and fails our fence on its expected sequence.
        let last = stream.get_info().await.map_err(|e| err("stream info", e))?.state.last_sequence;
        // A snapshot carries its writer's epoch: the fences before it may
        // have been purged.
        let fence = newest(&stream, &fence_subject).await?.map_or(0, |m| epoch_of(Some(&m.headers)).unwrap_or(0));
        let snapshot = newest_snapshot(&stream, &cfg).await?.map_or(0, |(_, epoch)| epoch);
        let newest = fence.max(snapshot);
        // Equal: this owner's own fence, from an open that failed after it.
        if newest > epoch {
            return Err(StoreError::Flush(format!(
                "jetstream: stream {} is fenced at epoch {newest}, above this owner's {epoch}: a newer owner holds it",
                cfg.stream
            )));
        }
        let mut headers = HeaderMap::new();
        headers.insert(EPOCH, epoch.to_string().as_str());
        headers.insert(NATS_EXPECTED_LAST_SEQUENCE, last.to_string().as_str());
        let ack = js.publish_with_headers(fence_subject.clone(), headers, Bytes::new()).await;
        match ack.map_err(|e| err("fence", e))?.await {
            Ok(ack) => break ack.sequence,
            Err(e) if e.kind() == PublishErrorKind::WrongLastSequence && tries < 10 => continue,
            Err(e) => return Err(err("fence", e)),
        }
    };
    let read = replay(&stream, &cfg, Through::Seq(fence_seq)).await?;
    Ok((client, js, fence_seq, read))
}

/// The newest message on `subject`, if any.
async fn newest(stream: &stream::Stream, subject: &str) -> Result<Option<StreamMessage>, StoreError> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(err("read the newest message", e)),
    }
}

/// Where the newest snapshot starts, and the epoch it was written under.
async fn newest_snapshot(stream: &stream::Stream, cfg: &JetStreamConfig) -> Result<Option<(u64, u64)>, StoreError> {
    let Some(last) = newest(stream, &cfg.subject(Kind::Snapshot)).await? else { return Ok(None) };
    let parts: u64 = last.headers.get(PARTS).and_then(|v| v.as_str().parse().ok()).unwrap_or(1);
    Ok(Some((last.sequence + 1 - parts.max(1), epoch_of(Some(&last.headers)).unwrap_or(0))))
}

/// The view at `through` (the fence just written, or the stream's last
/// message): the newest snapshot, then every group after it, in
/// order. Message `through` exists, so the walk always reaches it. A walk
/// that finds a gap (the owner purged below a newer snapshot meanwhile: a
/// read-only open does not stop it) starts again from the newest snapshot.
async fn replay(stream: &stream::Stream, cfg: &JetStreamConfig, through: Through) -> Result<Replayed, StoreError> {
    for _ in 0..REPLAY_TRIES {
        if let Some(read) = replay_once(stream, cfg, through).await? {
            return Ok(read);
        }
    }
    Err(err("replay", format!("the stream kept changing below the read ({REPLAY_TRIES} tries)")))
}

/// Reads a view whole, walks again when purged under a read.
const REPLAY_TRIES: usize = 5;

/// Messages a replay asks for at once: with parts of up to [`CHUNK_BYTES`]
/// about 16 MiB in flight, well under the 64 MiB a nats-server lets a
/// client fall behind before it drops it as a slow consumer.
const REPLAY_BATCH: i64 = 32;

/// What a replay read.
struct Replayed {
    view: Map,
    /// The sequence it is at.
    through: u64,
    /// Bytes of the snapshot it started from (0: none).
    snapshot_size: u64,
    /// Bytes of the groups after it.
    since_snapshot: u64,
}

/// Where a replay ends.
#[derive(Clone, Copy, Debug)]
enum Through {
    /// At this sequence (the fence this owner just wrote).
    Seq(u64),
    /// At the stream's last message when the walk starts (read-only).
    Last,
}

/// One walk of [`replay`]: the view and the sequence it is at; `None`
/// when it found a gap.
async fn replay_once(
    stream: &stream::Stream,
    cfg: &JetStreamConfig,
    through: Through,
) -> Result<Option<Replayed>, StoreError> {
    let mut view = Map::new();
    // The snapshot first, the last sequence after: the snapshot is then
    // at or below it.
    let snapshot = newest_snapshot(stream, cfg).await?;
    let through = match through {
        Through::Seq(seq) => seq,
        Through::Last => stream.get_info().await.map_err(|e| err("stream info", e))?.state.last_sequence,
    };
    if through == 0 {
        return Ok(Some(Replayed { view, through, snapshot_size: 0, since_snapshot: 0 }));
    }
    let start = snapshot.map_or(1, |(first, _)| first);
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig {
            deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: start },
            max_batch: REPLAY_BATCH,
            ..Default::default()
        })
        .await
        .map_err(|e| err("replay consumer", e))?;
    let mut messages = consumer.messages().await.map_err(|e| err("replay", e))?;
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let (mut next, mut snapshot_size, mut since_snapshot) = (start, 0, 0);
    // A replay that stops making progress (its consumer lost, the server
    // stalled) fails, and the caller tries again, rather than holding the
    // lease while serving nothing.
    let stall = cfg.timeout * 2;
    loop {
        let msg = progress(&mut messages, stall, next, through).await?;
        let seq = msg.info().map_err(|e| err("replay", e))?.stream_sequence;
        if seq != next {
            return Ok(None);
        }
        next += 1;
        let size = msg.payload.len() as u64;
        match cfg.kind(msg.subject.as_str()) {
            Some(Kind::Snapshot) if seq == start => {
                view.clear();
                snapshot_size = size;
                apply_message(&mut view, &mut parts, msg.headers.as_ref(), &msg.payload, seq, &cfg.stream)?;
            }
            Some(Kind::Snapshot) => {
                snapshot_size += size;
                apply_message(&mut view, &mut parts, msg.headers.as_ref(), &msg.payload, seq, &cfg.stream)?
            }
            Some(Kind::Group) => {
                since_snapshot += size;
                apply_message(&mut view, &mut parts, msg.headers.as_ref(), &msg.payload, seq, &cfg.stream)?
            }
            Some(Kind::Fence) | None => {}
        }
        if seq == through {
            break;
        }
    }
    Ok(Some(Replayed { view, through, snapshot_size, since_snapshot }))
}

/// A replay's next message, or an error when none comes within `stall`
/// (at sequence `next` of `through`) or the consumer ends: the watchdog
/// that keeps a stuck replay from holding a lease for minutes.
async fn progress<M, E: std::fmt::Display>(
    messages: &mut (impl futures_util::Stream<Item = Result<M, E>> + Unpin),
    stall: Duration,
    next: u64,
    through: u64,
) -> Result<M, StoreError> {
    match tokio::time::timeout(stall, messages.next()).await {
        Ok(Some(msg)) => msg.map_err(|e| err("replay", e)),
        Ok(None) => Err(err("replay", "the consumer ended before the fence")),
        Err(_) => Err(err("replay", format!("no message for {stall:?} at sequence {next} of {through}"))),
    }
}

/// Applies one stored group message to `view`. A batch's parts are kept in
/// `parts` until its commit part (JetStream stores a batch whole, so a
/// part without its commit is not in the stream).
fn apply_message(
    view: &mut Map,
    parts: &mut Vec<Vec<u8>>,
    headers: Option<&HeaderMap>,
    payload: &[u8],
    seq: u64,
    stream: &str,
) -> Result<(), StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt { stream: stream.to_owned(), seq, what: what.to_owned() };
    let in_batch = headers.and_then(|h| h.get(BATCH_ID)).is_some();
    let commit = headers.and_then(|h| h.get(BATCH_COMMIT)).is_some();
    parts.push(payload.to_vec());
    if in_batch && !commit {
        return Ok(());
    }
    for part in std::mem::take(parts) {
        let decoded = wal::decode(&part);
        if decoded.valid_len != part.len() {
            return Err(corrupt("a group message that does not decode whole"));
        }
        for group in decoded.groups {
            apply_to(view, group);
        }
    }
    Ok(())
}

fn apply_to(map: &mut Map, group: Vec<Write>) {
    for w in group {
        match w {
            Write::Put(k, v) => map.insert(k, v),
            Write::Remove(k) => map.remove(&k),
        };
    }
}

/// Between two tries of an unanswered publish.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Failures worth trying again: all but the stream having moved on (a
/// newer owner's fence) and a message too large. No answer in time, the
/// connection lost, no stream leader ("no responders" during an election
/// reads as `StreamNotFound`), a retry that came while the first try was
/// still being stored, or JetStream temporarily unavailable: the publish
/// may or may not have been stored, and a retry tells which.
fn transient(kind: PublishErrorKind) -> bool {
    !matches!(kind, PublishErrorKind::WrongLastSequence | PublishErrorKind::MaxPayloadExceeded)
}

/// Where and after what an append goes.
struct Append {
    js: jetstream::Context,
    client: async_nats::Client,
    stream: String,
    subject: String,
    /// This owner's epoch, on every message.
    epoch: u64,
    /// The stream's last sequence this owner knows: expected by the append.
    last_seq: u64,
    /// How long an append whose fate is unknown is tried again.
    retry_for: Duration,
}

/// Publishes `parts` after `to.last_seq`: one message, or an atomic batch.
/// Returns the stream sequence of the last part.
async fn publish(to: Append, parts: Vec<Bytes>) -> Result<u64, StoreError> {
    let Append { js, client, stream, subject, epoch, last_seq, retry_for } = to;
    let headers = append_headers(epoch, last_seq, parts.len());
    let fenced = |e: async_nats::jetstream::context::PublishError| match e.kind() {
        PublishErrorKind::WrongLastSequence => StoreError::Flush(format!(
            "jetstream: the stream moved past sequence {last_seq}: another owner fenced it (epoch {epoch} is stale)"
        )),
        _ => err("publish", e),
    };
    if parts.len() == 1 {
        // One message: a publish without an answer is retried under the
        // same message id (JetStream answers a retry of what it stored as a
        // duplicate, with the original sequence), while a stream leader is
        // being elected ("no responders") or the connection is back.
        let mut h = headers(0);
        h.insert(NATS_MESSAGE_ID, format!("{epoch}-{}", last_seq + 1).as_str());
        let started = tokio::time::Instant::now();
        let mut tries = 0u32;
        loop {
            tries += 1;
            let sent = js.publish_with_headers(subject.clone(), h.clone(), parts[0].clone()).await;
            let acked = match sent {
                Ok(ack) => ack.await,
                Err(e) => Err(e),
            };
            match acked {
                Ok(ack) => {
                    if tries > 1 {
                        tracing::warn!(
                            tries,
                            waited_ms = started.elapsed().as_millis() as u64,
                            "jetstream publish stored after retries"
                        );
                    }
                    return Ok(ack.sequence);
                }
                Err(e) if transient(e.kind()) && started.elapsed() < retry_for => {
                    if tries == 1 {
                        tracing::warn!(error = %e, "jetstream publish not acknowledged; retrying");
                    }
                    tokio::time::sleep(RETRY_PAUSE).await;
                }
                Err(e) => return Err(fenced(e)),
            }
        }
    }
    publish_batch_tries(Append { js, client, stream, subject, epoch, last_seq, retry_for }, parts, headers, 1).await
}

/// The headers of message `i` of an append of `n` after `last_seq`.
fn append_headers(epoch: u64, last_seq: u64, n: usize) -> impl Fn(usize) -> HeaderMap {
    move |i| {
        let mut h = HeaderMap::new();
        h.insert(EPOCH, epoch.to_string().as_str());
        if i == 0 {
            h.insert(NATS_EXPECTED_LAST_SEQUENCE, last_seq.to_string().as_str());
        }
        if i + 1 == n {
            h.insert(PARTS, n.to_string().as_str());
        }
        h
    }
}

/// A batch after `to.last_seq`, tried whole under a new id from try
/// `first` while its fate is unknown. An earlier try stored after all (its
/// acknowledgement lost or late) is found by its own id at `last_seq + 1`,
/// and then, since a batch is stored whole and in a row, ends at
/// `last_seq + parts`: the stream's tail, which may be another try of ours
/// being stored, is never read for a position ([`batch_outcome`]).
async fn publish_batch_tries(
    to: Append,
    parts: Vec<Bytes>,
    headers: impl Fn(usize) -> HeaderMap,
    first: u32,
) -> Result<u64, StoreError> {
    let Append { js, client, stream, subject, epoch, last_seq, retry_for } = to;
    let n = parts.len() as u64;
    let fenced = |e: &dyn std::fmt::Display| {
        StoreError::Flush(format!(
            "jetstream: the stream moved past sequence {last_seq}: another owner fenced it (epoch {epoch} is stale): {e}"
        ))
    };
    let started = tokio::time::Instant::now();
    for attempt in first.. {
        let id = batch_id(epoch, last_seq, attempt);
        let e = match publish_batch(&js, &client, &subject, &id, &parts, &headers).await {
            Ok(seq) => return Ok(seq),
            Err(e) => e,
        };
        let moved = e.kind() == PublishErrorKind::WrongLastSequence;
        if !moved && !transient(e.kind()) {
            return Err(err("publish", e));
        }
        tracing::warn!(error = %e, attempt, "jetstream batch not acknowledged; checking, then retrying");
        let tried: Vec<String> = (1..=attempt).map(|a| batch_id(epoch, last_seq, a)).collect();
        let outcome = loop {
            if !moved {
                // A moment for a try in flight to be stored.
                tokio::time::sleep(RETRY_PAUSE).await;
            }
            let outcome = batch_outcome(after(&js, &stream, last_seq).await, &tried, last_seq, n);
            // Moved on, yet nothing readable after ours: read again.
            let settled = match outcome {
                Outcome::Unknown => false,
                Outcome::NotStored => !moved,
                Outcome::Stored(_) | Outcome::Fenced => true,
            };
            if settled || started.elapsed() >= retry_for {
                break outcome;
            }
            if moved {
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        };
        match outcome {
            Outcome::Stored(seq) => return Ok(seq),
            Outcome::Fenced => return Err(fenced(&e)),
            Outcome::NotStored if !moved && started.elapsed() < retry_for => {}
            Outcome::NotStored | Outcome::Unknown if moved => return Err(fenced(&e)),
            Outcome::NotStored | Outcome::Unknown => return Err(err("publish", e)),
        }
    }
    unreachable!("the attempts are unbounded")
}

fn batch_id(epoch: u64, last_seq: u64, attempt: u32) -> String {
    format!("{epoch}-{}-{attempt}", last_seq + 1)
}

/// What the stream holds at `last_seq + 1`: `Ok(None)` nothing yet,
/// `Ok(Some(batch id))` a message (its batch id, `None` outside a batch),
/// `Err(())` no answer.
type After = Result<Option<Option<String>>, ()>;

async fn after(js: &jetstream::Context, stream: &str, last_seq: u64) -> After {
    let stream = js.get_stream(stream).await.map_err(drop)?;
    match stream.get_raw_message(last_seq + 1).await {
        Ok(msg) => Ok(Some(msg.headers.get(BATCH_ID).map(|id| id.as_str().to_owned()))),
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(_) => Err(()),
    }
}

/// The fate of a batch of `n` messages after `last_seq`, tried under the
/// ids `tried`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// One of the tries is stored, its commit at this sequence.
    Stored(u64),
    /// None is stored yet.
    NotStored,
    /// Something else follows `last_seq`: another owner's fence.
    Fenced,
    /// The stream did not answer.
    Unknown,
}

/// A stored batch starts right after `last_seq` (each try expects it) and
/// is stored whole and in a row, so its first message alone says whether
/// and where it landed: its commit is at `last_seq + n`, whatever the
/// stream's last sequence reads while it is being applied.
fn batch_outcome(after: After, tried: &[String], last_seq: u64, n: u64) -> Outcome {
    match after {
        Err(()) => Outcome::Unknown,
        Ok(None) => Outcome::NotStored,
        Ok(Some(Some(id))) if tried.contains(&id) => Outcome::Stored(last_seq + n),
        Ok(Some(_)) => Outcome::Fenced,
    }
}

async fn publish_batch(
    js: &jetstream::Context,
    client: &async_nats::Client,
    subject: &str,
    id: &str,
    parts: &[Bytes],
    headers: &impl Fn(usize) -> HeaderMap,
) -> Result<u64, async_nats::jetstream::context::PublishError> {
    let n = parts.len();
    for (i, part) in parts.iter().enumerate() {
        let mut h = headers(i);
        h.insert(BATCH_ID, id);
        h.insert(BATCH_SEQ, (i + 1).to_string().as_str());
        if i + 1 < n {
            client.publish_with_headers(subject.to_owned(), h, part.clone()).await.map_err(|e| {
                async_nats::jetstream::context::PublishError::with_source(PublishErrorKind::BrokenPipe, e)
            })?;
        } else {
            h.insert(BATCH_COMMIT, "1");
            return Ok(js.publish_with_headers(subject.to_owned(), h, part.clone()).await?.await?.sequence);
        }
    }
    unreachable!("a batch has at least one part")
}

impl Engine for JetStreamEngine {
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.view().get(key).cloned())
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        Box::new(Range {
            view: self.view.clone(),
            low: Bound::Included(start.to_vec()),
            high: end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec())),
            front: VecDeque::new(),
            back: VecDeque::new(),
        })
    }

    fn apply(&self, group: Vec<Write>) -> Result<(), StoreError> {
        self.writer().queued.push(group);
        Ok(())
    }

    fn barrier(&self) -> Result<(), StoreError> {
        let mut w = self.writer();
        if w.queued.is_empty() {
            return Ok(());
        }
        if self.epoch == 0 {
            return Err(StoreError::Flush("jetstream: opened read-only".into()));
        }
        // Everything queued goes in one append, so group boundaries do not
        // matter: parts split between writes, each a record of its own.
        let parts = frame(w.queued.iter().flatten());
        let bytes: usize = parts.iter().map(Bytes::len).sum();
        w.last_seq = self.append(Kind::Group, w.last_seq, parts)?;
        w.since_snapshot += bytes as u64;
        let queued = std::mem::take(&mut w.queued);
        w.acked.extend(queued);
        self.bytes.fetch_add(bytes as u64, Relaxed);
        self.barriers.fetch_add(1, Relaxed);
        Ok(())
    }

    fn install(&self) -> Result<(), StoreError> {
        let mut w = self.writer();
        let mut view = self.view.write().unwrap_or_else(|e| e.into_inner());
        for group in std::mem::take(&mut w.acked) {
            apply_to(&mut view, group);
        }
        drop(view);
        // Never more snapshot than groups written: a snapshot waits for
        // as many bytes of groups as the last one took.
        if w.since_snapshot >= self.cfg.snapshot_bytes.max(w.snapshot_size) {
            // Not fatal: the groups are stored. A snapshot that landed
            // unseen leaves `last_seq` behind, and the next append then
            // fails as fenced, which stops this owner safely.
            if let Err(e) = self.snapshot(&mut w) {
                tracing::warn!(error = %e, "jetstream snapshot failed; trying again later");
                w.since_snapshot = 0;
            }
        }
        Ok(())
    }

    fn bytes_written(&self) -> u64 {
        self.bytes.load(Relaxed)
    }

    fn barriers(&self) -> u64 {
        self.barriers.load(Relaxed)
    }
}

/// A group message stored after a fence of a newer epoch than its own: a
/// write by an owner that had been fenced out (must never exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceViolation {
    pub seq: u64,
    pub epoch: u64,
    pub fenced_at: u64,
}

/// Walks the whole stream and lists every group written after a newer
/// fence (or with no epoch at all).
pub fn fence_violations(cfg: &JetStreamConfig) -> Result<Vec<FenceViolation>, StoreError> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| err("runtime", e))?;
    let cfg = cfg.clone();
    std::thread::spawn(move || rt.block_on(walk_fences(cfg)))
        .join()
        .unwrap_or_else(|_| Err(err("fence walk", "panicked")))
}

async fn walk_fences(cfg: JetStreamConfig) -> Result<Vec<FenceViolation>, StoreError> {
    let (_client, js) = connect(&cfg).await?;
    let stream = js.get_stream(&cfg.stream).await.map_err(|e| err("get the stream", e))?;
    let last = stream.get_info().await.map_err(|e| err("stream info", e))?.state.last_sequence;
    let mut found = Vec::new();
    if last == 0 {
        return Ok(found);
    }
    let consumer = stream
        .create_consumer(jetstream::consumer::pull::OrderedConfig::default())
        .await
        .map_err(|e| err("fence walk consumer", e))?;
    let mut messages = consumer.messages().await.map_err(|e| err("fence walk", e))?;
    let mut fence = 0;
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| err("fence walk", e))?;
        let seq = msg.info().map_err(|e| err("fence walk", e))?.stream_sequence;
        let epoch = epoch_of(msg.headers.as_ref()).unwrap_or(0);
        match cfg.kind(msg.subject.as_str()) {
            Some(Kind::Fence) => fence = fence.max(epoch),
            // The stream's first message after a purge: its epoch stands
            // for the fences purged before it.
            Some(Kind::Snapshot) if fence == 0 => fence = epoch,
            _ if epoch != fence => found.push(FenceViolation { seq, epoch, fenced_at: fence }),
            _ => {}
        }
        if seq >= last {
            break;
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A replay whose consumer delivers nothing more (dropped by the
    /// server as a slow consumer, the server stalled) fails within the
    /// stall bound instead of waiting forever; the owner opens again.
    #[tokio::test(start_paused = true)]
    async fn a_replay_that_stops_progressing_fails_within_its_stall_bound() {
        let mut stuck = futures_util::stream::pending::<Result<(), String>>();
        let started = tokio::time::Instant::now();
        let failed = progress(&mut stuck, Duration::from_secs(10), 7, 900).await;
        match failed {
            Err(StoreError::Io(e)) => assert!(e.contains("no message for 10s at sequence 7 of 900"), "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        let mut ended = futures_util::stream::empty::<Result<(), String>>();
        assert!(progress(&mut ended, Duration::from_secs(10), 7, 900).await.is_err(), "ended before the fence");
        let mut one = futures_util::stream::iter([Ok::<_, String>(5u8)]);
        assert_eq!(progress(&mut one, Duration::from_secs(10), 7, 900).await.ok(), Some(5));
    }

    #[test]
    fn a_stored_batch_is_placed_by_its_own_first_message_never_by_the_streams_tail() {
        let tried = [batch_id(4, 10, 1), batch_id(4, 10, 2)];
        assert_eq!(tried, ["4-11-1", "4-11-2"]);
        // Try 1 found at 11: three parts end at 13, however far the stream
        // reads while it is being stored (the bug: its tail was taken).
        assert_eq!(batch_outcome(Ok(Some(Some("4-11-1".into()))), &tried, 10, 3), Outcome::Stored(13));
        assert_eq!(batch_outcome(Ok(Some(Some("4-11-2".into()))), &tried, 10, 3), Outcome::Stored(13));
        assert_eq!(batch_outcome(Ok(None), &tried, 10, 3), Outcome::NotStored);
        // Another owner's fence, a group outside any batch, another epoch's try.
        for other in [None, Some("9-11-1".to_owned()), Some("4-12-1".to_owned()), Some("4-11-3".to_owned())] {
            assert_eq!(batch_outcome(Ok(Some(other.clone())), &tried, 10, 3), Outcome::Fenced, "{other:?}");
        }
        assert_eq!(batch_outcome(Err(()), &tried, 10, 3), Outcome::Unknown);
    }

    /// The failure: a batch's first try stored, its acknowledgement
    /// lost; the retry meets the stream moved past `last_seq`. It is our
    /// own batch: recorded at its own end, and the owner appends on.
    #[test]
    fn a_batch_whose_earlier_try_was_stored_unseen_is_recorded_at_its_own_position() {
        let Some(bin) = crate::nats_server::binary_for_test() else { return };
        let dir = tempfile::tempdir().unwrap();
        let server = crate::nats_server::NatsServer::single(&bin, dir.path()).unwrap();
        let cfg = JetStreamConfig {
            timeout: Duration::from_millis(500),
            ..JetStreamConfig::shard(vec![server.url()], "t", 0, 1)
        };
        let engine = JetStreamEngine::open(cfg.clone(), 1).unwrap();
        let last_seq = engine.writer().last_seq;
        assert_eq!(last_seq, 1, "the fence");
        let parts = frame((0..3u8).map(|i| Write::Put(vec![i], vec![i; CHUNK_BYTES / 2 + 1])));
        assert_eq!(parts.len(), 3);
        let to = Append {
            js: engine.js.clone(),
            client: engine.client.clone(),
            stream: cfg.stream.clone(),
            subject: cfg.subject(Kind::Group),
            epoch: 1,
            last_seq,
            retry_for: Duration::from_secs(2),
        };
        let (js, client, subject, first) = (to.js.clone(), to.client.clone(), to.subject.clone(), parts.clone());
        let stored = engine.run(async move {
            let headers = append_headers(1, last_seq, first.len());
            publish_batch(&js, &client, &subject, &batch_id(1, last_seq, 1), &first, &headers)
                .await
                .map_err(|e| e.to_string())
        });
        assert_eq!(stored, Ok(4), "try 1 stored; its answer is what the owner never saw");
        let retried = engine.run(publish_batch_tries(to, parts, append_headers(1, last_seq, 3), 2));
        assert_eq!(retried.map_err(|e| e.to_string()), Ok(4), "try 2 finds try 1 at its own position");
        engine.writer().last_seq = 4;
        engine.apply(vec![Write::Put(b"after".to_vec(), b"1".to_vec())]).unwrap();
        engine.barrier().expect("the next append follows the batch: the owner was not fenced out");
        assert_eq!(fence_violations(&cfg).unwrap(), []);
    }

    proptest! {
        /// Pairs taken from either end, in any order, across chunk
        /// boundaries, are exactly the map's range, each once.
        #[test]
        fn a_range_read_in_chunks_from_both_ends_is_the_maps_range(
            keys in prop::collection::btree_set(0u16..2000, 0..700),
            start in 0u16..2000,
            len in prop::option::of(0u16..2000),
            ends in prop::collection::vec(any::<bool>(), 0..800),
        ) {
            let map: Map = keys.iter().map(|k| (k.to_be_bytes().to_vec(), vec![*k as u8])).collect();
            let (lo, hi) = (start.to_be_bytes().to_vec(), len.map(|n| start.saturating_add(n).to_be_bytes().to_vec()));
            let high = hi.clone().map_or(Bound::Unbounded, Bound::Excluded);
            let mut want: VecDeque<_> = if hi.as_ref().is_some_and(|h| *h < lo) {
                VecDeque::new()
            } else {
                map.range::<Vec<u8>, _>((Bound::Included(lo.clone()), high.clone())).map(|(k, v)| (k.clone(), v.clone())).collect()
            };
            let mut got = Range {
                view: Arc::new(RwLock::new(map)),
                low: Bound::Included(lo),
                high,
                front: VecDeque::new(),
                back: VecDeque::new(),
            };
            for from_back in ends.into_iter().chain(std::iter::repeat_n(false, 2100)) {
                let (g, w) = if from_back {
                    (got.next_back(), want.pop_back())
                } else {
                    (got.next(), want.pop_front())
                };
                prop_assert_eq!(g.map(Result::unwrap), w);
            }
        }
    }
}
