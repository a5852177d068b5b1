//! Metrics scraping, the summary numbers, the table and the JSON report.

use super::http::Conn;
use super::load::Outcome;
use super::series::{self, percentile_ms as pct};
use super::ws::Notify;
use relay::observe::status_bytes;
use serde_json::{json, Value};

/// The value of the first sample line named `name` (labels or not).
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ') || r.starts_with('{')))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// What one relay's `/metrics` says that the report uses.
#[derive(Clone, Copy, Default)]
pub struct Scrape {
    pub resident: f64,
    pub commits_sum: f64,
    pub flush_count: f64,
    /// Real durability barriers (fsync/fdatasync) of the store.
    pub barriers: f64,
    /// Bytes the store wrote to its own log.
    pub log_bytes: f64,
    /// Groups the store's writer wrote: one `write` and one barrier each.
    pub groups: f64,
    /// Messages handed to actors.
    pub actor_messages: f64,
}

pub fn scrape(addr: &str) -> Option<Scrape> {
    let (status, body) = Conn::open(addr).ok()?.get("/metrics").ok()?;
    if status != 200 {
        return None;
    }
    let m = String::from_utf8_lossy(&body);
    Some(Scrape {
        resident: sample(&m, "relay_account_actors_resident")?,
        commits_sum: sample(&m, "relay_store_flush_batch_commits_sum")?,
        flush_count: sample(&m, "relay_store_flush_batch_commits_count")?,
        barriers: sample(&m, "relay_store_barriers_total")?,
        log_bytes: sample(&m, "relay_store_bytes_written_total")?,
        groups: sample(&m, "relay_store_groups_total")?,
        actor_messages: sample(&m, "relay_actor_messages_total")?,
    })
}

/// Bytes process `pid` caused to be written to storage so far
/// (`write_bytes` of `/proc/{pid}/io`, Linux): the store's log and sled's
/// files alike.
pub fn disk_write_bytes(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("write_bytes:"))?.trim().parse().ok()
}

/// The process on this machine listening on TCP `host:port` (Linux: the
/// socket's inode in `/proc/net/tcp{,6}`, then the `/proc/*/fd` link to
/// it): a relay given with `--relays` that the bench can see. None for a
/// host that is not loopback, or a process of another user.
pub fn listener_pid(addr: &str) -> Option<u32> {
    let (host, port) = addr.rsplit_once(':')?;
    if !matches!(host, "127.0.0.1" | "localhost" | "[::1]") {
        return None;
    }
    let port: u16 = port.parse().ok()?;
    // Fields: sl, local address (hex IP:hex port), remote, state (0A:
    // LISTEN), …, inode (the tenth).
    let inode = ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|f| {
        std::fs::read_to_string(f).ok()?.lines().skip(1).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = u16::from_str_radix(f.get(1)?.rsplit_once(':')?.1, 16).ok()?;
            if local_port == port && f.get(3) == Some(&"0A") {
                f.get(9).map(|i| i.to_string())
            } else {
                None
            }
        })
    })?;
    let link = std::path::PathBuf::from(format!("socket:[{inode}]"));
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|p| {
        let pid: u32 = p.file_name().to_str()?.parse().ok()?;
        let mut fds = std::fs::read_dir(p.path().join("fd")).ok()?;
        fds.any(|fd| fd.is_ok_and(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l == link))).then_some(pid)
    })
}

/// Resident set size of process `pid` in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmRSS:")
}

/// The peak resident set size of process `pid` in bytes (`VmHWM`).
pub fn rss_peak_bytes(pid: u32) -> Option<u64> {
    status_bytes(pid, "VmHWM:")
}

fn round(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub struct Inputs<'a> {
    pub config: Value,
    pub outcome: &'a mut Outcome,
    pub before: Vec<Option<Scrape>>,
    pub after: Vec<Option<Scrape>>,
    /// RSS of each relay process the bench started (empty with `--relays`).
    pub rss: Vec<Option<u64>>,
    /// Their peak RSS (`VmHWM`), in the same order.
    pub rss_peak: Vec<Option<u64>>,
    /// Their `disk_write_bytes` before and after the window, same order.
    pub disk_before: Vec<Option<u64>>,
    pub disk_after: Vec<Option<u64>>,
    /// Their CPU seconds (user + system) before and after, same order.
    pub cpu_before: Vec<Option<f64>>,
    pub cpu_after: Vec<Option<f64>>,
    /// The bench process's own CPU seconds before and after: the load
    /// generator (with `--ws`, its listeners too), which shares the cores.
    pub load_cpu: (Option<f64>, Option<f64>),
    /// The relays' CPU and RSS once a second ([`series::Sampler`]).
    pub samples: &'a [(u64, Option<f64>, Option<u64>)],
}

