//! The retry timetable with 100,000 deliveries in flight: deciding each one's
//! next attempt after a failure (pure core), arming their timers in the
//! supervisor's timer actor, and restoring them from the due index on start.

use super::NOW;
use criterion::{criterion_group, BatchSize, Criterion, SamplingMode, Throughput};
use relay_actors::delivery::{self, NoPeers};
use relay_actors::store::Store;
use relay_actors::Supervisor;
use relay_core::aggregate::Aggregate;
use relay_core::clock::{Clock, SystemClock};
use relay_core::delivery::aggregate::{DeliveryCmd, DeliveryCtx, DeliveryEvent, DeliveryState};
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::delivery::timetable::{next_attempt_ms, slot_offset_ms};
use relay_core::policy::Policy;
use relay_schemas::{ErrorCode, RelayError, UnixMillis, UnixSecs};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const N: usize = 100_000;
const HOUR_MS: u64 = 3_600_000;

/// Deliveries with an attempt in flight, and the outcome each one gets.
type InFlight = (Vec<(DeliveryState, u32, UnixMillis)>, Vec<AttemptOutcome>);

/// Delivery `i`: accepted at `NOW + i % 3600` s with the default deadline,
/// its attempt `1 + i % 4` (slots 0, 30 s, 5 min, 25 min) in flight and
/// failing 250 ms after its slot; returns (state, attempt, failed at ms).
fn in_flight(policy: &Policy, i: usize) -> (DeliveryState, u32, UnixMillis) {
    let accepted_at = UnixSecs(NOW + (i % 3600) as u64);
    let attempt = 1 + (i % 4) as u32;
    let failed_at_ms = accepted_at.millis().plus(slot_offset_ms(policy, attempt as usize - 1) + 250);
    let deadline = accepted_at.plus(policy.delivery_age_limit);
    let mut s = DeliveryState { accepted_at, deadline, ..Default::default() };
    s.apply(&DeliveryEvent::AttemptStarted { attempt, targets: vec!["relay-b".into()], revision: 1 });
    (s, attempt, failed_at_ms)
}

/// The retryable outcomes an attempt fails with (seed error table).
fn failure(i: usize) -> AttemptOutcome {
    match (i / 4) % 4 {
        0 => AttemptOutcome::Unknown(RelayError::unavailable("delivery attempt timed out")),
        1 => AttemptOutcome::Rejected(RelayError::new(ErrorCode::TemporarilyUnavailable, "busy")),
        2 => AttemptOutcome::NotAttempted(RelayError::unavailable("connection refused")),
        _ => AttemptOutcome::Rejected(RelayError::new(ErrorCode::RouteStale, "route stale")),
    }
}

/// Sum of the next due times `DeliveryCmd::Outcome` picks (one per delivery).
fn decide_all(
    states: &[(DeliveryState, u32, UnixMillis)],
    outcomes: Vec<AttemptOutcome>,
    policy: &Policy,
) -> (usize, u64) {
    let (mut failed, mut sum) = (0, 0u64);
    for ((s, attempt, now_ms), outcome) in states.iter().zip(outcomes) {
        let ctx = DeliveryCtx { now_ms: *now_ms, policy };
        for e in s.decide(&DeliveryCmd::Outcome { attempt: *attempt, outcome: &outcome }, ctx).unwrap().events {
            if let DeliveryEvent::AttemptFailed { next_due_ms, .. } = e {
                failed += 1;
                sum = sum.wrapping_add(next_due_ms.0);
            }
        }
    }
    (failed, sum)
}

/// The stream names of `n` deliveries from one account.
fn streams(n: usize) -> Vec<String> {
    (0..n).map(|i| delivery::stream_id("fe61d66319578e17ca0f01bbf0004bb7", &format!("msg-{i:016}"))).collect()
}

fn supervisor(store: &Store) -> Supervisor {
    Supervisor::new(store.clone(), Policy::with_relay_id("relay-a"), Arc::new(SystemClock), Arc::new(NoPeers))
}

/// A fresh actix system and supervisor; times `schedule` of every stream
/// (due in an hour) until the timer actor has armed them all. The system,
/// with its timers, is dropped outside the measurement.
fn schedule_all(store: &Store, streams: &[String]) -> Duration {
    let sys = actix::System::new();
    let sup = supervisor(store);
    let streams = streams.to_vec();
    sys.block_on(async {
        sup.start().unwrap();
        sup.timers_armed().await;
        let due = SystemClock.now_ms().plus(HOUR_MS);
        let t = Instant::now();
        for stream in streams {
            sup.schedule(stream, due);
        }
        sup.timers_armed().await;
        t.elapsed()
    })
}

