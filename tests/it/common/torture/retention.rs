//! Retention mode of the crash torture ([`super::Params::retention`]):
//! relays delete what is past `limits.message_retention` (PROTOCOL §10)
//! while the killer stops them. A checker watches every accepted message
//! from its answer on, during the load (between and across kills) and
//! after it:
//!
//! - within retention (its `retention_until` = the answer's `accepted_at` +
//!   retention, still ahead of the moment the check's answer came back, by
//!   at least a second) its status is answered with that `accepted_at`, and
//!   once it is `target_accepted` the recipient's timeline holds its record
//!   (and the sender's its `sent` record, with sender boxes); a
//!   `message_expired`, a `not_found` or a missing record then is a
//!   deletion before `retention_until`;
//! - no record is held twice, nor at two sequences over the run (one swept
//!   and made again), and no timeline holds a record of no planned message;
//! - every message is seen whole within its retention at least once;
//! - re-sends while retained answer the message's status; once every
//!   message is past its retention (polled, bounded) every status answers
//!   `message_expired` and every timeline is empty; re-sends then answer
//!   `message_expired` and make no record; a fresh message per account
//!   then takes the sequence after every record the account ever had, so
//!   no hidden second record took one.
//!
//! Timing: a check is decided on the harness's clock taken after its
//! answer (the relay decided at or before that), in whole seconds as the
//! relay's clock; a check whose margin is under a second decides nothing.

use super::{
    key_of, retry_after, send_until_answered, sync_pages, Answer, Place, Planned, RecordKey, Report, Sent, RETRYABLE,
};
use crate::common::client::{now, Client, User};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use relay_actors::account::sweep::DEFER_SECS;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::{Duration, Instant};

/// The retention mode's settings.
#[derive(Clone, Debug)]
pub struct Retention {
    /// `limits.message_retention`, in seconds.
    pub secs: u64,
    /// `limits.retention_sweep`, in seconds.
    pub sweep_secs: u64,
    /// The load is spread over at least this long (message `i` is sent no
    /// earlier than `i / messages` of it after the start), so that sweeps
    /// run while relays are still being killed.
    pub span: Duration,
    /// Messages a checker round looks at besides those not yet seen whole.
    pub sample: usize,
    /// Accepted messages re-sent once all are swept.
    pub expired_resends: usize,
    /// Bound on the wait for every deletion once all are past retention.
    pub delete_limit: Duration,
}

impl Retention {
    /// The `[limits]` lines (appended to a config whose last section is
    /// `[limits]`).
    pub fn limits(&self) -> String {
        format!("message_retention = \"{}s\"\nretention_sweep = \"{}s\"\n", self.secs, self.sweep_secs)
    }
}

