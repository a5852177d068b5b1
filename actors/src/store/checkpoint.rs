//! Checkpoints of a shard's local copy (`jetstream.rs`), for a node that
//! has no copy, or one the trimmed log no longer reaches: the copy's pairs
//! in chunks on a stream of their own (`<stream>_CP`), never in the log.
//!
//! **Fuzzy, so commits never wait.** The owner reads its copy while groups
//! go on being installed: `from` is the copy's sequence before the read,
//! `until` after it. Each pair read is its key's value at some point in
//! between, so pairs + every group after `from`, laid in order, is the
//! shard at every sequence from `until` on: a key written after `from` ends
//! with its last write, any other never changed. A bootstrap therefore
//! lays the chunks, then the log from `from + 1`, and names its copy's
//! sequence only from `until` on; the log is never trimmed past `from + 1`
//! of the newest complete checkpoint.
//!
//! **Chunks, then a mark.** Chunks (`<prefix>.cp`, framed as groups, up to
//! `chunk_bytes` each, published one at a time: one chunk in memory) come
//! first; the mark (`<prefix>.cpe`) after them names them. A checkpoint
//! cut short has no mark and is never read; once a mark is stored, the
//! stream is purged below its first chunk. A mark names the log it was
//! made from (its name and creation time): another log's is ignored.

use async_nats::header::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use futures_util::StreamExt;

use super::consumer;
use super::copy::{LocalCopy, Pending};
use super::engine::Write;
use super::types::{jetstream_err as err, StoreError};
use super::wal;

/// Where a shard's checkpoints go, and how they are read (the engine's
/// settings, `jetstream.rs`).
pub struct Place<'a> {
    /// The log's stream; its checkpoints are in `<stream>_CP`.
    pub stream: &'a str,
    /// The log's subject prefix.
    pub prefix: &'a str,
    pub replicas: usize,
    /// A read that gets no chunk for this long fails.
    pub stall: std::time::Duration,
    /// Chunks are at most this long (a pair longer than that alone).
    pub chunk_bytes: usize,
    /// Chunks a bootstrap asks for at once.
    pub batch: i64,
}

const FROM: &str = "Relay-Checkpoint-From";
const UNTIL: &str = "Relay-Checkpoint-Until";
const FIRST: &str = "Relay-Checkpoint-First";
const CHUNKS: &str = "Relay-Checkpoint-Chunks";
const BYTES: &str = "Relay-Checkpoint-Bytes";
const LOG: &str = "Relay-Log";

/// A complete checkpoint, as its mark names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    /// The copy's sequence when the read began: the log is laid from the
    /// next one.
    pub from: u64,
    /// The copy's sequence when it ended: consistent from here on.
    pub until: u64,
    /// The first chunk's sequence in the checkpoints' stream.
    pub first: u64,
    pub chunks: u64,
    /// Bytes of the chunks.
    pub bytes: u64,
}

fn stream_name(cfg: &Place<'_>) -> String {
    format!("{}_CP", cfg.stream)
}

fn chunk_subject(cfg: &Place<'_>) -> String {
    format!("{}.cp", cfg.prefix)
}

fn mark_subject(cfg: &Place<'_>) -> String {
    format!("{}.cpe", cfg.prefix)
}

async fn stream(js: &jetstream::Context, cfg: &Place<'_>) -> Result<stream::Stream, StoreError> {
    js.get_or_create_stream(stream::Config {
        name: stream_name(cfg),
        subjects: vec![chunk_subject(cfg), mark_subject(cfg)],
        storage: stream::StorageType::File,
        num_replicas: cfg.replicas,
        ..Default::default()
    })
    .await
    .map_err(|e| err("create the checkpoints' stream", e))
}

fn number(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.as_str().parse().ok()
}

/// The newest complete checkpoint of the log named `log`, if any.
pub async fn newest(js: &jetstream::Context, cfg: &Place<'_>, log: &[u8]) -> Result<Option<Mark>, StoreError> {
    let stream = match js.get_stream(stream_name(cfg)).await {
        Ok(s) => s,
        Err(e)
            if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(ref e)
                if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(err("get the checkpoints' stream", e)),
    };
    let msg = match stream.get_last_raw_message_by_subject(&mark_subject(cfg)).await {
        Ok(m) => m,
        Err(e) if e.kind() == stream::LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(err("read the newest checkpoint", e)),
    };
    let h = &msg.headers;
    if h.get(LOG).map(|v| v.as_str().as_bytes()) != Some(log) {
        return Ok(None);
    }
    let mark = (|| {
        Some(Mark {
            from: number(h, FROM)?,
            until: number(h, UNTIL)?,
            first: number(h, FIRST)?,
            chunks: number(h, CHUNKS)?,
            bytes: number(h, BYTES)?,
        })
    })();
    mark.map(Some).ok_or_else(|| StoreError::Corrupt {
        stream: stream_name(cfg),
        seq: msg.sequence,
        what: "a checkpoint mark without its numbers".into(),
    })
}

