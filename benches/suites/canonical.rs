//! RFC 8785 canonical JSON and the idempotency digest of a send.

use super::Fixture;
use criterion::{criterion_group, Criterion, Throughput};
use relay_schemas::encoding::{jcs, jcs_digest};
use std::hint::black_box;

fn canonical(c: &mut Criterion) {
    let params = Fixture::new().send_params(1, 1024);
    let bytes = serde_json::to_vec(&params).unwrap();
    let mut g = c.benchmark_group("canonical");
    g.throughput(Throughput::Elements(1));
    g.bench_function("jcs_send_params_1KiB", |b| b.iter(|| jcs(black_box(&params)).unwrap()));
    g.bench_function("parse_and_digest_send_params_1KiB", |b| {
        b.iter(|| {
            let v: serde_json::Value = serde_json::from_slice(black_box(&bytes)).unwrap();
            jcs_digest(&v).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, canonical);
