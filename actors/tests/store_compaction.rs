//! The value log's compaction (`sled_engine.rs`, step 7), one test per
//! rule: live bytes are counted, dead segments are rewritten and removed
//! behind a checkpoint, a removal is never undone, and a kill at each of
//! compaction's boundaries, and at those of sled's rewrite (step 9), loses
//! nothing acknowledged and resurrects nothing removed.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use relay_actors::store::{verify_chain, Engine, Head, NewEvent, SledEngine, Store, Write};
use serde_json::value::RawValue;

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(20);

/// A blob's raw key in the engine (the blob space is `b`).
fn raw_blob(n: u32) -> Vec<u8> {
    [b"b".as_slice(), &blob(n)].concat()
}

fn blob(n: u32) -> Vec<u8> {
    format!("l/account/{n:06}").into_bytes()
}

/// A blob's value in generation `generation`: 1,000 bytes, its own.
fn value(n: u32, generation: u8) -> Vec<u8> {
    let mut v = format!("{n}/{generation}/").into_bytes();
    v.resize(1_000, (b'a' + (n % 26) as u8) ^ generation);
    v
}

fn event(n: u64) -> NewEvent {
    NewEvent {
        event_type: "noted".into(),
        version: 1,
        at: n,
        data: RawValue::from_string(format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(100))).unwrap(),
    }
}

fn small_store(dir: &Path, checkpoint_bytes: u64) -> (Store, Arc<SledEngine>) {
    let engine = Arc::new(SledEngine::open(dir, None).unwrap().with_checkpoint_bytes(checkpoint_bytes));
    (Store::with_engine(engine.clone()).unwrap(), engine)
}

/// Waits (bounded) until the open's count of live bytes has ended.
fn counted(engine: &SledEngine) {
    let started = Instant::now();
    while !engine.log_space().counted {
        assert!(started.elapsed() < WAIT, "the live bytes' count did not end");
        std::thread::yield_now();
    }
}

/// The log directory's bytes. The writer may remove a segment (or rename
/// `replay-from.new`) between the listing and a file's stat: that file
/// counts as gone.
fn log_bytes(dir: &Path) -> u64 {
    let entries = std::fs::read_dir(dir.join("log")).unwrap();
    entries.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum()
}

fn segment_path(dir: &Path, segment: u64) -> std::path::PathBuf {
    dir.join(format!("log/{segment:016x}"))
}

fn replay_from(dir: &Path) -> u64 {
    u64::from_str_radix(std::fs::read_to_string(dir.join("log/replay-from")).unwrap().trim(), 16).unwrap()
}

/// One group through the engine as the writer would write it.
fn commit(engine: &SledEngine, group: Vec<Write>) {
    engine.apply(group).unwrap();
    engine.barrier().unwrap();
    engine.install().unwrap();
}

fn live_total(engine: &SledEngine) -> u64 {
    engine.log_space().segments.iter().map(|s| s.live).sum()
}

#[test]
fn live_bytes_follow_puts_overwrites_and_removals_and_are_counted_again_at_open() {
    let dir = tempfile::tempdir().unwrap();
    {
        let engine = SledEngine::open(dir.path(), None).unwrap().with_checkpoint_bytes(4_096);
        counted(&engine);
        for n in 0..10 {
            commit(&engine, vec![Write::Put(raw_blob(n), value(n, 0))]);
        }
        assert_eq!(live_total(&engine), 10_000);
        commit(&engine, vec![Write::Put(raw_blob(0), value(0, 1)[..500].to_vec()), Write::Remove(raw_blob(1))]);
        commit(&engine, vec![Write::Remove(raw_blob(404)), Write::Put(b"knot-pointed".to_vec(), vec![0; 99])]);
        assert_eq!(live_total(&engine), 8_500, "{:?}", engine.log_space());
        engine.close().unwrap();
    }
    let engine = SledEngine::open(dir.path(), None).unwrap();
    counted(&engine);
    assert_eq!(live_total(&engine), 8_500, "the open's scan counts what sled holds");
    let space = engine.log_space();
    let lens: u64 = space.segments.iter().map(|s| s.len).sum();
    assert_eq!(lens, log_bytes(dir.path()) - std::fs::metadata(dir.path().join("log/replay-from")).unwrap().len());
}

