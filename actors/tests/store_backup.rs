//! The store's backup (`sled_engine.rs`, step 8) and its data-format
//! marker (`format.rs`), one test per rule.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use relay_actors::store::{verify_chain, Head, NewEvent, SledEngine, Store, StoreError, FORMAT_VERSION};
use serde_json::value::RawValue;

/// Every wait in these tests is bounded by this.
const WAIT: Duration = Duration::from_secs(30);
const STREAMS: usize = 8;

fn event(n: u64) -> NewEvent {
    NewEvent {
        event_type: "noted".into(),
        version: 1,
        at: n,
        data: RawValue::from_string(format!(r#"{{"n":{n},"pad":"{}"}}"#, "x".repeat(200))).unwrap(),
    }
}

fn stream(i: usize) -> String {
    format!("account/s{i}")
}

/// One durable commit: an event on stream `i`, the kv entry that names
/// its head (in the same batch: a copy of one moment has them agree),
/// and a 1 KB blob overwritten every time (dead values: compaction).
fn commit_one(store: &Store, i: usize) -> u64 {
    let (name, head) = (stream(i), store.head(&stream(i)).unwrap());
    let mut batch = store.batch();
    batch.append(&name, head, vec![event(head.seq + 1)]);
    batch.kv_put(format!("head/{name}").as_bytes(), &(head.seq + 1).to_be_bytes());
    batch.blob_put(format!("blob/{i}").as_bytes(), &vec![head.seq as u8; 1_000]);
    store.commit_durable_blocking(batch).unwrap();
    head.seq + 1
}

fn kv_head(store: &Store, i: usize) -> u64 {
    let v = store.kv_get(format!("head/{}", stream(i)).as_bytes()).unwrap().expect("a head entry");
    u64::from_be_bytes(v.try_into().unwrap())
}

/// Runs `f` on a thread and fails the test if it does not finish in time.
fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(WAIT).expect("operation did not finish in time")
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < WAIT, "{what}: not within {WAIT:?}");
        std::thread::yield_now();
    }
}

/// Step 8: commits go on through the backup (segments close every 16 KiB,
/// compaction moves values); the copy opens, its chains verify, it holds
/// every commit durable before the backup started, and it is one moment
/// of the store: each stream's kv entry names its head, and its events are
/// the live store's.
#[test]
fn a_backup_under_commits_holds_every_commit_durable_before_it_and_is_one_moment_of_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SledEngine::open(&dir.path().join("store"), None).unwrap().with_checkpoint_bytes(16 << 10));
    let store = Store::with_engine(engine).unwrap();
    // Heads known durable, per stream, as the committer learns them.
    let acked = Arc::new(Mutex::new(vec![0u64; STREAMS]));
    let stop = Arc::new(AtomicBool::new(false));
    let committer = {
        let (store, acked, stop) = (store.clone(), acked.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(SeqCst) && n < 20_000 {
                let seq = commit_one(&store, n % STREAMS);
                acked.lock().unwrap()[n % STREAMS] = seq;
                n += 1;
            }
            n
        })
    };
    wait_until("300 commits before the backup", || acked.lock().unwrap().iter().sum::<u64>() >= 300);
    let before = acked.lock().unwrap().clone();
    let out = dir.path().join("backup");
    let point = within({
        let (store, out) = (store.clone(), out.clone());
        move || store.backup(&out).unwrap()
    });
    let after_backup = acked.lock().unwrap().iter().sum::<u64>();
    wait_until("commits after the backup", || acked.lock().unwrap().iter().sum::<u64>() >= after_backup + 50);
    stop.store(true, SeqCst);
    within(move || committer.join().unwrap());
    assert!(point.linked > 0 && point.replay_from > 0, "closed segments were linked: {point:?}");

    let copy = Store::open(&out).unwrap();
    for (i, &acked_seq) in before.iter().enumerate() {
        let head = copy.head(&stream(i)).unwrap();
        assert!(head.seq >= acked_seq, "stream {i}: the copy ends at {}, {acked_seq} was durable before", head.seq);
        assert_eq!(kv_head(&copy, i), head.seq, "stream {i}: the kv entry of the same commits");
        assert_eq!(verify_chain(copy.read(&stream(i), 0)), [], "stream {i}");
        let live: Vec<Head> = store.read(&stream(i), 0).take(head.seq as usize).map(|e| e.unwrap().head()).collect();
        let copied: Vec<Head> = copy.read(&stream(i), 0).map(|e| e.unwrap().head()).collect();
        assert_eq!(copied, live, "stream {i}: the copy's events are the store's");
        let blob = copy.blob_get(format!("blob/{i}").as_bytes()).unwrap().unwrap();
        assert_eq!(blob, vec![(head.seq - 1) as u8; 1_000], "stream {i}: the blob of the last commit copied");
    }
    copy.close().unwrap();
    store.close().unwrap();
}

