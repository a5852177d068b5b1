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
//!
//! Two-home mode ([`Params::two_homes`], 3 relays): every account has two
//! home relays, pairs rotating (a,b), (b,c), (c,a), …: registered at the
//! first with a signed route naming both, then (bounded wait) a session
//! opened at the second once the account has replicated there (replication
//! rounds every 300 ms). Each message is sent at one of the sender's homes
//! (seeded), its retries to the same relay; "local" means sender and
//! recipient share a home. The settle also waits (same bound) until no
//! relay has a delivery in flight (`relay_deliveries_in_flight` 0: the
//! sender's other home's own deliveries end too) and both homes of every
//! account hold the same records; then the send's status at the sender's
//! other home must be the same `target_accepted` with the same
//! `accepted_at`. The timeline invariants above hold at EACH home (per
//! home sequences `1..=n`), both homes hold the same records in the same
//! `(created_at, message_id)` order (sequences and per-home acceptance
//! times aside), and delivery attempts may aim at any of the recipient's
//! two homes.
//!
//! Retention mode ([`Params::retention`], one home per account): the relays
//! delete what is past a short `message_retention`, the load is spread so
//! sweeps run while relays are still being killed, and a checker looks at
//! the messages during the load and after it: nothing goes before its
//! `retention_until`, everything goes after it, nothing is made twice
//! (see the `retention` submodule).

mod retention;

pub use retention::{Figures as RetentionFigures, Retention};

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

const RELAY_IDS: [&str; 4] = ["relay-a", "relay-b", "relay-c", "relay-d"];

/// Two-home mode: replication rounds within a run.
const TWO_HOMES_CONFIG: &str = "[replication]\ninterval = \"300ms\"\n";

