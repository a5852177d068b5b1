//! A standby's copy of a shard follows the log (`jetstream.rs`): a node
//! that may serve a shard (it holds the shard's copy, not its lease) lays
//! each acknowledged append on its copy as it is stored, by the owner's
//! catch-up rules: an append whole, with its sequence in the same sled
//! batch, so the copy is always the shard at some sequence of the log; a
//! copy the trimmed log no longer reaches (or of another log) is emptied
//! and bootstrapped from the newest checkpoint. It records its sequence in
//! `<stream>_COPIES` as the owner's copy does, so the owner's trim keeps
//! the log from there on and moves on as the standby does. A takeover
//! then reads only what was stored since the follower stopped.
//!
//! Bounded as the owner's catch-up: the consumer asks for at most
//! `REPLAY_BATCH` messages at once, what is read is laid every
//! `INSTALL_BYTES` (or when nothing more is pending), and a consumer that
//! delivers nothing for `2 × timeout` while the log holds more (lost, the
//! server stalled) is replaced. Its sled cache is at most
//! [`FOLLOW_CACHE_BYTES`] (it only writes), so a node following many shards
//! does not hold an owner's cache for each.

use std::sync::mpsc;
use std::time::Duration;

use async_nats::jetstream;
use futures_util::StreamExt;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::copy::{LocalCopy, Pending};
use super::jetstream::{
    connect, log_consumer, log_name, record, records, run, start, JetStreamConfig, Laying, Through, INSTALL_BYTES,
};
use super::types::{jetstream_err as err, StoreError};

/// The page cache of a following copy (at most `cache_bytes`): sled keeps
/// the pages a copy writes, and a follower reads only its own records.
pub const FOLLOW_CACHE_BYTES: u64 = 8 << 20;

/// A copy following its shard's log, on a runtime of its own, until
/// stopped.
pub struct Follower {
    rt: Option<tokio::runtime::Runtime>,
    stop: Option<oneshot::Sender<()>>,
    /// Sent when the follow task has ended.
    ended: Option<mpsc::Receiver<()>>,
    copy: LocalCopy,
    applied: watch::Receiver<u64>,
    /// What its record in `<stream>_COPIES` last said.
    recorded: watch::Receiver<u64>,
}

impl Follower {
    /// Opens the copy in `cfg.copy_dir` and follows the log into it. The
    /// directory is held (sled's lock) until [`Follower::stop`].
    pub fn start(cfg: JetStreamConfig) -> Result<Follower, StoreError> {
        let dir = cfg.copy_dir.clone().ok_or_else(|| err("follow", "a follower needs the copy's directory"))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-follow")
            .enable_all()
            .build()
            .map_err(|e| err("runtime", e))?;
        let copy = LocalCopy::open(Some(&dir), cfg.cache_bytes.min(FOLLOW_CACHE_BYTES))?;
        let (applied_tx, applied) = watch::channel(copy.applied()?);
        let (recorded_tx, recorded) = watch::channel(0);
        let (stop, stopped) = oneshot::channel();
        let (ended_tx, ended) = mpsc::sync_channel(1);
        let following = copy.clone();
        rt.spawn(async move {
            follow(cfg, following, Watched { applied: applied_tx, recorded: recorded_tx }, stopped).await;
            let _ = ended_tx.send(());
        });
        Ok(Follower { rt: Some(rt), stop: Some(stop), ended: Some(ended), copy, applied, recorded })
    }

    /// The sequence the copy is at.
    pub fn applied(&self) -> u64 {
        *self.applied.borrow()
    }

    /// Waits until the copy is at `seq` or later, at most `within`; the
    /// sequence it is at then.
    pub fn wait_for(&self, seq: u64, within: Duration) -> u64 {
        self.wait(&self.applied, seq, within)
    }

    /// Waits until the copy's record says `seq` or later, at most
    /// `within`; what it says then.
    pub fn wait_recorded(&self, seq: u64, within: Duration) -> u64 {
        self.wait(&self.recorded, seq, within)
    }

    fn wait(&self, watched: &watch::Receiver<u64>, seq: u64, within: Duration) -> u64 {
        let mut watched = watched.clone();
        let rt = self.rt.as_ref().expect("the runtime lives until stopped");
        run(rt, async move {
            let _ = tokio::time::timeout(within, watched.wait_for(|at| *at >= seq)).await;
            let at = *watched.borrow();
            at
        })
    }

    /// Stops following (between two sled batches: the copy stays the
    /// shard at its sequence) and lets the copy go, so that an owner's
    /// open finds its directory free. Blocks until then; the sequence the
    /// copy stopped at.
    pub fn stop(mut self) -> Result<u64, StoreError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(ended) = self.ended.take() {
            let _ = ended.recv();
        }
        let applied = self.copy.applied();
        self.copy.close()?;
        applied
    }
}

