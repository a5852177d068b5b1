//! What an operator sees of the relay's peers and process: the
//! `relay_peer_requests_total` counter and WARN lines about peer trouble
//! (rate-limited), the `process_*` metrics from `/proc/self`, the build-info
//! gauge and the optional access log.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use relay_actors::metrics::Metrics;
use relay_schemas::ErrorCode;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// A peer called this relay.
    In,
    /// This relay called a peer.
    Out,
}

impl Direction {
    fn as_str(self) -> &'static str {
        match self {
            Direction::In => "in",
            Direction::Out => "out",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    peer: String,
    direction: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

/// How a relay request ended, as a bounded metric label: `ok`, a protocol
/// error code (`unauthorized` among them), `unrecognized` for a code the
/// protocol does not define, or `unreachable` when no answer came.
pub fn outcome_of_code(code: &str) -> &'static str {
    ErrorCode::parse(code).map_or("unrecognized", |c| c.as_str())
}

/// A WARN line's key (peer label, kind), and when the last line for it was
/// written with how many were left out since.
type Seen = HashMap<(String, String), (Instant, u64)>;

/// At most one WARN line per key and interval; the next line admitted says
/// how many were left out in between.
pub struct WarnLimiter {
    every: Duration,
    seen: Mutex<Seen>,
}

impl WarnLimiter {
    pub fn new(every: Duration) -> Self {
        WarnLimiter { every, seen: Mutex::new(HashMap::new()) }
    }

    /// `Some(suppressed)` when a line for `key` may be written at `now`
    /// (`suppressed` lines were left out since the last one), else `None`.
    pub fn admit(&self, key: (&str, &str), now: Instant) -> Option<u64> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let key = (key.0.to_owned(), key.1.to_owned());
        match seen.get_mut(&key) {
            Some((last, suppressed)) if now.saturating_duration_since(*last) < self.every => {
                *suppressed += 1;
                None
            }
            Some((last, suppressed)) => {
                *last = now;
                Some(std::mem::take(suppressed))
            }
            None => {
                seen.insert(key, (now, 0));
                Some(0)
            }
        }
    }
}

/// Relay-to-relay traffic, both directions: counted per configured peer and
/// outcome, and trouble logged at WARN: the first line of each kind (a
/// refusal's reason, unreachable, 5xx) per peer at once, then at most one a
/// minute with the count of lines left out, so an outage or a stranger's
/// flood cannot flood the log.
pub struct PeerObserver {
    peers: HashSet<String>,
    requests: Family<PeerLabels, Counter>,
    warnings: WarnLimiter,
}

impl PeerObserver {
    pub fn new(peers: impl IntoIterator<Item = String>) -> Self {
        PeerObserver {
            peers: peers.into_iter().collect(),
            requests: Family::default(),
            warnings: WarnLimiter::new(Duration::from_secs(60)),
        }
    }

    /// The `peer` label: a configured peer's id, else `unknown`, so a
    /// stranger's `Relay-Id` cannot grow the label set.
    pub fn label<'a>(&self, peer: &'a str) -> &'a str {
        if self.peers.contains(peer) {
            peer
        } else {
            "unknown"
        }
    }

    pub fn count(&self, peer: &str, direction: Direction, outcome: &str) {
        let labels = PeerLabels {
            peer: self.label(peer).to_owned(),
            direction: direction.as_str().to_owned(),
            outcome: outcome.to_owned(),
        };
        self.requests.get_or_create(&labels).inc();
    }

    /// `Some(suppressed)` when a WARN of `kind` about `peer` may be written
    /// now. Kinds come from this relay's code (never from a request), so the
    /// keys stay few.
    pub fn may_warn(&self, peer: &str, kind: &str) -> Option<u64> {
        self.warnings.admit((self.label(peer), kind), Instant::now())
    }

    /// Adds `relay_peer_requests_total`, `relay_build_info` and (on Linux)
    /// the `process_*` metrics to `metrics`.
    pub fn register(&self, metrics: &Metrics) {
        let build = Family::<VersionLabels, Gauge>::default();
        build.get_or_create(&VersionLabels { version: env!("CARGO_PKG_VERSION").to_owned() }).set(1);
        let mut r = metrics.registry.lock().unwrap_or_else(|e| e.into_inner());
        r.register(
            "peer_requests",
            "Relay-to-relay requests by peer (configured id or unknown), direction (in/out) and outcome",
            self.requests.clone(),
        );
        r.register("build_info", "Always 1; the version of this relay binary", build);
        drop(r);
        #[cfg(target_os = "linux")]
        metrics.unprefixed.lock().unwrap_or_else(|e| e.into_inner()).register_collector(Box::new(ProcessCollector));
    }
}

/// Adds one to a gauge for as long as it lives (an open connection).
pub struct Held(Gauge);