/// How long an account registered at its first home may take to open a
/// session at its second (replication brings it there).
const REPLICATED_LIMIT: Duration = Duration::from_secs(30);

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
    /// 2 or 3 relays (2 to 4 in two-home mode).
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
    /// Two-home mode (3 or 4 relays): every account has two home relays,
    /// pairs rotating (a,b), (b,c), …, back to a; see [`run`]. With 4,
    /// accounts homed on (a,b) and (c,d) share no relay, so their messages
    /// cross between relays.
    pub two_homes: bool,
    /// Retention mode (one home per account): see [`Retention`]. `None`:
    /// the default retention (30 days), nothing is deleted within a run.
    pub retention: Option<Retention>,
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
            two_homes: false,
            retention: None,
        }
    }

    /// The CI version of the retention mode: 2 relays, 160 messages spread
    /// over 30 s, 8 SIGKILL stop events, retention 20 s, a sweep every
    /// second. The first 20 s of the load are within every message's
    /// retention; in its last third the sweeps delete the first messages
    /// while relays are still being killed. Each message is checked from
    /// its answer on (a round every 250 ms), so its checks fall mostly
    /// within its 20 s, even on a loaded 2-core debug build where a
    /// delivery across a kill takes a few seconds.
    pub fn ci_retention() -> Params {
        Params {
            seed: 0x7e57_3939,
            messages: 160,
            kills: 8,
            resend_sample: 20,
            retention: Some(Retention {
                secs: 20,
                sweep_secs: 1,
                span: Duration::from_secs(30),
                sample: 12,
                expired_resends: 30,
                delete_limit: Duration::from_secs(30),
            }),
            ..Params::ci()
        }
    }

    /// The CI version of the two-home mode: 4 relays, 8 accounts (each with
    /// two homes), 120 messages, 6 SIGKILL stop events of any relay.
    pub fn ci_two_homes() -> Params {
        Params {
            seed: 0x7e57_2403,
            messages: 120,
            kills: 6,
            relays: 4,
            accounts_per_relay: 2,
            resend_sample: 30,
            two_homes: true,
            ..Params::ci()
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

/// `relay_actors::store::verify_chain_from` over every stream of a stopped
/// relay's store, each from its pruned marker: (streams checked, findings).
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
                        let start = match store.pruned(&s) {
                            Ok(marker) => marker.map(|m| m.head).unwrap_or_default(),
                            Err(e) => {
                                findings.push(format!("stream {s:?}: pruned marker: {e}"));
                                continue;
                            }
                        };
                        let found = relay_actors::store::verify_chain_from(|_| start, store.read(&s, 0));
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
    /// Attempts aimed at more than one relay (both homes of a recipient).
    pub multi_target_attempts: usize,
    /// Each delivery stream's event types and seqs (after its pruned
    /// marker's, if it has one).
    pub held: BTreeMap<String, Vec<String>>,
}

/// Checks a stopped relay's delivery streams: one `accepted` first, attempt
/// numbers 1, 2, 3, …, at most one `finished` and nothing after it, every
/// attempt aimed at the recipient's home relays only (`home` of an account
/// id: its home relay, or its two homes; no route changes in a torture run,
/// so any other target is a switch): with one home exactly that home, with
/// two any non-empty subset of them (each at most once), and no due-index
/// entry for an unfinished delivery (all are terminal by now).
pub fn inspect_deliveries(
    data_dir: &std::path::Path,
    home: &BTreeMap<String, Vec<String>>,
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
        if let Some(m) = store.pruned(&stream).map_err(|e| e.to_string())? {
            view.held.entry(stream.clone()).or_default().push(format!("pruned through #{}", m.head.seq));
        }
        let (mut to, mut attempts, mut ends) = (None::<String>, 0u64, 0);
        for (k, ev) in store.read(&stream, 0).enumerate() {
            let ev = ev.map_err(|e| e.to_string())?;
            let v: Value = serde_json::from_str(ev.data.get()).map_err(|e| e.to_string())?;
            let body = v.get(&ev.event_type).cloned().unwrap_or(v);
            view.held.entry(stream.clone()).or_default().push(format!("{}#{}", ev.event_type, ev.seq));
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
                    if targets.len() > 1 {
                        view.multi_target_attempts += 1;
                    }
                    let want = to.as_ref().and_then(|t| home.get(t));
                    if !targets.is_empty() && want.is_none_or(|w| !aimed_at_homes(&targets, w)) {
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

/// Whether an attempt's (non-empty) `targets` are the recipient's homes
/// `homes`: with one home exactly it; with two, any of them, each once.
fn aimed_at_homes(targets: &[&str], homes: &[String]) -> bool {
    match homes {
        [one] => targets == [one.as_str()],
        _ => {
            let distinct: BTreeSet<&str> = targets.iter().copied().collect();
            distinct.len() == targets.len() && targets.iter().all(|t| homes.iter().any(|h| h == t))
        }
    }
}

/// What a run did and found.
#[derive(Debug, Default)]
pub struct Report {
    pub seed: u64,
    /// Which mode ran: every account with two home relays, or one.
    pub two_homes: bool,
    pub relays: usize,
    pub accounts: usize,
    pub messages: usize,
    /// The planned messages by kind (self, local, remote; in two-home mode
    /// also whether the sender's chosen home is one of the recipient's).
    pub plan_mix: BTreeMap<String, usize>,
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
    /// Timeline records seen at the end, over all accounts (and homes).
    pub records: usize,
    /// Two-home mode: records whose `accepted_at`/`expires_at` differ
    /// between an account's two homes (each home may have accepted its own
    /// delivery of a message; not a violation).
    pub home_times_differ: usize,
    pub resent: usize,
    /// Retention mode: what its checks did.
    pub retention: Option<RetentionFigures>,
    pub audits: Vec<Audit>,
    /// Streams checked with `verify_chain` (in addition to the audit).
    pub chains_checked: usize,
    /// Per relay, what its delivery streams show.
    pub stores: Vec<(String, StoreView)>,
    pub load_time: Duration,
    /// From the end of the load until every delivery ended (and, with two
    /// homes, both homes converged).
    pub settle_time: Duration,
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
            "torture seed {:#x} ({}): {} relays, {} accounts, {} messages ({} accepted, {} refused)",
            self.seed,
            if self.two_homes { "two-home mode: two home relays per account" } else { "single-home mode" },
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
        writeln!(f, "  planned messages by kind {:?}", self.plan_mix)?;
        writeln!(
            f,
            "  final statuses {:?}; {} timeline records; {} re-sent duplicates",
            self.final_statuses, self.records, self.resent
        )?;
        if let Some(r) = &self.retention {
            write!(f, "{r}")?;
        }
        if self.two_homes {
            writeln!(
                f,
                "  two homes per account: {} records with per-home accepted_at/expires_at",
                self.home_times_differ
            )?;
        }
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
                "  {relay}: {} delivery streams, {} attempts, {} due entries left for finished deliveries{}",
                v.deliveries,
                v.attempts,
                v.leftover_due,
                if self.two_homes {
                    format!("; {} attempts at both homes", v.multi_target_attempts)
                } else {
                    String::new()
                }
            )?;
        }
        writeln!(f, "  load {:.1?}, settle {:.1?}, total {:.1?}", self.load_time, self.settle_time, self.total_time)?;
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

/// One home of an account: the relay's index and the phone's session
/// token there. An account has one, or two in two-home mode.
#[derive(Clone, Debug)]
struct Place {
    relay: usize,
    token: String,
}

/// Whether accounts with homes `a` and `b` share a home relay.
fn share_home(a: &[Place], b: &[Place]) -> bool {
    a.iter().any(|x| b.iter().any(|y| x.relay == y.relay))
}

/// `account {u}`, and the relay when the account has two homes.
fn label(u: usize, places: &[Place], relay: usize) -> String {
    if places.len() > 1 {
        format!("account {u} at {}", RELAY_IDS[relay])
    } else {
        format!("account {u}")
    }
}

#[derive(Clone, Debug)]
struct Planned {
    from: usize,
    to: usize,
    sender_boxes: bool,
    id: String,
    /// Which of the sender's homes it is sent at (index into its places);
    /// every retry goes to the same relay.
    at: usize,
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

/// The seeded plan. "Local": sender and recipient share a home relay.
/// With two homes, the home a message is sent at is a seeded choice too
/// (drawn last, so a one-home plan is the same as it always was).
fn plan_messages(p: &Params, rng: &mut StdRng, places: &[Vec<Place>]) -> Vec<Planned> {
    let senders: Vec<usize> = (0..places.len())
        .filter(|u| p.senders_on.is_empty() || places[*u].iter().any(|pl| p.senders_on.contains(&pl.relay)))
        .collect();
    assert!(!senders.is_empty(), "no account may send");
    (0..p.messages)
        .map(|i| {
            let from = senders[rng.random_range(0..senders.len())];
            let local: Vec<usize> =
                (0..places.len()).filter(|u| *u != from && share_home(&places[*u], &places[from])).collect();
            let remote: Vec<usize> = (0..places.len()).filter(|u| !share_home(&places[*u], &places[from])).collect();
            let roll = rng.random_range(0..100);
            let to = if roll < 15 || (local.is_empty() && remote.is_empty()) {
                from
            } else if (roll < 40 && !local.is_empty()) || remote.is_empty() {
                local[rng.random_range(0..local.len())]
            } else {
                remote[rng.random_range(0..remote.len())]
            };
            let sender_boxes = from != to && rng.random_bool(0.5);
            let at = if places[from].len() > 1 { rng.random_range(0..places[from].len()) } else { 0 };
            Planned { from, to, sender_boxes, id: format!("torture-{:08x}-{i:06}", p.seed as u32), at }
        })
        .collect()
}

/// The plan by kind, for the report.
fn plan_mix(plan: &[Planned], places: &[Vec<Place>]) -> BTreeMap<String, usize> {
    let mut mix = BTreeMap::new();
    for m in plan {
        let kind = if m.from == m.to {
            "self"
        } else if share_home(&places[m.from], &places[m.to]) {
            "local"
        } else {
            "remote"
        };
        *mix.entry(kind.to_string()).or_default() += 1;
        if places[m.from].len() > 1 && m.from != m.to {
            let at = places[m.from][m.at].relay;
            let key = if places[m.to].iter().any(|pl| pl.relay == at) {
                "sent at a recipient's home"
            } else {
                "sent at a home the recipient lacks"
            };
            *mix.entry(key.to_string()).or_default() += 1;
        }
    }
    mix
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
    match p.two_homes {
        false => assert!((2..=3).contains(&p.relays), "2 or 3 relays"),
        true => assert!((3..=4).contains(&p.relays), "two-home mode runs 3 or 4 relays"),
    }
    assert!(!(p.two_homes && p.retention.is_some()), "retention mode runs one home per account");
    let t0 = Instant::now();
    let mut report =
        Report { seed: p.seed, two_homes: p.two_homes, relays: p.relays, messages: p.messages, ..Report::default() };
    eprintln!(
        "torture ({}): seed {:#x}, {} messages, {} stops ({:?}); reproduce with TORTURE_SEED={:#x} TORTURE_MESSAGES={} TORTURE_KILLS={}",
        if p.two_homes { "two homes per account" } else { "one home per account" },
        p.seed, p.messages, p.kills, p.stop, p.seed, p.messages, p.kills
    );
    let dir = tempfile::tempdir().unwrap();
    let ids = &RELAY_IDS[..p.relays];
    let cluster = Cluster::plan(dir.path(), ids);
    // FAST_TIMETABLE ends in its `[limits]` section.
    let extra = match (&p.retention, p.two_homes) {
        (Some(r), _) => format!("{FAST_TIMETABLE}{}", r.limits()),
        (None, true) => format!("{FAST_TIMETABLE}{TWO_HOMES_CONFIG}"),
        (None, false) => FAST_TIMETABLE.to_string(),
    };
    let procs: Vec<RelayProc> = ids.iter().map(|id| cluster.start(id, &extra)).collect();
    let urls: Vec<String> = ids.iter().map(|id| cluster.url(id).to_string()).collect();
    let rpc = clients(&urls);

    // Accounts: `accounts_per_relay` on every relay, public discovery on
    // (no authorization material needed), one device each. Two-home mode:
    // as many, each registered at its first home with a route naming both,
    // with a session at each home.
    let mut users = vec![];
    let mut places: Vec<Vec<Place>> = vec![];
    if p.two_homes {
        for i in 0..p.relays * p.accounts_per_relay {
            let pair = [i % p.relays, (i + 1) % p.relays];
            let user = register_two_homes(&rpc, ids, pair, (1 + i) as u8).await;
            let other = session_at(&user, &rpc[pair[1]], ids[pair[1]]).await;
            places.push(vec![
                Place { relay: pair[0], token: user.tokens[0].clone() },
                Place { relay: pair[1], token: other },
            ]);
            users.push(user);
        }
    } else {
        for (r, id) in ids.iter().enumerate() {
            let c = Client::new(&urls[r]);
            for k in 0..p.accounts_per_relay {
                let user = User::register(&c, id, (1 + r * p.accounts_per_relay + k) as u8, true).await;
                places.push(vec![Place { relay: r, token: user.tokens[0].clone() }]);
                users.push(user);
            }
        }
    }
    report.accounts = users.len();
    let homed_at = |u: usize, r: usize| places[u].iter().any(|pl| pl.relay == r);
    // Every relay learns every remote account's route before the load (the
    // route book is durable), so a send never depends on a peer being up.
    // (A device with a session there asks, so the relay may ask its peers.)
    for (r, c) in rpc.iter().enumerate() {
        let local = places.iter().flatten().find(|pl| pl.relay == r).map(|pl| pl.token.as_str());
        for (u, user) in users.iter().enumerate() {
            if !homed_at(u, r) {
                if let Err(e) = call(c, "route.get", local, &json!({"account_id": user.id()})).await {
                    panic!("route.get before the load: {e}");
                }
            }
        }
    }

    let home: BTreeMap<String, Vec<String>> = users
        .iter()
        .zip(&places)
        .map(|(u, pls)| (u.id().to_string(), pls.iter().map(|pl| ids[pl.relay].to_string()).collect()))
        .collect();
    let mut rng = StdRng::seed_from_u64(p.seed);
    let plan = plan_messages(&p, &mut rng, &places);
    report.plan_mix = plan_mix(&plan, &places);
    let watch = p.retention.as_ref().map(|r| retention::Watch::new(r, p.seed, &users, &plan));
    let users = Rc::new(users);
    let places = Rc::new(places);

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
    let span = p.retention.as_ref().map(|r| r.span);
    let tasks: Vec<_> = (0..p.senders.max(1))
        .map(|_| {
            let (next, results, plan, users, urls, places, progress) = (
                next.clone(),
                results.clone(),
                plan.clone(),
                users.clone(),
                urls.clone(),
                places.clone(),
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
                    if let Some(span) = span {
                        let due = load_start + span.mul_f64(i as f64 / plan.len() as f64);
                        if let Some(ahead) = due.checked_duration_since(Instant::now()) {
                            // Waits for message i's moment in the retention mode's load timetable (spread over `span`).
                            actix_rt::time::sleep(ahead).await;
                        }
                    }
                    let (sender, recipient) = (&users[m.from], &users[m.to]);
                    let sb: &[&str] = &["phone"];
                    let params =
                        sender.params_to(0, recipient.id(), &m.id, now(), &["phone"], m.sender_boxes.then_some(sb));
                    let body = serde_json::to_vec(&params).unwrap();
                    let at = &places[m.from][m.at];
                    let t = send_until_answered(&rpc[at.relay], &at.token, &body).await;
                    let (answer, tries, lost, retryable, lost_kinds) =
                        (t.answer, t.tries, t.lost, t.retryable, t.lost_kinds);
                    results.borrow_mut()[i] =
                        Some(Sent { plan: m.clone(), body, answer, tries, lost, retryable, lost_kinds });
                    progress.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    // Retention mode: the checker, until the load ends.
    let checking = Rc::new(std::cell::Cell::new(false));
    let checker = watch.map(|w| {
        let (rpc, places, results, done) = (clients(&urls), places.clone(), results.clone(), checking.clone());
        actix_rt::spawn(retention::during_load(w, rpc, places, results, done))
    });
    for t in futures_util::future::join_all(tasks).await {
        if let Err(e) = t {
            report.violations.push(format!("a sender task failed: {e}"));
        }
    }
    load_done.store(true, Ordering::SeqCst);
    checking.set(true);
    let watch = match checker {
        Some(c) => match c.await {
            Ok(w) => Some(w),
            Err(e) => {
                report.violations.push(format!("the retention checker failed: {e}"));
                None
            }
        },
        None => None,
    };
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

    let settle_start = Instant::now();
    if let (Some(r), Some(watch)) = (&p.retention, watch) {
        // Retention mode: the checker goes on until everything is deleted.
        retention::after_load(watch, r, &rpc, &places, &users, &sent, p.settle_limit, p.resend_sample, &mut report)
            .await;
        report.settle_time = settle_start.elapsed();
    } else {
        // Every accepted delivery ends (bounded), with its accepted_at.
        let final_status = settle(&rpc, &places, &sent, &p, &mut report).await;
        report.settle_time = settle_start.elapsed();
        check_timelines(&rpc, &places, &users, &sent, &final_status, &mut report).await;
        resend_sample(&rpc, &places, &sent, &final_status, &p, &mut rng, &mut report).await;
    }

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
                if p.retention.is_some() {
                    // Every message is past its retention: PROTOCOL §10, "a
                    // finished delivery's stream likewise".
                    for (stream, events) in &view.held {
                        report
                            .violations
                            .push(format!("{}: {stream} still holds {events:?} after every retention_until", r.id));
                    }
                }
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
/// Two-home mode, then: waits (same bound) until no relay has a delivery in
/// flight and both homes of every account hold the same records, and
/// checks each send's status at the sender's other home too.
async fn settle(
    rpc: &[Client],
    places: &[Vec<Place>],
    sent: &[Sent],
    p: &Params,
    report: &mut Report,
) -> BTreeMap<usize, Value> {
    let deadline = Instant::now() + p.settle_limit;
    let accepted: Vec<usize> = (0..sent.len()).filter(|i| matches!(sent[*i].answer, Answer::Accepted(_))).collect();
    let queries = accepted.iter().map(|i| (*i, sent[*i].plan.at)).collect();
    let finals = poll_terminal(rpc, places, sent, queries, deadline, p.settle_limit, report).await;
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
    if places.iter().any(|pls| pls.len() > 1) {
        wait_quiet_and_converged(rpc, places, deadline, p.settle_limit, report).await;
        // The send's status at the sender's other home: the same.
        let queries = accepted
            .iter()
            .filter(|i| places[sent[**i].plan.from].len() > 1)
            .map(|i| (*i, 1 - sent[*i].plan.at))
            .collect();
        let others = poll_terminal(rpc, places, sent, queries, deadline, p.settle_limit, report).await;
        for (i, st) in &others {
            let s = &sent[*i];
            let Answer::Accepted(reply) = &s.answer else { unreachable!() };
            let other = RELAY_IDS[places[s.plan.from][1 - s.plan.at].relay];
            if st["status"] != "target_accepted" || st["accepted_at"] != reply["accepted_at"] {
                report
                    .violations
                    .push(format!("{}: at {other} (the sender's other home) ends {st}; answered {reply}", s.plan.id));
            }
        }
    }
    finals
}

/// Polls `message.delivery.status` of messages `queries` ((index in
/// `sent`, which of the sender's homes to ask)) until each is no longer
/// `delivering`, at most until `deadline`. At the sender's other home an
/// error answer (the send not replicated there yet) is polled again too.
async fn poll_terminal(
    rpc: &[Client],
    places: &[Vec<Place>],
    sent: &[Sent],
    mut pending: Vec<(usize, usize)>,
    deadline: Instant,
    limit: Duration,
    report: &mut Report,
) -> BTreeMap<usize, Value> {
    let mut finals = BTreeMap::new();
    let mut last = BTreeMap::new();
    while !pending.is_empty() {
        let mut still = vec![];
        for (i, home) in pending {
            let s = &sent[i];
            let place = &places[s.plan.from][home];
            let other = home != s.plan.at;
            let params = json!({"message_id": s.plan.id});
            let st = match call(&rpc[place.relay], "message.delivery.status", Some(&place.token), &params).await {
                Ok(st) => st,
                Err(e) if other => {
                    last.insert(i, Value::String(e));
                    still.push((i, home));
                    continue;
                }
                Err(e) => {
                    report.violations.push(format!("{}: status query failed: {e}", s.plan.id));
                    continue;
                }
            };
            if st["status"] == "delivering" {
                last.insert(i, st);
                still.push((i, home));
            } else {
                finals.insert(i, st);
            }
        }
        pending = still;
        if !pending.is_empty() {
            if Instant::now() > deadline {
                for (i, home) in &pending {
                    let s = &sent[*i];
                    let at = if *home != s.plan.at {
                        format!(" at {}", RELAY_IDS[places[s.plan.from][*home].relay])
                    } else {
                        String::new()
                    };
                    report
                        .violations
                        .push(format!("{}{at}: still {} {} after {:?}", s.plan.id, last[i], "delivering", limit));
                }
                break;
            }
            // Waits for the relay processes' deliveries to settle: polls the pending statuses again (the deadline above records violations).
            actix_rt::time::sleep(Duration::from_millis(200)).await;
        }
    }
    finals
}

/// `relay_deliveries_in_flight` of a relay's `/metrics` (summed over
/// labels, if any).
async fn in_flight(c: &Client) -> Result<f64, String> {
    const METRIC: &str = "relay_deliveries_in_flight";
    let http = awc::Client::builder().timeout(Duration::from_secs(15)).finish();
    let mut resp = http.get(format!("{}/metrics", c.base)).send().await.map_err(|e| format!("GET /metrics: {e}"))?;
    let body = resp.body().limit(64 << 20).await.map_err(|e| format!("GET /metrics body: {e}"))?;
    let text = String::from_utf8_lossy(&body);
    let samples: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(METRIC))
        .filter(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        .filter_map(|rest| rest.rsplit(' ').next()?.parse().ok())
        .collect();
    if samples.is_empty() {
        return Err(format!("no {METRIC} in /metrics (HTTP {})", resp.status()));
    }
    Ok(samples.iter().sum())
}

/// A record as both homes of an account must hold it, keyed by the order
/// both agree on (`(envelope.created_at, envelope.message_id)`, then
/// direction): without `sequence` (each home numbers its own) and the
/// acceptance times (each home may have accepted its own delivery).
type SharedRecord = ((u64, String, String), Value);

fn replica_view(records: &[Value]) -> Vec<SharedRecord> {
    let mut view: Vec<SharedRecord> = records
        .iter()
        .map(|r| {
            let mut shared = r.clone();
            if let Some(o) = shared.as_object_mut() {
                for k in ["sequence", "accepted_at", "expires_at"] {
                    o.remove(k);
                }
            }
            let env = &r["envelope"];
            let key = (
                env["created_at"].as_u64().unwrap_or(0),
                env["message_id"].as_str().unwrap_or("?").to_string(),
                r["direction"].as_str().unwrap_or("?").to_string(),
            );
            (key, shared)
        })
        .collect();
    view.sort_by(|a, b| a.0.cmp(&b.0));
    view
}

/// How account `u`'s two homes differ (None: the same records, same order).
fn homes_differ(u: usize, homes: [(usize, &[Value]); 2]) -> Option<String> {
    let (a, b) = (replica_view(homes[0].1), replica_view(homes[1].1));
    if a == b {
        return None;
    }
    let keys = |v: &[SharedRecord]| v.iter().map(|(k, _)| k.clone()).collect::<BTreeSet<_>>();
    let (ka, kb) = (keys(&a), keys(&b));
    let only_a: Vec<_> = ka.difference(&kb).take(3).collect();
    let only_b: Vec<_> = kb.difference(&ka).take(3).collect();
    let changed: Vec<_> = a
        .iter()
        .filter(|(k, v)| b.iter().any(|(kb, vb)| kb == k && vb != v))
        .take(2)
        .map(|(k, v)| {
            let other = &b.iter().find(|(kb, _)| kb == k).expect("found above").1;
            format!("{k:?}: {v} vs {other}")
        })
        .collect();
    let (ra, rb) = (RELAY_IDS[homes[0].0], RELAY_IDS[homes[1].0]);
    Some(format!(
        "account {u}: its homes differ: {ra} holds {} records, {rb} {}; only at {ra} {only_a:?}; only at {rb} {only_b:?}; different {changed:?}",
        a.len(),
        b.len()
    ))
}

/// Two-home mode: waits (until `deadline`) until every relay reports no
/// delivery in flight (the sender's other home's own deliveries ended too)
/// and both homes of every account hold the same records.
async fn wait_quiet_and_converged(
    rpc: &[Client],
    places: &[Vec<Place>],
    deadline: Instant,
    limit: Duration,
    report: &mut Report,
) {
    loop {
        let mut why = vec![];
        for (r, c) in rpc.iter().enumerate() {
            match in_flight(c).await {
                Ok(0.0) => {}
                Ok(n) => why.push(format!("{}: {n} deliveries in flight", RELAY_IDS[r])),
                Err(e) => why.push(format!("{}: {e}", RELAY_IDS[r])),
            }
        }
        if why.is_empty() {
            for (u, pls) in places.iter().enumerate().filter(|(_, pls)| pls.len() == 2) {
                let mut held = vec![];
                for pl in pls {
                    match timeline(&rpc[pl.relay], &pl.token).await {
                        Ok(records) => held.push(records),
                        Err(e) => why.push(format!("account {u} at {}: {e}", RELAY_IDS[pl.relay])),
                    }
                }
                if let [a, b] = &held[..] {
                    if let Some(d) = homes_differ(u, [(pls[0].relay, a), (pls[1].relay, b)]) {
                        why.push(d);
                    }
                }
            }
        }
        if why.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            for w in why {
                report.violations.push(format!("not settled after {limit:?}: {w}"));
            }
            return;
        }
        // Waits for the relay processes' deliveries and replication rounds: polls the metrics and timelines again (the deadline above records violations).
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Record identity in a timeline: (direction, from, message_id).
type RecordKey = (String, String, String);

/// Every account's records at each of its homes: (account, relay, records).
async fn all_timelines(rpc: &[Client], places: &[Vec<Place>], report: &mut Report) -> Vec<(usize, usize, Vec<Value>)> {
    let mut out = vec![];
    for (u, pls) in places.iter().enumerate() {
        for pl in pls {
            match timeline(&rpc[pl.relay], &pl.token).await {
                Ok(records) => out.push((u, pl.relay, records)),
                Err(e) => {
                    report.violations.push(format!("{}: timeline sync failed: {e}", label(u, pls, pl.relay)));
                    out.push((u, pl.relay, vec![]));
                }
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
    places: &[Vec<Place>],
    users: &[User],
    sent: &[Sent],
    finals: &BTreeMap<usize, Value>,
    report: &mut Report,
) {
    // What each account must hold (exactly once) and may hold (at most once),
    // at each of its homes.
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
    let timelines = all_timelines(rpc, places, report).await;
    for (u, relay, records) in &timelines {
        let (u, who) = (*u, label(*u, &places[*u], *relay));
        report.records += records.len();
        let seqs: Vec<u64> = records.iter().map(|r| r["sequence"].as_u64().unwrap_or(0)).collect();
        if seqs != (1..=records.len() as u64).collect::<Vec<_>>() {
            let bad: Vec<_> = seqs.windows(2).filter(|w| w[1] != w[0] + 1).take(5).collect();
            report.violations.push(format!(
                "{who}: sequences are not 1..={} (first {:?}, breaks {bad:?})",
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
                    .push(format!("{who}: sent record {} shows {}", r["envelope"]["message_id"], r["delivery"]));
            }
        }
        for (k, n) in &counts {
            if *n > 1 {
                report.violations.push(format!("{who}: DUPLICATE {k:?} held {n} times"));
            } else if !must[u].contains(k) && !may[u].contains(k) {
                report.violations.push(format!("{who}: unexpected record {k:?}"));
            }
        }
        for k in &must[u] {
            if !counts.contains_key(k) {
                report.violations.push(format!("{who}: LOST {k:?}"));
            }
        }
    }
    // Two homes: the same records, in the same (created_at, message_id) order.
    for (u, pls) in places.iter().enumerate().filter(|(_, pls)| pls.len() == 2) {
        let held: Vec<(usize, &[Value])> =
            timelines.iter().filter(|t| t.0 == u).map(|(_, r, records)| (*r, records.as_slice())).collect();
        let [a, b] = held[..] else {
            report.violations.push(format!("account {u}: {} timelines for {} homes", held.len(), pls.len()));
            continue;
        };
        if let Some(d) = homes_differ(u, [a, b]) {
            report.violations.push(d);
        }
        let times = |records: &[Value]| -> BTreeMap<RecordKey, (Value, Value)> {
            records.iter().map(|r| (key_of(r), (r["accepted_at"].clone(), r["expires_at"].clone()))).collect()
        };
        let (ta, tb) = (times(a.1), times(b.1));
        report.home_times_differ += ta.iter().filter(|(k, t)| tb.get(*k).is_some_and(|o| o != *t)).count();
    }
}

/// Re-sends a random sample of accepted requests byte for byte (each to the
/// relay that accepted it): each answers its final status, and no timeline
/// changes (at any home).
async fn resend_sample(
    rpc: &[Client],
    places: &[Vec<Place>],
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
    let before = all_timelines(rpc, places, &mut scratch).await;
    for i in &sample {
        let s = &sent[*i];
        let at = &places[s.plan.from][s.plan.at];
        let t = send_until_answered(&rpc[at.relay], &at.token, &s.body).await;
        match t.answer {
            Answer::Accepted(v) if v == finals[i] => {}
            other => report.violations.push(format!("{}: duplicate answered {other:?}, not {}", s.plan.id, finals[i])),
        }
        report.resent += 1;
    }
    let after = all_timelines(rpc, places, &mut scratch).await;
    report.violations.extend(scratch.violations);
    for ((u, relay, b), (_, _, a)) in before.iter().zip(&after) {
        if b != a {
            report.violations.push(format!(
                "{}: re-sent duplicates changed the timeline ({} → {} records)",
                label(*u, &places[*u], *relay),
                b.len(),
                a.len()
            ));
        }
    }
}

// ---- two homes ---------------------------------------------------------------

/// Registers account `seed` at `pair[0]` with a route naming both homes
/// `pair` (public discovery on); its phone's session is at `pair[0]`.
async fn register_two_homes(rpc: &[Client], ids: &[&str], pair: [usize; 2], seed: u8) -> User {
    let homes = pair.map(|r| (ids[r], rpc[r].base.as_str()));
    User::register_two_homes(&Client::new(&rpc[pair[0]].base), seed, homes, true).await
}

/// The phone's session at the account's other home `relay_id`, once the
/// account has replicated there.
async fn session_at(user: &User, c: &Client, relay_id: &str) -> String {
    user.at_other_home(c, relay_id, REPLICATED_LIMIT).await.tokens.remove(0)
}
