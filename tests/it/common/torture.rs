//! Crash torture: a seeded mixed load through two or three relays on
//! loopback while relays are stopped (SIGKILL, or SIGTERM) at random
//! moments and restarted, then the invariants of durable, exactly-once
//! delivery are checked.
//!
//! The load: accounts on every relay, each with one device (`phone`);
//! messages chosen by a seeded RNG among cross-relay, local cross-account
//! and self-delivery, with or without sender boxes, sent by concurrent
//! senders. A `message.send` whose answer is lost (connection refused,
//! reset, timeout, unreadable answer) is retried with the byte-identical
//! request until it gets an answer (seed: "A retry MUST submit the
//! unchanged request to the same relay"); a retryable error answer
//! (`temporarily_unavailable`, `internal_error`, …) is retried the same way.
//!
//! The killer runs in its own thread: kill `j` happens once a share
//! `(j+1)/(kills+1)` of the messages was answered, after a random pause;
//! it stops one relay (sometimes two at once), waits a random downtime and
//! restarts them on the same port and data dir.
//!
//! Invariants checked at the end ([`run`] returns them as `violations`):
//! - every message whose `message.send` answered 200 ends `target_accepted`
//!   with the `accepted_at` of that answer (with healthy accounts no
//!   `failed` is allowed);
//! - every recipient timeline holds each accepted message exactly once (by
//!   `(from, message_id)`), every sender timeline holds exactly one `sent`
//!   record per accepted message with sender boxes, and nothing else;
//!   a message refused with an error holds no record anywhere;
//! - per account, the sequences `phone` sees (it is in every record's
//!   visible set) are exactly `1..=n`;
//! - re-sending a sample of accepted requests byte for byte answers the
//!   same status and `accepted_at` and changes no timeline;
//! - every relay stops cleanly (SIGTERM, exit 0) and its data dir passes
//!   `relay audit verify` (or, where that subcommand does not exist, the
//!   store's `verify_chain` over every stream: see [`verify_data_dir`]).

use super::client::{now, sync_pages, Client, User};
use super::cluster::Cluster;
use super::relay::RelayProc;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A millisecond-scale timetable so retries happen within a run.
pub const FAST_TIMETABLE: &str = "[delivery]\nretry_timetable = [\"0s\", \"200ms\", \"500ms\", \"1s\"]\n\
retry_then_every = \"1s\"\nattempt_timeout = \"1s\"\n[limits]\ndelivery_age_limit = \"10m\"\n";

const RELAY_IDS: [&str; 3] = ["relay-a", "relay-b", "relay-c"];

/// How the killer stops a relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: no shutdown, no flush.
    Kill9,
    /// SIGTERM: graceful shutdown, which must exit 0.
    Term,
}

#[derive(Clone, Debug)]
pub struct Params {
    pub seed: u64,
    pub messages: usize,
    /// How many stop/restart events (one event may stop two relays).
    pub kills: usize,
    /// 2 or 3 relays.
    pub relays: usize,
    pub accounts_per_relay: usize,
    /// Concurrent senders.
    pub senders: usize,
    pub stop: Stop,
    /// Indexes of the relays the killer may stop (empty: any).
    pub victims: Vec<usize>,
    /// Only accounts homed on these relays send (empty: every account).
    pub senders_on: Vec<usize>,
    /// Random downtime of a stopped relay, at most this long.
    pub max_down_ms: u64,
    /// How many accepted messages are re-sent byte for byte at the end.
    pub resend_sample: usize,
    /// Bound on waiting for every delivery to end, after the load.
    pub settle_limit: Duration,
}

impl Params {
    /// The short version CI runs (debug build, 2 cores): 150 messages, 6 kills.
    pub fn ci() -> Params {
        Params {
            seed: 0x7e57_5eed,
            messages: 150,
            kills: 6,
            relays: 2,
            accounts_per_relay: 2,
            senders: 6,
            stop: Stop::Kill9,
            victims: vec![],
            senders_on: vec![],
            max_down_ms: 400,
            resend_sample: 40,
            settle_limit: Duration::from_secs(90),
        }
    }

    /// The long version: 5,000 messages through three relays, 60 kills.
    pub fn long() -> Params {
        Params {
            messages: 5000,
            kills: 60,
            relays: 3,
            accounts_per_relay: 3,
            senders: 12,
            max_down_ms: 800,
            resend_sample: 300,
            settle_limit: Duration::from_secs(300),
            ..Params::ci()
        }
    }

    /// Overrides from `TORTURE_SEED` (decimal or 0x-hex), `TORTURE_MESSAGES`
    /// and `TORTURE_KILLS`.
    pub fn with_env(mut self) -> Params {
        fn var(name: &str) -> Option<u64> {
            let v = std::env::var(name).ok()?;
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            Some(parsed.unwrap_or_else(|_| panic!("{name}={v:?} is not a number")))
        }
        if let Some(s) = var("TORTURE_SEED") {
            self.seed = s;
        }
        if let Some(n) = var("TORTURE_MESSAGES") {
            self.messages = n as usize;
        }
        if let Some(k) = var("TORTURE_KILLS") {
            self.kills = k as usize;
        }
        self
    }
}