/// The copies of a key's value go to the log where every record before
/// them is in sled and none after: a removal in the next group is after
/// the copy in the log, in sled and in the replay (step 7.2).
#[test]
fn a_removed_key_is_not_resurrected_by_compaction() {
    let dir = tempfile::tempdir().unwrap();
    {
        let engine = SledEngine::open(dir.path(), None).unwrap().with_checkpoint_bytes(4_096);
        counted(&engine);
        for n in 0..12 {
            commit(&engine, vec![Write::Put(raw_blob(n), value(n, 0))]);
        }
        // Blob 0 stays live in a segment that is otherwise dead.
        commit(&engine, (1..12).map(|n| Write::Remove(raw_blob(n))).collect());
        let mut turns = 0;
        while engine.log_space().compacted_bytes == 0 {
            commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![turns as u8])]);
            turns += 1;
            assert!(turns < 1_000, "compaction never copied blob 0: {:?}", engine.log_space());
        }
        // The copy of blob 0 is written, not yet installed: the removal
        // is applied after it.
        assert_eq!(engine.log_space().compacted_bytes, 1_000);
        commit(&engine, vec![Write::Remove(raw_blob(0))]);
        assert_eq!(engine.get(&raw_blob(0)).unwrap(), None, "removed after its copy was written");
        engine.compact_now().unwrap();
        assert_eq!(engine.get(&raw_blob(0)).unwrap(), None);
        engine.close().unwrap();
    }
    let engine = SledEngine::open(dir.path(), None).unwrap();
    for n in 0..12 {
        assert_eq!(engine.get(&raw_blob(n)).unwrap(), None, "blob {n} after a reopen");
    }
}

/// ...and a key overwritten after its copy keeps the new value.
#[test]
fn a_value_written_after_its_copy_was_made_is_the_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    let engine = SledEngine::open(dir.path(), None).unwrap().with_checkpoint_bytes(4_096);
    counted(&engine);
    for n in 0..12 {
        commit(&engine, vec![Write::Put(raw_blob(n), value(n, 0))]);
    }
    commit(&engine, (1..12).map(|n| Write::Remove(raw_blob(n))).collect());
    let mut turns = 0;
    while engine.log_space().compacted_bytes == 0 {
        commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![turns as u8])]);
        turns += 1;
        assert!(turns < 1_000, "compaction never copied blob 0");
    }
    commit(&engine, vec![Write::Put(raw_blob(0), value(0, 7))]);
    assert_eq!(engine.get(&raw_blob(0)).unwrap(), Some(value(0, 7)));
    engine.close().unwrap();
    drop(engine);
    let engine = SledEngine::open(dir.path(), None).unwrap();
    assert_eq!(engine.get(&raw_blob(0)).unwrap(), Some(value(0, 7)));
}