/// What the retention checks did.
#[derive(Clone, Debug, Default)]
pub struct Figures {
    pub retention_secs: u64,
    pub sweep_secs: u64,
    /// Checker rounds during the load, and after it.
    pub rounds_load: usize,
    pub rounds_after: usize,
    /// Status queries answered within retention (during the load, after).
    pub status_within_load: usize,
    pub status_within_after: usize,
    /// Records found where they must be, within retention.
    pub records_within_load: usize,
    pub records_within_after: usize,
    /// Messages seen whole (status and every record) within retention.
    pub messages_seen_whole: usize,
    /// The smallest margin (seconds from a passed check's answer to the
    /// message's `retention_until`).
    pub min_margin: Option<u64>,
    /// Statuses and records still there past `retention_until` (allowed
    /// within a sweep interval).
    pub present_past: usize,
    /// Messages seen answering `message_expired`, records seen gone
    /// (deletions observed), and how many of both during the load.
    pub statuses_deleted: usize,
    pub records_deleted: usize,
    /// Distinct records seen over the run (every one gone at the end, or
    /// the run has a violation).
    pub records_seen: usize,
    pub deleted_during_load: usize,
    /// The longest time from a message's `retention_until` to the first
    /// check that found it deleted (an upper bound of the sweep's lag, as
    /// often as the checker looked).
    pub max_lag_secs: u64,
    /// A status or record seen again after it was seen deleted (a kill
    /// lost a sweep's commit that a read had seen: redone later).
    pub reappeared: usize,
    /// Checks that got no answer (the relay was down).
    pub no_answer: usize,
    /// Re-sends while retained answered the status; re-sends at the edge
    /// answered `message_expired` (past retention by then); re-sends after
    /// the sweep answered `message_expired`.
    pub resent_retained: usize,
    pub resent_at_edge: usize,
    pub resent_swept: usize,
    /// From the last `retention_until` until every deletion was seen.
    pub all_deleted_after: Option<Duration>,
    /// Accounts whose next sequence after the sweep was checked.
    pub watermarks: usize,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "  retention {} s, sweep every {} s; checker rounds {} during the load, {} after",
            self.retention_secs, self.sweep_secs, self.rounds_load, self.rounds_after
        )?;
        writeln!(
            f,
            "  within retention: {} + {} status checks, {} + {} record checks (load + after); {} messages seen whole; smallest margin {:?} s",
            self.status_within_load,
            self.status_within_after,
            self.records_within_load,
            self.records_within_after,
            self.messages_seen_whole,
            self.min_margin
        )?;
        writeln!(
            f,
            "  deletions observed: {} statuses message_expired, {} records gone ({} of these deletions during the load); {} distinct records seen in all, none left; {} still there past retention_until; first seen deleted at most {} s after retention_until; {} reappeared; {} checks unanswered",
            self.statuses_deleted,
            self.records_deleted,
            self.deleted_during_load,
            self.records_seen,
            self.present_past,
            self.max_lag_secs,
            self.reappeared,
            self.no_answer
        )?;
        writeln!(
            f,
            "  re-sends: {} answered their status within retention, {} message_expired at the edge, {} message_expired after the sweep; all deleted {:.1?} after the last retention_until; {} sequence watermarks",
            self.resent_retained, self.resent_at_edge, self.resent_swept, self.all_deleted_after, self.watermarks
        )
    }
}

/// An accepted message as the checker knows it.
#[derive(Clone, Debug)]
pub(super) struct Kept {
    pub i: usize,
    pub plan: Planned,
    pub accepted_at: u64,
    pub until: u64,
}

impl Kept {
    pub fn of(i: usize, s: &Sent, retention: u64) -> Option<Kept> {
        let Answer::Accepted(v) = &s.answer else { return None };
        let accepted_at = v["accepted_at"].as_u64()?;
        Some(Kept { i, plan: s.plan.clone(), accepted_at, until: accepted_at + retention })
    }
}

/// What the checker saw of one message.
#[derive(Debug, Default)]
struct Seen {
    terminal: Option<Value>,
    status_within: bool,
    /// Accounts whose record of it was seen within retention.
    records_within: BTreeSet<usize>,
    /// When it was first seen deleted (harness seconds).
    expired_at: Option<u64>,
    records_gone: BTreeSet<usize>,
}

enum Probe {
    Answer(u16, Value),
    NoAnswer,
}

/// One try (no retry: a relay that is down is looked at next round).
async fn probe(c: &Client, method: &str, token: &str, params: &Value) -> Probe {
    match c.try_raw(method, Some(token), &serde_json::to_vec(params).unwrap()).await {
        Ok((_, v)) if retry_after(&v).is_some() => Probe::NoAnswer,
        Ok((_, v)) if v["error"]["code"].as_str().is_some_and(|c| RETRYABLE.contains(&c)) => Probe::NoAnswer,
        Ok((status, v)) => Probe::Answer(status, v),
        Err(_) => Probe::NoAnswer,
    }
}

/// Every record, each page tried once.
async fn timeline_once(c: &Client, token: &str) -> Result<Vec<Value>, String> {
    sync_pages(|after| async move {
        match probe(c, "message.timeline.sync", token, &json!({"after": after, "limit": 500})).await {
            Probe::Answer(200, page) => Ok(page),
            Probe::Answer(status, v) => Err(format!("HTTP {status} {v}")),
            Probe::NoAnswer => Err("no answer".into()),
        }
    })
    .await
}

