//! The JetStream engine on a real single nats-server (skipped when none is
//! installed, except under `CI=true`): fencing of a stale owner, groups
//! larger than one message, and acknowledged commits across a `kill -9` of
//! the server (and of an owner at its checkpoints' crash points); a
//! standby's copy following the log. The store's property
//! test over it is in `store_model.rs`.

mod common;
use common::append;
use std::sync::Arc;

use relay_actors::nats_server::{self, NatsServer};
use relay_actors::store::{
    fence_violations, CatchUp, Engine, Follower, JetStreamConfig, JetStreamEngine, NewEvent, Store, StoreError, Write,
    CHUNK_BYTES,
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

/// A node's config for the shard: its local copy in `dir`, its name the
/// directory's.
fn node(cfg: &JetStreamConfig, dir: &tempfile::TempDir) -> JetStreamConfig {
    let name = dir.path().file_name().unwrap().to_string_lossy().replace('.', "-");
    JetStreamConfig { copy_dir: Some(dir.path().join("copy")), node: name, ..cfg.clone() }
}

/// A store over `cfg`'s engine, and the engine (to checkpoint it).
fn open_engine(cfg: &JetStreamConfig, epoch: u64) -> (Store, Arc<JetStreamEngine>) {
    let engine = Arc::new(JetStreamEngine::open(cfg.clone(), epoch).unwrap());
    (Store::with_engine(engine.clone()).unwrap(), engine)
}

/// Whether the checkpoints' stream holds a complete checkpoint.
fn has_checkpoint(f: &Fixture, cfg: &JetStreamConfig) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (url, stream, mark) = (f.server.url(), format!("{}_CP", cfg.stream), format!("{}.cpe", cfg.prefix));
    rt.block_on(async move {
        let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
        let Ok(stream) = js.get_stream(&stream).await else { return false };
        stream.get_last_raw_message_by_subject(&mark).await.is_ok()
    })
}

/// Opens as `open` does; also says how the copy caught up.
fn open_caught_up(cfg: &JetStreamConfig, epoch: u64) -> (Store, CatchUp) {
    let engine = JetStreamEngine::open(cfg.clone(), epoch).unwrap();
    let caught_up = engine.caught_up();
    (Store::with_engine(Arc::new(engine)).unwrap(), caught_up)
}

fn open(cfg: &JetStreamConfig, epoch: u64) -> Store {
    Store::with_engine(Arc::new(JetStreamEngine::open(cfg.clone(), epoch).unwrap())).unwrap()
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
fn a_node_without_a_copy_bootstraps_from_the_checkpoint_and_serves_the_same_records() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let (store, engine) = open_engine(&a, 1);
    for _ in 0..40 {
        append(&store, "account/a", 1).unwrap();
    }
    let mark = engine.checkpoint().unwrap();
    assert_eq!((mark.from, mark.until), (41, 41), "the fence and 40 groups, nothing written meanwhile");
    assert!(mark.chunks >= 1);
    append(&store, "account/b", 3).unwrap();
    drop((store, engine));
    let (first, _) = sequences(&f, &a);
    assert_eq!(first, 41, "trimmed below the checkpoint's sequence (the message it is at stays)");

    let (store, caught_up) = open_caught_up(&b, 2);
    assert_eq!(
        caught_up,
        CatchUp { from: 42, through: 43, bootstrapped: true },
        "the checkpoint, then the log after it"
    );
    assert_eq!(store.head("account/a").unwrap().seq, 40);
    assert_eq!(store.head("account/b").unwrap().seq, 3);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/b", 0)), []);
    assert_eq!(fence_violations(&a).unwrap(), [], "the first message left stands for the fences trimmed");
    // The newer owner's epoch is read from the log's last message.
    drop(store);
    match JetStreamEngine::open(a.clone(), 1) {
        Err(StoreError::Flush(e)) => assert!(e.contains("newer owner"), "{e}"),
        other => panic!("epoch 1 opened over epoch 2: {:?}", other.map(|e| e.epoch())),
    }
}