/// A store whose due index holds one entry per stream, due in 1 h to 1 h 1 min.
fn due_index(streams: &[String]) -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path()).unwrap();
    let due = SystemClock.now_ms().plus(HOUR_MS);
    let mut batch = store.batch();
    for (i, stream) in streams.iter().enumerate() {
        batch.kv_put(&delivery::due_key(due.plus((i % 60_000) as u64), stream), b"");
    }
    store.commit_durable_blocking(batch).unwrap();
    (dir, store)
}

/// Times `Supervisor::start` on `store` until every restored timer is armed.
fn restore(store: &Store) -> Duration {
    let sys = actix::System::new();
    let sup = supervisor(store);
    sys.block_on(async {
        let t = Instant::now();
        let n = sup.start().unwrap();
        sup.timers_armed().await;
        let took = t.elapsed();
        assert_eq!(n, N);
        took
    })
}

fn timetable(c: &mut Criterion) {
    let policy = Policy::with_relay_id("relay-a");
    let deliveries = || -> InFlight {
        let states = (0..N).map(|i| in_flight(&policy, i)).collect();
        (states, (0..N).map(failure).collect())
    };
    // Built on first use only, so other suites do not pay for them.
    let mut core: Option<InFlight> = None;
    let mut names: Option<Vec<String>> = None;
    let mut scratch: Option<Store> = None;
    let mut index: Option<(tempfile::TempDir, Store)> = None;
    let mut resident: Option<(actix::SystemRunner, Supervisor)> = None;

    let mut g = c.benchmark_group("timetable");
    g.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(N as u64));

    // 1. The pure core: the timetable's next slot alone, then the whole
    // decision the delivery actor takes on a failed attempt.
    g.bench_function("next_attempt_ms_100k", |b| {
        let (states, _) = core.get_or_insert_with(deliveries);
        b.iter(|| {
            states.iter().fold(0u64, |sum, (s, _, now_ms)| {
                let next =
                    next_attempt_ms(&policy, s.accepted_at.millis(), *now_ms, UnixMillis(0), s.deadline.millis());
                sum.wrapping_add(black_box(next).map_or(0, |n| n.0))
            })
        })
    });
    g.bench_function("decide_outcome_100k", |b| {
        let (states, outcomes) = core.get_or_insert_with(deliveries);
        assert_eq!(decide_all(states, outcomes.clone(), &policy).0, N, "every delivery gets a next attempt");
        b.iter_batched(|| outcomes.clone(), |o| decide_all(states, o, &policy), BatchSize::PerIteration)
    });

    // 2. and 3. The timer actor; each iteration in a fresh actix system.
    g.sampling_mode(SamplingMode::Flat);
    g.bench_function("schedule_100k", |b| {
        let names = names.get_or_insert_with(|| streams(N));
        let store = scratch.get_or_insert_with(|| Store::temporary().unwrap());
        b.iter_custom(|iters| (0..iters).map(|_| schedule_all(store, names)).sum())
    });
    g.measurement_time(Duration::from_secs(3));
    g.bench_function("restore_100k", |b| {
        let (_, store) = index.get_or_insert_with(|| due_index(&streams(N)));
        b.iter_custom(|iters| (0..iters).map(|_| restore(store)).sum())
    });

    // The steady state: one more timer armed while 100,000 are pending.
    g.sampling_mode(SamplingMode::Auto).measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(1));
    g.bench_function("schedule_1_with_100k_armed", |b| {
        let names = names.get_or_insert_with(|| streams(N));
        let store = scratch.get_or_insert_with(|| Store::temporary().unwrap());
        let (sys, sup) = resident.get_or_insert_with(|| {
            let sys = actix::System::new();
            let sup = supervisor(store);
            sys.block_on(async {
                sup.start().unwrap();
                let due = SystemClock.now_ms().plus(HOUR_MS);
                names.iter().for_each(|s| sup.schedule(s.clone(), due));
                sup.timers_armed().await;
            });
            (sys, sup)
        });
        let stream = names[0].clone();
        b.iter_custom(|iters| {
            sys.block_on(async {
                let due = SystemClock.now_ms().plus(HOUR_MS);
                let t = Instant::now();
                for _ in 0..iters {
                    sup.schedule(stream.clone(), due);
                    sup.timers_armed().await;
                }
                t.elapsed()
            })
        })
    });
    g.finish();
}

criterion_group!(benches, timetable);