/// The checker: what it knows and found.
pub(super) struct Watch {
    retention: u64,
    /// Messages a round looks at besides those not yet seen whole.
    sample: usize,
    ids: Vec<String>,
    /// Per account, the records any planned message could leave.
    may: Vec<BTreeSet<RecordKey>>,
    seen: BTreeMap<usize, Seen>,
    /// Per account, the sequences each record was seen at.
    seqs: Vec<BTreeMap<RecordKey, BTreeSet<u64>>>,
    /// Violations already reported once (by key).
    flagged: BTreeSet<String>,
    rng: StdRng,
    pub figures: Figures,
    pub violations: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Load,
    After,
}

impl Watch {
    pub fn new(r: &Retention, seed: u64, users: &[User], plan: &[Planned]) -> Watch {
        let ids: Vec<String> = users.iter().map(|u| u.id().to_string()).collect();
        let mut may = vec![BTreeSet::new(); users.len()];
        for m in plan {
            for (u, key) in records_of(&ids, m) {
                may[u].insert(key);
            }
        }
        Watch {
            retention: r.secs,
            sample: r.sample,
            seqs: vec![BTreeMap::new(); users.len()],
            ids,
            may,
            seen: BTreeMap::new(),
            flagged: BTreeSet::new(),
            rng: StdRng::seed_from_u64(seed ^ 0x7265_7465),
            figures: Figures { retention_secs: r.secs, sweep_secs: r.sweep_secs, ..Figures::default() },
            violations: vec![],
        }
    }

    fn flag(&mut self, key: String, violation: String) {
        if self.flagged.insert(key) {
            self.violations.push(violation);
        }
    }

    /// Whether `k` was seen whole within retention.
    fn whole(&self, k: &Kept) -> bool {
        self.seen.get(&k.i).is_some_and(|s| {
            s.terminal.is_some()
                && s.status_within
                && records_of(&self.ids, &k.plan).iter().all(|(u, _)| s.records_within.contains(u))
        })
    }

    fn delivered(&self, k: &Kept) -> bool {
        self.seen.get(&k.i).is_some_and(|s| s.terminal.is_some())
    }