/// How a data dir was audited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditMethod {
    /// `relay audit verify --config <cfg>`.
    Cli,
    /// `relay_actors::store::verify_chain` over every stream (the CLI
    /// subcommand is not available in this build).
    VerifyChain,
}

#[derive(Clone, Debug)]
pub struct Audit {
    pub relay: String,
    pub method: AuditMethod,
    /// Empty when clean.
    pub findings: Vec<String>,
    /// Why the CLI was not used, if it was not.
    pub note: Option<String>,
}

/// Audits a stopped relay's data dir: `relay audit verify --config <cfg>`
/// if this build has the subcommand, else the store's `verify_chain` over
/// every stream. The result says which was used.
pub fn verify_data_dir(relay: &RelayProc) -> Audit {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["audit", "verify", "--config"])
        .arg(&relay.config)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run relay audit verify");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    // clap's usage error (exit 2 with a usage text): no such subcommand.
    let usage_error = out.status.code() == Some(2) && stderr.contains("Usage:");
    if !usage_error {
        let findings = if out.status.success() {
            vec![]
        } else {
            vec![format!("relay audit verify exited {}: {stdout}{stderr}", out.status)]
        };
        return Audit { relay: relay.id.clone(), method: AuditMethod::Cli, findings, note: None };
    }
    let note = Some(format!("`relay audit verify` unavailable: {}", stderr.lines().next().unwrap_or("").trim()));
    let (_, findings) = verify_chains(&relay.data_dir);
    Audit { relay: relay.id.clone(), method: AuditMethod::VerifyChain, findings, note }
}

/// `relay_actors::store::verify_chain` over every stream of a stopped
/// relay's store: (streams checked, findings).
pub fn verify_chains(data_dir: &std::path::Path) -> (usize, Vec<String>) {
    let mut findings = vec![];
    let mut streams = 0;
    match relay_actors::store::Store::open(&data_dir.join("store")) {
        Err(e) => findings.push(format!("cannot open the store: {e}")),
        Ok(store) => {
            for stream in store.streams() {
                match stream {
                    Ok(s) => {
                        streams += 1;
                        let found = relay_actors::store::verify_chain(store.read(&s, 0));
                        findings.extend(found.iter().map(|f| f.to_string()));
                    }
                    Err(e) => findings.push(format!("listing streams: {e}")),
                }
            }
            if let Err(e) = store.close() {
                findings.push(format!("closing the store: {e}"));
            }
        }
    }
    (streams, findings)
}

/// What the delivery streams of a stopped relay show.
#[derive(Clone, Debug, Default)]
pub struct StoreView {
    pub deliveries: usize,
    pub attempts: usize,
    /// Due-index entries left for deliveries that had finished.
    pub leftover_due: usize,
}