#[test]
fn the_log_is_trimmed_below_what_every_copy_has_applied() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let store = open(&a, 1);
    append(&store, "account/a", 5).unwrap();
    drop(store);
    let (_, applied_a) = sequences(&f, &a);

    let (store, engine) = open_engine(&b, 2);
    for _ in 0..20 {
        append(&store, "account/b", 1).unwrap();
    }
    let mark = engine.checkpoint().unwrap();
    assert!(mark.from > applied_a + 1);
    let (first, _) = sequences(&f, &b);
    assert_eq!(first, applied_a + 1, "a's copy (its record) holds the log at the message it reads next");

    drop((store, engine));
    let (_, applied_b) = sequences(&f, &b);
    let (store, caught_up) = open_caught_up(&a, 3);
    assert!(!caught_up.bootstrapped && caught_up.from == applied_a + 1, "{caught_up:?}");
    assert_eq!(store.head("account/b").unwrap().seq, 20);
    drop(store);
    // a's record is now past b's (b closed at its last group): b's holds the log.
    let (store, engine) = open_engine(&a, 4);
    append(&store, "account/a", 1).unwrap();
    engine.checkpoint().unwrap();
    assert_eq!(sequences(&f, &a).0, applied_b + 1);
    drop((store, engine));
}

/// A takeover counts the log's bytes (trimmed at the newest checkpoint),
/// by whichever owner: owners that each crash before writing
/// `snapshot_bytes` of their own still checkpoint (and trim) between them.
#[test]
fn owners_in_a_crash_loop_still_checkpoint_counting_the_log_since_the_newest_checkpoint() {
    let Some(f) = server() else { return };
    let cfg = JetStreamConfig { snapshot_bytes: 2_000, ..shard(&f) };
    // Each owner writes well under snapshot_bytes before it "crashes".
    for epoch in 1..=30 {
        let store = open(&cfg, epoch);
        append(&store, "account/a", 1).unwrap();
        drop(store);
    }
    assert!(has_checkpoint(&f, &cfg), "no checkpoint in 30 owners' groups of {} bytes", cfg.snapshot_bytes);
    let (first, _) = sequences(&f, &cfg);
    assert!(first > 1, "the log was trimmed below a checkpoint (first sequence {first})");
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

#[test]
fn a_takeover_replays_only_the_groups_after_its_copys_applied_sequence() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let (store, caught_up) = open_caught_up(&a, 1);
    assert_eq!(caught_up, CatchUp { from: 1, through: 1, bootstrapped: true }, "no copy yet: built from the stream");
    for _ in 0..5 {
        append(&store, "account/a", 1).unwrap();
    }
    drop(store);
    let (_, applied_a) = sequences(&f, &a);

    let (store, caught_up) = open_caught_up(&b, 2);
    assert!(caught_up.bootstrapped && caught_up.from == 1, "{caught_up:?}");
    assert_eq!(store.head("account/a").unwrap().seq, 5);
    append(&store, "account/a", 3).unwrap();
    drop(store);
    let (_, applied_b) = sequences(&f, &b);

    // Node a takes over again: its copy is at its last group; it reads
    // from the next message (b's fence), not from the stream's start.
    let (store, caught_up) = open_caught_up(&a, 3);
    assert_eq!(caught_up, CatchUp { from: applied_a + 1, through: applied_b + 1, bootstrapped: false });
    assert_eq!(store.head("account/a").unwrap().seq, 8, "b's groups laid on a's copy");
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    append(&store, "account/a", 1).unwrap();
    drop(store);
    let (store, caught_up) = open_caught_up(&b, 4);
    assert!(!caught_up.bootstrapped && caught_up.from == applied_b + 1, "{caught_up:?}");
    assert_eq!(store.head("account/a").unwrap().seq, 9);
    assert_eq!(fence_violations(&a).unwrap(), []);
}