    /// This round's messages: those not yet seen whole (still retained),
    /// then the retained ones nearest their `retention_until`, the past
    /// ones not yet seen deleted (the oldest first), and a random few not
    /// yet seen deleted.
    fn pick<'k>(&mut self, kept: &'k [Kept], at: u64) -> Vec<&'k Kept> {
        const MAX: usize = 40;
        let sample = self.sample;
        let mut chosen: BTreeSet<usize> = BTreeSet::new();
        let mut out = vec![];
        for k in kept.iter().filter(|k| !self.whole(k) && k.until > at) {
            if out.len() < MAX && chosen.insert(k.i) {
                out.push(k);
            }
        }
        let mut retained: Vec<&Kept> = kept.iter().filter(|k| k.until > at && !chosen.contains(&k.i)).collect();
        retained.sort_by_key(|k| k.until);
        for k in retained.into_iter().take(sample / 2) {
            if chosen.insert(k.i) {
                out.push(k);
            }
        }
        let live: Vec<&Kept> =
            kept.iter().filter(|k| self.seen.get(&k.i).is_none_or(|s| s.expired_at.is_none())).collect();
        // Past and not yet seen deleted, the oldest first: the sweep's lag.
        let mut past: Vec<&Kept> = live.iter().copied().filter(|k| k.until <= at).collect();
        past.sort_by_key(|k| k.until);
        for k in past.into_iter().take(sample / 4) {
            if chosen.insert(k.i) {
                out.push(k);
            }
        }
        for _ in 0..sample / 4 {
            if live.is_empty() {
                break;
            }
            let k = live[self.rng.random_range(0..live.len())];
            if chosen.insert(k.i) {
                out.push(k);
            }
        }
        out
    }

    /// Checks the status of each of `kept`, then the timelines that must
    /// hold their records.
    async fn round(&mut self, rpc: &[Client], places: &[Vec<Place>], kept: &[&Kept], phase: Phase) {
        match phase {
            Phase::Load => self.figures.rounds_load += 1,
            Phase::After => self.figures.rounds_after += 1,
        }
        for k in kept {
            let pl = &places[k.plan.from][k.plan.at];
            let params = json!({"message_id": k.plan.id});
            let answer = probe(&rpc[pl.relay], "message.delivery.status", &pl.token, &params).await;
            let t1 = now();
            self.status(k, t1, answer, phase);
        }
        let delivered: Vec<&Kept> = kept.iter().copied().filter(|k| self.delivered(k)).collect();
        let mut accounts = BTreeSet::new();
        for k in &delivered {
            accounts.extend(records_of(&self.ids, &k.plan).into_iter().map(|(u, _)| u));
        }
        for u in accounts {
            let pl = &places[u][0];
            let got = timeline_once(&rpc[pl.relay], &pl.token).await;
            let t1 = now();
            let Ok(records) = got else {
                self.figures.no_answer += 1;
                continue;
            };
            self.timeline(u, &records);
            let held: BTreeMap<RecordKey, &Value> = records.iter().map(|r| (key_of(r), r)).collect();
            for k in &delivered {
                for (v, key) in records_of(&self.ids, &k.plan) {
                    if v == u {
                        self.record(k, u, held.get(&key).copied(), t1, phase);
                    }
                }
            }
        }
    }

    fn margin(&mut self, until: u64, t1: u64) {
        let m = until - t1;
        self.figures.min_margin = Some(self.figures.min_margin.map_or(m, |o| o.min(m)));
    }

    fn deleted(&mut self, k: &Kept, t1: u64, phase: Phase) {
        self.figures.max_lag_secs = self.figures.max_lag_secs.max(t1.saturating_sub(k.until));
        if phase == Phase::Load {
            self.figures.deleted_during_load += 1;
        }
    }

    /// A status answer got at (by) `t1`.
    fn status(&mut self, k: &Kept, t1: u64, answer: Probe, phase: Phase) {
        // The relay decided at or before t1: retained then if this holds.
        let retained = k.until > t1;
        let id = &k.plan.id;
        let Probe::Answer(code, st) = answer else {
            self.figures.no_answer += 1;
            return;
        };
        // A swept entry: 422 `message_expired` (or, had the relay swept it
        // while its retention ran, the swept form's `failed` with that code).
        let expired = st["error"]["code"] == "message_expired";
        match (code, expired) {
            (200, false) => {
                if st["accepted_at"].as_u64() != Some(k.accepted_at) {
                    self.flag(format!("at {id}"), format!("{id}: status {st}, answered accepted_at {}", k.accepted_at));
                }
                match st["status"].as_str() {
                    Some("delivering") => {}
                    Some("target_accepted") => {
                        let seen = self.seen.entry(k.i).or_default();
                        match &seen.terminal {
                            Some(t) if *t != st => {
                                let v = format!("{id}: terminal status changed: {t}, now {st}");
                                self.flag(format!("terminal {id}"), v);
                            }
                            Some(_) => {}
                            None => seen.terminal = Some(st.clone()),
                        }
                    }
                    _ => self.flag(format!("ended {id}"), format!("{id}: accepted but ended {st}")),
                }
                let seen = self.seen.entry(k.i).or_default();
                if seen.expired_at.is_some() {
                    self.figures.reappeared += 1;
                }
                if retained {
                    seen.status_within = true;
                    self.margin(k.until, t1);
                    match phase {
                        Phase::Load => self.figures.status_within_load += 1,
                        Phase::After => self.figures.status_within_after += 1,
                    }
                } else {
                    self.figures.present_past += 1;
                }
            }
            (_, true) if retained => self.flag(
                format!("early {id}"),
                format!(
                    "{id}: DELETED EARLY: status answered {st} at {t1}, retention_until {} (accepted_at {})",
                    k.until, k.accepted_at
                ),
            ),
            (_, true) => {
                if code != 422 {
                    // Only a swept entry whose retention had not ended is
                    // answered so (past it the relay answers 422).
                    let v = format!(
                        "{id}: DELETED EARLY: status answered HTTP {code} {st} at {t1} (the swept form), retention_until {}",
                        k.until
                    );
                    self.flag(format!("form {id}"), v);
                }
                let seen = self.seen.entry(k.i).or_default();
                if seen.expired_at.is_none() {
                    seen.expired_at = Some(t1);
                    self.figures.statuses_deleted += 1;
                    self.deleted(k, t1, phase);
                }
            }
            _ => {
                let when = if retained { "within" } else { "past" };
                let v = format!(
                    "{id}: status answered HTTP {code} {st} at {t1}, {when} retention (until {}; want {})",
                    k.until,
                    if retained { "its status" } else { "its status or message_expired" }
                );
                self.flag(format!("status {id}"), v);
            }
        }
    }

    /// Account `u`'s record of delivered `k`, as a sync that ended by `t1`
    /// found it.
    fn record(&mut self, k: &Kept, u: usize, found: Option<&Value>, t1: u64, phase: Phase) {
        let id = &k.plan.id;
        // The record's own retention_until (it may have been accepted
        // later than the send), else the send's, which is not later.
        let until = found.and_then(|r| r["expires_at"].as_u64()).unwrap_or(k.until);
        let retained = until > t1;
        let seen = self.seen.entry(k.i).or_default();
        match found {
            Some(_) => {
                if seen.records_gone.contains(&u) {
                    self.figures.reappeared += 1;
                }
                if retained {
                    seen.records_within.insert(u);
                    self.margin(until, t1);
                    match phase {
                        Phase::Load => self.figures.records_within_load += 1,
                        Phase::After => self.figures.records_within_after += 1,
                    }
                } else {
                    self.figures.present_past += 1;
                }
            }
            None if retained => self.flag(
                format!("lost {id} {u}"),
                format!(
                    "{id}: LOST or DELETED EARLY: account {u}'s record missing at {t1}, retention_until {} (accepted_at {})",
                    k.until, k.accepted_at
                ),
            ),
            None => {
                if seen.records_gone.insert(u) {
                    self.figures.records_deleted += 1;
                    self.deleted(k, t1, phase);
                }
            }
        }
    }

    /// One timeline of account `u`: no record twice, none at a second
    /// sequence over the run, none of no planned message, sequences rising.
    fn timeline(&mut self, u: usize, records: &[Value]) {
        let mut counts: BTreeMap<RecordKey, usize> = BTreeMap::new();
        let mut last = 0;
        for r in records {
            let key = key_of(r);
            *counts.entry(key.clone()).or_default() += 1;
            let seq = r["sequence"].as_u64().unwrap_or(0);
            if seq <= last {
                self.flag(format!("order {u} {seq}"), format!("account {u}: sequence {seq} after {last}"));
            }
            last = seq;
            let seqs = self.seqs[u].entry(key.clone()).or_default();
            seqs.insert(seq);
            if seqs.len() > 1 {
                let v = format!("account {u}: DUPLICATE {key:?} held at sequences {seqs:?} over the run");
                self.flag(format!("dup {u} {key:?}"), v);
            }
            if !self.may[u].contains(&key) {
                self.flag(format!("unexpected {u} {key:?}"), format!("account {u}: unexpected record {key:?}"));
            }
        }
        for (key, n) in counts.into_iter().filter(|(_, n)| *n > 1) {
            self.flag(format!("twice {u} {key:?}"), format!("account {u}: DUPLICATE {key:?} held {n} times"));
        }
    }
}

