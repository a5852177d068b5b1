//! The cluster engine: the store's groups as messages of one NATS JetStream
//! stream (a shard, its log), read from a local copy on this node's disk
//! (`copy.rs`: the sled engine of a standalone relay) that follows the log.
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
//! 3. `install` lays the acknowledged groups on the local copy, as one
//!    group with the sequence of the append that carried them.
//!
//! **The local copy** (`<data_dir>/shards/<stream>`): the shard's pairs
//! and the last sequence they reflect, always together, so the copy is
//! the shard as of some sequence of the log; a crash leaves it behind,
//! never wrong. Events and blobs stay in the sled engine's own log, sled
//! holding pointers to them, and sled's page cache is `cache_bytes`: what
//! an owner holds in memory follows its keys, not the bytes of its shard
//! (plain sled kept every value it was given in memory here: 24 MiB more
//! heap after 1,500 sends of 16 KiB, whatever its cache).
//!
//! **Fencing and catch-up.** Opening appends a fence (`<prefix>.f`, header
//! `Relay-Epoch`) with the expected last sequence it read, then brings the
//! copy to the fence: a copy of this log (its name and creation time)
//! whose next message the log still holds reads only the messages after
//! its sequence; any other (none, behind the trimmed log) is emptied and
//! bootstrapped from the newest checkpoint and the groups after it. From
//! that point any append by an earlier owner fails on its expected
//! sequence, its store fails (the writer's failure is sticky) and takes no
//! more commits. The epoch is the revision of the owner's lease
//! (`relay_core::lease`); opening refuses a stream whose newest fence (or
//! last message: the fences may be trimmed) has a higher epoch than its
//! own, so an owner whose lease was superseded cannot fence out the newer
//! one (an equal epoch is the same owner opening again after a failure).
//! Every group message also carries the epoch it was written under, so
//! [`fence_violations`] can show that no group follows a newer fence.
//!
//! **Standbys follow the log** (`tail.rs`): a node holding a copy of a
//! shard it does not own lays each append on it as it is stored, by the
//! same rules (the catch-up's [`Laying`]: an append whole, its sequence in
//! the same sled batch; the bootstrap's [`start`] when the log no longer
//! reaches the copy), so its takeover reads only the appends stored since
//! it stopped following: the last moments, whatever the shard holds.
//!
//! **Checkpoints and trimming** (`checkpoint.rs`). After `snapshot_bytes`
//! of groups (and at least as many as the last checkpoint took) the owner
//! writes a checkpoint of its copy, in chunks on a stream of its own, on a
//! thread beside the writer: commits never wait for it, and no more than a
//! chunk is in memory. Each node's copy has a record (a KV entry per node,
//! its applied sequence, written when it opens, at each checkpoint and as
//! a standby's copy follows, forgotten after `copy_record_ttl`); after a checkpoint the owner purges
//! the log below the lowest record and the checkpoint's `from`, plus one:
//! a copy with a live record always catches up, a bootstrap always finds
//! the log after its checkpoint, and the log's size follows what is
//! written between checkpoints, not its history. No snapshot goes into the
//! log (a log from an earlier version may hold some on `<prefix>.p`: a
//! bootstrap without a checkpoint starts from the newest, a catch-up skips
//! them).