#[test]
fn a_restarted_owner_catches_up_from_its_local_copy_without_the_snapshot() {
    let Some(f) = server() else { return };
    let dir = tempfile::tempdir().unwrap();
    let cfg = node(&JetStreamConfig { snapshot_bytes: 2_000, ..shard(&f) }, &dir);
    let store = open(&cfg, 1);
    for _ in 0..40 {
        append(&store, "account/a", 1).unwrap();
    }
    drop(store);
    let (first, last) = sequences(&f, &cfg);
    assert!(first > 1 && has_checkpoint(&f, &cfg), "a checkpoint was written and the log trimmed (first {first})");

    let (store, caught_up) = open_caught_up(&cfg, 2);
    // Only its own new fence is read: neither the checkpoint nor a group.
    assert_eq!(caught_up, CatchUp { from: last + 1, through: last + 1, bootstrapped: false });
    assert_eq!(store.head("account/a").unwrap().seq, 40);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
}

#[test]
fn a_copy_whose_record_is_forgotten_is_trimmed_past_and_bootstrapped_with_the_same_records() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let store = open(&b, 1);
    append(&store, "account/gone", 2).unwrap();
    drop(store);
    // b's record expires (`copy_record_ttl`): as if b had been away long.
    forget_record(&f, &b);
    let (store, engine) = open_engine(&a, 2);
    append(&store, "account/gone", 1).unwrap();
    for _ in 0..10 {
        append(&store, "account/a", 1).unwrap();
    }
    engine.checkpoint().unwrap();
    drop((store, engine));
    let (first, _) = sequences(&f, &a);
    assert!(first > 4, "b's copy (at 3) is behind the log's first message ({first})");

    let (store, caught_up) = open_caught_up(&b, 3);
    assert!(caught_up.bootstrapped, "{caught_up:?}");
    assert_eq!(store.head("account/a").unwrap().seq, 10);
    assert_eq!(store.head("account/gone").unwrap().seq, 3);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/gone", 0)), []);
}

/// A node that holds a shard's copy, standing by, lays the owner's appends
/// on it as they are stored and records how far it is: the owner's trim
/// follows it, and a takeover replays no group, only its own fence.
#[test]
fn a_standby_copy_follows_the_log_so_a_takeover_replays_only_the_tail() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let within = std::time::Duration::from_secs(20);
    // b served the shard once (the fence, one group): it has a copy.
    let store = open(&b, 1);
    append(&store, "account/a", 2).unwrap();
    drop(store);
    let follower = Follower::start(b.clone()).unwrap();
    assert_eq!(follower.applied(), 2);

    let (store, engine) = open_engine(&a, 2);
    for _ in 0..30 {
        append(&store, "account/a", 1).unwrap();
    }
    let (_, last) = sequences(&f, &a);
    assert_eq!(last, 33, "b's fence and group, a's fence, 30 groups");
    assert_eq!(follower.wait_for(last, within), last, "the standby's copy is at the owner's last group");
    assert_eq!(follower.wait_recorded(last, within), last, "and its record says so");
    engine.checkpoint().unwrap();
    assert_eq!(sequences(&f, &a).0, last, "trimmed up to what the owner and the standby read next (not b's 3)");
    for _ in 0..5 {
        append(&store, "account/a", 1).unwrap();
    }
    let (_, last) = sequences(&f, &a);
    assert_eq!(follower.wait_for(last, within), last);
    drop((store, engine));
    assert_eq!(follower.stop().unwrap(), last, "stopped where it was: the copy is free for b's open");

    let (store, caught_up) = open_caught_up(&b, 3);
    let replayed = caught_up.through - caught_up.from;
    assert_eq!(
        (caught_up, replayed),
        (CatchUp { from: last + 1, through: last + 1, bootstrapped: false }, 0),
        "the takeover read its own fence and no group"
    );
    assert_eq!(store.head("account/a").unwrap().seq, 37);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
    append(&store, "account/a", 1).unwrap();
    assert_eq!(fence_violations(&b).unwrap(), []);
}