/// The records message `m` leaves: (account, key).
fn records_of(ids: &[String], m: &Planned) -> Vec<(usize, RecordKey)> {
    let from = ids[m.from].clone();
    let mut out = vec![(m.to, ("received".to_string(), from.clone(), m.id.clone()))];
    if m.from != m.to && m.sender_boxes {
        out.push((m.from, ("sent".to_string(), from, m.id.clone())));
    }
    out
}

/// The accepted messages of the answers so far.
pub(super) fn kept(results: &[Option<Sent>], retention: u64) -> Vec<Kept> {
    results.iter().enumerate().filter_map(|(i, s)| Kept::of(i, s.as_ref()?, retention)).collect()
}

/// Between two checker rounds.
const ROUND_PAUSE: Duration = Duration::from_millis(250);

async fn pause() {
    // Waits for the relay processes to change what the checker reads (deliveries, sweeps, restarts): the round interval.
    actix_rt::time::sleep(ROUND_PAUSE).await;
}

/// During the load: rounds until `done` says the load ended.
pub(super) async fn during_load(
    mut watch: Watch,
    rpc: Vec<Client>,
    places: std::rc::Rc<Vec<Vec<Place>>>,
    results: std::rc::Rc<std::cell::RefCell<Vec<Option<Sent>>>>,
    done: std::rc::Rc<std::cell::Cell<bool>>,
) -> Watch {
    while !done.get() {
        let kept = kept(&results.borrow(), watch.retention);
        let chosen: Vec<Kept> = watch.pick(&kept, now()).into_iter().cloned().collect();
        let refs: Vec<&Kept> = chosen.iter().collect();
        watch.round(&rpc, &places, &refs, Phase::Load).await;
        pause().await;
    }
    watch
}