impl Drop for Follower {
    fn drop(&mut self) {
        // Never blocks (a follower may be dropped on an async thread): the
        // task ends with its runtime, at its next wait.
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

/// What the follow task tells its [`Follower`].
struct Watched {
    applied: watch::Sender<u64>,
    recorded: watch::Sender<u64>,
}

/// Follows until `stop`: a walk of the log at a time ([`tail`]), another
/// after one ends (a gap: trimmed under it; an error: after a pause).
async fn follow(cfg: JetStreamConfig, mut copy: LocalCopy, watched: Watched, mut stop: oneshot::Receiver<()>) {
    let connected = tokio::select! {
        connected = connect(&cfg) => connected,
        _ = &mut stop => return,
    };
    let (_client, js) = match connected {
        Ok(connected) => connected,
        Err(e) => return tracing::warn!(stream = %cfg.stream, error = %e, "jetstream: the copy cannot follow the log"),
    };
    let mut recorded = Recorded::default();
    loop {
        let walked = tokio::select! {
            walked = tail(&js, &cfg, &mut copy, &watched, &mut recorded) => walked,
            _ = &mut stop => return,
        };
        let pause = match walked {
            Ok(()) => Duration::ZERO,
            Err(e) => {
                tracing::warn!(stream = %cfg.stream, error = %e, "jetstream: the copy stopped following the log; again soon");
                cfg.timeout
            }
        };
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = &mut stop => return,
        }
    }
}

/// When the copy's record was last written, and with what.
#[derive(Default)]
struct Recorded {
    at: Option<Instant>,
    applied: u64,
}

impl Recorded {
    /// A record moved on at most every `2 × timeout` (the log is trimmed
    /// behind it), and written again before `copy_record_ttl` forgets it.
    fn due(&self, applied: u64, cfg: &JetStreamConfig) -> bool {
        self.at.is_none_or(|at| {
            let since = at.elapsed();
            (applied != self.applied && since >= cfg.timeout * 2) || since >= cfg.copy_record_ttl / 3
        })
    }
}

/// One walk: brings the copy to the log's end (caught up, or bootstrapped
/// as a takeover would be), then lays each append as it is stored. Ends
/// `Ok` at a gap (the log trimmed past the walk: the next walk decides
/// again), an error if the consumer stops delivering while the log holds
/// more.
async fn tail(
    js: &jetstream::Context,
    cfg: &JetStreamConfig,
    copy: &mut LocalCopy,
    watched: &Watched,
    recorded: &mut Recorded,
) -> Result<(), StoreError> {
    let stream = js.get_stream(&cfg.stream).await.map_err(|e| err("get the stream", e))?;
    let log = log_name(cfg, &stream);
    let start = start(js, &stream, cfg, Through::Last, copy, &log).await?;
    let last = start.state.last_sequence;
    if start.bootstrapped && start.from > last {
        // A checkpoint of the whole log is its state.
        copy.install(Pending::default(), last)?;
    }
    let mut at = copy.applied()?;
    watched.applied.send_replace(at);
    let mut messages = log_consumer(&stream, start.from).await?;
    let mut laying = Laying::new(&start);
    let stall = cfg.timeout * 2;
    loop {
        match tokio::time::timeout(stall, messages.next()).await {
            Ok(Some(msg)) => {
                let msg = msg.map_err(|e| err("follow", e))?;
                let info = msg.info().map_err(|e| err("follow", e))?;
                let (seq, more) = (info.stream_sequence, info.pending);
                let Some(whole) = laying.take(cfg, seq, &msg)? else { return Ok(()) };
                if whole && (laying.pending.bytes >= INSTALL_BYTES || more == 0) {
                    laying.install(copy, seq)?;
                    at = copy.applied()?;
                    watched.applied.send_replace(at);
                }
            }
            Ok(None) => return Err(err("follow", "the consumer ended")),
            // Nothing for a while: the log idle, or the consumer stuck.
            Err(_) => {
                let last = stream.get_info().await.map_err(|e| err("stream info", e))?.state.last_sequence;
                if last >= laying.next {
                    return Err(err(
                        "follow",
                        format!("no message for {stall:?} at sequence {} of {last}", laying.next),
                    ));
                }
            }
        }
        if recorded.due(at, cfg) {
            record(&records(js, cfg).await?, cfg, at).await?;
            *recorded = Recorded { at: Some(Instant::now()), applied: at };
            watched.recorded.send_replace(at);
        }
    }
}