pub fn build(i: Inputs) -> Value {
    let o = i.outcome;
    o.send_us.sort_unstable();
    o.deliver_us.sort_unstable();
    let secs = o.elapsed.as_secs_f64().max(1e-9);
    let per_sec = |n: f64| round(n / secs);
    let opt = |v: Option<f64>| v.map(round);
    // Metrics: sums over relays of the deltas across the measured window;
    // null when any relay could not be scraped.
    let pairs: Option<Vec<(Scrape, Scrape)>> =
        i.before.iter().zip(&i.after).map(|(b, a)| Some(((*b)?, (*a)?))).collect();
    let delta = |f: fn(&Scrape) -> f64| pairs.as_ref().map(|p| p.iter().map(|(b, a)| f(a) - f(b)).sum::<f64>());
    let resident = pairs.as_ref().map(|p| p.iter().map(|(_, a)| a.resident).sum::<f64>());
    let commits = delta(|s| s.commits_sum);
    let flushes = delta(|s| s.flush_count);
    let barriers = delta(|s| s.barriers);
    let log_bytes = delta(|s| s.log_bytes);
    let groups = delta(|s| s.groups);
    let hops = delta(|s| s.actor_messages);
    let disk_bytes = if i.disk_before.is_empty() {
        None
    } else {
        i.disk_before
            .iter()
            .zip(&i.disk_after)
            .map(|(b, a)| Some(a.as_ref()?.saturating_sub((*b)?)))
            .sum::<Option<u64>>()
    };
    let cpu_s = if i.cpu_before.is_empty() {
        None
    } else {
        i.cpu_before.iter().zip(&i.cpu_after).map(|(b, a)| Some(a.as_ref()? - (*b)?)).sum::<Option<f64>>()
    };
    // Cost of one send: the relays' totals over the window / sends answered.
    let per_send = |v: Option<f64>| v.filter(|_| o.sent > 0).map(|v| round(v / o.sent as f64));
    let sum = |v: &[Option<u64>]| if v.is_empty() { None } else { v.iter().copied().sum::<Option<u64>>() };
    let (rss, rss_peak) = (sum(&i.rss), sum(&i.rss_peak));
    let mean_flush = match (commits, flushes) {
        (Some(c), Some(f)) if f > 0.0 => Some(round(c / f)),
        _ => None,
    };
    let mut r = json!({
        "config": i.config,
        "elapsed_s": round(secs),
        "sent": o.sent,
        "cross_relay_sent": o.cross,
        "target_accepted": o.target_accepted,
        "delivering": o.delivering,
        "errors": o.errors,
        "error_samples": o.error_samples,
        "send_per_sec": per_sec(o.sent as f64),
        "send_p50_ms": opt(pct(&o.send_us, 0.50)),
        "send_p99_ms": opt(pct(&o.send_us, 0.99)),
        "send_max_ms": opt(o.send_us.last().map(|&v| v as f64 / 1000.0)),
        "target_accepted_per_sec": per_sec(o.target_accepted as f64),
        "deliver_p50_ms": opt(pct(&o.deliver_us, 0.50)),
        "deliver_p99_ms": opt(pct(&o.deliver_us, 0.99)),
        "resident_actors": resident.map(|v| v as u64),
        "rss_bytes": rss,
        "rss_bytes_per_relay": i.rss,
        "rss_peak_bytes": rss_peak,
        "commits": commits.map(|v| v as u64),
        "commits_per_sec": commits.map(per_sec),
        "events_per_sec": commits.map(per_sec),
        "flushes": flushes.map(|v| v as u64),
        "mean_flush_batch": mean_flush,
        // `--ws` (see `notify`); null otherwise.
        "notify_p50_ms": null,
        "notify_p99_ms": null,
        "notify_max_ms": null,
        "notified": null,
        "notify_missing": null,
        "ws_failures": null,
        "ws_failure_samples": [],
        // `--pending` (set by `pending::run`); null otherwise.
        "pending": null,
        "settle_s": null,
        "idle_window_s": null,
        "idle_cpu_seconds": null,
        "idle_cpu_share": null,
        "idle_cpu_target": null,
        // `--population` (set by `bench`); null otherwise.
        "population": null,
        "seed_s": null,
    });
    // What one send cost the store and the disk (a separate step: one
    // `json!` this long exceeds the macro recursion limit).
    r["barriers"] = json!(barriers.map(|v| v as u64));
    r["commits_per_send"] = json!(per_send(commits));
    r["barriers_per_send"] = json!(per_send(barriers));
    r["log_bytes_per_send"] = json!(per_send(log_bytes));
    // One `write` of the log and one barrier per group: the synced writes.
    r["log_writes_per_send"] = json!(per_send(groups));
    r["actor_hops_per_send"] = json!(per_send(hops));
    r["disk_bytes"] = json!(disk_bytes);
    r["disk_bytes_per_send"] = json!(per_send(disk_bytes.map(|v| v as f64)));
    // The relays' CPU (all threads, user + system; 10 ms ticks) per send:
    // steadier than sends/s on a shared machine.
    r["relay_cpu_s"] = json!(cpu_s.map(round));
    r["relay_cpu_us_per_send"] = json!(per_send(cpu_s.map(|s| s * 1e6)).map(f64::round));
    let load_cpu_s = i.load_cpu.0.zip(i.load_cpu.1).map(|(b, a)| a - b);
    r["load_cpu_us_per_send"] = json!(per_send(load_cpu_s.map(|s| s * 1e6)).map(f64::round));
    // What the HTML report draws (`--report`, `--compare`).
    r["send_p90_ms"] = json!(opt(pct(&o.send_us, 0.90)));
    r["send_p999_ms"] = json!(opt(pct(&o.send_us, 0.999)));
    r["send_histogram_us"] = series::histogram(&o.send_us);
    r["series"] = series::per_second(&o.replies, o.elapsed, i.samples);
    r
}