/// After the load: see the module doc. Findings go to `report`.
#[allow(clippy::too_many_arguments)]
pub(super) async fn after_load(
    mut watch: Watch,
    r: &Retention,
    rpc: &[Client],
    places: &[Vec<Place>],
    users: &[User],
    sent: &[Sent],
    settle_limit: Duration,
    resend_sample: usize,
    report: &mut Report,
) {
    let kept: Vec<Kept> = sent.iter().enumerate().filter_map(|(i, s)| Kept::of(i, s, r.secs)).collect();
    let last_until = kept.iter().map(|k| k.until).max().unwrap_or(0);

    // Until every message was seen whole within retention (or is past it).
    let deadline = Instant::now() + settle_limit;
    loop {
        let t = now();
        let open: Vec<&Kept> = kept.iter().filter(|k| !watch.whole(k) && k.until > t).collect();
        if open.is_empty() || Instant::now() > deadline {
            break;
        }
        let chosen: Vec<&Kept> = watch.pick(&kept, t);
        watch.round(rpc, places, &chosen, Phase::After).await;
        pause().await;
    }
    for k in &kept {
        if !watch.whole(k) {
            let seen = watch.seen.get(&k.i);
            watch
                .violations
                .push(format!("{}: not seen whole within its retention (until {}): {seen:?}", k.plan.id, k.until));
        }
    }
    watch.figures.messages_seen_whole = kept.iter().filter(|k| watch.whole(k)).count();

    // Every message still retained, at once.
    let t = now();
    let retained: Vec<&Kept> = kept.iter().filter(|k| k.until > t).collect();
    watch.round(rpc, places, &retained, Phase::After).await;

    // Re-sends while retained: the message's status, no new record (a new
    // one would show at a second sequence in a later round).
    let mut candidates: Vec<&Kept> = kept.iter().filter(|k| k.until > now() + 2).collect();
    for _ in 0..resend_sample.min(candidates.len()) {
        let k = candidates.swap_remove(watch.rng.random_range(0..candidates.len()));
        let s = &sent[k.i];
        let pl = &places[k.plan.from][k.plan.at];
        let t = send_until_answered(&rpc[pl.relay], &pl.token, &s.body).await;
        let t1 = now();
        let terminal = watch.seen.get(&k.i).and_then(|s| s.terminal.clone());
        match t.answer {
            Answer::Accepted(v) if Some(&v) == terminal.as_ref() => watch.figures.resent_retained += 1,
            Answer::Rejected(422, v) if v["error"]["code"] == "message_expired" && k.until <= t1 => {
                watch.figures.resent_at_edge += 1
            }
            other => watch.violations.push(format!(
                "{}: re-sent within retention (until {}, answered by {t1}) answered {other:?}, not {terminal:?}",
                k.plan.id, k.until
            )),
        }
        report.resent += 1;
    }

    // Until every message is past its retention: rounds (nothing may go
    // early), then every account's timeline once more.
    let all: BTreeSet<usize> = (0..places.len()).collect();
    while now() <= last_until {
        let chosen = watch.pick(&kept, now());
        watch.round(rpc, places, &chosen, Phase::After).await;
        pause().await;
    }
    sync_all(&mut watch, rpc, places, &all).await;

    // Every deletion, bounded: statuses message_expired, timelines empty.
    let past_all = Instant::now();
    let deadline = past_all + Duration::from_secs(r.sweep_secs) + r.delete_limit;
    let mut why;
    loop {
        why = vec![];
        let open: Vec<&Kept> =
            kept.iter().filter(|k| watch.seen.get(&k.i).is_none_or(|s| s.expired_at.is_none())).collect();
        watch.round(rpc, places, &open, Phase::After).await;
        for k in open.iter().filter(|k| watch.seen.get(&k.i).is_none_or(|s| s.expired_at.is_none())) {
            why.push(format!("{}: status not message_expired (retention_until {})", k.plan.id, k.until));
        }
        for (u, n) in sync_all(&mut watch, rpc, places, &all).await {
            why.push(format!("account {u}: {n} records left"));
        }
        if why.is_empty() || Instant::now() > deadline {
            break;
        }
        pause().await;
    }
    if why.is_empty() {
        watch.figures.all_deleted_after = Some(past_all.elapsed());
    }
    for w in why.iter().take(20) {
        watch.violations.push(format!("NOT DELETED {:?} after every retention_until: {w}", past_all.elapsed()));
    }
    // No answer shows a delivery stream (a status past its retention is
    // `message_expired` before the sweep): the stores are inspected after
    // the relays stop, once each sweep has caught up.
    caught_up(rpc, last_until, deadline, &mut watch).await;

    // Re-sends after the sweep: message_expired, and no record.
    let mut candidates: Vec<&Kept> = kept.iter().collect();
    for _ in 0..r.expired_resends.min(candidates.len()) {
        let k = candidates.swap_remove(watch.rng.random_range(0..candidates.len()));
        let pl = &places[k.plan.from][k.plan.at];
        let t = send_until_answered(&rpc[pl.relay], &pl.token, &sent[k.i].body).await;
        match t.answer {
            Answer::Rejected(422, v) if v["error"]["code"] == "message_expired" => watch.figures.resent_swept += 1,
            other => watch.violations.push(format!("{}: re-sent after the sweep answered {other:?}", k.plan.id)),
        }
        report.resent += 1;
    }
    for (u, n) in sync_all(&mut watch, rpc, places, &all).await {
        watch.violations.push(format!("account {u}: {n} records after the re-sends of swept messages"));
    }
    watermarks(&mut watch, rpc, places, users, sent).await;

    for s in watch.seen.values() {
        if let Some(t) = &s.terminal {
            *report.final_statuses.entry(t["status"].as_str().unwrap_or("?").to_string()).or_default() += 1;
        }
    }
    watch.figures.records_seen = watch.seqs.iter().map(BTreeMap::len).sum();
    report.violations.append(&mut watch.violations);
    report.retention = Some(watch.figures);
}

