//! Event appends with durable group commit: many writers share one flush.

use criterion::{criterion_group, Criterion, Throughput};
use relay_actors::store::{Head, NewEvent, Store};
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

criterion_group!(benches, store);
