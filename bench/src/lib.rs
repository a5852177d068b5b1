//! `relay bench`: a load generator that drives real relays over HTTP.
//!
//! It starts one or two relays of its own (this same binary, `serve`, fresh
//! data dirs on loopback, peering both ways) or targets `--relays URL,…`;
//! registers accounts and opens sessions; pre-builds every signed
//! `message.send` request; then measures only the sends:
//! - [`plan`]: keys, registration, sessions, the pre-built requests;
//! - [`load`]: the measured window (blocking keep-alive HTTP/1.1 per thread);
//! - [`report`]: `/metrics` and RSS, the table and the JSON report;
//! - [`series`]: the per-second series and the latency histogram;
//! - [`html`], [`page`]: `--report FILE.html`, and `--compare A.json B.json`;
//! - [`ws`]: `--ws`, the recipients' WebSockets and notification latency;
//! - [`pending`]: `--pending N`, the idle CPU of N deliveries to a dead relay;
//! - [`population`]: `--population N`, sends to random accounts among N
//!   seeded into relay-a's store before it starts;
//! - [`setup`]: the arguments, the relays (started here or given), the
//!   progress bars: what every part above uses, using none of them.

pub mod html;
pub mod http;
pub mod load;
pub mod page;
pub mod pending;
pub mod plan;
pub mod population;
pub mod report;
pub mod series;
pub mod setup;
pub mod ws;

use crate::setup::{own_relays, progress, BenchArgs, Target};
use serde_json::json;
use std::path::{Path, PathBuf};

/// Runs the bench; the exit code: 0, 2 when some sends failed (the report
/// is printed all the same), 1 when the bench itself could not run.
pub fn run(args: BenchArgs) -> u8 {
    let done = if args.compare.is_empty() { bench(&args).and_then(|r| output(&args, r)) } else { compare(&args) };
    match done {
        Ok((text, errors)) => {
            print!("{text}");
            if errors > 0 {
                eprintln!("relay bench: {errors} errors");
                return 2;
            }
            0
        }
        Err(e) => {
            eprintln!("relay bench: {e}");
            1
        }
    }
}

/// The table or the JSON of a run's report, written as HTML too with
/// `--report`.
fn output(args: &BenchArgs, (mut r, errors): (serde_json::Value, u64)) -> Result<(String, u64), String> {
    r["run"] = report::provenance();
    if let Some(path) = &args.report {
        write(path, &page::render(&[("this run", &r)]))?;
    }
    let text =
        if args.json { serde_json::to_string_pretty(&r).map_err(|e| e.to_string())? + "\n" } else { report::table(&r) };
    Ok((text, errors))
}

/// `--compare A.json B.json`: the table of both, and the HTML with `--report`.
fn compare(args: &BenchArgs) -> Result<(String, u64), String> {
    let read = |p: &PathBuf| -> Result<serde_json::Value, String> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
        if !v.is_object() || !v["config"].is_object() {
            return Err(format!("{}: not a `relay bench --json` report", p.display()));
        }
        Ok(v)
    };
    let (a, b) = (read(&args.compare[0])?, read(&args.compare[1])?);
    let name = |p: &PathBuf| p.file_name().map_or_else(|| p.display().to_string(), |n| n.to_string_lossy().into());
    let (na, nb) = (format!("A: {}", name(&args.compare[0])), format!("B: {}", name(&args.compare[1])));
    if let Some(path) = &args.report {
        write(path, &page::render(&[(&na, &a), (&nb, &b)]))?;
    }
    Ok((format!("{na}\n{nb}\n{}", report::compare_table(&a, &b)), 0))
}

fn write(path: &Path, html: &str) -> Result<(), String> {
    std::fs::write(path, html).map_err(|e| format!("{}: {e}", path.display()))
}