/// A victim walked whole stays on disk until a checkpoint that started
/// after its last copies were installed has made sled durable (step 7.4).
#[test]
fn a_compacted_segment_is_removed_only_after_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let holding = Arc::new(AtomicBool::new(false));
    let (held, checkpoints) = mpsc::channel();
    let (release, go) = mpsc::channel::<()>();
    let go = Mutex::new(go);
    let hold = {
        let holding = holding.clone();
        let held = Mutex::new(held);
        move || {
            if holding.load(SeqCst) {
                let _ = held.lock().unwrap().send(());
                let _ = go.lock().unwrap().recv();
            }
        }
    };
    let engine = SledEngine::open(dir.path(), None).unwrap().with_checkpoint_bytes(4_096).with_checkpoint_hold(hold);
    counted(&engine);
    for n in 0..12 {
        commit(&engine, vec![Write::Put(raw_blob(n), value(n, 0))]);
    }
    commit(&engine, (0..12).map(|n| Write::Remove(raw_blob(n))).collect());
    // A checkpoint beside the writer makes segment 1 a candidate; under
    // load it may not have ended yet, and once held it never would.
    let mut turns = 0;
    while engine.log_space().replay_from <= 1 {
        commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![0])]);
        std::thread::yield_now();
        turns += 1;
        assert!(turns < 100_000, "no checkpoint passed segment 1: {:?}", engine.log_space());
    }
    // Held from now on: a victim drained meanwhile must wait.
    holding.store(true, SeqCst);
    let old = segment_path(dir.path(), 1);
    let mut turns = 0;
    while engine.log_space().segments.iter().any(|s| s.segment == 1) {
        commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![turns as u8])]);
        turns += 1;
        assert!(turns < 1_000, "segment 1 was never compacted: {:?}", engine.log_space());
    }
    assert!(old.exists(), "walked whole, not yet behind a checkpoint");
    // The next checkpoint starts (it is held before its flush).
    let mut started = false;
    for _ in 0..1_000 {
        commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![0; 200])]);
        if checkpoints.try_recv().is_ok() {
            started = true;
            break;
        }
    }
    assert!(started, "no checkpoint started");
    assert!(old.exists(), "a checkpoint that has not flushed sled removes nothing");
    let before = replay_from(dir.path());
    holding.store(false, SeqCst);
    release.send(()).unwrap();
    let deadline = Instant::now() + WAIT;
    while old.exists() {
        assert!(Instant::now() < deadline, "segment 1 was never removed");
        commit(&engine, vec![Write::Put(b"kfiller".to_vec(), vec![0; 200])]);
    }
    assert!(replay_from(dir.path()) > before, "removed once replay-from moved past it");
}

/// The test that fails if compaction stops reclaiming: after most values
/// are removed the log shrinks to about what is left, both at once
/// (`compact_now`) and a bounded step per group.
#[test]
fn a_log_whose_values_are_mostly_removed_shrinks_to_about_what_is_left() {
    const N: u32 = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = small_store(dir.path(), 64 << 10);
    for chunk in (0..N).collect::<Vec<_>>().chunks(20) {
        let mut batch = store.batch();
        for &n in chunk {
            batch.blob_put(&blob(n), &value(n, 0));
        }
        store.commit_durable_blocking(batch).unwrap();
    }
    let full = log_bytes(dir.path());
    assert!(full > u64::from(N) * 1_000, "{full}");
    for chunk in (0..N).filter(|n| n % 10 != 0).collect::<Vec<_>>().chunks(50) {
        let mut batch = store.batch();
        for &n in chunk {
            batch.blob_remove(&blob(n));
        }
        store.commit_durable_blocking(batch).unwrap();
    }
    counted(&engine);
    // A step per group: small commits keep the writer turning.
    let live = u64::from(N / 10) * 1_000;
    let deadline = Instant::now() + WAIT;
    let mut turns = 0u32;
    while log_bytes(dir.path()) > 3 * live + (64 << 10) * 3 {
        assert!(Instant::now() < deadline, "the writer's steps did not reclaim: {}", log_bytes(dir.path()));
        let mut batch = store.batch();
        batch.kv_put(b"turn", &turns.to_be_bytes());
        store.commit_durable_blocking(batch).unwrap();
        turns += 1;
    }
    let stepped = log_bytes(dir.path());
    store.compact_now().unwrap();
    let now = log_bytes(dir.path());
    println!("log/: {full} bytes written, {stepped} after {turns} groups of steps, {now} after compact_now");
    assert!(now < 2 * live, "{now} bytes in log/ for {live} live");
    drop(store);
    drop(engine);
    let store = Store::open(dir.path()).unwrap();
    for n in 0..N {
        let want = (n % 10 == 0).then(|| value(n, 0));
        assert_eq!(store.blob_get(&blob(n)).unwrap(), want, "blob {n}");
    }
}