/// A standby's copy that the log was trimmed past (its record forgotten)
/// is bootstrapped by the follower from the checkpoint, and follows on.
#[test]
fn a_standby_copy_behind_the_trimmed_log_is_bootstrapped_and_then_follows() {
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (node(&shard(&f), &dir_a), node(&shard(&f), &dir_b));
    let within = std::time::Duration::from_secs(20);
    let store = open(&b, 1);
    append(&store, "account/gone", 2).unwrap();
    drop(store);
    forget_record(&f, &b);
    let (store, engine) = open_engine(&a, 2);
    for _ in 0..10 {
        append(&store, "account/a", 1).unwrap();
    }
    engine.checkpoint().unwrap();
    assert!(sequences(&f, &a).0 > 3, "b's copy (at 2) is behind the log's first message");
    let follower = Follower::start(b.clone()).unwrap();
    append(&store, "account/a", 1).unwrap();
    let (_, last) = sequences(&f, &a);
    assert_eq!(follower.wait_for(last, within), last);
    drop((store, engine));
    assert_eq!(follower.stop().unwrap(), last);
    let (store, caught_up) = open_caught_up(&b, 3);
    assert_eq!(caught_up, CatchUp { from: last + 1, through: last + 1, bootstrapped: false });
    assert_eq!(store.head("account/a").unwrap().seq, 11);
    assert_eq!(store.head("account/gone").unwrap().seq, 2);
    assert_eq!(relay_actors::store::verify_chain(store.read("account/a", 0)), []);
}

/// Forgets `cfg.node`'s copy record, as `copy_record_ttl` does for a node
/// away that long.
fn forget_record(f: &Fixture, cfg: &JetStreamConfig) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (url, bucket, key) = (f.server.url(), format!("{}_COPIES", cfg.stream), cfg.node.clone());
    rt.block_on(async move {
        let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
        js.get_key_value(bucket).await.unwrap().purge(key).await.unwrap();
    });
}

// Kill tests at the engine's own crash boundaries (`relay_actors::crash`):
// a child (this test binary, started on `kill_child_runs_a_kill_script`)
// runs a script against the parent's nats-server with one point armed,
// printing `acked <step>` as each step is durable, until it aborts there.

const KILL_URL: &str = "RELAY_JETSTREAM_KILL_URL";
const KILL_DIR: &str = "RELAY_JETSTREAM_KILL_DIR";
const KILL_SCRIPT: &str = "RELAY_JETSTREAM_KILL_SCRIPT";
/// Steps of the kill history: each puts a blob of 40 KiB (so a checkpoint
/// of it takes several 512 KiB chunks), removes every third step's
/// predecessor, and appends an event.
const KILL_STEPS: u64 = 48;

/// Blob `n` after `steps` steps of the kill history.
fn kill_blob(n: u64, steps: u64) -> Option<Vec<u8>> {
    let removed = n < steps && (n + 1).is_multiple_of(3);
    (n <= steps && !removed).then(|| vec![n as u8; 40 << 10])
}

