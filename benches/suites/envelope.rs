//! Envelope validation as a destination does it: parse, certificate check,
//! constraints and the strict Ed25519 signature.

use super::{Fixture, NOW};
use criterion::{criterion_group, Criterion, Throughput};
use relay_schemas::methods::DeliverParams;
use relay_schemas::sign::Tag;
use std::hint::black_box;

fn envelope(c: &mut Criterion) {
    let f = Fixture::new();
    let mut params = f.send_params(1, 1024);
    params["sender_device_certificate"] = f.alice.certificate(&f.phone, NOW, None);
    let body = serde_json::to_string(&params).unwrap();
    let mut g = c.benchmark_group("envelope");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_check_certificate_and_verify", |b| {
        b.iter(|| {
            let p: DeliverParams = serde_json::from_str(black_box(&body)).unwrap();
            let key = p.sender_device_certificate.check(NOW, 300).unwrap();
            p.envelope.check_constraints(65536).unwrap();
            p.envelope.verify(Tag::Envelope, &key).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, envelope);
