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
//!   seeded into relay-a's store before it starts.

pub mod html;
pub mod http;
pub mod load;
pub mod page;
pub mod pending;
pub mod plan;
pub mod population;
pub mod report;
pub mod series;
pub mod ws;

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use std::io::{BufRead, BufReader, IsTerminal};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Accounts to register (split round-robin across the relays).
    #[arg(long, default_value_t = 16)]
    pub accounts: usize,
    /// Devices per account (the first registers, the others via device.add).
    #[arg(long, default_value_t = 1)]
    pub devices: usize,
    /// Messages to pre-build and send (an upper bound with --duration).
    #[arg(long, default_value_t = 10_000)]
    pub messages: usize,
    /// Clients sending at once, each with one keep-alive connection per
    /// relay; one thread drives them all.
    #[arg(long, default_value_t = 8)]
    pub concurrency: usize,
    /// Ciphertext bytes per message.
    #[arg(long, default_value_t = 256)]
    pub payload: usize,
    /// Number of relays to start (1 or 2); ignored with --relays.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    pub local_relays: u8,
    /// Fraction of messages sent to an account on the other relay (two
    /// relays only; starting own relays, a non-zero value starts two).
    #[arg(long, default_value_t = 0.0, value_parser = share)]
    pub cross_share: f64,
    /// Stop sending after this long (e.g. `10s`), even if messages remain.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Offered load in sends per second (open loop): send i is due at
    /// i / RATE and its latency counts from then, so a relay that falls
    /// behind shows it. Without it each client sends as fast as replies come.
    #[arg(long, conflicts_with = "pending")]
    pub rate: Option<f64>,
    /// Target existing relays instead of starting them: `URL[,URL2]`.
    #[arg(long, value_delimiter = ',')]
    pub relays: Vec<String>,
    /// The ids of the --relays, in the same order.
    #[arg(long, value_delimiter = ',', default_value = "relay-a,relay-b")]
    pub relay_ids: Vec<String>,
    /// Every device holds a WebSocket (`GET /v1/ws`) through the window;
    /// measure send → `message.timeline.changed` at the recipient device.
    #[arg(long)]
    pub ws: bool,
    /// With --ws: how long to wait after the sends for notifications still
    /// missing (then counted in `notify_missing`).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub notify_grace: Duration,
    /// Instead of the load: N deliveries pending to a dead relay, and the
    /// CPU share of one core the source relay uses between due times (own
    /// relays only).
    #[arg(long, value_name = "N", conflicts_with_all = ["relays", "ws", "duration", "cross_share", "local_relays"])]
    pub pending: Option<usize>,
    /// Before relay-a starts, register N accounts in its store (offline, in
    /// this process); every send goes to one of them chosen at random (own
    /// relays only; one relay).
    #[arg(long, value_name = "N", conflicts_with_all = ["relays", "ws", "cross_share", "local_relays", "pending"])]
    pub population: Option<u64>,
    /// `actors.passivate_after` of the relays the bench starts (default:
    /// the relay's own, 10m; 5s with --population).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with_all = ["relays", "pending"])]
    pub passivate_after: Option<Duration>,
    /// With --pending: how long to measure the idle CPU.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub idle_window: Duration,
    /// Print the JSON report instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also write the report as one self-contained HTML page (charts in
    /// SVG); with --compare, the two runs overlaid.
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Run nothing: print the main figures of two JSON reports (`--json`
    /// output) side by side with their ratios B/A.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"], conflicts_with_all = ["json", "relays", "pending", "population", "ws", "rate", "duration"])]
    pub compare: Vec<PathBuf>,
}

/// A fraction in `0..=1`.
fn share(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{f} is not between 0 and 1"))
    }
}

/// A relay under load.
pub struct Target {
    pub id: String,
    /// Its URL as written in routes.
    pub url: String,
    /// `host:port` to connect to.
    pub addr: String,
}

/// A relay process this bench started: killed and its dir removed on drop.
struct OwnRelay {
    child: Child,
}

impl Drop for OwnRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Writes a key file (base64url seed, mode 0600); returns the public key.
fn write_key(path: &Path, seed: [u8; 32]) -> Result<String, String> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{}", relay_schemas::encoding::b64_encode(&seed)).map_err(|e| e.to_string())?;
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    Ok(relay_schemas::encoding::b64_encode(key.verifying_key().as_bytes()))
}

/// Called with relay-a's config file once it is written, before relay-a
/// starts (`--population` seeds its store).
pub type BeforeStart<'a> = &'a mut dyn FnMut(&Path) -> Result<(), String>;