fn bench(args: &BenchArgs) -> Result<(serde_json::Value, u64), String> {
    if args.accounts == 0 || args.devices == 0 || args.messages == 0 {
        return Err("--accounts, --devices and --messages must be at least 1".into());
    }
    let run_id =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
            ^ u64::from(std::process::id());
    if let Some(n) = args.pending {
        return pending::run(args, n, run_id);
    }
    if args.population == Some(0) {
        return Err("--population must be at least 1".into());
    }
    let mut seed_time = None;
    let (targets, own, dir, mode) = if args.relays.is_empty() {
        let n = match (args.population, args.cross_share > 0.0) {
            (Some(_), _) => 1,
            (None, true) => 2,
            (None, false) => args.local_relays as usize,
        };
        let passivate = args.passivate_after.or(args.population.map(|_| population::PASSIVATE_AFTER));
        let actors =
            passivate.map(|d| format!("[actors]\npassivate_after = \"{}ms\"\n", d.as_millis())).unwrap_or_default();
        let mut seed = |cfg: &Path| -> Result<(), String> {
            if let Some(p) = args.population {
                seed_time = Some(population::seed(cfg, p)?);
            }
            Ok(())
        };
        let (t, p, dir) = own_relays(run_id, n, &[&actors, &actors], Some(&mut seed))?;
        (t, p, Some(dir), "started")
    } else {
        if args.relays.len() > 2 || args.relay_ids.len() < args.relays.len() {
            return Err("--relays takes one or two URLs, and --relay-ids one id per URL".into());
        }
        let t = args
            .relays
            .iter()
            .zip(&args.relay_ids)
            .map(|(u, id)| {
                Ok(Target { id: id.clone(), url: u.trim_end_matches('/').to_string(), addr: http::host_port(u)? })
            })
            .collect::<Result<Vec<_>, String>>()?;
        (t, Vec::new(), None, "external")
    };
    if args.accounts < targets.len() {
        return Err(format!("--accounts must be at least the number of relays ({})", targets.len()));
    }

    // Outside the measured window: accounts, sessions, signed requests.
    let setup = progress(2, "setup: registering accounts");
    let accounts = plan::register(&targets, args.accounts, args.devices, run_id)?;
    setup.inc(1);
    setup.set_message("setup: signing requests");
    let sends = match args.population {
        Some(p) => population::sends(&accounts, p, args.messages, args.payload, run_id),
        None => plan::sends(&accounts, targets.len(), args.messages, args.payload, args.cross_share, run_id),
    };
    let listener = if args.ws {
        setup.set_message("setup: attaching websockets");
        Some(ws::Listener::start(&targets, &accounts)?)
    } else {
        None
    };
    setup.finish_and_clear();

    let before: Vec<_> = targets.iter().map(|t| report::scrape(&t.addr)).collect();
    let disk_before = own.iter().map(|p| report::disk_write_bytes(p.child.id())).collect();
    let cpu_before = own.iter().map(|p| relay::observe::cpu_seconds(p.child.id())).collect();
    let load_cpu_before = relay::observe::cpu_seconds(std::process::id());
    let bar = progress(sends.len() as u64, "sends");
    // The relays' CPU seconds and RSS over time, summed: those the bench
    // started, or with `--relays` those listening on this machine.
    let pids: Vec<u32> = if own.is_empty() {
        targets.iter().map(|t| report::listener_pid(&t.addr)).collect::<Option<_>>().unwrap_or_default()
    } else {
        own.iter().map(|p| p.child.id()).collect()
    };
    let mut sampler = series::Sampler::new(|| {
        if pids.is_empty() {
            return (None, None);
        }
        let cpu = pids.iter().map(|&p| relay::observe::cpu_seconds(p)).sum::<Option<f64>>();
        (cpu, pids.iter().map(|&p| report::rss_bytes(p)).sum::<Option<u64>>())
    });
    let mut tick = |n, elapsed| {
        bar.set_position(n);
        sampler.poll(elapsed);
    };
    let mut outcome = load::run(&targets, &sends, args.concurrency, args.duration, args.rate, &mut tick);
    sampler.finish(outcome.elapsed);
    bar.finish_and_clear();
    let after: Vec<_> = targets.iter().map(|t| report::scrape(&t.addr)).collect();
    let disk_after = own.iter().map(|p| report::disk_write_bytes(p.child.id())).collect();
    let cpu_after = own.iter().map(|p| relay::observe::cpu_seconds(p.child.id())).collect();
    let load_cpu = (load_cpu_before, relay::observe::cpu_seconds(std::process::id()));
    let rss = own.iter().map(|p| report::rss_bytes(p.child.id())).collect();
    let rss_peak = own.iter().map(|p| report::rss_peak_bytes(p.child.id())).collect();
    let mut notify = match listener {
        Some(l) => {
            let waiting = progress(1, "waiting for notifications");
            let n = ws::correlate(l, &targets, &accounts, &sends, &outcome.accepted, args.notify_grace)?;
            waiting.finish_and_clear();
            Some(n)
        }
        None => None,
    };

    let config = json!({
        "mode": mode,
        "relays": targets.len(),
        "relay_urls": targets.iter().map(|t| t.url.clone()).collect::<Vec<_>>(),
        "accounts": args.accounts,
        "devices": args.devices,
        "messages": args.messages,
        "concurrency": args.concurrency,
        "payload": args.payload,
        "cross_share": if targets.len() > 1 { args.cross_share } else { 0.0 },
        "duration_s": args.duration.map(|d| d.as_secs_f64()),
        "rate": args.rate,
        "websocket": args.ws,
        "websocket_connections": notify.as_ref().map(|n| n.sockets),
        "notify_grace_s": args.ws.then_some(args.notify_grace.as_secs_f64()),
        "population": args.population,
        "passivate_after_s": args.passivate_after.or(args.population.map(|_| population::PASSIVATE_AFTER))
            .map(|d| d.as_secs_f64()),
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
        load_cpu,
        samples: &sampler.samples,
    });
    if let (Some(p), Some(t)) = (args.population, seed_time) {
        r["population"] = json!(p);
        r["seed_s"] = json!((t.as_secs_f64() * 1e3).round() / 1e3);
    }
    if let Some(n) = notify.as_mut() {
        report::notify(&mut r, n);
    }
    drop(own);
    drop(dir);
    Ok((r, outcome.errors))
}