/// Events moved by compaction read back with their bytes (and chains).
#[test]
fn events_moved_by_compaction_read_back_with_verified_chains_across_reopens() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, engine) = small_store(dir.path(), 8_192);
        let mut head = Head::default();
        for n in 1..=40u64 {
            let mut batch = store.batch();
            head = batch.append("account/a", head, vec![event(n)]);
            batch.blob_put(&blob(n as u32), &value(n as u32, 0));
            store.commit_durable_blocking(batch).unwrap();
        }
        let mut batch = store.batch();
        (1..=40).for_each(|n| batch.blob_remove(&blob(n)));
        store.commit_durable_blocking(batch).unwrap();
        store.compact_now().unwrap();
        assert!(engine.log_space().compacted_bytes > 40 * 100, "{:?}", engine.log_space());
        assert!(engine.log_space().removed_segments > 0);
    }
    for _ in 0..2 {
        let store = Store::open(dir.path()).unwrap();
        let events: Vec<_> = store.read("account/a", 0).map(|e| e.unwrap()).collect();
        assert_eq!(events.len(), 40);
        assert_eq!(verify_chain(store.read("account/a", 0)), []);
        for e in &events {
            assert_eq!(e.data.get(), event(e.seq).data.get());
        }
        assert_eq!(store.blob_get(&blob(3)).unwrap(), None);
    }
}

// ---- Kill tests at compaction's boundaries ----

const KILL_DIR: &str = "RELAY_COMPACT_KILL_DIR";
const KILL_EVENTS: u64 = 60;
const KILL_BLOBS: u32 = 60;

/// The child's history, one commit per step: steps 1..=60 append event
/// n to `account/k` with blob n; steps 61..=120 then remove half the
/// blobs and overwrite a quarter (generation 1). The first segments end
/// under half live, so compaction starts while the history is written.
const KILL_STEPS: u64 = KILL_EVENTS + KILL_BLOBS as u64;

/// Blob `n` after the first `steps` steps.
fn kill_blob(n: u32, steps: u64) -> Option<Vec<u8>> {
    if steps < u64::from(n) {
        return None;
    }
    if steps < KILL_EVENTS + u64::from(n) {
        return Some(value(n, 0));
    }
    match n % 4 {
        0 => Some(value(n, 0)),
        1 => Some(value(n, 1)),
        _ => None,
    }
}

/// The child half of the kill tests; does nothing unless started by one.
/// Writes the history above, printing `acked <step>` after each step is
/// durable, then compacts at once and rewrites sled while it writes the
/// history again; `RELAY_CRASH_AT` is armed all along, so the writer's own
/// steps may reach the point first.
#[test]
fn kill_child_writes_then_compacts() {
    let Some(dir) = std::env::var_os(KILL_DIR) else { return };
    let (store, engine) = small_store(Path::new(&dir), 8_192);
    let mut head = Head::default();
    for step in 1..=KILL_STEPS {
        let mut batch = store.batch();
        if step <= KILL_EVENTS {
            head = batch.append("account/k", head, vec![event(step)]);
            batch.blob_put(&blob(step as u32), &value(step as u32, 0));
        } else {
            let n = (step - KILL_EVENTS) as u32;
            match kill_blob(n, KILL_STEPS) {
                None => batch.blob_remove(&blob(n)),
                Some(v) => batch.blob_put(&blob(n), &v),
            }
        }
        store.commit_durable_blocking(batch).unwrap();
        println!("acked {step}");
    }
    store.compact_now().unwrap();
    // The rewrite copies sled while the last blob is written over and over
    // (the same value, so the history stays the same).
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(SeqCst) {
                let mut batch = store.batch();
                match kill_blob(KILL_BLOBS, KILL_STEPS) {
                    None => batch.blob_remove(&blob(KILL_BLOBS)),
                    Some(v) => batch.blob_put(&blob(KILL_BLOBS), &v),
                }
                store.commit_durable_blocking(batch).unwrap();
            }
        })
    };
    engine.rewrite_now().unwrap();
    done.store(true, SeqCst);
    writer.join().unwrap();
    println!("kill child: compacted");
}

struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The store holds the history of exactly `steps` steps: every value with
/// its bytes, no removed blob back.
fn holds_kill_history(store: &Store, steps: u64) -> Result<(), String> {
    let events: Vec<_> = store.read("account/k", 0).map(|e| e.unwrap()).collect();
    if events.len() as u64 != steps.min(KILL_EVENTS) {
        return Err(format!("{} events", events.len()));
    }
    assert_eq!(verify_chain(store.read("account/k", 0)), []);
    for e in &events {
        assert_eq!(e.data.get(), event(e.seq).data.get());
    }
    for n in 1..=KILL_BLOBS {
        if store.blob_get(&blob(n)).unwrap() != kill_blob(n, steps) {
            return Err(format!("blob {n} is not as after step {steps}"));
        }
    }
    Ok(())
}

/// The history up to the last step acknowledged, or the one in flight.
fn check_kill_history(store: &Store, acked: u64, why: &str) -> u64 {
    let last = (acked + 1).min(KILL_STEPS);
    match holds_kill_history(store, acked) {
        Ok(()) => acked,
        Err(e) => match holds_kill_history(store, last) {
            Ok(()) => last,
            Err(then) => panic!("{why}: not the history after step {acked} ({e}) nor {last} ({then})"),
        },
    }
}

/// Runs the child with `point` armed until it aborts there; then reopens,
/// checks, compacts to the end and checks again across a reopen.
fn killed_at(point: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args(["kill_child_writes_then_compacts", "--exact", "--nocapture", "--test-threads=1"])
            .env(KILL_DIR, dir.path())
            .env("RELAY_CRASH_AT", point)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (mut acked, mut compacted) = (0, false);
    while let Ok(line) = rx.recv_timeout(WAIT) {
        if let Some(step) = line.strip_prefix("acked ") {
            acked = step.parse().unwrap();
        }
        compacted |= line == "kill child: compacted";
    }
    let status = child.0.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.0.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!compacted && !status.success(), "{point}: the child never reached the point: {stderr}");
    assert!(stderr.contains(&format!("crash point {point}: aborting")), "{stderr}");
    println!("{point}: killed after {acked} of {KILL_STEPS} steps acknowledged");

    let store = Store::open(dir.path()).unwrap();
    let steps = check_kill_history(&store, acked, &format!("reopened after {point}"));
    store.compact_now().unwrap();
    assert_eq!(holds_kill_history(&store, steps), Ok(()), "compacted after {point}");
    drop(store);
    let left = log_bytes(dir.path());
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(holds_kill_history(&store, steps), Ok(()), "reopened twice after {point}");
    // At most 60 events of ~250 bytes and 60 blobs of 1,000 are live.
    assert!(left < 2 * (KILL_EVENTS * 250 + 60_000), "{point}: {left} bytes left in log/");
    drop(store);
    let (store, engine) = small_store(dir.path(), 8_192);
    engine.rewrite_now().unwrap();
    assert_eq!(holds_kill_history(&store, steps), Ok(()), "rewritten after {point}");
    drop((store, engine));
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(holds_kill_history(&store, steps), Ok(()), "reopened after the rewrite after {point}");
}

/// The kill tests need the crash points: a test build without the
/// `crash-points` feature fails here by name, besides in each kill test.
#[test]
fn the_crash_points_are_compiled_into_the_test_build() {
    assert!(relay_actors::crash::compiled_in(), "relay-actors was built without its crash-points feature");
}

#[test]
fn a_kill_after_the_compaction_record_is_written_before_its_install_loses_nothing() {
    killed_at("compact.before_install");
}

#[test]
fn a_kill_after_the_install_before_the_checkpoint_loses_nothing() {
    killed_at("compact.before_checkpoint");
}

#[test]
fn a_kill_after_the_checkpoint_before_the_removal_loses_nothing() {
    killed_at("compact.before_remove");
}

#[test]
fn a_kill_during_the_removal_loses_nothing() {
    killed_at("compact.during_remove");
}

#[test]
fn a_kill_after_sled_is_swapped_before_its_copy_is_synced_loses_nothing() {
    killed_at("rewrite.after_swap");
}

#[test]
fn a_kill_after_the_copy_is_synced_before_the_tree_file_names_it_loses_nothing() {
    killed_at("rewrite.before_switch");
}

#[test]
fn a_kill_after_the_tree_file_names_the_copy_before_the_old_sled_is_removed_loses_nothing() {
    killed_at("rewrite.after_switch");
}