/// The `--ws` figures: latency send written → notification read, per
/// (send, recipient device).
pub fn notify(r: &mut Value, n: &mut Notify) {
    n.us.sort_unstable();
    let opt = |v: Option<f64>| v.map(round);
    r["notify_p50_ms"] = json!(opt(pct(&n.us, 0.50)));
    r["notify_p99_ms"] = json!(opt(pct(&n.us, 0.99)));
    r["notify_max_ms"] = json!(opt(n.us.last().map(|&v| v as f64 / 1000.0)));
    r["notified"] = json!(n.notified);
    r["notify_missing"] = json!(n.missing);
    r["ws_failures"] = json!(n.socket_failures);
    r["ws_failure_samples"] = json!(n.failure_samples);
}

/// When, which build and which machine: `date` (UTC), `version`,
/// `git` (`git describe --always --dirty` of the source tree this binary
/// was built from, read at run time: null when it is not there), `profile`,
/// `nproc` and `cpu_model` (`/proc/cpuinfo`).
pub fn provenance() -> Value {
    let git = std::process::Command::new("git")
        .args(["-C", env!("CARGO_MANIFEST_DIR"), "describe", "--always", "--dirty"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo").ok().and_then(|s| {
        s.lines().find_map(|l| Some(l.strip_prefix("model name")?.split_once(':')?.1.trim().to_string()))
    });
    json!({
        "date": humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        "version": env!("CARGO_PKG_VERSION"),
        "git": git,
        "profile": if cfg!(debug_assertions) { "debug" } else { "release" },
        "nproc": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "cpu_model": cpu_model,
    })
}

/// The figures `--compare` sets side by side: (JSON key, label).
pub const COMPARED: &[(&str, &str)] = &[
    ("sent", "sent"),
    ("errors", "errors"),
    ("send_per_sec", "send/s"),
    ("send_p50_ms", "send p50 ms"),
    ("send_p90_ms", "send p90 ms"),
    ("send_p99_ms", "send p99 ms"),
    ("send_p999_ms", "send p99.9 ms"),
    ("send_max_ms", "send max ms"),
    ("target_accepted_per_sec", "target_accepted/s"),
    ("deliver_p50_ms", "deliver p50 ms"),
    ("deliver_p99_ms", "deliver p99 ms"),
    ("notify_p50_ms", "notify p50 ms"),
    ("notify_p99_ms", "notify p99 ms"),
    ("relay_cpu_us_per_send", "relay CPU µs/send"),
    ("load_cpu_us_per_send", "load CPU µs/send"),
    ("commits_per_send", "commits/send"),
    ("barriers_per_send", "barriers/send"),
    ("log_writes_per_send", "log writes/send"),
    ("actor_hops_per_send", "actor hops/send"),
    ("log_bytes_per_send", "log bytes/send"),
    ("disk_bytes_per_send", "disk bytes/send"),
    ("mean_flush_batch", "mean flush batch"),
    ("rss_bytes", "relay RSS bytes"),
    ("rss_peak_bytes", "relay RSS peak bytes"),
];

