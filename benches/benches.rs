//! Criterion micro-benchmarks, one entry point with a suite per subsystem
//! (run one with `cargo bench --bench benches -- <suite>`).

mod suites;

criterion::criterion_main!(
    suites::canonical::benches,
    suites::envelope::benches,
    suites::store::benches,
    suites::account::benches,
    suites::http::benches,
    suites::timetable::benches,
);
