//! sled rewritten into a fresh copy while commits go on (`sled_engine.rs`,
//! step 9), one test per rule: the copy holds exactly what the old sled
//! held plus every commit made meanwhile, it is smaller than a sled that
//! took many removals, the store reopens on it and forgets the old one,
//! and the writer starts one by itself once sled's file has grown.
//! Kills at the rewrite's boundaries are in `store_compaction.rs` (its
//! kill child compacts, then rewrites).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use relay_actors::store::{verify_chain, Engine, Head, NewEvent, SledEngine, Store, StoreError, Write};
use serde_json::value::RawValue;

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(30);

fn blob(n: u64) -> Vec<u8> {
    format!("l/account/{n:08}").into_bytes()
}

/// Blob `n`'s value in `generation`: 200 bytes of its own.
fn value(n: u64, generation: u64) -> Vec<u8> {
    let mut v = format!("{n}/{generation}/").into_bytes();
    v.resize(200, b'a' + (n % 26) as u8);
    v
}

fn event(n: u64) -> NewEvent {
    NewEvent {
        event_type: "noted".into(),
        version: 1,
        at: n,
        data: RawValue::from_string(format!(r#"{{"n":{n}}}"#)).unwrap(),
    }
}

fn open(dir: &Path, floor: u64) -> (Store, Arc<SledEngine>) {
    let engine = Arc::new(SledEngine::open(dir, None).unwrap().with_rewrite_floor(floor));
    (Store::with_engine(engine.clone()).unwrap(), engine)
}

/// Every pair the engine holds, values resolved through the log.
fn contents(engine: &SledEngine) -> Vec<(Vec<u8>, Vec<u8>)> {
    engine.range(&[], None).map(|kv| kv.unwrap()).collect()
}

fn sled_bytes(dir: &Path) -> u64 {
    let tree = std::fs::read_to_string(dir.join("tree")).map(|t| t.trim().to_owned());
    let at = tree.map_or_else(|_| dir.join("db"), |t| dir.join(t).join("db"));
    std::fs::metadata(at).unwrap().len()
}

/// `rounds` rounds of 1,000 blobs each put, then three quarters of them
/// removed: sled's file grows with what it was given, not what it keeps.
fn churn(store: &Store, rounds: u64) {
    for round in 0..rounds {
        for chunk in 0..10 {
            let mut batch = store.batch();
            for i in 0..100 {
                let n = round * 1_000 + chunk * 100 + i;
                batch.blob_put(&blob(n), &value(n, 0));
            }
            store.commit_durable_blocking(batch).unwrap();
        }
        let mut batch = store.batch();
        (round * 1_000..round * 1_000 + 1_000).filter(|n| n % 4 != 0).for_each(|n| batch.blob_remove(&blob(n)));
        store.commit_durable_blocking(batch).unwrap();
    }
}

#[test]
fn a_rewritten_sled_holds_exactly_the_pairs_of_the_old_one_and_is_smaller() {
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = open(dir.path(), u64::MAX);
    let mut batch = store.batch();
    batch.append("account/a", Head::default(), (1..=50).map(event).collect());
    store.commit_durable_blocking(batch).unwrap();
    churn(&store, 30);
    store.close().unwrap();
    let before = contents(&engine);
    let bytes_before = sled_bytes(dir.path());

    let pairs = engine.rewrite_now().unwrap();

    assert_eq!(pairs, before.len() as u64);
    assert_eq!(contents(&engine), before, "the copy holds what the old sled held");
    let bytes_after = sled_bytes(dir.path());
    println!("sled's file: {bytes_before} bytes before, {bytes_after} after ({} pairs)", before.len());
    // sled lays its file out in 512 KiB segments, so a store this small
    // shows little of the gain (the soak's figures are in the journal).
    assert!(bytes_after < bytes_before, "{bytes_after} is not under {bytes_before}");
    assert_eq!(std::fs::read_to_string(dir.path().join("tree")).unwrap(), "tree.1\n");
    assert_eq!(std::fs::read_to_string(dir.path().join("FORMAT")).unwrap(), "3\n", "a writer's open marked it");
    assert!(!dir.path().join("db").exists() && !dir.path().join("conf").exists(), "the old sled's files are gone");
    assert_eq!(engine.rewrites(), (1, bytes_after));
}

#[test]
fn commits_made_during_a_rewrite_are_in_the_new_sled_and_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(AtomicU64::new(0));
    {
        let (store, engine) = open(dir.path(), u64::MAX);
        churn(&store, 10);
        let done = Arc::new(AtomicBool::new(false));
        let writer = {
            let (store, acked, done) = (store.clone(), acked.clone(), done.clone());
            std::thread::spawn(move || {
                let mut head = Head::default();
                let mut n = 0;
                // At least 200 commits, and on until the rewrite ended.
                while n < 200 || !done.load(SeqCst) {
                    n += 1;
                    let mut batch = store.batch();
                    head = batch.append("account/w", head, vec![event(n)]);
                    batch.blob_put(&blob(1_000_000 + n), &value(n, 1));
                    if n > 1 {
                        batch.blob_remove(&blob(1_000_000 + n - 1));
                    }
                    store.commit_durable_blocking(batch).unwrap();
                    acked.store(n, SeqCst);
                    assert!(n < 1_000_000, "the rewrite did not end");
                }
            })
        };
        while acked.load(SeqCst) < 20 {
            std::thread::yield_now();
        }
        let started_at = acked.load(SeqCst);
        engine.rewrite_now().unwrap();
        let ended_at = acked.load(SeqCst);
        done.store(true, SeqCst);
        writer.join().unwrap();
        println!("commits acknowledged while the rewrite ran: {}", ended_at - started_at);
        holds(&store, acked.load(SeqCst));
        store.close().unwrap();
    }
    for _ in 0..2 {
        let (store, _engine) = open(dir.path(), u64::MAX);
        holds(&store, acked.load(SeqCst));
        store.close().unwrap();
    }
}

/// `account/w` has events 1..=n, chained, and only the last blob of the
/// writer's is there.
fn holds(store: &Store, n: u64) {
    let events: Vec<_> = store.read("account/w", 0).map(|e| e.unwrap()).collect();
    assert_eq!(events.len() as u64, n);
    assert_eq!(verify_chain(store.read("account/w", 0)), []);
    assert_eq!(store.blob_get(&blob(1_000_000 + n)).unwrap(), Some(value(n, 1)));
    assert_eq!(store.blob_get(&blob(1_000_000 + n - 1)).unwrap(), None);
    assert_eq!(store.blob_get(&blob(4)).unwrap(), Some(value(4, 0)));
    assert_eq!(store.blob_get(&blob(5)).unwrap(), None);
}

#[test]
fn a_store_reopens_on_the_sled_its_tree_names_and_a_second_rewrite_removes_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let (store, engine) = open(dir.path(), u64::MAX);
        churn(&store, 5);
        engine.rewrite_now().unwrap();
        store.close().unwrap();
        contents(&engine)
    };
    // A copy left by a rewrite that never swapped (a crash mid-walk).
    std::fs::create_dir(dir.path().join("tree.7")).unwrap();
    std::fs::write(dir.path().join("tree.7/db"), b"half a copy").unwrap();
    let (store, engine) = open(dir.path(), u64::MAX);
    assert!(!dir.path().join("tree.7").exists(), "an open removes a copy the tree file does not name");
    assert_eq!(contents(&engine), before);
    engine.rewrite_now().unwrap();
    assert_eq!(std::fs::read_to_string(dir.path().join("tree")).unwrap(), "tree.2\n");
    assert!(!dir.path().join("tree.1").exists());
    assert_eq!(contents(&engine), before);
    store.close().unwrap();
}

