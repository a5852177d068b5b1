//! Event appends with durable group commit: many writers share one flush;
//! and a ledger lookup that misses, in sled's tree and through the filter
//! in front of it.

use criterion::{criterion_group, Criterion, Throughput};
use relay_actors::store::{Head, NewEvent, SledEngine, Store};
use serde_json::value::RawValue;
use std::sync::Arc;

fn event(n: u64) -> NewEvent {
    NewEvent {
        event_type: "bench".into(),
        version: 1,
        at: n,
        data: RawValue::from_string(format!("{{\"n\":{n},\"pad\":\"{}\"}}", "x".repeat(200))).unwrap(),
    }
}

/// `writers` threads each append `per_writer` events, one durable commit
/// each; returns when all are durable.
fn append_durable(store: &Store, writers: usize, per_writer: u64, round: u64) {
    std::thread::scope(|s| {
        for w in 0..writers {
            let store = store.clone();
            s.spawn(move || {
                let stream = format!("bench/{writers}/{round}/{w}");
                let mut head = Head::default();
                for n in 0..per_writer {
                    let mut batch = store.batch();
                    head = batch.append(&stream, head, vec![event(n)]);
                    store.commit_durable_blocking(batch).unwrap();
                }
            });
        }
    });
}

fn store(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let mut g = c.benchmark_group("store");
    g.sample_size(10);
    for writers in [1usize, 64] {
        let per_writer = 1600 / writers as u64;
        g.throughput(Throughput::Elements(writers as u64 * per_writer));
        let round = Arc::new(std::sync::atomic::AtomicU64::new(0));
        g.bench_function(format!("durable_appends_{writers}_writers"), |b| {
            b.iter(|| {
                let r = round.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                append_durable(&store, writers, per_writer, r)
            })
        });
    }
    g.finish();
    let stats = store.stats();
    eprintln!("store stats: {stats:?}");
}

/// The lookup every new `message.send` and receipt makes first: its
/// ledger entry, which is not there. 100,000 entries in the store, as
/// ledger keys are (16 bytes of a hash under the account's prefix).
fn blob_miss(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(SledEngine::open(dir.path(), None).unwrap());
    let store = Store::with_engine(engine.clone()).unwrap();
    let key = |n: u64| {
        let mut k = b"l/acct-0000000000000000000000000000000000000000/".to_vec();
        k.extend_from_slice(&blake3::hash(&n.to_le_bytes()).as_bytes()[..16]);
        k
    };
    for round in 0..100u64 {
        let mut batch = store.batch();
        for n in round * 1_000..(round + 1) * 1_000 {
            batch.blob_put(&key(n), &[0; 20]);
        }
        store.commit_durable_blocking(batch).unwrap();
    }
    let sled_key = |n: u64| [&b"b"[..], &key(n)].concat();
    assert!(store.raw_db().get(sled_key(7)).unwrap().is_some(), "the key layout is the store's");
    while !engine.blob_filter().0 {
        std::thread::yield_now();
    }
    let db = store.raw_db();
    let mut g = c.benchmark_group("store");
    let mut n = 1u64 << 40;
    g.bench_function("ledger_miss_sled_tree", |b| {
        b.iter(|| {
            n += 1;
            assert!(db.get(sled_key(n)).unwrap().is_none())
        })
    });
    g.bench_function("ledger_miss_through_filter", |b| {
        b.iter(|| {
            n += 1;
            assert!(store.blob_get(&key(n)).unwrap().is_none())
        })
    });
    g.finish();
}

criterion_group!(benches, store, blob_miss);