/// Checks a stopped relay's delivery streams: one `accepted` first, attempt
/// numbers 1, 2, 3, …, at most one `finished` and nothing after it, every
/// attempt aimed at the recipient's home relay only (`home` of an account
/// id: no route changes in a torture run, so any other target is a switch),
/// and no due-index entry for an unfinished delivery (all are terminal by
/// now).
pub fn inspect_deliveries(
    data_dir: &std::path::Path,
    home: &BTreeMap<String, String>,
) -> Result<(StoreView, Vec<String>), String> {
    use relay_actors::delivery::{parse_due_key, DUE_PREFIX};
    let store = relay_actors::store::Store::open(&data_dir.join("store")).map_err(|e| e.to_string())?;
    let mut view = StoreView::default();
    let mut bad = vec![];
    let mut finished = BTreeSet::new();
    for stream in store.streams() {
        let stream = stream.map_err(|e| e.to_string())?;
        if !stream.starts_with("delivery/") {
            continue;
        }
        view.deliveries += 1;
        let (mut to, mut attempts, mut ends) = (None::<String>, 0u64, 0);
        for (k, ev) in store.read(&stream, 0).enumerate() {
            let ev = ev.map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_str(ev.data.get()).map_err(|e| e.to_string())?;
            let body = v.get(&ev.event_type).cloned().unwrap_or(v);
            if ends > 0 {
                bad.push(format!("{stream}: {} after finished", ev.event_type));
            }
            match ev.event_type.as_str() {
                "accepted" => {
                    if k != 0 {
                        bad.push(format!("{stream}: accepted at position {k}"));
                    }
                    to = body["to"].as_str().map(str::to_string);
                }
                "attempt_started" => {
                    attempts += 1;
                    view.attempts += 1;
                    if body["attempt"].as_u64() != Some(attempts) {
                        bad.push(format!("{stream}: attempt {} where {attempts} was due", body["attempt"]));
                    }
                    let targets: Vec<&str> =
                        body["targets"].as_array().into_iter().flatten().filter_map(|t| t.as_str()).collect();
                    let want = to.as_ref().and_then(|t| home.get(t));
                    if !targets.is_empty() && want.is_none_or(|w| targets != [w.as_str()]) {
                        bad.push(format!(
                            "{stream}: attempt {attempts} aimed at {targets:?}, recipient's home {want:?}"
                        ));
                    }
                }
                "finished" => ends += 1,
                _ => {}
            }
        }
        if ends > 0 {
            finished.insert(stream);
        }
    }
    for kv in store.kv_scan_prefix(DUE_PREFIX) {
        let (key, _) = kv.map_err(|e| e.to_string())?;
        match parse_due_key(&key) {
            Some((_, stream)) if finished.contains(&stream) => view.leftover_due += 1,
            Some((due, stream)) => bad.push(format!("{stream}: still due at {due} ms, never finished")),
            None => bad.push(format!("unreadable due key {key:?}")),
        }
    }
    store.close().map_err(|e| e.to_string())?;
    Ok((view, bad))
}

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    pub relays: usize,
    pub accounts: usize,
    pub messages: usize,
    /// `message.send` answered 200.
    pub accepted: usize,
    /// Refused with an error that is not retried: (message id, code).
    pub rejected: Vec<(String, String)>,
    /// Stop/restart events done, and relays stopped in all.
    pub kill_events: usize,
    pub relays_stopped: usize,
    pub kill_log: Vec<String>,
    /// Messages whose `message.send` had to be retried after a lost
    /// answer, and the number of lost answers.
    pub retried_messages: usize,
    pub lost_answers: usize,
    /// Most tries one `message.send` needed.
    pub max_tries: u32,
    /// Lost answers by kind (the client's error, numbers removed).
    pub lost_kinds: BTreeMap<String, usize>,
    /// Retryable error answers (retried with the same request), by code.
    pub retryable_answers: BTreeMap<String, usize>,
    /// Final statuses of accepted messages, by status (and error code).
    pub final_statuses: BTreeMap<String, usize>,
    /// Timeline records seen at the end, over all accounts.
    pub records: usize,
    pub resent: usize,
    pub audits: Vec<Audit>,
    /// Streams checked with `verify_chain` (in addition to the audit).
    pub chains_checked: usize,
    /// Per relay, what its delivery streams show.
    pub stores: Vec<(String, StoreView)>,
    pub load_time: Duration,
    pub total_time: Duration,
    /// Broken invariants; empty on success.
    pub violations: Vec<String>,
    /// Where all violations were written (when there are any).
    pub violations_file: Option<std::path::PathBuf>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "torture seed {:#x}: {} relays, {} accounts, {} messages ({} accepted, {} refused)",
            self.seed,
            self.relays,
            self.accounts,
            self.messages,
            self.accepted,
            self.rejected.len()
        )?;
        writeln!(
            f,
            "  {} stop events ({} relay stops); {} messages retried after {} lost answers (at most {} tries); retryable answers {:?}",
            self.kill_events, self.relays_stopped, self.retried_messages, self.lost_answers, self.max_tries, self.retryable_answers
        )?;
        writeln!(f, "  lost answers by kind {:?}", self.lost_kinds)?;
        writeln!(
            f,
            "  final statuses {:?}; {} timeline records; {} re-sent duplicates",
            self.final_statuses, self.records, self.resent
        )?;
        for a in &self.audits {
            writeln!(
                f,
                "  audit {} via {:?}: {}{}",
                a.relay,
                a.method,
                if a.findings.is_empty() { "clean".to_string() } else { format!("{} findings", a.findings.len()) },
                a.note.as_ref().map(|n| format!(" ({n})")).unwrap_or_default()
            )?;
        }
        writeln!(f, "  verify_chain: {} streams", self.chains_checked)?;
        for (relay, v) in &self.stores {
            writeln!(
                f,
                "  {relay}: {} delivery streams, {} attempts, {} due entries left for finished deliveries",
                v.deliveries, v.attempts, v.leftover_due
            )?;
        }
        writeln!(f, "  load {:.1?}, total {:.1?}", self.load_time, self.total_time)?;
        if self.violations.is_empty() {
            writeln!(f, "  no violations: nothing lost, nothing duplicated")?;
        } else {
            writeln!(f, "  {} VIOLATIONS:", self.violations.len())?;
            for v in self.violations.iter().take(50) {
                writeln!(f, "    {v}")?;
            }
            if let Some(path) = &self.violations_file {
                writeln!(f, "  all violations: {}", path.display())?;
            }
        }
        Ok(())
    }
}

// ---- HTTP without panics -----------------------------------------------------

/// One client per relay (requests give up after 15 s).
fn clients(urls: &[String]) -> Vec<Client> {
    urls.iter().map(|u| Client::with_timeout(u, Duration::from_secs(15))).collect()
}