/// Writes step `step` of the kill history, durably.
fn kill_step(store: &Store, step: u64) {
    let mut batch = store.batch();
    batch.blob_put(format!("blob-{step}").as_bytes(), &kill_blob(step, step).unwrap());
    if step.is_multiple_of(3) {
        batch.blob_remove(format!("blob-{}", step - 1).as_bytes());
    }
    let head = store.head("account/k").unwrap();
    let data = RawValue::from_string(format!(r#"{{"step":{step}}}"#)).unwrap();
    batch.append("account/k", head, vec![NewEvent { event_type: "noted".into(), version: 1, at: step, data }]);
    store.commit_durable_blocking(batch).unwrap();
}

/// The store holds the history of exactly `steps` steps.
fn holds_kill_history(store: &Store, steps: u64) {
    assert_eq!(store.head("account/k").unwrap().seq, steps, "events");
    assert_eq!(relay_actors::store::verify_chain(store.read("account/k", 0)), []);
    for n in 1..=KILL_STEPS {
        assert_eq!(
            store.blob_get(format!("blob-{n}").as_bytes()).unwrap(),
            kill_blob(n, steps),
            "blob {n} after {steps}"
        );
    }
}

/// The node of the kill tests whose copy is in `dir`, on the server at `url`.
fn kill_node(url: String, dir: &std::path::Path) -> JetStreamConfig {
    let name = dir.file_name().unwrap().to_string_lossy().replace('.', "-");
    JetStreamConfig {
        timeout: std::time::Duration::from_millis(500),
        copy_dir: Some(dir.join("copy")),
        node: name,
        ..JetStreamConfig::shard(vec![url], "t", 0, 1)
    }
}

/// The child half of the kill tests; does nothing unless started by one.
/// `checkpoint <epoch> <from>`: opens as owner, writes the steps from
/// `from` on, then checkpoints. `bootstrap <epoch>`: opens as owner (a node
/// without a copy: it bootstraps).
#[test]
fn kill_child_runs_a_kill_script() {
    let (Ok(url), Some(dir), Ok(script)) =
        (std::env::var(KILL_URL), std::env::var_os(KILL_DIR), std::env::var(KILL_SCRIPT))
    else {
        return;
    };
    let cfg = kill_node(url, std::path::Path::new(&dir));
    let words: Vec<&str> = script.split(' ').collect();
    let epoch: u64 = words[1].parse().unwrap();
    match words[0] {
        "checkpoint" => {
            let (store, engine) = open_engine(&cfg, epoch);
            for step in words[2].parse().unwrap()..=KILL_STEPS {
                kill_step(&store, step);
                println!("acked {step}");
            }
            engine.checkpoint().unwrap();
        }
        "bootstrap" => drop(open(&cfg, epoch)),
        other => panic!("kill script {other:?}"),
    }
    println!("kill child: done");
}

struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs the child on `script` with `point` armed until it aborts there;
/// the last step it acknowledged.
fn killed_at(f: &Fixture, dir: &std::path::Path, script: &str, point: &str) -> u64 {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["kill_child_runs_a_kill_script", "--exact", "--nocapture", "--test-threads=1"])
            .env(KILL_URL, f.server.url())
            .env(KILL_DIR, dir)
            .env(KILL_SCRIPT, script)
            .env("RELAY_CRASH_AT", point)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let (mut acked, mut done) = (0, false);
    for line in std::io::BufReader::new(child.0.stdout.take().unwrap()).lines().map_while(Result::ok) {
        if let Some(step) = line.strip_prefix("acked ") {
            acked = step.parse().unwrap();
        }
        done |= line == "kill child: done";
    }
    let status = child.0.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!done && !status.success(), "{point}: the child never reached the point: {stderr}");
    assert!(stderr.contains(&format!("crash point {point}: aborting")), "{stderr}");
    acked
}

/// The owner killed after the first chunk of a checkpoint, before its
/// mark: the cut-short checkpoint is never read, the log is kept from the
/// complete one before it, and both the owner (catching up) and a node
/// without a copy (bootstrapping from the complete one) serve exactly the
/// acknowledged history.
#[test]
fn a_kill_in_the_middle_of_a_checkpoints_chunks_loses_nothing_and_the_log_keeps_the_complete_one() {
    assert!(relay_actors::crash::compiled_in(), "relay-actors was built without its crash-points feature");
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (kill_node(f.server.url(), dir_a.path()), kill_node(f.server.url(), dir_b.path()));
    let half = KILL_STEPS / 2;
    let (store, engine) = open_engine(&a, 1);
    (1..=half).for_each(|step| kill_step(&store, step));
    let complete = engine.checkpoint().unwrap();
    assert!(complete.chunks >= 2, "{complete:?}");
    drop((store, engine));

    let acked = killed_at(&f, dir_a.path(), &format!("checkpoint 2 {}", half + 1), "checkpoint.after_chunk");
    assert_eq!(acked, KILL_STEPS, "every step acknowledged before the checkpoint began");
    let (first, _) = sequences(&f, &a);
    assert!(first <= complete.from + 1, "the log is kept from the complete checkpoint ({first} > {})", complete.from);

    let (store, caught_up) = open_caught_up(&a, 3);
    assert!(!caught_up.bootstrapped, "{caught_up:?}");
    holds_kill_history(&store, acked);
    drop(store);
    let (store, caught_up) = open_caught_up(&b, 4);
    assert_eq!(caught_up.from, complete.from + 1, "bootstrapped from the complete checkpoint: {caught_up:?}");
    assert!(caught_up.bootstrapped);
    holds_kill_history(&store, acked);
    assert_eq!(fence_violations(&a).unwrap(), []);
}