// ---- Figures (run by hand: `--ignored --nocapture`) ----

fn dir_bytes(dir: &Path, skip_log: bool) -> u64 {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        if skip_log && entry.file_name() == "log" {
            continue;
        }
        let meta = entry.metadata().unwrap();
        n += if meta.is_dir() { dir_bytes(&entry.path(), false) } else { meta.len() };
    }
    n
}

/// Latencies of `n` durable one-entry commits, one after another: (max, p99).
fn commit_pauses(store: &Store, n: u32, tag: u8) -> (Duration, Duration) {
    let mut took: Vec<Duration> = (0..n)
        .map(|i| {
            let mut batch = store.batch();
            batch.kv_put(&[b't', tag], &i.to_be_bytes());
            let started = Instant::now();
            store.commit_durable_blocking(batch).unwrap();
            started.elapsed()
        })
        .collect();
    took.sort_unstable();
    (took[took.len() - 1], took[took.len() * 99 / 100])
}

/// 40,000 blobs of 1 KB in 4 MiB segments, 90 % removed: the log's and
/// sled's sizes at each stage, and commit latencies while the writer
/// compacts a step per group, against the same commits with nothing to
/// compact.
#[test]
#[ignore = "figures for docs/performance-journal.md: run by hand with --nocapture"]
fn figures_compaction_space_and_commit_pauses() {
    const N: u32 = 40_000;
    let dir = tempfile::tempdir().unwrap();
    let (store, engine) = small_store(dir.path(), 4 << 20);
    let sizes = |what: &str| {
        println!("{what}: log/ {} KiB, sled {} KiB", log_bytes(dir.path()) >> 10, dir_bytes(dir.path(), true) >> 10);
    };
    for chunk in (0..N).collect::<Vec<_>>().chunks(100) {
        let mut batch = store.batch();
        chunk.iter().for_each(|&n| batch.blob_put(&blob(n), &value(n, 0)));
        store.commit_durable_blocking(batch).unwrap();
    }
    sizes("40,000 blobs written");
    let (max, p99) = commit_pauses(&store, 2_000, 0);
    println!("baseline, nothing to compact: commit max {max:?}, p99 {p99:?}");
    for chunk in (0..N).filter(|n| n % 10 != 0).collect::<Vec<_>>().chunks(100) {
        let mut batch = store.batch();
        chunk.iter().for_each(|&n| batch.blob_remove(&blob(n)));
        store.commit_durable_blocking(batch).unwrap();
    }
    sizes("90 % removed");
    println!(
        "longest step so far {:?}, {} KiB copied",
        engine.log_space().longest_step,
        engine.log_space().compacted_bytes >> 10
    );
    counted(&engine);
    let before = engine.log_space().compacted_bytes;
    let started = Instant::now();
    let (max, p99) = commit_pauses(&store, 2_000, 1);
    println!(
        "while compacting ({} KiB copied in {:?}): commit max {max:?}, p99 {p99:?}, longest step {:?}",
        (engine.log_space().compacted_bytes - before) >> 10,
        started.elapsed(),
        engine.log_space().longest_step,
    );
    sizes("after 2,000 more commits");
    for round in 0..3u32 {
        for chunk in (N + round * 4_000..N + (round + 1) * 4_000).collect::<Vec<_>>().chunks(100) {
            let mut batch = store.batch();
            chunk.iter().for_each(|&n| batch.blob_put(&blob(n), &value(n, 0)));
            store.commit_durable_blocking(batch).unwrap();
        }
        let mut batch = store.batch();
        (N + round * 4_000..N + (round + 1) * 4_000).for_each(|n| batch.blob_remove(&blob(n)));
        store.commit_durable_blocking(batch).unwrap();
        sizes(&format!("round {round}: 4,000 more written and removed"));
    }
    let started = Instant::now();
    store.compact_now().unwrap();
    println!("compact_now took {:?}", started.elapsed());
    sizes("after compact_now");
    drop(store);
    drop(engine);
    let store = Store::open(dir.path()).unwrap();
    sizes("reopened");
    drop(store);
}