/// Writes a checkpoint of `copy` (the log named `log`) while commits go
/// on, then purges the checkpoints before it. Runs on a thread of its own
/// (a blocking caller): reads of sled and publishes take turns, one chunk
/// at a time.
pub async fn write(js: &jetstream::Context, cfg: &Place<'_>, copy: &LocalCopy, log: &[u8]) -> Result<Mark, StoreError> {
    let stream = stream(js, cfg).await?;
    let from = copy.applied()?;
    let (subject, mut first, mut chunks, mut bytes) = (chunk_subject(cfg), 0, 0u64, 0u64);
    let publish = |record: Vec<u8>| {
        let (js, subject) = (js.clone(), subject.clone());
        async move {
            let ack = js.publish(subject, Bytes::from(record)).await.map_err(|e| err("checkpoint", e))?;
            Ok::<_, StoreError>(ack.await.map_err(|e| err("checkpoint", e))?.sequence)
        }
    };
    let (mut writes, mut size): (Vec<Write>, usize) = (Vec::new(), 0);
    let mut pairs = copy.range(b"", None);
    loop {
        let next = pairs.next().transpose()?.map(|(k, v)| Write::Put(k, v));
        let n = next.as_ref().map_or(0, wal::encoded_len);
        if (next.is_none() || size + n > cfg.chunk_bytes) && !writes.is_empty() {
            let mut record = Vec::with_capacity(size + 8);
            wal::encode(&writes, &mut record);
            bytes += record.len() as u64;
            let seq = publish(record).await?;
            if chunks == 0 {
                first = seq;
            }
            chunks += 1;
            if chunks == 1 {
                crate::crash::engine_point("checkpoint.after_chunk");
            }
            (writes, size) = (Vec::new(), 0);
        }
        let Some(w) = next else { break };
        size += n;
        writes.push(w);
    }
    drop(pairs);
    let until = copy.applied()?;
    let mut h = HeaderMap::new();
    for (name, n) in [(FROM, from), (UNTIL, until), (FIRST, first), (CHUNKS, chunks), (BYTES, bytes)] {
        h.insert(name, n.to_string().as_str());
    }
    h.insert(LOG, String::from_utf8_lossy(log).as_ref());
    let ack = js.publish_with_headers(mark_subject(cfg), h, Bytes::new()).await;
    let at = ack.map_err(|e| err("checkpoint mark", e))?.await.map_err(|e| err("checkpoint mark", e))?.sequence;
    // Older checkpoints go; without chunks, the mark is the first to keep.
    if let Err(e) = stream.purge().sequence(if chunks == 0 { at } else { first }).await {
        tracing::warn!(error = %e, "checkpoint written; purging the older ones failed");
    }
    Ok(Mark { from, until, first, chunks, bytes })
}

/// Lays checkpoint `mark`'s pairs on `copy` (emptied before), a sled batch
/// at a time, without naming a sequence: the log after `mark.from` makes
/// it consistent.
pub async fn read(js: &jetstream::Context, cfg: &Place<'_>, mark: &Mark, copy: &LocalCopy) -> Result<(), StoreError> {
    if mark.chunks == 0 {
        return Ok(());
    }
    let stream = stream(js, cfg).await?;
    let config = jetstream::consumer::pull::OrderedConfig {
        deliver_policy: jetstream::consumer::DeliverPolicy::ByStartSequence { start_sequence: mark.first },
        filter_subject: chunk_subject(cfg),
        max_batch: cfg.batch,
        ..Default::default()
    };
    let consumer = consumer::ordered(&stream, config, "checkpoint consumer").await?;
    let mut messages = consumer.messages().await.map_err(|e| err("checkpoint", e))?;
    let last = mark.first + mark.chunks - 1;
    for n in 0..mark.chunks {
        let msg = match tokio::time::timeout(cfg.stall, messages.next()).await {
            Ok(Some(msg)) => msg.map_err(|e| err("checkpoint", e))?,
            Ok(None) => return Err(err("checkpoint", "the consumer ended before the last chunk")),
            Err(_) => {
                return Err(err("checkpoint", format!("no chunk for {:?} at {} of {last}", cfg.stall, mark.first + n)))
            }
        };
        let seq = msg.info().map_err(|e| err("checkpoint", e))?.stream_sequence;
        let decoded = wal::decode(&msg.payload);
        if seq != mark.first + n || decoded.valid_len != msg.payload.len() {
            let what = "a checkpoint chunk missing or not decoding whole".to_owned();
            return Err(StoreError::Corrupt { stream: stream_name(cfg), seq, what });
        }
        let mut pending = Pending::default();
        decoded.groups.into_iter().flatten().for_each(|w| pending.push(w));
        copy.install(pending, 0)?;
        if n == 0 {
            crate::crash::engine_point("bootstrap.after_chunk");
        }
    }
    Ok(())
}