use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use async_nats::header::{HeaderMap, NATS_EXPECTED_LAST_SEQUENCE, NATS_MESSAGE_ID};
use async_nats::jetstream::{self, context::PublishErrorKind, message::StreamMessage, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::checkpoint;
use super::consumer;
use super::copy::{LocalCopy, Pending};
use super::engine::{Engine, KvIter, Write};
use super::types::{jetstream_err as err, StoreError};
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
    /// Subject prefix: groups go to `<prefix>.g`, fences to `<prefix>.f`
    /// (snapshots of earlier versions are on `<prefix>.p`; checkpoints
    /// on `<prefix>.cp` and `<prefix>.cpe`, in a stream of their own).
    pub prefix: String,
    /// Copies JetStream keeps (3 in a cluster, 1 on a single server).
    pub replicas: usize,
    /// How long one request to JetStream may take before it is retried; an
    /// append is retried for four times this long, then the store fails.
    pub timeout: Duration,
    /// A checkpoint of the local copy is written after this many bytes of
    /// groups (and at least as many as the last checkpoint took).
    pub snapshot_bytes: u64,
    /// How the engine authenticates to the servers and checks them.
    pub auth: NatsAuth,
    /// Where this node keeps its copy of the shard (`copy.rs`), e.g.
    /// `<data_dir>/shards/<stream>`; `None`: a temporary copy, removed
    /// when the engine is dropped (tests). A read-only open always uses a
    /// temporary one (the owner may hold this directory).
    pub copy_dir: Option<PathBuf>,
    /// The copy's page cache in memory (sled's `cache_capacity`): what
    /// an owner holds of its shard, whatever the shard's size.
    pub cache_bytes: u64,
    /// This node's name: the key of its copy's record.
    pub node: String,
    /// A copy's record (its applied sequence, which the log is not trimmed
    /// past) is forgotten this long after its node last wrote it: a node
    /// gone longer bootstraps from the checkpoint.
    pub copy_record_ttl: Duration,
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

/// Default of [`JetStreamConfig::cache_bytes`].
pub const SHARD_CACHE_BYTES: u64 = 64 << 20;

/// Default of [`JetStreamConfig::copy_record_ttl`].
pub const COPY_RECORD_TTL: Duration = Duration::from_secs(15 * 60);

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
            copy_dir: None,
            cache_bytes: SHARD_CACHE_BYTES,
            node: "node".into(),
            copy_record_ttl: COPY_RECORD_TTL,
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

    /// Where this shard's checkpoints go (`checkpoint.rs`).
    fn checkpoints(&self) -> checkpoint::Place<'_> {
        checkpoint::Place {
            stream: &self.stream,
            prefix: &self.prefix,
            replicas: self.replicas,
            stall: self.timeout * 2,
            chunk_bytes: CHUNK_BYTES,
            batch: REPLAY_BATCH,
        }
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

struct Writer {
    /// Groups applied, not yet published.
    queued: Vec<Vec<Write>>,
    /// Groups acknowledged, not yet installed in the copy.
    acked: Vec<Vec<Write>>,
    /// The stream's last sequence: this owner's last append.
    last_seq: u64,
    /// Bytes of groups since the last checkpoint began.
    since_checkpoint: u64,
    /// Bytes of the last checkpoint.
    checkpoint_size: u64,
}

pub struct JetStreamEngine {
    /// Drives the NATS connection; the writer thread blocks on it.
    rt: Option<tokio::runtime::Runtime>,
    js: jetstream::Context,
    client: async_nats::Client,
    cfg: JetStreamConfig,
    /// 0 for a read-only engine, which refuses writes.
    epoch: u64,
    /// This node's copy of the shard: what reads see.
    copy: LocalCopy,
    caught_up: CatchUp,
    /// The log's name and creation time: what checkpoints are of.
    log: Vec<u8>,
    /// The checkpoint being written beside the writer, if any.
    checkpointing: Mutex<Option<std::thread::JoinHandle<()>>>,
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

impl JetStreamEngine {
    /// Connects, creates the stream if missing, fences it with `epoch` and
    /// brings the local copy up to the fence.
    pub fn open(cfg: JetStreamConfig, epoch: u64) -> Result<JetStreamEngine, StoreError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-jetstream")
            .enable_all()
            .build()
            .map_err(|e| err("runtime", e))?;
        // Read-only: never the owner's directory (it may hold it open).
        let dir = if epoch == 0 { None } else { cfg.copy_dir.as_deref() };
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(|e| err("create the copy's directory", e))?;
        }
        let copy = LocalCopy::open(dir, cfg.cache_bytes)?;
        let (client, js, last_seq, read, copy) = run(&rt, open(cfg.clone(), epoch, copy))?;
        let CatchUp { from, through, bootstrapped } = read.caught_up;
        tracing::info!(stream = %cfg.stream, from, through, bootstrapped,
            "jetstream: the local copy is at the fence");
        Ok(JetStreamEngine {
            rt: Some(rt),
            js,
            client,
            cfg,
            epoch,
            copy,
            caught_up: read.caught_up,
            log: read.log,
            checkpointing: Mutex::new(None),
            writer: Mutex::new(Writer {
                queued: Vec::new(),
                acked: Vec::new(),
                last_seq,
                // Counted on from the stream (trimmed at the newest
                // checkpoint): a takeover (a crash loop too) checkpoints
                // when the groups since call for it, whoever wrote them.
                since_checkpoint: read.log_bytes,
                checkpoint_size: read.checkpoint_size,
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

    /// How the open brought the local copy to the fence.
    pub fn caught_up(&self) -> CatchUp {
        self.caught_up
    }

    fn run<T: Send + 'static>(&self, fut: impl Future<Output = T> + Send + 'static) -> T {
        run(self.rt.as_ref().expect("runtime lives until drop"), fut)
    }

    fn writer(&self) -> MutexGuard<'_, Writer> {
        self.writer.lock().unwrap_or_else(|e| e.into_inner())
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

    /// Writes a checkpoint of the copy while commits go on, then trims the
    /// log below what it and every copy's record need; waits for it.
    pub fn checkpoint(&self) -> Result<checkpoint::Mark, StoreError> {
        let (js, cfg, copy, log) = (self.js.clone(), self.cfg.clone(), self.copy.clone(), self.log.clone());
        self.run(async move { checkpoint_and_trim(&js, &cfg, &copy, &log).await })
    }

    /// Starts [`JetStreamEngine::checkpoint`] on a thread beside the
    /// writer, unless one is running.
    fn start_checkpoint(&self) {
        let mut slot = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let handle = self.rt.as_ref().expect("runtime lives until drop").handle().clone();
        let (js, cfg, copy, log) = (self.js.clone(), self.cfg.clone(), self.copy.clone(), self.log.clone());
        let spawned = std::thread::Builder::new().name("store-checkpoint".into()).spawn(move || {
            // Not fatal: the groups are stored; the next is tried after
            // as many bytes again.
            match handle.block_on(checkpoint_and_trim(&js, &cfg, &copy, &log)) {
                Ok(mark) => tracing::info!(stream = %cfg.stream, from = mark.from, until = mark.until,
                    chunks = mark.chunks, bytes = mark.bytes, "jetstream checkpoint written"),
                Err(e) => tracing::warn!(stream = %cfg.stream, error = %e, "jetstream checkpoint failed"),
            }
        });
        match spawned {
            Ok(thread) => *slot = Some(thread),
            Err(e) => tracing::warn!(error = %e, "jetstream checkpoint not started"),
        }
    }
}

/// Checkpoints `copy`, records its sequence as this node's, and trims the
/// log below the newest checkpoint's `from + 1` and every live record
/// (what a copy at that sequence reads next): no copy whose node wrote its
/// record within `copy_record_ttl` has to bootstrap, and a bootstrap
/// always finds the log after its checkpoint.
async fn checkpoint_and_trim(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    copy: &LocalCopy,
    log: &[u8],
) -> Result<checkpoint::Mark, StoreError> {
    let mark = checkpoint::write(js, &cfg.checkpoints(), copy, log).await?;
    // The message the copy is at stays: the log's last epoch is read there.
    let applied = copy.applied()?;
    let records = records(js, cfg).await?;
    record(&records, cfg, applied).await?;
    let mut floor = mark.from.min(applied.saturating_sub(1));
    let mut keys = records.keys().await.map_err(|e| err("copy records", e))?;
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| err("copy records", e))?;
        let value = records.get(&key).await.map_err(|e| err("copy records", e))?;
        if let Some(applied) = value.and_then(|v| std::str::from_utf8(&v).ok()?.parse::<u64>().ok()) {
            floor = floor.min(applied);
        }
    }
    let stream = js.get_stream(&cfg.stream).await.map_err(|e| err("get the stream", e))?;
    // Not fenced, and harmless when late: it only drops what every copy
    // and the checkpoint are past.
    match stream.purge().sequence(floor + 1).await {
        Ok(p) => tracing::info!(stream = %cfg.stream, below = floor + 1, purged = p.purged, "jetstream log trimmed"),
        Err(e) => tracing::warn!(stream = %cfg.stream, error = %e, "jetstream log not trimmed"),
    }
    Ok(mark)
}

/// The bucket of the copies' records: per node, the sequence its copy is
/// at, forgotten `copy_record_ttl` after its last write.
pub(super) async fn records(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
) -> Result<jetstream::kv::Store, StoreError> {
    let bucket = format!("{}_COPIES", cfg.stream);
    if let Ok(kv) = js.get_key_value(&bucket).await {
        return Ok(kv);
    }
    js.create_key_value(jetstream::kv::Config {
        bucket,
        history: 1,
        max_age: cfg.copy_record_ttl,
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| err("copy records", e))
}

pub(super) async fn record(
    records: &jetstream::kv::Store,
    cfg: &JetStreamConfig,
    applied: u64,
) -> Result<(), StoreError> {
    records.put(&cfg.node, applied.to_string().into()).await.map_err(|e| err("copy record", e))?;
    Ok(())
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
pub(super) fn run<T: Send + 'static>(rt: &tokio::runtime::Runtime, fut: impl Future<Output = T> + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv().expect("the engine's runtime ended a task without an answer")
}

pub(super) async fn connect(cfg: &JetStreamConfig) -> Result<(async_nats::Client, jetstream::Context), StoreError> {
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
    mut copy: LocalCopy,
) -> Result<(async_nats::Client, jetstream::Context, u64, Replayed, LocalCopy), StoreError> {
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
        let read = replay(&js, &stream, &cfg, Through::Last, &mut copy).await?;
        return Ok((client, js, read.caught_up.through, read, copy));
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
        // A snapshot, and the last message (the log is never trimmed past
        // it), carry their writer's epoch: the fences before them may have
        // been purged.
        let fence = newest(&stream, &fence_subject).await?.map_or(0, |m| epoch_of(Some(&m.headers)).unwrap_or(0));
        let snapshot = newest_snapshot(&stream, &cfg).await?.map_or(0, |(_, epoch)| epoch);
        let tail = match last {
            0 => 0,
            last => match stream.get_raw_message(last).await {
                Ok(m) => epoch_of(Some(&m.headers)).unwrap_or(0),
                Err(e) if e.kind() == stream::RawMessageErrorKind::NoMessageFound => 0,
                Err(e) => return Err(err("read the last message", e)),
            },
        };
        let newest = fence.max(snapshot).max(tail);
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
    let read = replay(&js, &stream, &cfg, Through::Seq(fence_seq), &mut copy).await?;
    // Not fatal: without its record a copy may be trimmed past, and is
    // then bootstrapped.
    let recorded = async { record(&records(&js, &cfg).await?, &cfg, read.caught_up.through).await };
    if let Err(e) = recorded.await {
        tracing::warn!(stream = %cfg.stream, error = %e, "jetstream: the copy's record was not written");
    }
    Ok((client, js, fence_seq, read, copy))
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

/// Brings `copy` to `through` (the fence just written, or the stream's
/// last message), and says where it started.
///
/// A copy of this very log (its name and creation time) whose applied
/// sequence the log still holds the next message of **catches up**: only
/// the messages after it are read. Any other copy (none, another log's,
/// behind the trimmed log) is emptied and **bootstrapped**: the newest
/// checkpoint (`checkpoint.rs`), then every group after its `from` (a log
/// from before checkpoints: its newest snapshot, then the groups after
/// it). Message `through` exists, so the walk always reaches it. A walk
/// that finds a gap (trimmed meanwhile: a read-only open does not stop the
/// owner) starts again.
async fn replay(
    js: &jetstream::Context,
    stream: &stream::Stream,
    cfg: &JetStreamConfig,
    through: Through,
    copy: &mut LocalCopy,
) -> Result<Replayed, StoreError> {
    let log = log_name(cfg, stream);
    for _ in 0..REPLAY_TRIES {
        if let Some(read) = replay_once(js, stream, cfg, through, copy, &log).await? {
            return Ok(read);
        }
    }
    Err(err("replay", format!("the stream kept changing below the read ({REPLAY_TRIES} tries)")))
}

/// The log's name and creation time: what a copy and a checkpoint are of
/// (a stream deleted and created again under the same name is another log).
pub(super) fn log_name(cfg: &JetStreamConfig, stream: &stream::Stream) -> Vec<u8> {
    let created = stream.cached_info().created.unix_timestamp_nanos();
    format!("{} {created}", cfg.stream).into_bytes()
}

/// Walks again when trimmed under a read.
const REPLAY_TRIES: usize = 5;

/// Messages a replay asks for at once: with parts of up to [`CHUNK_BYTES`]
/// about 16 MiB in flight, well under the 64 MiB a nats-server lets a
/// client fall behind before it drops it as a slow consumer.
const REPLAY_BATCH: i64 = 32;

/// A replay lays what it read on the copy in sled batches of about this
/// many bytes (each at the end of an append, with its sequence).
pub(super) const INSTALL_BYTES: usize = 4 << 20;

/// How an open brought the local copy to the fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CatchUp {
    /// The first message read (`through + 1`: none).
    pub from: u64,
    /// The sequence the copy is at: the fence (or, read-only, the
    /// stream's last message).
    pub through: u64,
    /// Whether the copy was emptied and built again from the newest
    /// checkpoint (no copy, or one the trimmed log no longer reaches).
    pub bootstrapped: bool,
}

/// What a replay did.
#[derive(Debug)]
struct Replayed {
    caught_up: CatchUp,
    /// The log's name and creation time.
    log: Vec<u8>,
    /// Bytes of the newest checkpoint (0: none).
    checkpoint_size: u64,
    /// Bytes the log holds (it is trimmed at the newest checkpoint).
    log_bytes: u64,
}

/// Where a replay ends.
#[derive(Clone, Copy, Debug)]
pub(super) enum Through {
    /// At this sequence (the fence this owner just wrote).
    Seq(u64),
    /// At the stream's last message when the walk starts (read-only).
    Last,
}

/// Where a walk of the log starts on a copy, decided as [`replay`] says:
/// a copy of this log that the log still reaches catches up; any other is
/// emptied and laid from the newest checkpoint (or snapshot).
pub(super) struct Start {
    /// The first message to read.
    pub(super) from: u64,
    /// The copy is the shard at a message laid only from here on (a
    /// checkpoint's `until`; 0: at once).
    pub(super) consistent: u64,
    /// Whether the copy was emptied and built again.
    pub(super) bootstrapped: bool,
    /// A bootstrap from a snapshot of an earlier version: read its parts.
    pub(super) in_snapshot: bool,
    /// The copy's sequence before the walk (0: none of this log).
    pub(super) applied: u64,
    /// Bytes of the newest checkpoint (0: none).
    pub(super) checkpoint_size: u64,
    /// The log's state when the walk began.
    pub(super) state: stream::State,
}

pub(super) async fn start(
    js: &jetstream::Context,
    stream: &stream::Stream,
    cfg: &JetStreamConfig,
    through: Through,
    copy: &mut LocalCopy,
    log: &[u8],
) -> Result<Start, StoreError> {
    // The checkpoint and snapshot first, the log's state after: they are
    // then at or below its last sequence.
    let mark = checkpoint::newest(js, &cfg.checkpoints(), log).await?;
    let snapshot = if mark.is_none() { newest_snapshot(stream, cfg).await? } else { None };
    let state = stream.get_info().await.map_err(|e| err("stream info", e))?.state;
    let through = match through {
        Through::Seq(seq) => seq,
        Through::Last => state.last_sequence,
    };
    let applied = if copy.stream()?.as_deref() == Some(log) { copy.applied()? } else { 0 };
    // The message after the copy's is still in the stream (or there is
    // none to read): catch up. A copy at 0 may hold a bootstrap cut short.
    let bootstrapped = !(applied > 0 && applied + 1 >= state.first_sequence && applied <= through);
    let (from, consistent) = match (&mark, snapshot) {
        _ if !bootstrapped => (applied + 1, 0),
        (Some(mark), _) => {
            copy.restart(log)?;
            checkpoint::read(js, &cfg.checkpoints(), mark, copy).await?;
            (mark.from + 1, mark.until)
        }
        (None, Some((first, _))) => {
            copy.restart(log)?;
            (first, 0)
        }
        (None, None) => {
            copy.restart(log)?;
            (1, 0)
        }
    };
    Ok(Start {
        from,
        consistent,
        bootstrapped,
        in_snapshot: bootstrapped && mark.is_none() && snapshot.is_some(),
        applied,
        checkpoint_size: mark.as_ref().map_or(0, |m| m.bytes),
        state,
    })
}

/// Lays the log's messages on a copy, in order, an append at a time.
pub(super) struct Laying {
    pub(super) pending: Pending,
    /// A batch's parts until its commit part.
    parts: Vec<Vec<u8>>,
    /// The snapshot a bootstrap starts from is read; any other is skipped:
    /// the copy already holds what it does.
    in_snapshot: bool,
    /// The sequence expected next.
    pub(super) next: u64,
    consistent: u64,
}

impl Laying {
    pub(super) fn new(start: &Start) -> Laying {
        Laying {
            pending: Pending::default(),
            parts: Vec::new(),
            in_snapshot: start.in_snapshot,
            next: start.from,
            consistent: start.consistent,
        }
    }

    /// Takes message `seq`: `None` if it is not the one expected (a gap:
    /// trimmed under the read), else whether it ended its append.
    pub(super) fn take(
        &mut self,
        cfg: &JetStreamConfig,
        seq: u64,
        msg: &jetstream::Message,
    ) -> Result<Option<bool>, StoreError> {
        if seq != self.next {
            return Ok(None);
        }
        self.next += 1;
        let (pending, parts, headers) = (&mut self.pending, &mut self.parts, msg.headers.as_ref());
        Ok(Some(match cfg.kind(msg.subject.as_str()) {
            Some(Kind::Snapshot) if self.in_snapshot => {
                let whole = lay(pending, parts, headers, &msg.payload, seq, &cfg.stream)?;
                self.in_snapshot = !whole;
                whole
            }
            Some(Kind::Group) => lay(pending, parts, headers, &msg.payload, seq, &cfg.stream)?,
            // A skipped snapshot's parts, a fence: nothing to lay, and the
            // copy is at this sequence once the last part is passed.
            Some(Kind::Snapshot) => last_part(headers),
            Some(Kind::Fence) | None => true,
        }))
    }

    /// Lays what was taken on the copy, at `seq` (the end of an append):
    /// the shard at `seq`, once past a checkpoint's `until`.
    pub(super) fn install(&mut self, copy: &LocalCopy, seq: u64) -> Result<(), StoreError> {
        copy.install(std::mem::take(&mut self.pending), if seq >= self.consistent { seq } else { 0 })
    }
}

/// One walk of [`replay`]; `None` when it found a gap.
async fn replay_once(
    js: &jetstream::Context,
    stream: &stream::Stream,
    cfg: &JetStreamConfig,
    through: Through,
    copy: &mut LocalCopy,
    log: &[u8],
) -> Result<Option<Replayed>, StoreError> {
    let start = start(js, stream, cfg, through, copy, log).await?;
    let through = match through {
        Through::Seq(seq) => seq,
        Through::Last => start.state.last_sequence,
    };
    let read = Replayed {
        caught_up: CatchUp { from: start.from, through, bootstrapped: start.bootstrapped },
        log: log.to_vec(),
        checkpoint_size: start.checkpoint_size,
        log_bytes: start.state.bytes,
    };
    if through == 0 || start.from > through {
        // Nothing to read: a checkpoint of the whole log is its state.
        copy.install(Pending::default(), through.max(start.applied))?;
        return Ok(Some(read));
    }
    let mut messages = log_consumer(stream, start.from).await?;
    let mut laying = Laying::new(&start);
    // A replay that stops making progress (its consumer lost, the server
    // stalled) fails, and the caller tries again, rather than holding the
    // lease while serving nothing.
    let stall = cfg.timeout * 2;
    loop {
        let msg = progress(&mut messages, stall, laying.next, through).await?;
        let seq = msg.info().map_err(|e| err("replay", e))?.stream_sequence;
        let Some(whole) = laying.take(cfg, seq, &msg)? else { return Ok(None) };
        if whole && (laying.pending.bytes >= INSTALL_BYTES || seq == through) {
            laying.install(copy, seq)?;
        }
        if seq == through {
            break;
        }
    }
    Ok(Some(read))
}

/// The log's messages from `from` on, at most [`REPLAY_BATCH`] asked for
/// at once (what a slow reader can have pending).
pub(super) async fn log_consumer(
    stream: &stream::Stream,
    from: u64,
) -> Result<jetstream::consumer::pull::Ordered, StoreError> {
    let config = jetstream::consumer::pull::OrderedConfig {
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: from },
        max_batch: REPLAY_BATCH,
        ..Default::default()
    };
    let consumer = consumer::ordered(stream, config, "replay consumer").await?;
    consumer.messages().await.map_err(|e| err("replay", e))
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

/// Whether a message is the last of its append (a batch's commit, or a
/// message outside a batch).
fn last_part(headers: Option<&HeaderMap>) -> bool {
    headers.and_then(|h| h.get(BATCH_ID)).is_none() || headers.and_then(|h| h.get(BATCH_COMMIT)).is_some()
}

/// Lays one stored group message on `pending`; whether it ended its
/// append. A batch's parts are kept in `parts` until its commit part
/// (JetStream stores a batch whole, so a part without its commit is not in
/// the stream).
fn lay(
    pending: &mut Pending,
    parts: &mut Vec<Vec<u8>>,
    headers: Option<&HeaderMap>,
    payload: &[u8],
    seq: u64,
    stream: &str,
) -> Result<bool, StoreError> {
    let corrupt = |what: &str| StoreError::Corrupt { stream: stream.to_owned(), seq, what: what.to_owned() };
    parts.push(payload.to_vec());
    if !last_part(headers) {
        return Ok(false);
    }
    for part in std::mem::take(parts) {
        let decoded = wal::decode(&part);
        if decoded.valid_len != part.len() {
            return Err(corrupt("a group message that does not decode whole"));
        }
        decoded.groups.into_iter().flatten().for_each(|w| pending.push(w));
    }
    Ok(true)
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
        self.copy.get(key)
    }

    fn range(&self, start: &[u8], end: Option<&[u8]>) -> KvIter {
        self.copy.range(start, end)
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
        w.since_checkpoint += bytes as u64;
        let queued = std::mem::take(&mut w.queued);
        w.acked.extend(queued);
        self.bytes.fetch_add(bytes as u64, Relaxed);
        self.barriers.fetch_add(1, Relaxed);
        Ok(())
    }

    fn install(&self) -> Result<(), StoreError> {
        let mut w = self.writer();
        if !w.acked.is_empty() {
            // One sled batch: the groups and the sequence they reach.
            let mut pending = Pending::default();
            std::mem::take(&mut w.acked).into_iter().flatten().for_each(|write| pending.push(write));
            self.copy.install(pending, w.last_seq)?;
        }
        // Never more checkpoint than groups written: one waits for as
        // many bytes of groups as the last one took.
        if w.since_checkpoint >= self.cfg.snapshot_bytes.max(w.checkpoint_size) {
            w.since_checkpoint = 0;
            self.start_checkpoint();
        }
        Ok(())
    }

    fn close(&self) -> Result<(), StoreError> {
        // A checkpoint under way ends before the runtime it uses does.
        let running = self.checkpointing.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = running {
            let _ = thread.join();
        }
        // Where the copy stops: the log is kept from there for it (best
        // effort: without it, the record of its open or last checkpoint).
        // Never a reason to keep the copy open: it is let go below whatever this says.
        if self.epoch != 0 {
            let recorded = self.copy.applied().and_then(|applied| {
                let (js, cfg) = (self.js.clone(), self.cfg.clone());
                self.run(async move { record(&records(&js, &cfg).await?, &cfg, applied).await })
            });
            if let Err(e) = recorded {
                tracing::warn!(stream = %self.cfg.stream, error = %e, "jetstream: the copy's record was not written");
            }
        }
        // Let go, so that the next open of this shard on this node finds
        // the directory free even if the store is still held somewhere.
        self.copy.close()
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
    let state = stream.get_info().await.map_err(|e| err("stream info", e))?.state;
    let (first, last) = (state.first_sequence, state.last_sequence);
    let mut found = Vec::new();
    if last == 0 {
        return Ok(found);
    }
    let config = jetstream::consumer::pull::OrderedConfig::default();
    let consumer = consumer::ordered(&stream, config, "fence walk consumer").await?;
    let mut messages = consumer.messages().await.map_err(|e| err("fence walk", e))?;
    let mut fence = 0;
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| err("fence walk", e))?;
        let seq = msg.info().map_err(|e| err("fence walk", e))?.stream_sequence;
        let epoch = epoch_of(msg.headers.as_ref()).unwrap_or(0);
        match cfg.kind(msg.subject.as_str()) {
            Some(Kind::Fence) => fence = fence.max(epoch),
            // The log's first message after a trim: its epoch stands for
            // the fences purged before it.
            _ if fence == 0 && seq == first => fence = epoch,
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
}