/// A node killed while its bootstrap lays the checkpoint (its copy emptied,
/// one chunk laid, no sequence named): its next open bootstraps again and
/// serves exactly the acknowledged history, and a checkpoint after that
/// trims the log no further than it.
#[test]
fn a_kill_while_a_bootstrap_lays_the_checkpoint_loses_nothing_and_the_next_open_bootstraps_again() {
    assert!(relay_actors::crash::compiled_in(), "relay-actors was built without its crash-points feature");
    let Some(f) = server() else { return };
    let (dir_a, dir_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (a, b) = (kill_node(f.server.url(), dir_a.path()), kill_node(f.server.url(), dir_b.path()));
    let (store, engine) = open_engine(&a, 1);
    (1..KILL_STEPS).for_each(|step| kill_step(&store, step));
    let mark = engine.checkpoint().unwrap();
    assert!(mark.chunks >= 2, "{mark:?}");
    kill_step(&store, KILL_STEPS);
    drop((store, engine));

    killed_at(&f, dir_b.path(), "bootstrap 2", "bootstrap.after_chunk");
    let (store, caught_up) = open_caught_up(&b, 3);
    assert_eq!(caught_up.from, mark.from + 1, "bootstrapped again from the checkpoint: {caught_up:?}");
    assert!(caught_up.bootstrapped);
    holds_kill_history(&store, KILL_STEPS);
    drop(store);
    let (store, engine) = open_engine(&b, 4);
    let next = engine.checkpoint().unwrap();
    assert!(sequences(&f, &b).0 <= next.from + 1);
    holds_kill_history(&store, KILL_STEPS);
    assert_eq!(fence_violations(&b).unwrap(), []);
}

/// Issue 40 (D-1): an owner fenced out mid-write stops its store; its node
/// must be able to open its own copy again at once, even while something
/// (an actor not yet dropped) still holds the stopped store. The writer
/// that failed used to return without closing the engine, so sled's lock
/// on the copy stayed held and every later open failed with WouldBlock.
#[test]
fn a_stopped_engines_copy_opens_again_at_once_even_after_a_failed_write_and_with_the_store_still_held() {
    let Some(f) = server() else { return };
    let cfg = shard(&f);
    let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mine, theirs) = (node(&cfg, &here), node(&cfg, &there));
    let old = open(&mine, 1);
    append(&old, "account/a", 2).unwrap();
    let new = open(&theirs, 2);
    assert!(matches!(append(&old, "account/a", 1), Err(StoreError::Flush(_))), "fenced out");
    let still_held = old.clone();
    let _ = old.close();
    let again = JetStreamEngine::open(mine.clone(), 3).map(|e| e.epoch());
    assert_eq!(again.map_err(|e| e.to_string()), Ok(3), "the copy's directory is free after the stop");
    drop((still_held, new));

    // And after a stop with no failure, the same.
    let ok = open(&mine, 4);
    append(&ok, "account/a", 1).unwrap();
    let still_held = ok.clone();
    ok.close().unwrap();
    let reopened = open(&mine, 5);
    assert_eq!(reopened.head("account/a").unwrap().seq, 3);
    drop(still_held);
}
