//! RFC 8785 canonical JSON and the idempotency digest of a send.

use super::Fixture;
use criterion::{criterion_group, Criterion, Throughput};
use relay_schemas::encoding::{jcs, jcs_digest};
use relay_schemas::methods::DeliverParams;
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
    // The digest step of `message.deliver` (and of every local send's
    // receipt): JCS of the whole typed params, as before, against
    // `DeliverParams::jcs` joining each object's canonical bytes, which
    // the relay's signature checks leave behind (after the first
    // iteration, here). Parsing is outside both.
    let f = Fixture::new();
    let mut deliver = f.send_params(1, 1024);
    let deliver_map = deliver.as_object_mut().unwrap();
    deliver_map.remove("sender_boxes");
    deliver_map.insert("sender_device_certificate".into(), f.alice.certificate(&f.phone, super::NOW, None));
    deliver_map.insert("sender_route".into(), f.alice.route(1, &[("relay-a", "https://a.example")], super::NOW));
    let p: DeliverParams = serde_json::from_slice(&serde_json::to_vec(&deliver).unwrap()).unwrap();
    assert_eq!(p.jcs().unwrap(), jcs(&p).unwrap(), "both ways give the same bytes");
    g.bench_function("deliver_digest_whole_params_1KiB", |b| b.iter(|| blake3::hash(&jcs(black_box(&p)).unwrap())));
    g.bench_function("deliver_digest_from_pieces_1KiB", |b| b.iter(|| blake3::hash(&black_box(&p).jcs().unwrap())));
    g.finish();
}

criterion_group!(benches, canonical);
