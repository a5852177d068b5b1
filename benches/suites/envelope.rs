//! Envelope validation as a destination does it: parse, certificate check,
//! constraints and the strict Ed25519 signature. A signed object verified
//! once is remembered (`relay_schemas` keeps a memo keyed by tag, key and
//! bytes), so there are two cases: an envelope seen for the first time (its
//! device certificate already known, as for every message after a device's
//! first), and one seen again (a local recipient checking what the sender's
//! account just verified). A third times the strict Ed25519 check alone.

use super::{Fixture, NOW};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use relay_schemas::methods::DeliverParams;
use relay_schemas::sign::Tag;
use std::hint::black_box;

fn validate(body: &str) {
    let p: DeliverParams = serde_json::from_str(body).unwrap();
    let key = p
        .sender_device_certificate
        .check(relay_schemas::UnixSecs(NOW), 300, relay_schemas::objects::MAX_OBJECT_BYTES)
        .unwrap();
    p.envelope.check_constraints(65536).unwrap();
    p.envelope.verify(Tag::Envelope, &key).unwrap();
}

fn envelope(c: &mut Criterion) {
    let f = Fixture::new();
    let certificate = f.alice.certificate(&f.phone, NOW, None);
    let body = |n: u64| {
        let mut params = f.send_params(n, 1024);
        params["sender_device_certificate"] = certificate.clone();
        serde_json::to_string(&params).unwrap()
    };
    let mut g = c.benchmark_group("envelope");
    g.throughput(Throughput::Elements(1));
    // Every iteration a new message id, so a new signature to check.
    let mut n = 1_000_000;
    g.bench_function("parse_check_certificate_and_verify", |b| {
        b.iter_batched(
            || {
                n += 1;
                body(n)
            },
            |body| validate(black_box(&body)),
            BatchSize::SmallInput,
        )
    });
    let again = body(1);
    validate(&again);
    g.bench_function("parse_check_certificate_and_verify_again", |b| b.iter(|| validate(black_box(&again))));
    // The Ed25519 check alone, on the envelope's signed bytes: the part of
    // a first sight that no memo or parser change removes.
    let p: DeliverParams = serde_json::from_str(&again).unwrap();
    let key = p
        .sender_device_certificate
        .check(relay_schemas::UnixSecs(NOW), 300, relay_schemas::objects::MAX_OBJECT_BYTES)
        .unwrap();
    let signed = relay_schemas::sign::signed_bytes(Tag::Envelope, &p.envelope.map().unwrap()).unwrap();
    g.bench_function("verify_strict_only", |b| {
        b.iter(|| {
            relay_schemas::sign::verify_bytes(&key, black_box(&signed), black_box(&p.envelope.signature)).unwrap()
        })
    });
    g.finish();
}

criterion_group!(benches, envelope);