/// B / A, when both are numbers and A is not zero.
pub fn ratio(a: &Value, b: &Value) -> Option<f64> {
    Some(b.as_f64()? / a.as_f64().filter(|a| *a != 0.0)?)
}

/// `--compare`: A, B and B/A of every figure either report has.
pub fn compare_table(a: &Value, b: &Value) -> String {
    let cell = |v: &Value| if v.is_number() { v.to_string() } else { "-".into() };
    let mut rows = vec![("".to_string(), "A".to_string(), "B".to_string(), "B/A".to_string())];
    for (key, label) in COMPARED {
        if a[key].is_null() && b[key].is_null() {
            continue;
        }
        let r = ratio(&a[key], &b[key]).map_or_else(|| "-".into(), |r| format!("{r:.3}"));
        rows.push((label.to_string(), cell(&a[key]), cell(&b[key]), r));
    }
    let w = |f: fn(&(String, String, String, String)) -> &String| rows.iter().map(|r| f(r).chars().count()).max();
    let (w0, w1, w2) = (w(|r| &r.0).unwrap_or(0), w(|r| &r.1).unwrap_or(0), w(|r| &r.2).unwrap_or(0));
    rows.iter().map(|(k, a, b, r)| format!("{k:<w0$}  {a:>w1$}  {b:>w2$}  {r}\n")).collect()
}

