//! The store against a model, across power cuts (the pattern of sled's own
//! BTreeMap model test): random histories of commits, durability waits,
//! reads and power cuts run through the real `Store` over the model engine.
//!
//! After every cut and reopen the store must hold the history up to some
//! commit `k`, whole commits only, with `k` at least the last commit
//! acknowledged durable; before any cut, reads see every commit at once.
//! The same histories run over sled, with a close and reopen for the cut,
//! and over the JetStream engine on a single nats-server (skipped when none
//! is installed, except under `CI=true`), where the cut is a close, a
//! `kill -9` of the server and a reopen under a newer fencing epoch.
//!
//! Histories remove kv entries and blobs and compact the store
//! (`Store::compact_now`, a no-op on the model): on sled, whose segments
//! are kept small here, compaction moves the live blobs and events and
//! removes segments, and the store must still equal the model after every
//! reopen, removed keys included. On sled a compaction also rewrites sled
//! into a fresh copy (`sled_engine.rs`, step 9).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use proptest::prelude::*;
use relay_actors::nats_server::NatsServer;
use relay_actors::store::{
    verify_chain, JetStreamConfig, JetStreamEngine, ModelEngine, NewEvent, SledEngine, Snapshot, Store,
};
use serde_json::value::RawValue;

const STREAMS: [&str; 3] = ["account/a", "account/b", "delivery/a/m1"];
/// kv keys, and blob keys (`l/…`: values the sled engine keeps in its log).
const KEYS: [&[u8]; 8] = [b"due/1", b"due/2", b"i/a/v", b"t/a/1", b"l/a/m1", b"l/a/m2", b"l/a/m3", b"l/b/m1"];

fn is_blob(key: &[u8]) -> bool {
    key.starts_with(b"l/")
}

/// A kv entry's value is one byte; a blob's is longer, so that its
/// segments on sled are mostly its values and compaction has work.
fn value_of(key: &[u8], v: u8) -> Vec<u8> {
    if is_blob(key) {
        vec![v; 100 + usize::from(v)]
    } else {
        vec![v]
    }
}

/// sled's segments close past this here, so histories cross many.
const SMALL_SEGMENTS: u64 = 1_024;

#[derive(Clone, Debug)]
struct Commit {
    /// (stream, events appended)
    appends: Vec<(usize, u8)>,
    /// (key, Some(value) to put, None to remove)
    kv: Vec<(usize, Option<u8>)>,
    /// A snapshot of this stream at its head after the appends.
    snapshot: Option<usize>,
}

#[derive(Clone, Debug)]
enum Op {
    Commit(Commit),
    /// Wait until every commit so far is durable.
    Durable,
    /// Compare everything readable with the model (read your writes).
    Check,
    /// Power cut keeping this many groups written after the last barrier;
    /// then reopen.
    PowerCut(usize),
    /// Reclaim the log's dead space now (and, on sled, rewrite sled).
    Compact,
}

fn commit() -> impl Strategy<Value = Commit> {
    (
        prop::collection::vec((0..STREAMS.len(), 1..3u8), 0..3),
        prop::collection::vec((0..KEYS.len(), prop::option::weighted(0.7, any::<u8>())), 0..3),
        prop::option::of(0..STREAMS.len()),
    )
        .prop_map(|(mut appends, kv, snapshot)| {
            appends.sort_by_key(|a| a.0);
            appends.dedup_by_key(|a| a.0);
            Commit { appends, kv, snapshot }
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => commit().prop_map(Op::Commit),
        2 => Just(Op::Durable),
        2 => Just(Op::Check),
        1 => (0..3usize).prop_map(Op::PowerCut),
        1 => Just(Op::Compact),
    ]
}

/// What the store should hold: events (seq, data) per stream, snapshots
/// (seq) per stream, kv.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    events: BTreeMap<String, Vec<(u64, String)>>,
    snapshots: BTreeMap<String, u64>,
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
}

/// One commit as written, so that the model can apply it again.
#[derive(Clone, Debug)]
struct Written {
    events: Vec<(String, u64, String)>,
    snapshot: Option<(String, u64)>,
    kv: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

impl State {
    fn apply(&mut self, w: &Written) {
        for (stream, seq, data) in &w.events {
            self.events.entry(stream.clone()).or_default().push((*seq, data.clone()));
        }
        if let Some((stream, seq)) = &w.snapshot {
            self.snapshots.insert(stream.clone(), *seq);
        }
        for (k, v) in &w.kv {
            match v {
                Some(v) => self.kv.insert(k.clone(), v.clone()),
                None => self.kv.remove(k),
            };
        }
    }