/// Waits (until `deadline`) until every relay's retention sweep has
/// handled everything past its retention (`last_until`): no delivery in
/// flight any more (seen at second `ended`), then a pass that left nothing
/// due after both `last_until` and `ended` + [`DEFER_SECS`] (a send still
/// delivering when its traces were due was deferred that long).
async fn caught_up(rpc: &[Client], last_until: u64, deadline: Instant, watch: &mut Watch) {
    const METRIC: &str = "relay_retention_caught_up_seconds ";
    let mut ended: Vec<Option<u64>> = vec![None; rpc.len()];
    loop {
        let mut why = vec![];
        for (r, c) in rpc.iter().enumerate() {
            if ended[r].is_none() {
                match super::in_flight(c).await {
                    Ok(0.0) => ended[r] = Some(now()),
                    Ok(n) => why.push(format!("relay {r}: {n} deliveries in flight")),
                    Err(e) => why.push(format!("relay {r}: {e}")),
                }
            }
            if let Some(ended) = ended[r] {
                let through = last_until.max(ended + DEFER_SECS);
                match c.metric(METRIC).await {
                    Some(t) if t > through as f64 => {}
                    other => why.push(format!("relay {r}: sweep caught up to {other:?}, not past {through}")),
                }
            }
        }
        if why.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            watch.violations.extend(why.into_iter().map(|w| format!("sweep never caught up: {w}")));
            return;
        }
        pause().await;
    }
}

