//! `relay bench` runs a tiny load to completion with zero errors and prints
//! a complete JSON report; `--report` writes it as HTML, `--compare` sets two
//! reports side by side. No timing assertions: benchmarks are not tests.

use crate::common::node::{can_run, node};
use crate::common::relay::RelayProc;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn bench(extra: &[&str]) -> Value {
    run(&[&["--messages", "200", "--accounts", "4", "--concurrency", "4"], extra].concat())
}

/// `relay bench --json ARGS`: exit 0 and the parsed report.
fn run(args: &[&str]) -> Value {
    let stdout = relay_bench(&[args, &["--json"]].concat());
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// `relay bench ARGS`: exit 0 and its output.
fn relay_bench(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_relay")).arg("bench").args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// A short paced run (`--rate`, 2 s) with `--report DIR/NAME.html`; its JSON
/// is saved as `DIR/NAME.json`, as `--json > NAME.json` would.
fn reported_run(dir: &Path, name: &str, rate: &str) -> Value {
    let html = dir.join(format!("{name}.html"));
    let args = ["--rate", rate, "--duration", "2s", "--messages", "2000", "--accounts", "2", "--concurrency", "4"];
    let r = run(&[&args[..], &["--report", html.to_str().unwrap()]].concat());
    std::fs::write(dir.join(format!("{name}.json")), r.to_string()).unwrap();
    r
}

fn path(dir: &Path, file: &str) -> String {
    dir.join(file).to_str().unwrap().to_string()
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

#[test]
fn bench_report_writes_series_histogram_and_an_html_page() {
    let dir = tempfile::tempdir().unwrap();
    let r = reported_run(dir.path(), "a", "200");
    assert_eq!(r["errors"], 0, "{r:#}");
    let sent = r["sent"].as_u64().unwrap();
    // Every reply is in the histogram once, and in the second it came.
    let hist = r["send_histogram_us"].as_array().unwrap_or_else(|| panic!("{r:#}"));
    assert_eq!(hist.iter().map(|b| b[1].as_u64().unwrap()).sum::<u64>(), sent, "{r:#}");
    let series = r["series"].as_array().unwrap_or_else(|| panic!("{r:#}"));
    assert!(series.len() >= 2, "a 2 s window, one entry a second: {r:#}");
    let mut t0 = 0.0;
    let mut counted = 0.0;
    for s in series {
        let t = s["t_s"].as_f64().unwrap();
        assert!(t > t0, "{r:#}");
        counted += s["send_per_sec"].as_f64().unwrap() * (t - t0);
        t0 = t;
    }
    assert!((counted - sent as f64).abs() < 0.5, "{counted} counted in the series, {sent} sent: {r:#}");
    assert_eq!(t0, r["elapsed_s"].as_f64().unwrap(), "the last entry ends with the window: {r:#}");
    // The relay the bench started is sampled: CPU and RSS.
    assert!(series.iter().all(|s| s["relay_cpu_pct"].as_f64().is_some()), "{r:#}");
    assert!(series.iter().all(|s| s["relay_rss_bytes"].as_u64() > Some(0)), "{r:#}");
    let pct: Vec<f64> = ["send_p50_ms", "send_p90_ms", "send_p99_ms", "send_p999_ms", "send_max_ms"]
        .iter()
        .map(|k| r[k].as_f64().unwrap_or_else(|| panic!("{k}: {r:#}")))
        .collect();
    assert!(pct.windows(2).all(|w| w[0] <= w[1]), "{pct:?}");
    assert_eq!(r["run"]["version"], env!("CARGO_PKG_VERSION"), "{r:#}");
    assert!(r["run"]["nproc"].as_u64() >= Some(1), "{r:#}");

    let page = std::fs::read_to_string(dir.path().join("a.html")).unwrap();
    assert_eq!(page.matches("<svg").count(), 7, "{page}");
    assert!(!page.contains("no data"), "{page}");
    assert!(!page.contains("<script") && !page.contains("src="), "self-contained: {page}");
    assert!(page.contains(&format!("<td>sent</td><td>{sent}</td>")), "{page}");
}

#[test]
fn bench_compare_prints_the_ratios_of_two_runs_old_or_new() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (a, b) = (reported_run(d, "a", "150"), reported_run(d, "b", "250"));
    let out = relay_bench(&["--compare", &path(d, "a.json"), &path(d, "b.json"), "--report", &path(d, "ab.html")]);
    let row = |out: &str, label: &str| -> Vec<String> {
        let line =
            out.lines().find(|l| l.starts_with(&format!("{label}  "))).unwrap_or_else(|| panic!("{label}: {out}"));
        line[label.len()..].split_whitespace().map(str::to_string).collect()
    };
    for (label, key) in
        [("send/s", "send_per_sec"), ("send p99 ms", "send_p99_ms"), ("relay CPU µs/send", "relay_cpu_us_per_send")]
    {
        let (va, vb) = (a[key].as_f64().unwrap(), b[key].as_f64().unwrap());
        assert_eq!(row(&out, label), [a[key].to_string(), b[key].to_string(), format!("{:.3}", vb / va)], "{out}");
    }
    let page = std::fs::read_to_string(d.join("ab.html")).unwrap();
    assert!(page.contains("<th>A: a.json</th><th>B: b.json</th><th>B/A</th>"), "{page}");
    assert!(!page.contains("no data"), "{page}");

    // A report from before the series and p90 existed: what it has is compared.
    let mut old = a.clone();
    for k in ["series", "send_histogram_us", "send_p90_ms", "send_p999_ms", "run"] {
        old.as_object_mut().unwrap().remove(k);
    }
    std::fs::write(d.join("old.json"), old.to_string()).unwrap();
    let out = relay_bench(&["--compare", &path(d, "old.json"), &path(d, "b.json"), "--report", &path(d, "old.html")]);
    assert_eq!(row(&out, "send p90 ms"), ["-", &b["send_p90_ms"].to_string(), "-"], "{out}");
    assert_eq!(
        row(&out, "send/s")[2],
        format!("{:.3}", b["send_per_sec"].as_f64().unwrap() / a["send_per_sec"].as_f64().unwrap())
    );
    let page = std::fs::read_to_string(d.join("old.html")).unwrap();
    assert_eq!(page.matches("<svg").count(), 7, "{page}");

    // Not a report: an error, and no page.
    std::fs::write(d.join("junk.json"), "[1, 2]").unwrap();
    let bad = Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["bench", "--compare", &path(d, "junk.json"), &path(d, "b.json"), "--report", &path(d, "junk.html")])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("not a `relay bench --json` report"), "{bad:?}");
    assert!(!d.join("junk.html").exists());
}