    /// Everything the store shows through its public reads; chains checked.
    fn read(store: &Store) -> State {
        let mut state = State::default();
        for stream in STREAMS {
            assert_eq!(verify_chain(store.read(stream, 0)), [], "{stream}");
            let events: Vec<_> =
                store.read(stream, 0).map(|e| e.unwrap()).map(|e| (e.seq, e.data.get().to_owned())).collect();
            assert_eq!(store.head(stream).unwrap().seq, events.last().map_or(0, |e| e.0), "{stream}");
            assert_eq!(store.has_events(stream).unwrap(), !events.is_empty(), "{stream}");
            if !events.is_empty() {
                state.events.insert(stream.to_owned(), events);
            }
            if let Some(snap) = store.load_snapshot(stream).unwrap() {
                state.snapshots.insert(stream.to_owned(), snap.seq);
            }
        }
        let streams: Vec<String> = store.streams().map(|s| s.unwrap()).collect();
        assert_eq!(streams, state.events.keys().cloned().collect::<Vec<_>>());
        state.kv = store.kv_scan_prefix(b"").chain(store.blob_scan_prefix(b"")).map(|kv| kv.unwrap()).collect();
        for key in KEYS {
            let got = if is_blob(key) { store.blob_get(key) } else { store.kv_get(key) };
            assert_eq!(got.unwrap().as_ref(), state.kv.get(key), "{}", String::from_utf8_lossy(key));
        }
        state
    }
}

/// Builds and commits `c` on `store` (tracking heads through the store);
/// returns what it wrote.
fn run_commit(store: &Store, c: &Commit, serial: &mut u64) -> Written {
    let mut batch = store.batch();
    let mut written = Written { events: Vec::new(), snapshot: None, kv: Vec::new() };
    let mut heads = HashMap::new();
    for &(s, n) in &c.appends {
        let stream = STREAMS[s];
        let head = store.head(stream).unwrap();
        let events: Vec<NewEvent> = (0..n)
            .map(|i| {
                *serial += 1;
                let data = format!(r#"{{"serial":{serial}}}"#);
                written.events.push((stream.to_owned(), head.seq + 1 + i as u64, data.clone()));
                NewEvent {
                    event_type: "noted".into(),
                    version: 1,
                    at: *serial,
                    data: RawValue::from_string(data).unwrap(),
                }
            })
            .collect();
        heads.insert(s, batch.append(stream, head, events));
    }
    if let Some(s) = c.snapshot {
        let head = heads.get(&s).copied().unwrap_or_else(|| store.head(STREAMS[s]).unwrap());
        batch.put_snapshot(STREAMS[s], Snapshot { seq: head.seq, hash: head.hash, state: b"{}".to_vec() });
        written.snapshot = Some((STREAMS[s].to_owned(), head.seq));
    }
    for &(k, v) in &c.kv {
        let key = KEYS[k].to_vec();
        match v {
            Some(v) if is_blob(&key) => {
                batch.blob_put(&key, &value_of(&key, v));
                written.kv.push((key.clone(), Some(value_of(&key, v))));
            }
            None if is_blob(&key) => {
                batch.blob_remove(&key);
                written.kv.push((key, None));
            }
            Some(v) => {
                batch.kv_put(&key, &[v]);
                written.kv.push((key, Some(vec![v])));
            }
            None => {
                batch.kv_remove(&key);
                written.kv.push((key, None));
            }
        }
    }
    store.commit(batch).unwrap();
    written
}

/// Where the history runs. A power cut on sled is a close and reopen (a
/// real cut needs a process to kill: see `store.rs`), so there every
/// commit made before it must come back.
enum Backend {
    Model(Arc<ModelEngine>),
    Sled(tempfile::TempDir),
    /// A stream of its own on the shared server, and the epoch to open with.
    /// ...and the directory of its local copy, kept across reopens.
    JetStream(Box<(JetStreamConfig, tempfile::TempDir)>, u64),
}

impl Backend {
    /// The store, and its sled engine when it has one.
    fn open(&self) -> (Store, Option<Arc<SledEngine>>) {
        match self {
            Backend::Model(engine) => (Store::with_engine(engine.clone()).unwrap(), None),
            Backend::Sled(dir) => {
                let engine =
                    Arc::new(SledEngine::open(dir.path(), None).unwrap().with_checkpoint_bytes(SMALL_SEGMENTS));
                (Store::with_engine(engine.clone()).unwrap(), Some(engine))
            }
            Backend::JetStream(js, epoch) => {
                (Store::with_engine(Arc::new(JetStreamEngine::open(js.0.clone(), *epoch).unwrap())).unwrap(), None)
            }
        }
    }
}

/// One nats-server for every JetStream case of this test binary.
fn nats() -> Option<&'static std::sync::Mutex<(NatsServer, tempfile::TempDir)>> {
    static SERVER: std::sync::OnceLock<Option<std::sync::Mutex<(NatsServer, tempfile::TempDir)>>> =
        std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            let bin = relay_actors::nats_server::binary_for_test()?;
            let dir = tempfile::tempdir().unwrap();
            Some(std::sync::Mutex::new((NatsServer::single(&bin, dir.path()).unwrap(), dir)))
        })
        .as_ref()
}

