//! What a run needs before it starts: its arguments ([`BenchArgs`]), the
//! relays it drives ([`Target`]: started here, or given with `--relays`)
//! and the progress bars. A leaf: the modes and the report use it.

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
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
pub(crate) struct OwnRelay {
    pub(crate) child: Child,
}

impl Drop for OwnRelay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub(crate) fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// Writes a key file (base64url seed, mode 0600); returns the public key.
pub(crate) fn write_key(path: &Path, seed: [u8; 32]) -> Result<String, String> {
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
pub(crate) fn start_relays(
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
pub(crate) fn own_relays(
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

pub(crate) fn progress(len: u64, msg: &str) -> ProgressBar {
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