/// `data.retry_after` of a `rate_limited` answer (at least 1 s).
fn retry_after(v: &Value) -> Option<Duration> {
    (v["error"]["code"] == "rate_limited")
        .then(|| Duration::from_secs(v["error"]["data"]["retry_after"].as_u64().unwrap_or(1).max(1)))
}

/// A call that should succeed now (relays up): transport failures and
/// `rate_limited` (after `retry_after`) are retried (bounded), another
/// error answer is returned as `Err`.
async fn call(c: &Client, method: &str, token: Option<&str>, params: &Value) -> Result<Value, String> {
    let (base, body) = (&c.base, serde_json::to_vec(params).unwrap());
    let mut last = String::new();
    for _ in 0..100 {
        match c.try_raw(method, token, &body).await {
            Ok((200, v)) => return Ok(v),
            Ok((status, v)) => match retry_after(&v) {
                Some(wait) => {
                    last = v.to_string();
                    // Waits for the relay's rate limiter (its own clock): the answer's retry_after.
                    actix_rt::time::sleep(wait).await;
                    continue;
                }
                None => return Err(format!("{method} at {base}: HTTP {status} {v}")),
            },
            Err(e) => last = e,
        }
        // Waits for a relay process the killer may have stopped to come back: a client's pause before its retry.
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{method} at {base}: no answer: {last}"))
}

/// Every record `token`'s device can sync, following pagination.
async fn timeline(c: &Client, token: &str) -> Result<Vec<Value>, String> {
    sync_pages(|after| async move {
        call(c, "message.timeline.sync", Some(token), &json!({"after": after, "limit": 500})).await
    })
    .await
}

// ---- the load --------------------------------------------------------------

/// Error codes a sender retries with the unchanged request.
const RETRYABLE: [&str; 4] = ["temporarily_unavailable", "internal_error", "bad_gateway", "rate_limited"];
/// How long one message may go unanswered before the run gives up on it.
const SEND_LIMIT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug)]
struct Planned {
    from: usize,
    to: usize,
    sender_boxes: bool,
    id: String,
}

#[derive(Clone, Debug)]
enum Answer {
    Accepted(Value),
    Rejected(u16, Value),
    Unanswered(String),
}

#[derive(Clone, Debug)]
struct Sent {
    plan: Planned,
    body: Vec<u8>,
    answer: Answer,
    tries: u32,
    lost: u32,
    retryable: Vec<String>,
    lost_kinds: Vec<String>,
}

/// Sends one request until it is answered: lost answers and retryable
/// errors are retried with the identical bytes.
/// A client error without numbers (ports, os error codes), shortened.
fn error_kind(e: &str) -> String {
    let s: String = e.chars().filter(|c| !c.is_ascii_digit()).collect();
    s.chars().take(90).collect()
}

struct Tried {
    answer: Answer,
    tries: u32,
    lost: u32,
    retryable: Vec<String>,
    lost_kinds: Vec<String>,
}

async fn send_until_answered(c: &Client, token: &str, body: &[u8]) -> Tried {
    let start = Instant::now();
    let mut t =
        Tried { answer: Answer::Unanswered(String::new()), tries: 0, lost: 0, retryable: vec![], lost_kinds: vec![] };
    loop {
        t.tries += 1;
        let last = match c.try_raw("message.send", Some(token), body).await {
            Ok((200, v)) => {
                t.answer = Answer::Accepted(v);
                return t;
            }
            Ok((status, v)) => {
                let code = v["error"]["code"].as_str().unwrap_or("").to_string();
                if !RETRYABLE.contains(&code.as_str()) {
                    t.answer = Answer::Rejected(status, v);
                    return t;
                }
                t.retryable.push(code.clone());
                if let Some(wait) = retry_after(&v) {
                    // Waits for the relay's rate limiter (its own clock): the answer's retry_after.
                    actix_rt::time::sleep(wait).await;
                }
                code
            }
            Err(e) => {
                t.lost += 1;
                t.lost_kinds.push(error_kind(&e));
                e
            }
        };
        if start.elapsed() > SEND_LIMIT {
            t.answer = Answer::Unanswered(last);
            return t;
        }
        // Waits for a relay process the killer may have stopped to come back: the client's growing backoff.
        actix_rt::time::sleep(Duration::from_millis(20 * u64::from(t.tries.min(15)))).await;
    }
}

