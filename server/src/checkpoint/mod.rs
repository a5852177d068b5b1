//! Signed checkpoints of this relay's store (PROTOCOL §10): written at
//! start, every `audit.checkpoint_interval`, and whenever the retention
//! sweep asks (before it prunes); kept with their leaves; answered to peers
//! by `audit.checkpoint`; the peers' own are fetched and logged by
//! [`witness`]. The object, the tree and the *extends* rule are
//! `relay_schemas::checkpoint` (pure); this module reads the store and
//! keeps files.
//!
//! # On disk
//! `<data_dir>/checkpoints/<n>.jsonl` (n: 16 decimal digits, counting up):
//! the first line is the signed checkpoint, each further line one leaf's
//! exact bytes (`JCS([stream, last_sequence, last_chain_hash])`, sorted by
//! stream), the bytes the tree hashes. Written aside, fsynced, renamed,
//! the directory fsynced; files 0600 and the directory 0700 (the process
//! umask, `private_files`). The last [`KEEP`] are kept: a leaf costs its
//! line, about 110 bytes for an `account/…` stream and up to about 190
//! for a `delivery/…` one, per stream per kept checkpoint.
//!
//! # Computing one
//! Only reads: every stream with events (`Store::streams`) and every
//! stream pruned whole (`Store::pruned_markers`), each one's head
//! (`Store::head`, a stream pruned whole has its marker's). Commits go on
//! meanwhile: each head is one the store had at some moment of the scan.
//! Then `Store::flush` waits until everything read is durable, so a crash
//! cannot take back what a checkpoint claims. `events` is the sum of the
//! heads' sequences: every event ever appended to the streams listed,
//! pruned ones included. A store whose heads are those of the latest
//! checkpoint gets no new one (pruning leaves heads as they are).

pub mod witness;

use ed25519_dalek::SigningKey;
use relay_actors::store::{Store, StoreError};
use relay_core::clock::SharedClock;
use relay_schemas::checkpoint::{Checkpoint, Leaf};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Checkpoints kept with their leaves (the latest ones); older files are
/// removed when a new one is written.
pub const KEEP: usize = 24;

/// The directory of the kept checkpoints in a data dir.
pub fn dir_in(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoints")
}

/// Every stream's leaf, sorted by stream, and the events they count.
pub fn leaves_of(store: &Store) -> Result<(Vec<Leaf>, u64), StoreError> {
    let mut whole: BTreeMap<String, relay_actors::store::Head> = BTreeMap::new();
    for marker in store.pruned_markers() {
        let (stream, pruned) = marker?;
        whole.insert(stream, pruned.head);
    }
    let mut leaves = Vec::with_capacity(whole.len());
    for stream in store.streams() {
        let stream = stream?;
        // A prefix-pruned stream has events: its head is its last event's.
        whole.remove(&stream);
        let head = store.head(&stream)?;
        leaves.push(Leaf { stream, seq: head.seq, hash: head.hash });
    }
    leaves.extend(whole.into_iter().map(|(stream, head)| Leaf { stream, seq: head.seq, hash: head.hash }));
    leaves.retain(|l| l.seq > 0);
    leaves.sort_unstable_by(|a, b| a.stream.cmp(&b.stream));
    let events = leaves.iter().map(|l| l.seq).sum();
    Ok((leaves, events))
}

/// A kept checkpoint: its file and the checkpoint (its first line).
#[derive(Clone, Debug)]
pub struct KeptFile {
    pub path: PathBuf,
    pub checkpoint: Checkpoint,
}

/// The kept checkpoints in `dir`, oldest first (unreadable files skipped).
pub fn kept(dir: &Path) -> std::io::Result<Vec<KeptFile>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut files: Vec<(u64, PathBuf)> = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let n = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".jsonl"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(n) = n {
            files.push((n, path));
        }
    }
    files.sort();
    for (_, path) in files {
        if let Ok(checkpoint) = first_line(&path) {
            out.push(KeptFile { path, checkpoint });
        }
    }
    Ok(out)
}

