//! `--pending N`: what N deliveries waiting for a dead relay cost between
//! due times (the target: 10,000 of them under 2 % of one core).
//!
//! It starts relay-a (`delivery.retry_timetable = ["0s", "1h"]`) and
//! relay-b, registers a sender on relay-a and a recipient on relay-b, lets
//! relay-a learn the recipient's route (`route.get`), kills relay-b, then
//! sends N messages: each is accepted, its first attempt fails, the next is
//! due in an hour. Once the first attempts have settled (relay-a's
//! `/metrics`: attempts counted, none in flight, no store commits for a
//! while), it reads relay-a's CPU time (`/proc/<pid>/stat` utime + stime)
//! across `--idle-window` and reports the share of one core.

use super::http::Conn;
use super::{load, plan, report};
use crate::setup::{progress, BenchArgs};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TIMETABLE: &str = "[delivery]\nretry_timetable = [\"0s\", \"1h\"]\n";

/// Longest wait for the first attempts to settle.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);
/// Settled: no store commit on relay-a for this long.
const QUIET: Duration = Duration::from_secs(1);

/// Sum of every sample of metric `name` (all label sets).
fn sum(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ') || r.starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn metrics(addr: &str) -> Result<String, String> {
    let (status, body) = Conn::open(addr)?.get("/metrics")?;
    if status != 200 {
        return Err(format!("/metrics: HTTP {status}"));
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Waits until relay-a has counted an attempt for each of `accepted`
/// deliveries beyond `attempts0`, has none in flight and has made no store
/// commit for [`QUIET`]; the time it took.
fn settle(addr: &str, attempts0: f64, accepted: u64) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last_commits = -1.0;
    let mut quiet_since = Instant::now();
    loop {
        let m = metrics(addr)?;
        let attempts = sum(&m, "relay_delivery_attempts_total") - attempts0;
        let running = sum(&m, "relay_delivery_attempts_in_flight");
        let commits = sum(&m, "relay_store_flush_batch_commits_sum");
        if commits != last_commits {
            last_commits = commits;
            quiet_since = Instant::now();
        }
        if attempts >= accepted as f64 && running == 0.0 && quiet_since.elapsed() >= QUIET {
            return Ok(start.elapsed());
        }
        if start.elapsed() > SETTLE_LIMIT {
            return Err(format!(
                "first attempts did not settle within {SETTLE_LIMIT:?} ({attempts} of {accepted} attempts, {running} running)"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn run(args: &BenchArgs, n: usize, run_id: u64) -> Result<(Value, u64), String> {
    if n == 0 {
        return Err("--pending must be at least 1".into());
    }
    if args.idle_window.is_zero() {
        return Err("--idle-window must be positive".into());
    }
    let (targets, mut own, dir) = crate::setup::own_relays(run_id, 2, &[TIMETABLE, ""], None)?;

    let setup = progress(3, "setup: registering accounts");
    // Account 0 (the sender) on relay-a, account 1 (the recipient) on relay-b.
    let accounts = plan::register(&targets, 2, args.devices, run_id)?;
    setup.inc(1);
    let mut a = Conn::open(&targets[0].addr)?;
    a.ok("route.get", Some(&accounts[0].tokens[0]), &json!({"account_id": accounts[1].account.id}))?;
    setup.set_message("setup: signing requests");
    let sends = plan::sends_between(&accounts, 0, 1, n, args.payload, run_id);
    setup.inc(1);
    // relay-b dies: every first attempt fails and the next is due in 1 h.
    drop(own.pop());
    setup.finish_and_clear();

    let pid = own[0].child.id();
    let attempts0 = sum(&metrics(&targets[0].addr)?, "relay_delivery_attempts_total");
    let before = vec![report::scrape(&targets[0].addr)];
    let disk_before = vec![report::disk_write_bytes(pid)];
    let cpu_before = vec![relay::observe::cpu_seconds(pid)];
    let bar = progress(sends.len() as u64, "sends to a dead relay");
    let mut outcome = load::run(&targets, &sends, args.concurrency, None, None, &mut |k, _| bar.set_position(k));
    bar.finish_and_clear();
    let after = vec![report::scrape(&targets[0].addr)];
    let disk_after = vec![report::disk_write_bytes(pid)];
    let cpu_after = vec![relay::observe::cpu_seconds(pid)];

    let accepted = outcome.delivering + outcome.target_accepted;
    let settled = settle(&targets[0].addr, attempts0, accepted)?;
    let cpu0 = relay::observe::cpu_seconds(pid).ok_or("cannot read relay-a's CPU time from /proc")?;
    let t0 = Instant::now();
    std::thread::sleep(args.idle_window);
    let cpu1 = relay::observe::cpu_seconds(pid).ok_or("cannot read relay-a's CPU time from /proc")?;
    let window = t0.elapsed().as_secs_f64();
    let m = metrics(&targets[0].addr)?;
    let pending = report::sample(&m, "relay_deliveries_in_flight").map(|v| v as u64);
    let rss = vec![report::rss_bytes(pid)];
    let rss_peak = vec![report::rss_peak_bytes(pid)];

    let config = json!({
        "mode": "started",
        "relays": 2,
        "relay_urls": targets.iter().map(|t| t.url.clone()).collect::<Vec<_>>(),
        "accounts": 2,
        "devices": args.devices,
        "messages": n,
        "concurrency": args.concurrency,
        "payload": args.payload,
        "cross_share": 1.0,
        "duration_s": Value::Null,
        "rate": Value::Null,
        "websocket": false,
        "pending": n,
        "idle_window_s": args.idle_window.as_secs_f64(),
        "retry_timetable": ["0s", "1h"],
    });
    let mut r = report::build(report::Inputs {
        config,
        outcome: &mut outcome,
        before,
        after,
        rss,
        rss_peak,
        disk_before,
        disk_after,
        cpu_before,
        cpu_after,
        load_cpu: (None, None),
        samples: &[],
    });
    let round = |v: f64, per_unit: f64| (v * per_unit).round() / per_unit;
    r["pending"] = json!(pending);
    r["settle_s"] = json!(round(settled.as_secs_f64(), 1e3));
    r["idle_window_s"] = json!(round(window, 1e3));
    // CPU time moves in clock ticks (10 ms at USER_HZ 100).
    r["idle_cpu_seconds"] = json!(round(cpu1 - cpu0, 1e3));
    r["idle_cpu_share"] = json!(round((cpu1 - cpu0) / window, 1e6));
    r["idle_cpu_target"] = json!(0.02);
    drop(own);
    drop(dir);
    Ok((r, outcome.errors))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_label_set_of_a_metric() {
        let m = "# TYPE x counter\nrelay_delivery_attempts_total{outcome=\"unknown\"} 3\n\
                 relay_delivery_attempts_total{outcome=\"answered\"} 4\nrelay_delivery_attempts_in_flight 9\n";
        assert_eq!(sum(m, "relay_delivery_attempts_total"), 7.0);
        assert_eq!(sum(m, "relay_delivery_attempts_in_flight"), 9.0);
    }
}