/// Starts `n` relays (ids relay-a, relay-b) peering with each other;
/// `extra[i]`, when given, is appended to relay `i`'s TOML.
fn start_relays(
    dir: &Path,
    n: usize,
    extra: &[&str],
    mut before_start: Option<BeforeStart>,
) -> Result<(Vec<Target>, Vec<OwnRelay>), String> {
    let ids = ["relay-a", "relay-b"];
    let mut plan = Vec::new();
    for (i, id) in ids.iter().take(n).enumerate() {
        let data = dir.join(id);
        std::fs::create_dir_all(&data).map_err(|e| e.to_string())?;
        let key_file = data.join("relay.key");
        let pk = write_key(&key_file, [100 + i as u8; 32])?;
        plan.push((id.to_string(), free_port()?, data, key_file, pk));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut targets = Vec::new();
    let mut procs = Vec::new();
    for (i, (id, port, data, key_file, _)) in plan.iter().enumerate() {
        let mut peers = String::new();
        for (pid, pport, _, _, pk) in plan.iter().filter(|p| &p.0 != id) {
            peers.push_str(&format!(
                "[[peers]]\nid = \"{pid}\"\nurl = \"http://127.0.0.1:{pport}\"\npublic_key = \"{pk}\"\n\n"
            ));
        }
        let cfg = data.join("relay.toml");
        let toml = format!(
            "[relay]\nid = \"{id}\"\npublic_url = \"http://127.0.0.1:{port}\"\nlisten = \"127.0.0.1:{port}\"\n\
             data_dir = {:?}\nkey_file = {:?}\n\n{peers}[limits]\nsession_rate = 1000000\nsession_burst = 1000000\n\
             peer_rate = 1000000\npeer_burst = 1000000\n\
             peer_read_rate = 1000000\npeer_read_burst = 1000000\n\
             peer_replicate_rate = 1000000\npeer_replicate_burst = 1000000\n\
             anonymous_rate = 1000000\nanonymous_burst = 1000000\n\n[http]\nmax_connections_per_ip = 1000000\n\n{}",
            data.display().to_string(),
            key_file.display().to_string(),
            extra.get(i).copied().unwrap_or("")
        );
        std::fs::write(&cfg, toml).map_err(|e| e.to_string())?;
        if let (0, Some(f)) = (i, before_start.as_mut()) {
            // Holds the port chosen for relay-a while the hook runs.
            let held = std::net::TcpListener::bind(("127.0.0.1", *port));
            f(&cfg)?;
            drop(held);
        }
        let mut child = Command::new(&exe)
            .args(["serve", "--config"])
            .arg(&cfg)
            .env("RUST_LOG", std::env::var("RELAY_BENCH_LOG").unwrap_or_else(|_| "error".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting {id}: {e}"))?;
        let stdout = child.stdout.take();
        let own = OwnRelay { child };
        let mut line = String::new();
        if let Some(out) = stdout {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        let addr = line.trim().rsplit("http://").next().unwrap_or("").to_string();
        if !line.contains("listening on") || addr.is_empty() {
            return Err(format!("{id} did not start (see its log above)"));
        }
        procs.push(own);
        targets.push(Target { id: id.clone(), url: format!("http://127.0.0.1:{port}"), addr });
    }
    Ok((targets, procs))
}

/// Starts `n` relays in a fresh temp dir (removed when dropped, after the
/// relays).
fn own_relays(
    run_id: u64,
    n: usize,
    extra: &[&str],
    before_start: Option<BeforeStart>,
) -> Result<(Vec<Target>, Vec<OwnRelay>, TempDir), String> {
    let dir = TempDir(std::env::temp_dir().join(format!("relay-bench-{}-{run_id:x}", std::process::id())));
    std::fs::create_dir_all(&dir.0).map_err(|e| format!("{}: {e}", dir.0.display()))?;
    let (t, p) = start_relays(&dir.0, n, extra, before_start)?;
    Ok((t, p, dir))
}

fn progress(len: u64, msg: &str) -> ProgressBar {
    if !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} {msg} ({per_sec})") {
        bar.set_style(style);
    }
    bar.set_message(msg.to_string());
    bar
}

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
    let cpu_before = own.iter().map(|p| crate::observe::cpu_seconds(p.child.id())).collect();
    let load_cpu_before = crate::observe::cpu_seconds(std::process::id());
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
        let cpu = pids.iter().map(|&p| crate::observe::cpu_seconds(p)).sum::<Option<f64>>();
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
    let cpu_after = own.iter().map(|p| crate::observe::cpu_seconds(p.child.id())).collect();
    let load_cpu = (load_cpu_before, crate::observe::cpu_seconds(std::process::id()));
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