fn plan_messages(p: &Params, rng: &mut StdRng, homes: &[usize]) -> Vec<Planned> {
    let senders: Vec<usize> =
        (0..homes.len()).filter(|u| p.senders_on.is_empty() || p.senders_on.contains(&homes[*u])).collect();
    assert!(!senders.is_empty(), "no account may send");
    (0..p.messages)
        .map(|i| {
            let from = senders[rng.random_range(0..senders.len())];
            let local: Vec<usize> = (0..homes.len()).filter(|u| *u != from && homes[*u] == homes[from]).collect();
            let remote: Vec<usize> = (0..homes.len()).filter(|u| homes[*u] != homes[from]).collect();
            let roll = rng.random_range(0..100);
            let to = if roll < 15 || (local.is_empty() && remote.is_empty()) {
                from
            } else if (roll < 40 && !local.is_empty()) || remote.is_empty() {
                local[rng.random_range(0..local.len())]
            } else {
                remote[rng.random_range(0..remote.len())]
            };
            let sender_boxes = from != to && rng.random_bool(0.5);
            Planned { from, to, sender_boxes, id: format!("torture-{:08x}-{i:06}", p.seed as u32) }
        })
        .collect()
}

// ---- the killer ------------------------------------------------------------

struct KillStats {
    events: usize,
    stopped: usize,
    log: Vec<String>,
    violations: Vec<String>,
}

fn killer(
    relays: Arc<Mutex<Vec<RelayProc>>>,
    p: Params,
    progress: Arc<AtomicUsize>,
    load_done: Arc<AtomicBool>,
) -> KillStats {
    let mut rng = StdRng::seed_from_u64(p.seed ^ 0x6b69_6c6c);
    let victims: Vec<usize> = if p.victims.is_empty() { (0..p.relays).collect() } else { p.victims.clone() };
    let mut stats = KillStats { events: 0, stopped: 0, log: vec![], violations: vec![] };
    let t0 = Instant::now();
    for j in 0..p.kills {
        let milestone = (j + 1) * p.messages / (p.kills + 1);
        let wait_limit = Instant::now() + Duration::from_secs(120);
        while progress.load(Ordering::SeqCst) < milestone
            && !load_done.load(Ordering::SeqCst)
            && Instant::now() < wait_limit
        {
            // Waits for the relay processes' answers to the load (progress counts them): kills are tied to progress.
            std::thread::sleep(Duration::from_millis(5));
        }
        // Waits for a random moment within the load: the seeded kill plan's pause before this stop.
        std::thread::sleep(Duration::from_millis(rng.random_range(0..150)));
        let mut chosen = vec![victims[rng.random_range(0..victims.len())]];
        if victims.len() > 1 && rng.random_bool(0.25) {
            let other = victims.iter().copied().filter(|v| *v != chosen[0]).collect::<Vec<_>>();
            chosen.push(other[rng.random_range(0..other.len())]);
        }
        let down = Duration::from_millis(rng.random_range(0..=p.max_down_ms));
        let mut relays = relays.lock().unwrap_or_else(|e| e.into_inner());
        let answered = progress.load(Ordering::SeqCst);
        for &v in &chosen {
            match p.stop {
                Stop::Kill9 => relays[v].kill9(),
                Stop::Term => {
                    let status = relays[v].terminate();
                    if !status.success() {
                        stats.violations.push(format!("{} exited {status} after SIGTERM (stop {j})", relays[v].id));
                    }
                }
            }
        }
        // Waits for the seeded downtime: the stopped relay processes stay down this long.
        std::thread::sleep(down);
        for &v in &chosen {
            relays[v].restart();
        }
        let names: Vec<&str> = chosen.iter().map(|v| relays[*v].id.as_str()).collect();
        stats.log.push(format!(
            "{:>7.2?} stop {j}: {:?} {names:?} after {answered} answers, down {down:?}",
            t0.elapsed(),
            p.stop
        ));
        stats.events += 1;
        stats.stopped += chosen.len();
    }
    stats
}

// ---- the run ---------------------------------------------------------------