#[test]
fn bench_report_samples_a_relay_given_with_relays_that_runs_on_this_machine() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let r = run(&[
        "--relays",
        &relay.url,
        "--rate",
        "100",
        "--duration",
        "1500ms",
        "--messages",
        "1000",
        "--accounts",
        "2",
    ]);
    assert_eq!(r["errors"], 0, "{r:#}");
    assert_eq!(r["config"]["mode"], "external", "{r:#}");
    // Found by its listening socket: its CPU and RSS over time.
    let series = r["series"].as_array().unwrap_or_else(|| panic!("{r:#}"));
    assert!(!series.is_empty(), "{r:#}");
    assert!(series.iter().all(|s| s["relay_cpu_pct"].as_f64().is_some()), "{r:#}");
    assert!(series.iter().all(|s| s["relay_rss_bytes"].as_u64() > Some(0)), "{r:#}");
}

/// The pages open from file:// in headless Chromium and draw every chart,
/// with no console error and no request beyond the page
/// (`web/test/report.mjs`; screenshots under the target dir).
#[test]
fn bench_report_renders_in_chromium() {
    if !can_run("bench_report_renders_in_chromium") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    reported_run(d, "run", "200");
    relay_bench(&["--compare", &path(d, "run.json"), &path(d, "run.json"), "--report", &path(d, "compare.html")]);
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("bench-report");
    let (scratch, out) = (d.join("chromium"), shots.as_os_str());
    let (run, compare) = (d.join("run.html"), d.join("compare.html"));
    node(
        &[
            "test/report.mjs".as_ref(),
            "--dir".as_ref(),
            scratch.as_os_str(),
            "--out".as_ref(),
            out,
            run.as_os_str(),
            compare.as_os_str(),
        ],
        Duration::from_secs(120),
    );
    eprintln!("screenshots in {}", shots.display());
}
