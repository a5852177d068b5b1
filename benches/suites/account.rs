//! The account core's decide/apply for a cross-account send (no I/O).

use super::{Fixture, NOW};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use relay_core::account::method::account_register::register;
use relay_core::account::method::message_send::{send, SendDecision};
use relay_core::account::Ctx;
use relay_core::account::{AccountEvent, AccountState};
use relay_core::policy::Policy;
use relay_schemas::methods::{RegisterParams, SendParams};

fn account(c: &mut Criterion) {
    let f = Fixture::new();
    let policy = Policy::with_relay_id("relay-a");
    let ctx = Ctx::new(relay_schemas::UnixSecs(NOW), &policy);
    let route = f.alice.route(1, &[("relay-a", "http://127.0.0.1:7801")], NOW);
    let reg = f.alice.register_params(&route, &f.alice.certificate(&f.phone, NOW, None), "relay-a", false, NOW);
    let reg: RegisterParams = serde_json::from_str(&reg.to_string()).unwrap();
    let mut state = AccountState::new(f.alice.id.clone());
    for e in register(&state, &reg, "d", None, ctx).unwrap() {
        state.apply(&e);
    }
    let mut n = 0u64;
    let mut g = c.benchmark_group("account");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decide_and_apply_send", |b| {
        b.iter_batched(
            || {
                n += 1;
                let p = serde_json::from_str::<SendParams>(&f.send_params(n, 256).to_string()).unwrap();
                (p, format!("{n:064x}"))
            },
            |(p, digest)| match send(&state, None, "phone", &p, &digest, ctx).unwrap() {
                SendDecision::Sent { event, .. } => {
                    let mut s = state.clone();
                    s.apply(&event);
                    matches!(event, AccountEvent::MessageSent { .. })
                }
                other => panic!("{other:?}"),
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, account);