#[test]
fn a_backup_into_an_existing_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    commit_one(&store, 0);
    let out = dir.path().join("taken");
    std::fs::create_dir(&out).unwrap();
    let e = store.backup(&out).unwrap_err();
    assert!(e.to_string().contains("File exists"), "{e}");
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 0, "nothing written into it");
}

#[test]
fn a_model_store_has_no_files_to_back_up() {
    let store = Store::with_engine(Arc::new(relay_actors::store::ModelEngine::new())).unwrap();
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(store.backup(&dir.path().join("b")), Err(StoreError::Unsupported(_))));
}

// ---- the data-format marker --------------------------------------------------

fn format_of(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join("FORMAT")).ok()
}

fn store_with_one_commit(dir: &Path) {
    let store = Store::open(dir).unwrap();
    commit_one(&store, 0);
    store.close().unwrap();
}

/// A store a writer opened is `FORMAT_VERSION` (3: its retention index
/// entries may cover runs of messages, which a release of format 2 would
/// sweep late), whatever its sled's layout.
#[test]
fn a_new_store_is_marked_with_the_format_of_the_release_that_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    store_with_one_commit(dir.path());
    assert_eq!(format_of(dir.path()), Some("3\n".to_owned()));
    assert_eq!(FORMAT_VERSION, 3);
}

#[test]
fn a_store_of_a_newer_format_is_refused_naming_both_versions_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    store_with_one_commit(dir.path());
    let newer = FORMAT_VERSION + 1;
    std::fs::write(dir.path().join("FORMAT"), format!("{newer}\n")).unwrap();
    let files = |d: &Path| {
        let mut names: Vec<_> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    let (names, log) = (files(dir.path()), files(&dir.path().join("log")));
    for open in [Store::open, Store::open_to_read] {
        let Err(e) = open(dir.path()) else { panic!("a store of format {newer} opened") };
        let text = e.to_string();
        assert!(matches!(e, StoreError::Format { .. }), "{e}");
        assert!(
            text.contains(&format!("version {newer}")) && text.contains(&format!("1 to {FORMAT_VERSION}")),
            "{text}"
        );
    }
    assert_eq!((files(dir.path()), files(&dir.path().join("log"))), (names, log), "nothing written");
    std::fs::write(dir.path().join("FORMAT"), "one\n").unwrap();
    let Err(e) = Store::open(dir.path()) else { panic!("a store with an unreadable marker opened") };
    assert!(e.to_string().contains("\"one\" (not a version number)"), "{e}");
}

#[test]
fn an_unmarked_store_is_format_1_and_its_first_writer_marks_it() {
    let dir = tempfile::tempdir().unwrap();
    store_with_one_commit(dir.path());
    std::fs::remove_file(dir.path().join("FORMAT")).unwrap();
    let read = Store::open_to_read(dir.path()).unwrap();
    assert_eq!(read.head(&stream(0)).unwrap().seq, 1);
    read.close().unwrap();
    drop(read);
    assert_eq!(format_of(dir.path()), None, "the audit's open does not mark it");
    let store = Store::open(dir.path()).unwrap();
    assert_eq!(store.head(&stream(0)).unwrap().seq, 1);
    assert_eq!(format_of(dir.path()), Some(format!("{FORMAT_VERSION}\n")));
    store.close().unwrap();
}