impl Held {
    pub fn new(gauge: &Gauge) -> Self {
        gauge.inc();
        Held(gauge.clone())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// A relay id as it may appear in a log line: a valid id as it is; anything
/// else (a stranger's header) is not repeated.
pub fn shown_id(id: &str) -> &str {
    if id.is_empty() {
        "(none)"
    } else if relay_schemas::ids::check_relay_id("relay_id", id).is_ok() {
        id
    } else {
        "(invalid relay id)"
    }
}

/// `process_*` metrics read from `/proc/self` at each scrape (the names
/// Prometheus' own clients use).
#[cfg(target_os = "linux")]
#[derive(Debug)]
struct ProcessCollector;

#[cfg(target_os = "linux")]
impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let p = ProcStats::read();
        if let Some(cpu) = p.cpu_seconds {
            let m = ConstCounter::new(cpu);
            m.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "User and system CPU time",
                None,
                m.metric_type(),
            )?)?;
        }
        let gauges = [
            ("process_resident_memory_bytes", "Resident memory size", p.resident_bytes),
            ("process_virtual_memory_bytes", "Virtual memory size", p.virtual_bytes),
            ("process_open_fds", "Open file descriptors", p.open_fds),
            ("process_max_fds", "Limit of open file descriptors", p.max_fds),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                let m = ConstGauge::new(v as i64);
                m.encode(encoder.encode_descriptor(name, help, None, m.metric_type())?)?;
            }
        }
        Ok(())
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` times (`AT_CLKTCK` in the
/// auxiliary vector; Linux's USER_HZ is 100 everywhere in practice).
fn clock_ticks_per_sec() -> f64 {
    const AT_CLKTCK: usize = 17;
    const W: usize = std::mem::size_of::<usize>();
    let word = |b: &[u8]| b.try_into().ok().map(usize::from_ne_bytes);
    if let Ok(auxv) = std::fs::read("/proc/self/auxv") {
        for pair in auxv.chunks_exact(2 * W) {
            match (word(&pair[..W]), word(&pair[W..])) {
                (Some(AT_CLKTCK), Some(v)) if v > 0 => return v as f64,
                (Some(0), _) | (None, _) => break,
                _ => {}
            }
        }
    }
    100.0
}

/// CPU seconds (user + system, all threads) process `pid` has used.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name `(…)`, which may hold spaces: state is
    // field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / clock_ticks_per_sec())
}

/// A `kB` line of `/proc/{pid}/status` (Linux), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = s.lines().find_map(|l| l.strip_prefix(field))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kb * 1024)
}

/// What `/proc/self` says about this process; a field it could not read is `None`.
#[derive(Debug, Default)]
pub struct ProcStats {
    pub cpu_seconds: Option<f64>,
    pub resident_bytes: Option<u64>,
    pub virtual_bytes: Option<u64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
}

impl ProcStats {
    #[cfg(target_os = "linux")]
    pub fn read() -> ProcStats {
        let pid = std::process::id();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        ProcStats {
            cpu_seconds: cpu_seconds(pid),
            resident_bytes: status_bytes(pid, "VmRSS:"),
            virtual_bytes: status_bytes(pid, "VmSize:"),
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as u64),
            max_fds: limits
                .lines()
                .find_map(|l| l.strip_prefix("Max open files"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warn_limiter_admits_one_line_per_key_and_interval_and_counts_the_rest() {
        let l = WarnLimiter::new(Duration::from_secs(60));
        let t0 = Instant::now();
        assert_eq!(l.admit(("relay-b", "unreachable"), t0), Some(0));
        assert_eq!(l.admit(("relay-b", "unreachable"), t0 + Duration::from_secs(1)), None);
        assert_eq!(l.admit(("relay-b", "unreachable"), t0 + Duration::from_secs(59)), None);
        // Another peer or another kind has its own allowance.
        assert_eq!(l.admit(("relay-c", "unreachable"), t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(l.admit(("relay-b", "unauthorized"), t0 + Duration::from_secs(2)), Some(0));
        assert_eq!(l.admit(("relay-b", "unreachable"), t0 + Duration::from_secs(60)), Some(2));
        assert_eq!(l.admit(("relay-b", "unreachable"), t0 + Duration::from_secs(61)), None);
        assert_eq!(l.admit(("relay-b", "unreachable"), t0 + Duration::from_secs(121)), Some(1));
    }

    #[test]
    fn peer_label_is_a_configured_peer_or_unknown() {
        let o = PeerObserver::new(["relay-b".to_owned()]);
        assert_eq!(o.label("relay-b"), "relay-b");
        assert_eq!(o.label("relay-x"), "unknown");
        assert_eq!(outcome_of_code("route_not_found"), "route_not_found");
        assert_eq!(outcome_of_code("made_up"), "unrecognized");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_stats_of_this_process_are_plausible() {
        let p = ProcStats::read();
        assert!(p.resident_bytes.unwrap() > 1 << 20);
        assert!(p.virtual_bytes.unwrap() >= p.resident_bytes.unwrap());
        assert!(p.open_fds.unwrap() >= 3);
        assert!(p.max_fds.unwrap() >= p.open_fds.unwrap());
        assert!(p.cpu_seconds.unwrap() >= 0.0);
    }

    #[test]
    fn clock_ticks_come_from_the_auxiliary_vector() {
        let hz = clock_ticks_per_sec();
        assert!((10.0..=10_000.0).contains(&hz), "{hz}");
    }

    #[test]
    fn cpu_seconds_of_a_busy_process_grow() {
        // Spins until the count shows CPU used, not for a wall time: on a
        // loaded machine a spinning thread may get little of it.
        let pid = std::process::id();
        let before = cpu_seconds(pid).unwrap();
        let t = Instant::now();
        let (mut x, mut used) = (0u64, 0.0);
        while used < 0.05 && t.elapsed() < Duration::from_secs(60) {
            for _ in 0..1_000_000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
            }
            used = cpu_seconds(pid).unwrap() - before;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let wall = t.elapsed().as_secs_f64();
        assert!(used >= 0.05, "{used} s of CPU counted in {wall} s of spinning");
        // A tick (10 ms) of slack for where the count was when we started.
        assert!(used <= wall * cores + 0.011, "{used} s of CPU in {wall} s of wall time on {cores} cores");
    }
}
