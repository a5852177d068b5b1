//! `relay bench` runs a tiny load to completion with zero errors and prints
//! a complete JSON report. No timing assertions: benchmarks are not tests.

use serde_json::Value;
use std::process::Command;

fn bench(extra: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["bench", "--messages", "200", "--accounts", "4", "--concurrency", "4", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn check(r: &Value, relays: u64) {
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["sent"], 200, "{r:#}");
    assert_eq!(r["config"]["relays"], relays);
    for k in [
        "send_per_sec",
        "send_p50_ms",
        "send_p99_ms",
        "send_max_ms",
        "target_accepted_per_sec",
        "deliver_p50_ms",
        "deliver_p99_ms",
        "events_per_sec",
        "commits_per_sec",
        "mean_flush_batch",
    ] {
        let v = r[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {r:#}"));
        assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
    }
    assert!(r["send_p50_ms"].as_f64() <= r["send_max_ms"].as_f64());
    assert!(r["resident_actors"].as_u64().is_some_and(|n| n >= 1), "{r:#}");
    assert!(r["rss_bytes"].as_u64().is_some_and(|n| n > 0), "{r:#}");
    assert!(r["errors"].is_u64());
}

#[test]
fn bench_one_relay_runs_a_tiny_load_without_errors() {
    let r = bench(&[]);
    check(&r, 1);
    assert_eq!(r["cross_relay_sent"], 0);
}

#[test]
fn bench_two_relays_with_cross_relay_share() {
    let r = bench(&["--cross-share", "0.5"]);
    check(&r, 2);
    assert_eq!(r["cross_relay_sent"], 100, "{r:#}");
}