/// The human table.
pub fn table(r: &Value) -> String {
    let ms = |k: &str| r[k].as_f64().map(|v| format!("{v:.3} ms")).unwrap_or_else(|| "-".into());
    let num = |k: &str| match &r[k] {
        Value::Null => "-".to_string(),
        v => v.to_string(),
    };
    let mib = |k: &str| r[k].as_u64().map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "-".into());
    let c = &r["config"];
    let workload = if c["population"].is_u64() {
        format!(
            "{} senders × {} devices → {} population accounts (uniform), {} B payload, concurrency {}, passivate after {} s",
            c["accounts"], c["devices"], c["population"], c["payload"], c["concurrency"], c["passivate_after_s"]
        )
    } else if c["pending"].is_u64() {
        format!(
            "{} messages relay-a → relay-b (killed), {} devices, {} B payload, concurrency {}, retry timetable 0s, 1h",
            c["pending"], c["devices"], c["payload"], c["concurrency"]
        )
    } else {
        format!(
            "{} accounts × {} devices, {} B payload, concurrency {}, cross-share {}",
            c["accounts"], c["devices"], c["payload"], c["concurrency"], c["cross_share"]
        )
    };
    let mut rows: Vec<(String, String)> = vec![
        ("relays".into(), format!("{} ({})", c["relays"], c["mode"].as_str().unwrap_or(""))),
        ("workload".into(), workload),
        ("sent".into(), format!("{} ({} cross-relay) in {} s", num("sent"), num("cross_relay_sent"), num("elapsed_s"))),
        ("send/s".into(), num("send_per_sec")),
        (
            "send p50 / p99 / max".into(),
            format!("{} / {} / {}", ms("send_p50_ms"), ms("send_p99_ms"), ms("send_max_ms")),
        ),
        ("target_accepted/s".into(), num("target_accepted_per_sec")),
        ("deliver p50 / p99".into(), format!("{} / {}", ms("deliver_p50_ms"), ms("deliver_p99_ms"))),
        ("delivering (not yet accepted)".into(), num("delivering")),
        ("errors".into(), num("errors")),
        ("resident actors".into(), num("resident_actors")),
        ("relay RSS".into(), mib("rss_bytes")),
        ("relay RSS peak".into(), mib("rss_peak_bytes")),
        ("store commits/s (events_per_sec)".into(), num("commits_per_sec")),
        ("mean flush batch (commits)".into(), num("mean_flush_batch")),
        ("per send: commits / barriers".into(), format!("{} / {}", num("commits_per_send"), num("barriers_per_send"))),
        (
            "per send: log writes / actor hops".into(),
            format!("{} / {}", num("log_writes_per_send"), num("actor_hops_per_send")),
        ),
        ("per send: relay CPU".into(), format!("{} µs", num("relay_cpu_us_per_send"))),
        ("per send: load generator CPU".into(), format!("{} µs", num("load_cpu_us_per_send"))),
        (
            "per send: bytes to log / to disk".into(),
            format!("{} B / {} B", num("log_bytes_per_send"), num("disk_bytes_per_send")),
        ),
    ];
    if let (Some(n), Some(s)) = (r["population"].as_u64(), r["seed_s"].as_f64()) {
        rows.push((
            "population (seeded offline)".into(),
            format!("{n} accounts in {s:.3} s ({:.0} accounts/s)", n as f64 / s.max(1e-9)),
        ));
    }
    if c["websocket"] == true {
        rows.push((
            "websockets".into(),
            format!("{} (notify grace {} s)", c["websocket_connections"], c["notify_grace_s"]),
        ));
        rows.push((
            "notify p50 / p99 / max".into(),
            format!("{} / {} / {}", ms("notify_p50_ms"), ms("notify_p99_ms"), ms("notify_max_ms")),
        ));
        rows.push(("notified / missing".into(), format!("{} / {}", num("notified"), num("notify_missing"))));
        rows.push(("websocket failures".into(), num("ws_failures")));
    }
    if !r["pending"].is_null() || !r["idle_cpu_share"].is_null() {
        rows.push(("pending deliveries (relay-a)".into(), num("pending")));
        rows.push(("first attempts settled in".into(), format!("{} s", num("settle_s"))));
        let share = r["idle_cpu_share"].as_f64();
        rows.push((
            "idle CPU of relay-a".into(),
            format!(
                "{} of one core ({} s CPU in {} s; target < 2 %)",
                share.map(|v| format!("{:.3} %", v * 100.0)).unwrap_or_else(|| "-".into()),
                num("idle_cpu_seconds"),
                num("idle_window_s")
            ),
        ));
    }
    let w = rows.iter().map(|(k, _)| k.chars().count()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        out.push_str(&format!("{k:<w$}  {v}\n"));
    }
    for (key, label) in [("error_samples", "error"), ("ws_failure_samples", "websocket")] {
        for e in r[key].as_array().into_iter().flatten() {
            out.push_str(&format!("{label}: {}\n", e.as_str().unwrap_or("")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_prints_both_figures_and_their_ratio() {
        let a = json!({"config": {}, "send_per_sec": 100.0, "send_p99_ms": 4.0, "errors": 0, "send_p90_ms": null});
        let b = json!({"config": {}, "send_per_sec": 150.0, "send_p99_ms": 2.0, "errors": 3, "send_p90_ms": 1.5});
        let t = compare_table(&a, &b);
        let row = |label: &str| {
            let line = t.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("{label}: {t}"));
            line[label.len()..].split_whitespace().map(str::to_string).collect::<Vec<_>>()
        };
        assert_eq!(row("send/s"), ["100.0", "150.0", "1.500"]);
        assert_eq!(row("send p99 ms"), ["4.0", "2.0", "0.500"]);
        // No ratio to a zero, nor to a figure an older report lacks.
        assert_eq!(row("errors"), ["0", "3", "-"]);
        assert_eq!(row("send p90 ms"), ["-", "1.5", "-"]);
        assert!(!t.contains("deliver p50"), "absent from both: {t}");
    }

    #[test]
    fn the_listener_of_a_loopback_port_is_found_by_its_socket() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        assert_eq!(listener_pid(&addr), Some(std::process::id()));
        drop(l);
        assert_eq!(listener_pid(&addr), None, "nobody listens there now");
        assert_eq!(listener_pid("192.0.2.1:80"), None, "not on this machine");
    }

    #[test]
    fn provenance_names_the_build_and_the_machine() {
        let p = provenance();
        assert_eq!(p["version"], env!("CARGO_PKG_VERSION"));
        assert!(p["nproc"].as_u64() >= Some(1), "{p}");
        assert!(humantime::parse_rfc3339(p["date"].as_str().unwrap()).is_ok(), "{p}");
    }
}
