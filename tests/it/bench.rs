//! `relay bench` runs a tiny load to completion with zero errors and prints
//! a complete JSON report. No timing assertions: benchmarks are not tests.

use serde_json::Value;
use std::process::Command;

fn bench(extra: &[&str]) -> Value {
    run(&[&["--messages", "200", "--accounts", "4", "--concurrency", "4"], extra].concat())
}

/// `relay bench --json ARGS`: exit 0 and the parsed report.
fn run(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_relay")).arg("bench").args(args).arg("--json").output().unwrap();
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
        "commits_per_send",
        "barriers_per_send",
        "log_bytes_per_send",
        "log_writes_per_send",
        "actor_hops_per_send",
        "disk_bytes_per_send",
        "relay_cpu_us_per_send",
        "load_cpu_us_per_send",
    ] {
        let v = r[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {r:#}"));
        assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
    }
    // Every answered send was made durable: at least one commit, behind a
    // real barrier, and written to the log.
    assert!(r["commits_per_send"].as_f64() >= Some(1.0), "{r:#}");
    assert!(r["barriers"].as_u64().is_some_and(|n| n > 0), "{r:#}");
    assert!(r["log_bytes_per_send"].as_f64() > Some(0.0), "{r:#}");
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
    // A local send is two commits (the receipt; the acceptance with its
    // final status) and three actor messages (decide, receive, settle; no
    // delivery actor); a snapshot now and then adds a commit.
    let (commits, hops) = (r["commits_per_send"].as_f64().unwrap(), r["actor_hops_per_send"].as_f64().unwrap());
    assert!((2.0..2.1).contains(&commits), "commits per local send: {r:#}");
    assert!((3.0..3.1).contains(&hops), "actor hops per local send: {r:#}");
}

#[test]
fn bench_two_relays_with_cross_relay_share() {
    let r = bench(&["--cross-share", "0.5"]);
    check(&r, 2);
    assert_eq!(r["cross_relay_sent"], 100, "{r:#}");
}

#[test]
fn bench_ws_correlates_a_notification_to_every_accepted_send() {
    // Two relays (cross-relay records are notified at relay-b) and two
    // devices per account (each recipient device is notified).
    let r = run(&[
        "--ws",
        "--messages",
        "40",
        "--accounts",
        "4",
        "--devices",
        "2",
        "--concurrency",
        "4",
        "--cross-share",
        "0.5",
    ]);
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["sent"], 40, "{r:#}");
    assert_eq!(r["config"]["websocket"], true, "{r:#}");
    assert_eq!(r["config"]["websocket_connections"], 8, "{r:#}");
    assert_eq!(r["notify_missing"], 0, "{r:#}");
    assert_eq!(r["ws_failures"], 0, "{r:#}");
    let accepted = r["target_accepted"].as_u64().unwrap();
    assert!(accepted > 0, "{r:#}");
    assert_eq!(r["notified"].as_u64(), Some(accepted * 2), "one per recipient device: {r:#}");
    for k in ["notify_p50_ms", "notify_p99_ms", "notify_max_ms"] {
        let v = r[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {r:#}"));
        assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
    }
    assert!(r["notify_p50_ms"].as_f64() <= r["notify_max_ms"].as_f64(), "{r:#}");
}

#[test]
fn bench_rate_paces_the_sends_and_stops_at_the_duration() {
    // 400/s for 1 s: sends due at 0, 1/400, … 399/400 s; none after.
    let r = run(&["--rate", "400", "--duration", "1s", "--messages", "1000", "--accounts", "2", "--concurrency", "4"]);
    assert_eq!(r["errors"], 0, "{r:#}");
    let sent = r["sent"].as_u64().unwrap();
    assert!((1..=400).contains(&sent), "paced to the rate and cut at the duration: {r:#}");
}

#[test]
fn bench_without_ws_reports_no_notification_figures() {
    let r = run(&["--messages", "10", "--accounts", "2", "--concurrency", "2"]);
    assert_eq!(r["config"]["websocket"], false, "{r:#}");
    for k in ["notify_p50_ms", "notified", "notify_missing", "pending", "idle_cpu_share", "population", "seed_s"] {
        assert!(r.get(k).is_some_and(Value::is_null), "{k}: {r:#}");
    }
}

#[test]
fn bench_pending_counts_the_deliveries_waiting_for_a_dead_relay() {
    let r = run(&["--pending", "20", "--idle-window", "1s"]);
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["sent"], 20, "{r:#}");
    assert_eq!(r["delivering"], 20, "the destination is down: {r:#}");
    assert_eq!(r["pending"], 20, "{r:#}");
    assert_eq!(r["config"]["pending"], 20, "{r:#}");
    for k in ["idle_cpu_share", "idle_cpu_seconds", "idle_window_s", "settle_s"] {
        let v = r[k].as_f64().unwrap_or_else(|| panic!("{k} is not a number: {r:#}"));
        assert!(v.is_finite() && v >= 0.0, "{k} = {v}");
    }
}

#[test]
fn bench_population_sends_to_accounts_seeded_before_the_relay_starts() {
    let r = run(&["--population", "300", "--messages", "100", "--accounts", "4", "--concurrency", "4"]);
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["sent"], 100, "{r:#}");
    assert_eq!(r["target_accepted"], 100, "every send reaches a seeded account: {r:#}");
    assert_eq!(r["delivering"], 0, "{r:#}");
    assert_eq!(r["population"], 300, "{r:#}");
    assert_eq!(r["config"]["population"], 300, "{r:#}");
    assert_eq!(r["config"]["relays"], 1, "{r:#}");
    let seed = r["seed_s"].as_f64().unwrap_or_else(|| panic!("seed_s is not a number: {r:#}"));
    assert!(seed.is_finite() && seed > 0.0, "{r:#}");
    let rss = r["rss_bytes"].as_u64().unwrap_or_else(|| panic!("rss_bytes: {r:#}"));
    let peak = r["rss_peak_bytes"].as_u64().unwrap_or_else(|| panic!("rss_peak_bytes: {r:#}"));
    assert!(rss > 0 && peak >= rss, "{r:#}");
    assert!(r["resident_actors"].is_u64(), "{r:#}");
}