/// Runs the torture described by `p`; see the module doc.
pub async fn run(p: Params) -> Report {
    assert!((2..=3).contains(&p.relays), "2 or 3 relays");
    let t0 = Instant::now();
    let mut report = Report { seed: p.seed, relays: p.relays, messages: p.messages, ..Report::default() };
    eprintln!(
        "torture: seed {:#x}, {} messages, {} stops ({:?}); reproduce with TORTURE_SEED={:#x} TORTURE_MESSAGES={} TORTURE_KILLS={}",
        p.seed, p.messages, p.kills, p.stop, p.seed, p.messages, p.kills
    );
    let dir = tempfile::tempdir().unwrap();
    let ids = &RELAY_IDS[..p.relays];
    let cluster = Cluster::plan(dir.path(), ids);
    let procs: Vec<RelayProc> = ids.iter().map(|id| cluster.start(id, FAST_TIMETABLE)).collect();
    let urls: Vec<String> = ids.iter().map(|id| cluster.url(id).to_string()).collect();
    let rpc = clients(&urls);

    // Accounts: `accounts_per_relay` on every relay, public discovery on
    // (no authorization material needed), one device each.
    let mut users = vec![];
    let mut homes = vec![];
    for (r, id) in ids.iter().enumerate() {
        let c = Client::new(&urls[r]);
        for k in 0..p.accounts_per_relay {
            users.push(User::register(&c, id, (1 + r * p.accounts_per_relay + k) as u8, true).await);
            homes.push(r);
        }
    }
    report.accounts = users.len();
    // Every relay learns every remote account's route before the load (the
    // route book is durable), so a send never depends on a peer being up.
    // (A device with a session there asks, so the relay may ask its peers.)
    for (r, c) in rpc.iter().enumerate() {
        let local = users.iter().zip(&homes).find(|(_, h)| **h == r).map(|(u, _)| u.token(0));
        for (u, user) in users.iter().enumerate() {
            if homes[u] != r {
                if let Err(e) = call(c, "route.get", local.flatten(), &json!({"account_id": user.id()})).await {
                    panic!("route.get before the load: {e}");
                }
            }
        }
    }

    let home: BTreeMap<String, String> =
        users.iter().zip(&homes).map(|(u, r)| (u.id().to_string(), ids[*r].to_string())).collect();
    let mut rng = StdRng::seed_from_u64(p.seed);
    let plan = plan_messages(&p, &mut rng, &homes);
    let users = Rc::new(users);

    // The killer.
    let relays = Arc::new(Mutex::new(procs));
    let progress = Arc::new(AtomicUsize::new(0));
    let load_done = Arc::new(AtomicBool::new(false));
    let killer_thread = {
        let (relays, p, progress, load_done) = (relays.clone(), p.clone(), progress.clone(), load_done.clone());
        std::thread::spawn(move || killer(relays, p, progress, load_done))
    };

    // The senders.
    let load_start = Instant::now();
    let next = Rc::new(RefCell::new(0usize));
    let results: Rc<RefCell<Vec<Option<Sent>>>> = Rc::new(RefCell::new(vec![None; plan.len()]));
    let plan = Rc::new(plan);
    let tasks: Vec<_> = (0..p.senders.max(1))
        .map(|_| {
            let (next, results, plan, users, urls, homes, progress) = (
                next.clone(),
                results.clone(),
                plan.clone(),
                users.clone(),
                urls.clone(),
                homes.clone(),
                progress.clone(),
            );
            actix_rt::spawn(async move {
                let rpc = clients(&urls);
                loop {
                    let i = {
                        let mut n = next.borrow_mut();
                        let i = *n;
                        *n += 1;
                        i
                    };
                    let Some(m) = plan.get(i) else { return };
                    let (sender, recipient) = (&users[m.from], &users[m.to]);
                    let sb: &[&str] = &["phone"];
                    let params =
                        sender.params_to(0, recipient.id(), &m.id, now(), &["phone"], m.sender_boxes.then_some(sb));
                    let body = serde_json::to_vec(&params).unwrap();
                    let token = sender.tokens[0].clone();
                    let t = send_until_answered(&rpc[homes[m.from]], &token, &body).await;
                    let (answer, tries, lost, retryable, lost_kinds) =
                        (t.answer, t.tries, t.lost, t.retryable, t.lost_kinds);
                    results.borrow_mut()[i] =
                        Some(Sent { plan: m.clone(), body, answer, tries, lost, retryable, lost_kinds });
                    progress.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in futures_util::future::join_all(tasks).await {
        if let Err(e) = t {
            report.violations.push(format!("a sender task failed: {e}"));
        }
    }
    load_done.store(true, Ordering::SeqCst);
    report.load_time = load_start.elapsed();
    match killer_thread.join() {
        Ok(k) => {
            report.kill_events = k.events;
            report.relays_stopped = k.stopped;
            report.kill_log = k.log;
            report.violations.extend(k.violations);
        }
        Err(_) => report.violations.push("the killer thread panicked (a relay did not restart?)".into()),
    }
    for line in &report.kill_log {
        eprintln!("  {line}");
    }
    let sent: Vec<Sent> = Rc::try_unwrap(results)
        .map(|r| r.into_inner())
        .unwrap_or_else(|r| r.borrow().clone())
        .into_iter()
        .map(|s| s.expect("every message was sent"))
        .collect();

    // Answers.
    for s in &sent {
        if s.lost > 0 {
            report.retried_messages += 1;
        }
        report.lost_answers += s.lost as usize;
        for k in &s.lost_kinds {
            *report.lost_kinds.entry(k.clone()).or_default() += 1;
        }
        for code in &s.retryable {
            *report.retryable_answers.entry(code.clone()).or_default() += 1;
        }
        report.max_tries = report.max_tries.max(s.tries);
        match &s.answer {
            Answer::Accepted(_) => report.accepted += 1,
            Answer::Rejected(status, v) => {
                let code = v["error"]["code"].as_str().unwrap_or("?").to_string();
                report.violations.push(format!("{}: refused with HTTP {status} {v}", s.plan.id));
                report.rejected.push((s.plan.id.clone(), code));
            }
            Answer::Unanswered(e) => {
                report.violations.push(format!("{}: no answer within {SEND_LIMIT:?}: {e}", s.plan.id))
            }
        }
    }

    // Every accepted delivery ends (bounded), with its accepted_at.
    let final_status = settle(&rpc, &homes, &users, &sent, &p, &mut report).await;
    check_timelines(&rpc, &homes, &users, &sent, &final_status, &mut report).await;
    resend_sample(&rpc, &homes, &users, &sent, &final_status, &p, &mut rng, &mut report).await;

    // Stop every relay gracefully, then audit its data dir.
    let mut procs = Arc::try_unwrap(relays)
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()))
        .unwrap_or_else(|_| panic!("the killer still holds the relays"));
    for r in procs.iter_mut() {
        let status = r.terminate();
        if !status.success() {
            report.violations.push(format!("{} exited {status} after the final SIGTERM", r.id));
        }
    }
    for r in &procs {
        let audit = verify_data_dir(r);
        for f in &audit.findings {
            report.violations.push(format!("audit {} ({:?}): {f}", r.id, audit.method));
        }
        report.audits.push(audit);
        let (streams, findings) = verify_chains(&r.data_dir);
        report.chains_checked += streams;
        report.violations.extend(findings.into_iter().map(|f| format!("verify_chain {}: {f}", r.id)));
        match inspect_deliveries(&r.data_dir, &home) {
            Ok((view, bad)) => {
                report.violations.extend(bad.into_iter().map(|b| format!("{}: {b}", r.id)));
                report.stores.push((r.id.clone(), view));
            }
            Err(e) => report.violations.push(format!("{}: reading delivery streams: {e}", r.id)),
        }
    }
    report.total_time = t0.elapsed();
    if !report.violations.is_empty() {
        let path = std::env::temp_dir().join(format!("torture-{:x}-violations.txt", p.seed));
        if std::fs::write(&path, report.violations.join("\n") + "\n").is_ok() {
            report.violations_file = Some(path);
        }
    }
    report
}

/// Polls `message.delivery.status` until every accepted message is
/// terminal (bounded); checks `accepted_at`; returns the final statuses.
async fn settle(
    rpc: &[Client],
    homes: &[usize],
    users: &[User],
    sent: &[Sent],
    p: &Params,
    report: &mut Report,
) -> BTreeMap<usize, Value> {
    let mut finals = BTreeMap::new();
    let mut pending: Vec<usize> = (0..sent.len()).filter(|i| matches!(sent[*i].answer, Answer::Accepted(_))).collect();
    let deadline = Instant::now() + p.settle_limit;
    let mut last = BTreeMap::new();
    while !pending.is_empty() {
        let mut still = vec![];
        for i in pending {
            let s = &sent[i];
            let u = &users[s.plan.from];
            let st = match call(
                &rpc[homes[s.plan.from]],
                "message.delivery.status",
                Some(&u.tokens[0]),
                &json!({"message_id": s.plan.id}),
            )
            .await
            {
                Ok(st) => st,
                Err(e) => {
                    report.violations.push(format!("{}: status query failed: {e}", s.plan.id));
                    continue;
                }
            };
            if st["status"] == "delivering" {
                last.insert(i, st);
                still.push(i);
            } else {
                finals.insert(i, st);
            }
        }
        pending = still;
        if !pending.is_empty() {
            if Instant::now() > deadline {
                for i in &pending {
                    report.violations.push(format!(
                        "{}: still {} {} after {:?}",
                        sent[*i].plan.id, last[i], "delivering", p.settle_limit
                    ));
                }
                break;
            }
            // Waits for the relay processes' deliveries to settle: polls the pending statuses again (the deadline above records violations).
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
    }
    for (i, st) in &finals {
        let s = &sent[*i];
        let Answer::Accepted(reply) = &s.answer else { unreachable!() };
        if st["accepted_at"] != reply["accepted_at"] {
            report.violations.push(format!("{}: accepted_at changed: answered {reply}, now {st}", s.plan.id));
        }
        if reply["status"] != "delivering" && st != reply {
            report.violations.push(format!("{}: terminal status changed: answered {reply}, now {st}", s.plan.id));
        }
        let key = match st["error"]["code"].as_str() {
            Some(code) => format!("{} {code}", st["status"].as_str().unwrap_or("?")),
            None => st["status"].as_str().unwrap_or("?").to_string(),
        };
        *report.final_statuses.entry(key).or_default() += 1;
        if st["status"] != "target_accepted" {
            report
                .violations
                .push(format!("{}: accepted but ended {st} (healthy accounts: no failure allowed)", s.plan.id));
        }
    }
    finals
}

/// Record identity in a timeline: (direction, from, message_id).
type RecordKey = (String, String, String);

async fn all_timelines(rpc: &[Client], homes: &[usize], users: &[User], report: &mut Report) -> Vec<Vec<Value>> {
    let mut out = vec![];
    for (u, user) in users.iter().enumerate() {
        match timeline(&rpc[homes[u]], &user.tokens[0]).await {
            Ok(records) => out.push(records),
            Err(e) => {
                report.violations.push(format!("account {u}: timeline sync failed: {e}"));
                out.push(vec![]);
            }
        }
    }
    out
}

fn key_of(r: &Value) -> RecordKey {
    (
        r["direction"].as_str().unwrap_or("?").to_string(),
        r["envelope"]["from"].as_str().unwrap_or("?").to_string(),
        r["envelope"]["message_id"].as_str().unwrap_or("?").to_string(),
    )
}

async fn check_timelines(
    rpc: &[Client],
    homes: &[usize],
    users: &[User],
    sent: &[Sent],
    finals: &BTreeMap<usize, Value>,
    report: &mut Report,
) {
    // What each account must hold (exactly once) and may hold (at most once).
    let mut must: Vec<BTreeSet<RecordKey>> = vec![BTreeSet::new(); users.len()];
    let mut may: Vec<BTreeSet<RecordKey>> = vec![BTreeSet::new(); users.len()];
    for (i, s) in sent.iter().enumerate() {
        let (from, to) = (s.plan.from, s.plan.to);
        let from_id = users[from].id().to_string();
        let received = ("received".to_string(), from_id.clone(), s.plan.id.clone());
        let sent_rec = ("sent".to_string(), from_id.clone(), s.plan.id.clone());
        match &s.answer {
            Answer::Accepted(_) => {
                if from == to {
                    must[from].insert(received);
                    continue;
                }
                if s.plan.sender_boxes {
                    must[from].insert(sent_rec);
                }
                match finals.get(&i) {
                    Some(st) if st["status"] == "target_accepted" => {
                        must[to].insert(received);
                    }
                    _ => {
                        may[to].insert(received);
                    }
                }
            }
            Answer::Rejected(..) => {}
            Answer::Unanswered(_) => {
                may[to].insert(received);
                may[from].insert(sent_rec);
            }
        }
    }
    let timelines = all_timelines(rpc, homes, users, report).await;
    for (u, records) in timelines.iter().enumerate() {
        report.records += records.len();
        let seqs: Vec<u64> = records.iter().map(|r| r["sequence"].as_u64().unwrap_or(0)).collect();
        if seqs != (1..=records.len() as u64).collect::<Vec<_>>() {
            let bad: Vec<_> = seqs.windows(2).filter(|w| w[1] != w[0] + 1).take(5).collect();
            report.violations.push(format!(
                "account {u}: sequences are not 1..={} (first {:?}, breaks {bad:?})",
                records.len(),
                seqs.first()
            ));
        }
        let mut counts: BTreeMap<RecordKey, usize> = BTreeMap::new();
        for r in records {
            *counts.entry(key_of(r)).or_default() += 1;
            if r["direction"] == "sent" && r["delivery"]["status"] != "target_accepted" {
                report
                    .violations
                    .push(format!("account {u}: sent record {} shows {}", r["envelope"]["message_id"], r["delivery"]));
            }
        }
        for (k, n) in &counts {
            if *n > 1 {
                report.violations.push(format!("account {u}: DUPLICATE {k:?} held {n} times"));
            } else if !must[u].contains(k) && !may[u].contains(k) {
                report.violations.push(format!("account {u}: unexpected record {k:?}"));
            }
        }
        for k in &must[u] {
            if !counts.contains_key(k) {
                report.violations.push(format!("account {u}: LOST {k:?}"));
            }
        }
    }
}

/// Re-sends a random sample of accepted requests byte for byte: each
/// answers its final status, and no timeline changes.
#[allow(clippy::too_many_arguments)]
async fn resend_sample(
    rpc: &[Client],
    homes: &[usize],
    users: &[User],
    sent: &[Sent],
    finals: &BTreeMap<usize, Value>,
    p: &Params,
    rng: &mut StdRng,
    report: &mut Report,
) {
    let mut candidates: Vec<usize> = finals.keys().copied().collect();
    let mut sample = vec![];
    while sample.len() < p.resend_sample && !candidates.is_empty() {
        sample.push(candidates.swap_remove(rng.random_range(0..candidates.len())));
    }
    let mut scratch = Report::default();
    let before = all_timelines(rpc, homes, users, &mut scratch).await;
    for i in &sample {
        let s = &sent[*i];
        let t = send_until_answered(&rpc[homes[s.plan.from]], &users[s.plan.from].tokens[0], &s.body).await;
        match t.answer {
            Answer::Accepted(v) if v == finals[i] => {}
            other => report.violations.push(format!("{}: duplicate answered {other:?}, not {}", s.plan.id, finals[i])),
        }
        report.resent += 1;
    }
    let after = all_timelines(rpc, homes, users, &mut scratch).await;
    report.violations.extend(scratch.violations);
    for (u, (b, a)) in before.iter().zip(&after).enumerate() {
        if b != a {
            report.violations.push(format!(
                "account {u}: re-sent duplicates changed the timeline ({} → {} records)",
                b.len(),
                a.len()
            ));
        }
    }
}