/// Syncs each of `accounts` (bounded retries); the checks of
/// [`Watch::timeline`]; the accounts holding records: (account, records).
async fn sync_all(
    watch: &mut Watch,
    rpc: &[Client],
    places: &[Vec<Place>],
    accounts: &BTreeSet<usize>,
) -> Vec<(usize, usize)> {
    let mut held = vec![];
    for &u in accounts {
        let pl = &places[u][0];
        match super::timeline(&rpc[pl.relay], &pl.token).await {
            Ok(records) => {
                watch.timeline(u, &records);
                if !records.is_empty() {
                    held.push((u, records.len()));
                }
            }
            Err(e) => watch.violations.push(format!("account {u}: timeline sync failed: {e}")),
        }
    }
    held
}

/// After every deletion: a fresh self-message per account takes the next
/// sequence, which must follow every record the account had (accepted
/// messages' records, plus at most the unanswered ones'): a second record
/// made and swept unseen would have taken one more.
async fn watermarks(watch: &mut Watch, rpc: &[Client], places: &[Vec<Place>], users: &[User], sent: &[Sent]) {
    let (mut must, mut may) = (vec![0u64; users.len()], vec![0u64; users.len()]);
    for s in sent {
        for (u, _) in records_of(&watch.ids, &s.plan) {
            match s.answer {
                Answer::Accepted(_) => must[u] += 1,
                Answer::Unanswered(_) => may[u] += 1,
                Answer::Rejected(..) => {}
            }
        }
    }
    for (u, user) in users.iter().enumerate() {
        let pl = &places[u][0];
        let id = format!("torture-mark-{u:03}");
        let params = user.params_to(0, user.id(), &id, now(), &["phone"], None);
        let t = send_until_answered(&rpc[pl.relay], &pl.token, &serde_json::to_vec(&params).unwrap()).await;
        if !matches!(t.answer, Answer::Accepted(_)) {
            watch.violations.push(format!("account {u}: the watermark message answered {:?}", t.answer));
            continue;
        }
        let want = format!("{}..={}", must[u] + 1, must[u] + may[u] + 1);
        let found = crate::common::wait::poll(Duration::from_secs(30), || async {
            let records = super::timeline(&rpc[pl.relay], &pl.token).await?;
            match &records[..] {
                [r] if r["envelope"]["message_id"] == id.as_str() => Ok(r["sequence"].as_u64().unwrap_or(0)),
                _ => Err(format!("{} records: {:?}", records.len(), records.iter().map(key_of).collect::<Vec<_>>())),
            }
        })
        .await;
        match found {
            Ok(seq) if (must[u] + 1..=must[u] + may[u] + 1).contains(&seq) => watch.figures.watermarks += 1,
            Ok(seq) => watch.violations.push(format!(
                "account {u}: the next record took sequence {seq}, want {want}: records were made that no check saw"
            )),
            Err(e) => watch.violations.push(format!("account {u}: the watermark record: {e}")),
        }
    }
}
