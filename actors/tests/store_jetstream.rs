//! The JetStream engine on a real single nats-server (skipped when none is
//! installed, except under `CI=true`): fencing of a stale owner, groups
//! larger than one message, and acknowledged commits across a `kill -9` of
//! the server. The store's property test over it is in `store_model.rs`.

use std::sync::Arc;

use relay_actors::nats_server::{self, NatsServer};
use relay_actors::store::{
    fence_violations, Engine, JetStreamConfig, JetStreamEngine, NewEvent, Store, StoreError, Write, CHUNK_BYTES,
};
use serde_json::value::RawValue;

struct Fixture {
    server: NatsServer,
    _dir: tempfile::TempDir,
}

fn server() -> Option<Fixture> {
    let bin = nats_server::binary_for_test()?;
    let dir = tempfile::tempdir().unwrap();
    Some(Fixture { server: NatsServer::single(&bin, dir.path()).unwrap(), _dir: dir })
}

fn shard(f: &Fixture) -> JetStreamConfig {
    // Short: a publish to a killed server is retried this long a few times.
    JetStreamConfig {
        timeout: std::time::Duration::from_millis(500),
        ..JetStreamConfig::shard(vec![f.server.url()], "t", 0, 1)
    }
}

fn open(cfg: &JetStreamConfig, epoch: u64) -> Store {
    Store::with_engine(Arc::new(JetStreamEngine::open(cfg.clone(), epoch).unwrap())).unwrap()
}