#[test]
fn the_writer_rewrites_sled_by_itself_once_its_file_passes_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = open(dir.path(), 1 << 20);
    let started = Instant::now();
    let mut round = 0;
    while engine.rewrites().0 == 0 {
        assert!(started.elapsed() < WAIT, "no rewrite after {round} rounds; sled at {} bytes", sled_bytes(dir.path()));
        churn_round(&store, round);
        round += 1;
    }
    // It ended with the swap: what was committed is all there.
    let kept = contents(&engine);
    assert!(kept.iter().any(|(k, _)| k.ends_with(&blob(0))), "blob 0 is kept");
    assert!(engine.rewrites().1 > 0);
    store.close().unwrap();
    drop((store, engine));
    let (_store, engine) = open(dir.path(), u64::MAX);
    assert_eq!(contents(&engine), kept);
}

fn churn_round(store: &Store, round: u64) {
    let mut batch = store.batch();
    for i in 0..100 {
        let n = round * 100 + i;
        batch.blob_put(&blob(n), &value(n, 0));
        if !n.is_multiple_of(4) && n >= 100 {
            batch.blob_remove(&blob(n - 100));
        }
    }
    store.commit_durable_blocking(batch).unwrap();
}

#[test]
fn a_tree_file_naming_something_else_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    open(dir.path(), u64::MAX).0.close().unwrap();
    std::fs::write(dir.path().join("tree"), "../elsewhere\n").unwrap();
    match SledEngine::open(dir.path(), None) {
        Err(StoreError::Io(e)) => assert!(e.contains("not a tree of this store"), "{e}"),
        other => panic!("opened: {:?}", other.map(|_| ())),
    }
}

#[test]
fn a_group_installed_after_the_swap_goes_into_the_copy() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SledEngine::open(dir.path(), None).unwrap();
    engine.apply(vec![Write::Put(b"kfirst".to_vec(), b"1".to_vec())]).unwrap();
    engine.barrier().unwrap();
    engine.install().unwrap();
    engine.rewrite_now().unwrap();
    engine.apply(vec![Write::Put(b"ksecond".to_vec(), b"2".to_vec())]).unwrap();
    engine.barrier().unwrap();
    engine.install().unwrap();
    assert_eq!(engine.get(b"kfirst").unwrap(), Some(b"1".to_vec()));
    assert_eq!(engine.get(b"ksecond").unwrap(), Some(b"2".to_vec()));
    assert!(engine.db().contains_key(b"ksecond").unwrap(), "the engine's sled is the copy");
    engine.close().unwrap();
}