fn first_line(path: &Path) -> Result<Checkpoint, String> {
    let mut line = String::new();
    BufReader::new(std::fs::File::open(path).map_err(|e| e.to_string())?)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let map: Map<String, Value> = serde_json::from_str(&line).map_err(|e| e.to_string())?;
    Checkpoint::from_map(&map).map_err(|e| e.to_string())
}

/// The leaves kept in a checkpoint's file (every line after the first).
pub fn read_leaves(path: &Path) -> Result<Vec<Leaf>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut leaves = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate().skip(1) {
        let line = line.map_err(|e| format!("{}: {e}", path.display()))?;
        leaves.push(Leaf::parse(line.as_bytes()).map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?);
    }
    Ok(leaves)
}

/// Writes `path` whole or not at all: aside, fsynced, renamed, the
/// directory fsynced. The file is its owner's only (0600).
pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let aside = dir.join(format!(".{name}.tmp"));
    {
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let mut f = opts.open(&aside)?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&aside, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Creates `dir` (0700) if needed.
pub(crate) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// The checkpoint writer of a running relay.
pub struct Checkpoints {
    store: Store,
    key: SigningKey,
    relay_id: String,
    dir: PathBuf,
    clock: SharedClock,
    /// Held while one is computed and written: one at a time.
    state: Mutex<State>,
    /// The latest checkpoint's JSON, for `audit.checkpoint`.
    latest: Mutex<Option<Arc<str>>>,
}

struct State {
    /// The number of the next file.
    next: u64,
    latest: Option<Checkpoint>,
}

impl Checkpoints {
    /// The writer for `data_dir/checkpoints`, resuming after the files there.
    pub fn open(
        store: Store,
        key: SigningKey,
        relay_id: &str,
        data_dir: &Path,
        clock: SharedClock,
    ) -> Result<Checkpoints, String> {
        let dir = dir_in(data_dir);
        private_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let files = kept(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let next = files.iter().filter_map(|f| file_number(&f.path)).max().map_or(1, |n| n + 1);
        let latest = files.last().map(|f| f.checkpoint.clone());
        let json = latest.as_ref().map(|c| Arc::from(json_of(c)));
        Ok(Checkpoints {
            store,
            key,
            relay_id: relay_id.to_owned(),
            dir,
            clock,
            state: Mutex::new(State { next, latest }),
            latest: Mutex::new(json),
        })
    }

    /// The latest checkpoint's JSON (what `audit.checkpoint` answers).
    pub fn latest_json(&self) -> Option<Arc<str>> {
        self.latest.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Computes a checkpoint of the store now and keeps it, unless the
    /// store's heads are the latest one's. Blocking (reads every stream's
    /// head, writes and syncs a file): call it off the event loop.
    pub fn write_now(&self) -> Result<Checkpoint, String> {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (leaves, events) = leaves_of(&self.store).map_err(|e| format!("reading the store: {e}"))?;
        // What was read is made durable before it is claimed.
        self.store.flush().map_err(|e| format!("flushing the store: {e}"))?;
        let root = hex::encode(relay_schemas::checkpoint::root_of(&leaves));
        if let Some(latest) = st.latest.as_ref().filter(|l| l.root == root && l.events == events) {
            return Ok(latest.clone());
        }
        // Never older than the one before (a clock set back).
        let issued_at = st.latest.as_ref().map_or(0, |l| l.issued_at).max(self.clock.now().0);
        let cp = Checkpoint::issue(&self.relay_id, issued_at, &leaves, events, &self.key).map_err(|e| e.to_string())?;
        let json = json_of(&cp);
        let mut bytes = Vec::with_capacity(json.len() + 1 + leaves.len() * 128);
        bytes.extend_from_slice(json.as_bytes());
        for leaf in &leaves {
            bytes.push(b'\n');
            bytes.extend_from_slice(&leaf.bytes());
        }
        bytes.push(b'\n');
        let path = self.dir.join(format!("{:016}.jsonl", st.next));
        write_atomically(&path, &bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        st.next += 1;
        st.latest = Some(cp.clone());
        *self.latest.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::from(json));
        self.remove_old();
        tracing::info!(streams = cp.streams, events = cp.events, root = %cp.root, "checkpoint written");
        Ok(cp)
    }

    /// Removes all but the last [`KEEP`] files.
    fn remove_old(&self) {
        let Ok(files) = kept(&self.dir) else { return };
        for old in files.iter().take(files.len().saturating_sub(KEEP)) {
            if let Err(e) = std::fs::remove_file(&old.path) {
                tracing::warn!(file = %old.path.display(), error = %e, "removing an old checkpoint");
            }
        }
    }

    /// Writes one now and then every `every`, each on a blocking thread
    /// (on the current arbiter's runtime).
    pub fn start_timer(self: &Arc<Self>, every: Duration) {
        let me = self.clone();
        actix_web::rt::spawn(async move {
            let mut tick = actix_web::rt::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let writer = me.clone();
                match actix_web::rt::task::spawn_blocking(move || writer.write_now()).await {
                    Ok(Ok(_)) => {}
                    Ok(Err(e)) => tracing::warn!(error = %e, "checkpoint"),
                    Err(e) => tracing::warn!(error = %e, "checkpoint"),
                }
            }
        });
    }
}

impl relay_actors::Checkpointer for Checkpoints {
    fn checkpoint(&self) -> Result<(), String> {
        self.write_now().map(drop)
    }
}

fn json_of(cp: &Checkpoint) -> String {
    serde_json::to_string(cp).expect("a checkpoint serializes")
}

fn file_number(path: &Path) -> Option<u64> {
    path.file_name()?.to_str()?.strip_suffix(".jsonl")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_actors::store::{Head, NewEvent};
    use relay_core::clock::ManualClock;
    use relay_schemas::checkpoint::{check_kept, verify};
    use relay_schemas::UnixSecs;

    fn append(store: &Store, stream: &str, n: usize) {
        let head = store.head(stream).unwrap();
        let events = (0..n).map(|i| NewEvent::new("noted", 1, UnixSecs(1), &i).unwrap()).collect();
        let mut batch = store.batch();
        batch.append(stream, head, events);
        store.commit_durable_blocking(batch).unwrap();
    }

    fn writer(store: &Store, dir: &Path, clock: Arc<ManualClock>) -> Checkpoints {
        Checkpoints::open(store.clone(), SigningKey::from_bytes(&[4; 32]), "relay-a", dir, clock).unwrap()
    }

    #[test]
    fn a_checkpoint_covers_every_stream_head_and_keeps_its_leaves() {
        let store = Store::temporary().unwrap();
        append(&store, "account/b", 3);
        append(&store, "account/a", 2);
        append(&store, "delivery/a/m1", 1);
        // Pruned whole: its head is its marker's.
        let gone = store.head("delivery/a/m1").unwrap();
        let mut batch = store.batch();
        batch.prune("delivery/a/m1", 0, gone, UnixSecs(5), Vec::new());
        store.commit_durable_blocking(batch).unwrap();
        assert_eq!(store.streams().count(), 2);

        let dir = tempfile::tempdir().unwrap();
        let w = writer(&store, dir.path(), ManualClock::at_ms(1_700_000_000_000));
        let cp = w.write_now().unwrap();
        assert_eq!((cp.streams, cp.events, cp.issued_at), (3, 6, 1_700_000_000));
        verify(&cp.to_map(), &SigningKey::from_bytes(&[4; 32]).verifying_key(), "relay-a").unwrap();
        let files = kept(&dir_in(dir.path())).unwrap();
        assert_eq!(files.len(), 1);
        let leaves = read_leaves(&files[0].path).unwrap();
        check_kept(&cp, &leaves).unwrap();
        let names: Vec<&str> = leaves.iter().map(|l| l.stream.as_str()).collect();
        assert_eq!(names, ["account/a", "account/b", "delivery/a/m1"]);
        assert_eq!(leaves[2], Leaf { stream: "delivery/a/m1".into(), seq: 1, hash: gone.hash });
        assert_eq!(w.latest_json().as_deref(), Some(json_of(&cp).as_str()));
    }

    #[test]
    fn an_unchanged_store_gets_no_new_checkpoint_and_a_changed_one_does() {
        let store = Store::temporary().unwrap();
        append(&store, "account/a", 2);
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::at_ms(1_700_000_000_000);
        let w = writer(&store, dir.path(), clock.clone());
        let first = w.write_now().unwrap();
        clock.advance_ms(5_000);
        assert_eq!(w.write_now().unwrap(), first);
        append(&store, "account/a", 1);
        let second = w.write_now().unwrap();
        assert_eq!((second.events, second.issued_at), (3, 1_700_000_005));
        assert_eq!(kept(&dir_in(dir.path())).unwrap().len(), 2);
        // A writer opened again goes on after the files there.
        let again = writer(&store, dir.path(), clock);
        assert_eq!(again.latest_json().as_deref(), Some(json_of(&second).as_str()));
        append(&store, "account/b", 1);
        again.write_now().unwrap();
        let numbers: Vec<u64> =
            kept(&dir_in(dir.path())).unwrap().iter().filter_map(|f| file_number(&f.path)).collect();
        assert_eq!(numbers, [1, 2, 3]);
    }

    #[test]
    fn only_the_last_checkpoints_are_kept() {
        let store = Store::temporary().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&store, dir.path(), ManualClock::at_ms(1_700_000_000_000));
        for _ in 0..KEEP + 3 {
            append(&store, "account/a", 1);
            w.write_now().unwrap();
        }
        let files = kept(&dir_in(dir.path())).unwrap();
        assert_eq!(files.len(), KEEP);
        assert_eq!(files.last().unwrap().checkpoint.events, KEEP as u64 + 3);
        assert_eq!(file_number(&files[0].path), Some(4));
    }

    /// The cost of one checkpoint: `CHECKPOINT_STREAMS` (default 100,000)
    /// streams of 3 events, half `account/…` and half `delivery/…`; prints
    /// the time to compute and write it and the bytes kept per stream.
    #[test]
    #[ignore = "a measurement: cargo test -p relay --lib checkpoint_cost -- --ignored --nocapture"]
    fn checkpoint_cost_for_many_streams() {
        let n: usize = std::env::var("CHECKPOINT_STREAMS").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
        let store = Store::temporary().unwrap();
        for chunk in (0..n).collect::<Vec<_>>().chunks(2_000) {
            let mut batch = store.batch();
            for &i in chunk {
                let stream = match i % 2 {
                    0 => format!("account/{:032x}", i),
                    _ => format!("delivery/{:032x}/{:026}", i, i),
                };
                let events = (0..3).map(|k| NewEvent::new("noted", 1, UnixSecs(1), &k).unwrap()).collect();
                batch.append(&stream, Head::default(), events);
            }
            store.commit_durable_blocking(batch).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&store, dir.path(), ManualClock::at_ms(1_700_000_000_000));
        let started = std::time::Instant::now();
        let (leaves, _) = leaves_of(&store).unwrap();
        let read = started.elapsed();
        let root = std::time::Instant::now();
        relay_schemas::checkpoint::root_of(&leaves);
        let hashed = root.elapsed();
        let started = std::time::Instant::now();
        let cp = w.write_now().unwrap();
        let whole = started.elapsed();
        let bytes = std::fs::metadata(&kept(&dir_in(dir.path())).unwrap()[0].path).unwrap().len();
        println!(
            "{n} streams: heads read in {read:?}, root in {hashed:?}, a whole checkpoint (read, root, sign, write, fsync) in {whole:?}; {bytes} bytes kept, {:.0} per stream",
            bytes as f64 / cp.streams as f64
        );
    }

    #[test]
    fn checkpoint_files_are_private_to_the_relays_user() {
        use std::os::unix::fs::PermissionsExt;
        let store = Store::temporary().unwrap();
        append(&store, "account/a", 1);
        let dir = tempfile::tempdir().unwrap();
        let w = writer(&store, dir.path(), ManualClock::at_ms(1_700_000_000_000));
        w.write_now().unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir_in(dir.path())), 0o700);
        assert_eq!(mode(&kept(&dir_in(dir.path())).unwrap()[0].path), 0o600);
    }
}