fn append(store: &Store, stream: &str, n: u64) -> Result<(), StoreError> {
    let mut batch = store.batch();
    let head = store.head(stream)?;
    let events = (0..n)
        .map(|i| NewEvent {
            event_type: "noted".into(),
            version: 1,
            at: i,
            data: RawValue::from_string(format!(r#"{{"n":{i}}}"#)).unwrap(),
        })
        .collect();
    batch.append(stream, head, events);
    store.commit_durable_blocking(batch)
}

#[test]
fn a_newer_owner_fences_the_stale_one_whose_next_append_fails_and_changes_nothing() {
    let Some(f) = server() else { return };
    let cfg = shard(&f);
    let old = open(&cfg, 1);
    append(&old, "account/a", 2).unwrap();

    let new = open(&cfg, 2);
    assert_eq!(new.head("account/a").unwrap().seq, 2, "the new owner replays what the old one wrote");

    let failure = old.failure();
    let refused = append(&old, "account/a", 1);
    assert!(matches!(refused, Err(StoreError::Flush(ref e)) if e.contains("fenced")), "{refused:?}");
    assert!(!old.is_healthy(), "a fenced store takes no more commits");
    // What a cluster node waits on to give the relay up.
    let why = tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(failure);
    assert!(why.contains("fenced"), "{why}");
    assert!(append(&old, "account/b", 1).is_err());

    append(&new, "account/a", 1).unwrap();
    drop((old, new));
    let again = open(&cfg, 3);
    assert_eq!(again.head("account/a").unwrap().seq, 3);
    assert_eq!(again.head("account/b").unwrap().seq, 0, "nothing of the fenced owner's landed");
    assert_eq!(fence_violations(&cfg).unwrap(), [], "no group after a newer fence");
}

#[test]
fn an_owner_whose_epoch_is_below_the_newest_fence_cannot_open_and_the_same_owner_can_reopen() {
    let Some(f) = server() else { return };
    let cfg = shard(&f);
    drop(open(&cfg, 5));
    for stale in [4, 1] {
        match JetStreamEngine::open(cfg.clone(), stale) {
            Err(StoreError::Flush(e)) => assert!(e.contains("newer owner"), "{e}"),
            other => panic!("epoch {stale} opened over fence 5: {:?}", other.map(|e| e.epoch())),
        }
    }
    // The owner of epoch 5 opening again (an open that failed after its fence).
    let again = open(&cfg, 5);
    append(&again, "account/a", 1).unwrap();
    assert_eq!(fence_violations(&cfg).unwrap(), []);
}

#[test]
fn a_group_larger_than_a_message_is_stored_whole_as_one_atomic_batch() {
    let Some(f) = server() else { return };
    let cfg = shard(&f);
    let engine = JetStreamEngine::open(cfg.clone(), 1).unwrap();
    // One group, as the store's writer hands it: four parts, and a write
    // larger than a part on its own.
    let value = vec![7u8; CHUNK_BYTES / 2 + 1];
    let mut group: Vec<Write> = (0..3u8).map(|g| Write::Put(vec![b'k', g], value.clone())).collect();
    group.push(Write::Put(vec![b'k', 3], vec![9u8; CHUNK_BYTES * 3]));
    engine.apply(group).unwrap();
    engine.barrier().unwrap();
    assert_eq!(sequences(&f, &cfg), (1, 5), "the fence, then one batch of four messages");
    engine.install().unwrap();
    assert_eq!(engine.range(b"k", None).count(), 4);
    drop(engine);

    let reopened = JetStreamEngine::open(cfg.clone(), 2).unwrap();
    let keys: Vec<Vec<u8>> = reopened.range(b"", None).map(|kv| kv.unwrap().0).collect();
    assert_eq!(keys, (0..4u8).map(|g| vec![b'k', g]).collect::<Vec<_>>());
    assert_eq!(fence_violations(&cfg).unwrap(), []);
}

#[test]
fn a_snapshot_lets_the_next_owner_replay_only_the_tail_and_purges_the_stream_below_it() {
    let Some(f) = server() else { return };
    let cfg = JetStreamConfig { snapshot_bytes: 2_000, ..shard(&f) };
    let store = open(&cfg, 1);
    for _ in 0..40 {
        append(&store, "account/a", 1).unwrap();
    }
    append(&store, "account/b", 3).unwrap();
    drop(store);

    let (first, _) = sequences(&f, &cfg);
    assert!(first > 10, "the stream was purged below a snapshot (first sequence {first})");
    let store = open(&cfg, 2);
    assert_eq!(store.head("account/a").unwrap().seq, 40);
    assert_eq!(store.head("account/b").unwrap().seq, 3);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    assert_eq!(fence_violations(&cfg).unwrap(), [], "a snapshot stands for the fences purged before it");
    // The newer owner's fence is above the snapshot's epoch: the old one stays out.
    drop(store);
    match JetStreamEngine::open(cfg.clone(), 1) {
        Err(StoreError::Flush(e)) => assert!(e.contains("newer owner"), "{e}"),
        other => panic!("epoch 1 opened over epoch 2: {:?}", other.map(|e| e.epoch())),
    }
}

/// A takeover counts the groups written since the newest snapshot, by
/// whichever owner: owners that each crash before writing
/// `snapshot_bytes` of their own still snapshot (and purge) between them.
#[test]
fn owners_in_a_crash_loop_still_snapshot_counting_groups_since_the_newest_snapshot() {
    let Some(f) = server() else { return };
    let cfg = JetStreamConfig { snapshot_bytes: 2_000, ..shard(&f) };
    // Each owner writes well under snapshot_bytes before it "crashes".
    for epoch in 1..=30 {
        let store = open(&cfg, epoch);
        append(&store, "account/a", 1).unwrap();
        drop(store);
    }
    let snapshots = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
        let js = async_nats::jetstream::new(async_nats::connect(f.server.url()).await.unwrap());
        let stream = js.get_stream(&cfg.stream).await.unwrap();
        stream.get_last_raw_message_by_subject(&format!("{}.p", cfg.prefix)).await.is_ok()
    });
    assert!(snapshots, "no snapshot in 30 owners' groups of {} bytes", cfg.snapshot_bytes);
    let (first, _) = sequences(&f, &cfg);
    assert!(first > 1, "the stream was purged below a snapshot (first sequence {first})");
    let store = open(&cfg, 31);
    assert_eq!(store.head("account/a").unwrap().seq, 30);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    assert_eq!(fence_violations(&cfg).unwrap(), []);
}

/// The stream's first (1 until a purge) and last sequences.
fn sequences(f: &Fixture, cfg: &JetStreamConfig) -> (u64, u64) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (url, stream) = (f.server.url(), cfg.stream.clone());
    rt.block_on(async move {
        let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
        let state = js.get_stream(&stream).await.unwrap().get_info().await.unwrap().state;
        (state.first_sequence, state.last_sequence)
    })
}

#[test]
fn acknowledged_commits_survive_a_kill_of_the_server() {
    let Some(mut f) = server() else { return };
    let cfg = shard(&f);
    let store = open(&cfg, 1);
    for _ in 0..50 {
        append(&store, "account/a", 1).unwrap();
    }
    f.server.kill();
    // The store cannot make anything durable while the server is gone.
    assert!(append(&store, "account/a", 1).is_err());
    drop(store);
    f.server.restart().unwrap();

    let store = open(&cfg, 2);
    let seq = store.head("account/a").unwrap().seq;
    assert!(seq == 50 || seq == 51, "the 50 acknowledged commits, and perhaps the one refused: {seq}");
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    append(&store, "account/a", 1).unwrap();
    assert_eq!(store.head("account/a").unwrap().seq, seq + 1);
}