fn jetstream_backend(server: &NatsServer) -> Backend {
    static CASE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let case = CASE.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let cfg = JetStreamConfig {
        // Small: checkpoints (and the trims below them) happen within a
        // history; reopens catch the copy up.
        snapshot_bytes: 600,
        copy_dir: Some(dir.path().join("copy")),
        ..JetStreamConfig::shard(vec![server.url()], &format!("model{}", std::process::id()), case, 1)
    };
    Backend::JetStream(Box::new((cfg, dir)), 1)
}

fn run(ops: Vec<Op>, mut backend: Backend) {
    let (mut store, mut sled) = backend.open();
    // The state at the last reopen, the commits since, and how many of
    // those were acknowledged durable.
    let mut base = State::default();
    let mut since: Vec<Written> = Vec::new();
    let mut acked = 0;
    let mut serial = 0;
    let expected = |base: &State, since: &[Written]| {
        let mut s = base.clone();
        since.iter().for_each(|w| s.apply(w));
        s
    };
    for op in ops {
        match op {
            Op::Commit(c) => since.push(run_commit(&store, &c, &mut serial)),
            Op::Durable => {
                store.flush().unwrap();
                acked = since.len();
            }
            Op::Check => assert_eq!(State::read(&store), expected(&base, &since), "read your writes"),
            Op::Compact => {
                store.compact_now().unwrap();
                assert_eq!(State::read(&store), expected(&base, &since), "compaction changes nothing readable");
                if let Some(engine) = &sled {
                    engine.rewrite_now().unwrap();
                    assert_eq!(State::read(&store), expected(&base, &since), "a rewrite changes nothing readable");
                }
            }
            Op::PowerCut(keep) => {
                match &mut backend {
                    Backend::Model(engine) => {
                        let image = Arc::new(engine.power_cut(keep));
                        drop((store, sled));
                        *engine = image;
                    }
                    Backend::Sled(_) => {
                        drop((store, sled));
                        acked = since.len();
                    }
                    Backend::JetStream(_, epoch) => {
                        drop((store, sled));
                        acked = since.len();
                        let mut server = nats().unwrap().lock().unwrap_or_else(|e| e.into_inner());
                        server.0.kill();
                        server.0.restart().unwrap();
                        *epoch += 1;
                    }
                }
                (store, sled) = backend.open();
                let found = State::read(&store);
                // Some prefix of the history, at least what was acknowledged.
                let mut state = expected(&base, &since[..acked]);
                let mut k = acked;
                while state != found && k < since.len() {
                    state.apply(&since[k]);
                    k += 1;
                }
                assert_eq!(
                    found,
                    state,
                    "after a power cut: not the history up to any commit from {acked} (acknowledged) to {}",
                    since.len()
                );
                base = found;
                since.clear();
                acked = 0;
            }
        }
    }
    store.flush().unwrap();
    assert_eq!(State::read(&store), expected(&base, &since));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn power_cuts_lose_nothing_acknowledged_and_keep_commits_whole(ops in prop::collection::vec(op(), 1..60)) {
        run(ops, Backend::Model(Arc::new(ModelEngine::new())));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn sled_reopens_hold_every_commit_with_verified_chains(ops in prop::collection::vec(op(), 1..40)) {
        run(ops, Backend::Sled(tempfile::tempdir().unwrap()));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn jetstream_reopens_after_server_kills_hold_every_commit_with_verified_chains(
        ops in prop::collection::vec(op(), 1..40)
    ) {
        let Some(server) = nats() else { return Ok(()) };
        let backend = jetstream_backend(&server.lock().unwrap_or_else(|e| e.into_inner()).0);
        run(ops, backend);
    }
}

/// The model itself: a cut keeps the barrier's state and whole groups after it.
#[test]
fn model_power_cut_keeps_what_the_barrier_covered_and_whole_groups_after_it() {
    use relay_actors::store::{Engine, Write};
    let put = |k: &str, v: &str| Write::Put(k.as_bytes().to_vec(), v.as_bytes().to_vec());
    let m = ModelEngine::new();
    m.apply(vec![put("a", "1")]).unwrap();
    m.barrier().unwrap();
    m.apply(vec![put("b", "2"), put("a", "3")]).unwrap();
    m.apply(vec![put("c", "4")]).unwrap();
    assert_eq!(m.pending_groups(), 2);
    let get = |e: &ModelEngine, k: &str| e.get(k.as_bytes()).unwrap();
    let cut = m.power_cut(0);
    assert_eq!((get(&cut, "a"), get(&cut, "b")), (Some(b"1".to_vec()), None));
    let cut = m.power_cut(1);
    assert_eq!((get(&cut, "a"), get(&cut, "b"), get(&cut, "c")), (Some(b"3".to_vec()), Some(b"2".to_vec()), None));
}
