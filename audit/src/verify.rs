//! `relay audit verify`: the whole log, or one stream, checked link by link.
//!
//! For every stream: the hash chain and sequence continuity
//! ([`ChainCheck`]: seq 1, 2, 3…, or from its pruned marker: the first kept
//! event is the marker's seq + 1 and links to the marker's hash; each
//! `prev` is the previous hash; each hash is `blake3(prev ‖ body)` over the
//! bytes as stored), every event decoded through the upcasters and folded
//! exactly as its actor folds it, from the marker's state when the stream
//! was pruned (plus the rules a fold accepts silently, e.g. a delivery
//! starts with `accepted`), and the stream's snapshot: at an existing event
//! (or the marker), with its hash, and equal to the state rebuilt (an
//! account snapshot from before the ledger left the state: its
//! `sends`/`receipts` equal to the ledger those events give, when nothing
//! was pruned). For an account, its idempotency ledger in the store must be
//! exactly the one its events give, in the layout its markers name
//! (`ledger::layout`: the hashed keys of `ledger.rs`, or the readable kv
//! keys `i/{account_id}/…` of version 1), unless the relay has not moved it
//! yet (it rebuilds that ledger at the account's next load), and except for
//! what retention leaves (PROTOCOL §10, `check_ledger`).
//! Snapshots of streams without events are reported too, and streams
//! pruned whole (a marker, no events) are listed and checked as such.
//! Deleting a stream's *last* events leaves a shorter valid chain; no log
//! can show that by itself.
//!
//! Streams are checked in parallel (one thread per core, up to 8), each
//! part of the key space in one pass ([`Store::visit_raw_range`]): each
//! event is read once, in place (its bytes lent from the mapped log, not
//! copied), hashed over its stored bytes and its data decoded once,
//! without building a JSON tree.

use super::{first_difference, pruned_text, stream_kind, AccountFold, AuditError, Folded, StreamKind};
use relay_actors::account::stored_layout;
use relay_actors::store::{ChainCheck, ChainProblem, Hash, Head, Pruned, RawEvent, Snapshot, Store, StoreError};
use relay_actors::upcast::Text;
use relay_core::account::ledger::{self, ReceiptEntry, SendEntry};
use relay_schemas::UnixSecs;
use std::fmt;
use std::sync::mpsc;

/// One broken link: stream, sequence, what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub stream: String,
    /// The event's sequence (for a snapshot, the sequence it claims; 0 when
    /// the record does not tell).
    pub seq: u64,
    pub problem: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// Hash chain, sequence or record layout.
    Chain(ChainProblem),
    /// The event does not decode as its stream's event type (or version).
    Event(String),
    /// The event decodes but breaks a rule of its stream.
    Rule(String),
    /// The snapshot is not the state the events give.
    Snapshot(String),
    /// The stream's pruned marker cannot be read, or its state is not the
    /// stream's.
    Marker(String),
    /// An account's idempotency ledger (kv projection) is not the one its
    /// events give.
    Ledger(String),
    /// The stream is of no known kind (neither `account/…` nor `delivery/…`).
    UnknownStream,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:?} seq {}: ", self.stream, self.seq)?;
        match &self.problem {
            Problem::Chain(ChainProblem::HashMismatch) => {
                write!(f, "hash mismatch: the stored event is not the one that was hashed (altered)")
            }
            Problem::Chain(ChainProblem::PrevMismatch) => {
                write!(f, "broken link: prev is not the hash of the event before it")
            }
            Problem::Chain(ChainProblem::MarkerMismatch) => {
                write!(f, "broken link: prev is not the hash the pruned marker keeps (of the last event pruned)")
            }
            Problem::Chain(ChainProblem::Gap { expected }) => {
                write!(f, "sequence gap: expected seq {expected} (events missing or out of place)")
            }
            Problem::Chain(ChainProblem::Decode(what)) => write!(f, "unreadable record: {what}"),
            Problem::Event(what) => write!(f, "undecodable event: {what}"),
            Problem::Rule(what) => write!(f, "event breaks a rule: {what}"),
            Problem::Snapshot(what) => write!(f, "snapshot: {what}"),
            Problem::Marker(what) => write!(f, "pruned marker: {what}"),
            Problem::Ledger(what) => write!(f, "ledger: {what}"),
            Problem::UnknownStream => write!(f, "stream of unknown kind: events not decoded"),
        }
    }
}

/// What a run of `verify` saw.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub streams: u64,
    pub events: u64,
    pub snapshots: u64,
    /// Streams with a pruned marker (of which `pruned_whole` have no events left).
    pub pruned: u64,
    pub pruned_whole: u64,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }

    fn add(&mut self, r: Report) {
        self.streams += r.streams;
        self.events += r.events;
        self.snapshots += r.snapshots;
        self.pruned += r.pruned;
        self.pruned_whole += r.pruned_whole;
        self.findings.extend(r.findings);
    }
}

/// How much of each event's data `verify` decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Depth {
    /// What the folds, rules and checks read: every event through the
    /// upcasters into its type, except the protocol objects of a timeline
    /// record (envelope, key boxes, sender certificate) and a delivery's
    /// params when no snapshot holds them, which only the hash chain
    /// covers: no state, ledger or rule reads them.
    Fold,
    /// Every protocol object too, as the actors read them.
    Full,
}

/// Verifies every stream (or only `only`), calling `progress(streams,
/// events)` as parts of the store are done. `now` is the audit's clock:
/// what retention may have swept from a ledger is what is past its
/// `retention_until` by then. Findings are in stream order, then seq order.
pub fn verify(
    store: &Store,
    only: Option<&str>,
    now: UnixSecs,
    depth: Depth,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<Report, AuditError> {
    let mut report = Report::default();
    let ctx = Ctx { store, now, depth };
    match only {
        Some(stream) => {
            if store.head(stream)?.seq == 0 && store.load_snapshot(stream).ok().flatten().is_none() {
                return Err(AuditError::Usage(format!("no stream {stream:?} in this store")));
            }
            verify_stream(&ctx, stream, store.read_raw(stream, 0), &mut report);
            progress(1, report.events);
        }
        None => {
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
            verify_all(&ctx, threads, &mut report, progress)?;
            orphan_snapshots(store, &mut report);
        }
    }
    Ok(report)
}

/// What every stream's check needs.
struct Ctx<'a> {
    store: &'a Store,
    now: UnixSecs,
    depth: Depth,
}

/// The bounds that split the stream ids into parts checked in parallel:
/// each kind's ids by their first two hex digits (no bound splits a stream).
fn bounds() -> Vec<String> {
    let hex = b"0123456789abcdef";
    let mut out = Vec::new();
    for kind in ["account/", "delivery/"] {
        for a in hex {
            for b in hex {
                out.push(format!("{kind}{}{}", *a as char, *b as char));
            }
        }
    }
    out
}

/// Every stream, the parts of the key space [`bounds`] makes `threads` at a
/// time, each read in one pass (streams are independent); `progress` runs
/// on the calling thread, the report keeps stream order.
fn verify_all(
    ctx: &Ctx,
    threads: usize,
    report: &mut Report,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), AuditError> {
    // Streams pruned whole have no events to come across: their markers.
    let mut markers = Vec::new();
    for item in ctx.store.pruned_markers() {
        markers.push(item?.0);
    }
    let bounds = bounds();
    let parts: Vec<(Option<&str>, Option<&str>)> = std::iter::once(None)
        .chain(bounds.iter().map(|b| Some(b.as_str())))
        .zip(bounds.iter().map(|b| Some(b.as_str())).chain(std::iter::once(None)))
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<(usize, Report)>();
    let mut done = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (tx, next, parts, markers) = (tx.clone(), &next, &parts, &markers);
            scope.spawn(move || loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&(from, to)) = parts.get(i) else { break };
                let mut r = Report::default();
                verify_part(ctx, from.unwrap_or(""), to, markers, &mut r);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, r) in rx {
            progress(r.streams, r.events);
            done.push((i, r));
        }
    });
    done.sort_by_key(|(i, _)| *i);
    for (_, r) in done {
        report.add(r);
    }
    Ok(())
}

/// The streams with ids in `from..to`: those with events in one pass over
/// their keys, each event borrowed from the store's bytes as the pass goes
/// ([`Store::visit_raw_range`]), and those of `markers` (sorted) in the
/// part that have none.
fn verify_part(ctx: &Ctx, from: &str, to: Option<&str>, markers: &[String], report: &mut Report) {
    let within = |s: &str| s >= from && to.is_none_or(|t| s < t);
    let mut whole = markers.iter().filter(|m| within(m)).peekable();
    let mut check: Option<StreamCheck> = None;
    let walked = ctx.store.visit_raw_range(from, to, &mut |item| {
        let (stream, event) = match item {
            Ok(item) => item,
            Err(e) => {
                // A key that names no stream (or a pair unread): the stream
                // under way ends, the error is reported, the pass goes on.
                if let Some(c) = check.take() {
                    c.finish(report);
                }
                report.findings.push(finding_from_error(e));
                return;
            }
        };
        if check.as_ref().is_none_or(|c| c.stream != stream) {
            if let Some(c) = check.take() {
                c.finish(report);
            }
            // Markers of streams without events, before this one.
            while let Some(m) = whole.next_if(|m| m.as_str() < stream) {
                StreamCheck::new(ctx, m).finish(report);
            }
            if whole.peek().is_some_and(|m| *m == stream) {
                whole.next();
            }
            check = Some(StreamCheck::new(ctx, stream));
        }
        if let Some(c) = check.as_mut() {
            c.event(event);
        }
    });
    if let Some(c) = check.take() {
        c.finish(report);
    }
    if let Err(e) = walked {
        report.findings.push(finding_from_error(e));
    }
    for m in whole {
        StreamCheck::new(ctx, m).finish(report);
    }
}

/// The number of streams (for a progress bar's length).
pub fn count_streams(store: &Store) -> u64 {
    super::all_streams(store).count() as u64
}

fn finding_from_error(e: StoreError) -> Finding {
    match e {
        StoreError::Corrupt { stream, seq, what } => {
            Finding { stream, seq, problem: Problem::Chain(ChainProblem::Decode(what)) }
        }
        StoreError::HashMismatch { stream, seq } => {
            Finding { stream, seq, problem: Problem::Chain(ChainProblem::HashMismatch) }
        }
        other => {
            Finding { stream: String::new(), seq: 0, problem: Problem::Chain(ChainProblem::Decode(other.to_string())) }
        }
    }
}

/// The state and ledger at one point of the stream (for the snapshot).
type Sound = Option<(serde_json::Value, Option<serde_json::Value>)>;

/// Checks one stream's events (as `Store::read_raw` gives them), marker
/// and snapshot, adding to `report`.
fn verify_stream<'e>(
    ctx: &Ctx,
    stream: &str,
    events: impl Iterator<Item = Result<RawEvent<'e>, StoreError>>,
    report: &mut Report,
) {
    let mut check = StreamCheck::new(ctx, stream);
    events.for_each(|item| check.event(item));
    check.finish(report);
}

/// Where a stream's chain starts ([`ChainCheck::new`]): its marker's head.
type StartAt = Box<dyn FnMut(&str) -> Head>;

/// One stream's check as its events go by ([`verify_stream`]; a pass over
/// many streams hands each its events as it meets them, [`verify_part`]):
/// the marker and snapshot read at the start, each event chained, decoded
/// and folded, the snapshot and ledger compared at the end.
struct StreamCheck<'c> {
    ctx: &'c Ctx<'c>,
    stream: String,
    findings: Vec<Finding>,
    snapshot: Option<Snapshot>,
    marker: Option<Pruned>,
    /// Where the events start: the marker's head, or the empty head.
    start: Head,
    snap_seq: Option<u64>,
    snapshot_ledger: bool,
    /// While true, `folded` is the fold of the marker's state and events
    /// start.seq+1..=last_seq, all decoded.
    fold_ok: bool,
    folded: Option<Folded>,
    /// A stream whose marker keeps no state has nothing to fold.
    stateless: bool,
    last_seq: u64,
    count: u64,
    /// (hash of the event at the snapshot's seq, the state and the ledger there if sound)
    at_snapshot: Option<(Hash, Sound)>,
    chain: ChainCheck<StartAt>,
}

impl<'c> StreamCheck<'c> {
    fn new(ctx: &'c Ctx<'c>, stream: &str) -> StreamCheck<'c> {
        let store = ctx.store;
        let mut findings = Vec::new();
        let finding = |seq: u64, problem: Problem| Finding { stream: stream.to_owned(), seq, problem };
        let snapshot = match store.load_snapshot(stream) {
            Ok(s) => s,
            Err(e) => {
                let mut f = finding_from_error(e);
                f.problem = Problem::Snapshot(format!("unreadable: {}", f.problem_text()));
                findings.push(f);
                None
            }
        };
        let marker = match store.pruned(stream) {
            Ok(m) => m,
            Err(e) => {
                let f = finding_from_error(e);
                findings.push(finding(f.seq, Problem::Marker(format!("unreadable: {}", f.problem_text()))));
                None
            }
        };
        let start = marker.as_ref().map(|m| m.head).unwrap_or_default();
        let snap_seq = snapshot.as_ref().map(|s| s.seq);
        let snapshot_ledger = snapshot.as_ref().is_some_and(|s| holds_ledger(&s.state));
        let mut fold_ok = true;
        let folded = match (Folded::new(stream), &marker) {
            (None, _) => {
                findings.push(finding(0, Problem::UnknownStream));
                None
            }
            (Some(empty), None) => Some(empty),
            (Some(_), Some(m)) => match Folded::from_marker(stream, m) {
                Ok(f) => f,
                Err(what) => {
                    findings.push(finding(m.head.seq, Problem::Marker(what)));
                    fold_ok = false;
                    None
                }
            },
        };
        let stateless = folded.is_none() && fold_ok && marker.is_some() && stream_kind(stream) != StreamKind::Other;
        let mut at_snapshot = None;
        if let (Some(m), Some(seq)) = (&marker, snap_seq) {
            if seq == m.head.seq {
                at_snapshot = Some((m.head.hash, folded.as_ref().filter(|_| fold_ok).map(|f| (f.to_json(), None))));
            }
        }
        StreamCheck {
            ctx,
            stream: stream.to_owned(),
            findings,
            snapshot,
            marker,
            start,
            snap_seq,
            snapshot_ledger,
            fold_ok,
            folded,
            stateless,
            last_seq: start.seq,
            count: 0,
            at_snapshot,
            chain: ChainCheck::new(Box::new(move |_: &str| start)),
        }
    }

    fn finding(&self, seq: u64, problem: Problem) -> Finding {
        Finding { stream: self.stream.clone(), seq, problem }
    }

    /// The stream's next event.
    fn event(&mut self, item: Result<RawEvent<'_>, StoreError>) {
        let stream = self.stream.as_str();
        self.count += 1;
        self.chain.raw(stream, &item);
        let Ok(ev) = item else {
            self.fold_ok = false;
            return;
        };
        if ev.seq != self.last_seq + 1 {
            self.fold_ok = false;
        }
        self.last_seq = ev.seq;
        let mut found = Vec::new();
        if self.stateless && self.count == 1 {
            found.push(Problem::Rule(
                "events after the pruned marker, which keeps no state (a stream deleted whole)".into(),
            ));
        }
        match self.folded.as_mut() {
            Some(f) => match match self.ctx.depth {
                Depth::Fold => f.apply_fold(&Text { stream, event: &ev }, self.snap_seq.is_some()),
                Depth::Full => f.apply(&Text { stream, event: &ev }),
            } {
                Ok(None) => {}
                Ok(Some(rule)) => found.push(Problem::Rule(rule)),
                Err(e) => {
                    self.fold_ok = false;
                    found.push(match ev.to_stored(stream) {
                        // Not JSON: the record itself is unreadable.
                        Err(StoreError::Corrupt { what, .. }) => Problem::Chain(ChainProblem::Decode(what)),
                        _ => Problem::Event(match e {
                            StoreError::Corrupt { what, .. } => what,
                            other => other.to_string(),
                        }),
                    });
                }
            },
            None => {
                if let Err(StoreError::Corrupt { what, .. }) = ev.to_stored(stream) {
                    found.push(Problem::Chain(ChainProblem::Decode(what)));
                }
            }
        }
        if Some(ev.seq) == self.snap_seq {
            let state = match (&self.folded, self.fold_ok) {
                // The ledger as JSON only for a snapshot that holds one.
                (Some(f), true) => Some((
                    f.to_json(),
                    (self.marker.is_none() && self.snapshot_ledger).then(|| f.ledger_json()).flatten(),
                )),
                _ => None,
            };
            self.at_snapshot = Some((ev.hash, state));
        }
        for problem in found {
            let f = self.finding(ev.seq, problem);
            self.findings.push(f);
        }
    }

    /// The stream's snapshot and ledger against what its events gave;
    /// the findings into `report`, in seq order.
    fn finish(self, report: &mut Report) {
        let StreamCheck {
            ctx,
            stream,
            mut findings,
            snapshot,
            marker,
            start,
            folded,
            fold_ok,
            last_seq,
            count,
            at_snapshot,
            chain,
            ..
        } = self;
        let finding = |seq: u64, problem: Problem| Finding { stream: stream.clone(), seq, problem };
        findings.extend(chain.finish().into_iter().map(|c| Finding {
            stream: c.stream,
            seq: c.seq,
            problem: Problem::Chain(c.problem),
        }));
        report.events += count;
        report.streams += 1;
        if marker.is_some() {
            report.pruned += 1;
            report.pruned_whole += u64::from(count == 0);
        }
        let rebuilt = |seq: u64| match &marker {
            Some(m) if seq > m.head.seq => {
                format!("the pruned marker (seq {}) and events {}..={seq}", m.head.seq, m.head.seq + 1)
            }
            Some(m) => format!("the pruned marker (seq {})", m.head.seq),
            None => format!("events 1..={seq}"),
        };

        if let Some(snap) = snapshot {
            report.snapshots += 1;
            let problem = |what: String| finding(snap.seq, Problem::Snapshot(what));
            match (&at_snapshot, &folded) {
                _ if snap.seq == 0 => findings.push(problem("taken at seq 0, before any event".into())),
                _ if snap.seq < start.seq => findings.push(problem(format!(
                    "taken at seq {}, before the pruned marker (seq {}): its events are gone",
                    snap.seq, start.seq
                ))),
                (None, _) => findings.push(problem(format!(
                    "taken at seq {} but the stream has no such event (last seq {last_seq})",
                    snap.seq
                ))),
                (Some((hash, _)), _) if *hash != snap.hash => findings.push(problem(format!(
                    "its hash {} is not the hash of event {} ({})",
                    hex::encode(&snap.hash[..8]),
                    snap.seq,
                    hex::encode(&hash[..8])
                ))),
                (Some((_, Some((replayed, ledger)))), Some(f)) => match f.check_snapshot(&snap.state) {
                    Err(what) => findings.push(problem(what)),
                    Ok((stored, legacy)) => {
                        if let Some(diff) = first_difference(&stored, replayed) {
                            findings.push(problem(format!(
                                "differs from the state rebuilt from {} at {diff} (snapshot vs events)",
                                rebuilt(snap.seq)
                            )));
                        }
                        if let (Some(stored), Some(replayed)) = (legacy, ledger) {
                            if let Some(diff) = first_difference(&stored, replayed) {
                                findings.push(problem(format!(
                                    "differs from the ledger rebuilt from {} at {diff} (snapshot vs events)",
                                    rebuilt(snap.seq)
                                )));
                            }
                        }
                    }
                },
                // The events up to the snapshot are already reported broken,
                // or (a stream pruned whole) there is no state to compare.
                _ => {}
            }
        }
        if let (Some(Folded::Account(account)), true) = (&folded, fold_ok && last_seq > 0) {
            findings.extend(
                check_ledger(ctx.store, account, marker.as_ref(), ctx.now)
                    .into_iter()
                    .map(|what| finding(last_seq, Problem::Ledger(what))),
            );
        }
        findings.sort_by_key(|f| f.seq);
        report.findings.extend(findings);
    }
}

/// Whether a snapshot's state has the `sends` or `receipts` of an account
/// snapshot from before the ledger left the state (or does not parse:
/// then the check says why), read past without building its tree.
fn holds_ledger(state: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Legacy {
        sends: Option<serde::de::IgnoredAny>,
        receipts: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Legacy>(state).map_or(true, |l| l.sends.is_some() || l.receipts.is_some())
}

/// Differences between an account's ledger in the store and the one its
/// events give, in whichever layout its markers name (nothing for an
/// account the relay has not moved yet: it rebuilds that ledger at the
/// account's next load).
///
/// What retention leaves is accepted (PROTOCOL §10): an entry whose
/// `retention_until` has passed by `now` may be missing or in its swept
/// form ([`SendEntry::swept`]: its retention and nothing it said); once the
/// stream was pruned, entries no kept event gives are accepted when swept,
/// or when already past retention as the prefix was pruned (the sweep
/// removes them in a later turn). Anything else that differs from the
/// events is a finding.
fn check_ledger(store: &Store, account: &AccountFold, marker: Option<&Pruned>, now: UnixSecs) -> Vec<String> {
    let id = &account.state.account_id;
    let v1 = match stored_layout(store, id) {
        Ok(Ok(ledger::Layout::Current)) => false,
        Ok(Ok(ledger::Layout::V1)) => true,
        Ok(Ok(ledger::Layout::Rebuild)) => return vec![],
        Ok(Err(what)) => return vec![what],
        Err(e) => return vec![format!("unreadable: {e}")],
    };
    let mut found = Vec::new();
    if !v1 {
        // A move removes every version 1 key with the marker.
        let left = store.kv_scan_prefix(&ledger::v1::prefix(id)).count();
        if left > 0 {
            found.push(format!("{left} version 1 keys left beside the current ledger"));
        }
    }
    let version = ledger::v1::version_key(id);
    // In key order, as the scan gives the stored entries: the two are
    // merged, with no table to build. Borrowed from the fold, not cloned.
    let mut expected: Vec<(Vec<u8>, Given)> =
        Given::all(&account.ledger).map(|e| (if v1 { e.v1_key(id) } else { e.key(id) }, e)).collect();
    expected.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut expected = expected.into_iter().peekable();
    let mut missing = Vec::new();
    let past = |until: u64| until <= now.0;
    let mut encoded = Vec::new();
    // The stored entries lent by the store, in key order.
    let mut stored = |item: Result<(&[u8], &[u8]), StoreError>| {
        let (key, value) = match item {
            Ok(kv) => kv,
            Err(e) => {
                found.push(format!("unreadable: {e}"));
                return false;
            }
        };
        if v1 && key == version.as_slice() {
            return true;
        }
        while let Some((_, e)) = expected.next_if(|(k, _)| k.as_slice() < key) {
            missing.push(e);
        }
        let Some((_, entry)) = expected.next_if(|(k, _)| k.as_slice() == key) else {
            if let Some(what) = orphan(marker, value) {
                found.push(format!("{}: {what}", key_name(id, key)));
            }
            return true;
        };
        // Stored as the actor writes it (the usual case): the same bytes
        // are the same entry, without decoding them.
        encoded.clear();
        let written = match entry {
            Given::Send { entry, .. } => serde_json::to_writer(&mut encoded, entry),
            Given::Receipt { entry, .. } => serde_json::to_writer(&mut encoded, entry),
        };
        if written.is_ok() && encoded == value {
            return true;
        }
        let (same, swept, until) = match entry {
            Given::Send { entry, .. } => {
                let stored = serde_json::from_slice::<SendEntry>(value).ok();
                let swept = stored.as_ref().filter(|s| s.is_swept()).map(|s| s.retention_until);
                (stored.as_ref() == Some(entry), swept, entry.retention_until)
            }
            Given::Receipt { entry, .. } => {
                let stored = serde_json::from_slice::<ReceiptEntry>(value).ok();
                let swept = stored.as_ref().filter(|s| s.is_swept()).map(|s| s.retention_until);
                (stored.as_ref() == Some(entry), swept, entry.retention_until)
            }
        };
        match swept {
            _ if same => {}
            Some(kept) if kept == until && past(until) => {}
            Some(kept) if kept == until => {
                found.push(format!("{}: swept before its retention ended ({until})", entry.name()))
            }
            _ => found.push(format!("{}: differs from the entry its events give", entry.name())),
        }
        true
    };
    let walked = match v1 {
        true => store.visit_kv_prefix(&ledger::v1::prefix(id), &mut stored),
        false => store.visit_blob_prefix(&ledger::prefix(id), &mut stored),
    };
    if let Err(e) = walked {
        found.push(format!("unreadable: {e}"));
    }
    missing.extend(expected.map(|(_, e)| e));
    found.extend(missing.into_iter().filter(|e| !past(e.retention_until())).map(|e| format!("{}: missing", e.name())));
    found
}

/// A ledger entry an account's events give, as [`ledger::Ledger::entries`]
/// yields it but borrowed from the fold: that one clones every entry, and
/// the audit compares each once (building an account's clones, hundreds of
/// entries in a growing vector, was ~8 % of a verify's CPU, most of it the
/// kernel zeroing fresh pages for them).
#[derive(Clone, Copy)]
enum Given<'a> {
    Send { message_id: &'a str, entry: &'a SendEntry },
    Receipt { from: &'a str, message_id: &'a str, entry: &'a ReceiptEntry },
}

impl<'a> Given<'a> {
    /// Every entry, in the order and with the keys `Ledger::entries` gives.
    fn all(ledger: &'a ledger::Ledger) -> impl Iterator<Item = Given<'a>> {
        let sends = ledger.sends.iter().map(|(m, entry)| Given::Send { message_id: m, entry });
        let receipts = ledger.receipts.iter().filter_map(|(k, entry)| {
            let (from, message_id) = k.split_once('/')?;
            Some(Given::Receipt { from, message_id, entry })
        });
        sends.chain(receipts)
    }

    fn key(&self, id: &str) -> Vec<u8> {
        match *self {
            Given::Send { message_id, .. } => ledger::send_key(id, message_id),
            Given::Receipt { from, message_id, .. } => ledger::receipt_key(id, from, message_id),
        }
    }

    fn v1_key(&self, id: &str) -> Vec<u8> {
        match *self {
            Given::Send { message_id, .. } => ledger::v1::send_key(id, message_id),
            Given::Receipt { from, message_id, .. } => ledger::v1::receipt_key(id, from, message_id),
        }
    }

    fn retention_until(&self) -> u64 {
        match self {
            Given::Send { entry, .. } => entry.retention_until,
            Given::Receipt { entry, .. } => entry.retention_until,
        }
    }

    /// As findings name it (`ledger::Entry::name`; only for a finding).
    fn name(&self) -> String {
        match *self {
            Given::Send { message_id, entry } => {
                ledger::Entry::Send { message_id: message_id.into(), entry: entry.clone() }.name()
            }
            Given::Receipt { from, message_id, entry } => {
                ledger::Entry::Receipt { from: from.into(), message_id: message_id.into(), entry: entry.clone() }.name()
            }
        }
    }
}

/// Why a ledger entry no kept event gives is a finding; `None` when it is
/// what retention leaves of an event pruned.
fn orphan(marker: Option<&Pruned>, value: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Kept {
        digest: String,
        retention_until: u64,
    }
    let Some(m) = marker else {
        return Some("no event gives this entry".into());
    };
    match serde_json::from_slice::<Kept>(value) {
        // Swept: its event was pruned (it says nothing to compare).
        Ok(k) if k.digest.is_empty() => None,
        // Past retention when the prefix was pruned: its event may be in it.
        Ok(k) if k.retention_until <= m.at => None,
        _ => Some(format!(
            "no kept event gives this entry, and it was not past retention when the stream was {}",
            pruned_text(m)
        )),
    }
}

/// A ledger key as the audit prints it: a hashed key's hash in hex.
fn key_name(id: &str, key: &[u8]) -> String {
    let prefix = ledger::prefix(id);
    match key.strip_prefix(prefix.as_slice()) {
        Some(hash) => format!("{}{}", String::from_utf8_lossy(&prefix), hex::encode(hash)),
        None => String::from_utf8_lossy(key).into_owned(),
    }
}

/// Snapshots whose stream has no events at all.
fn orphan_snapshots(store: &Store, report: &mut Report) {
    for item in store.raw_scan_prefix(b"s") {
        let Ok((key, value)) = item else {
            report.findings.push(Finding {
                stream: String::new(),
                seq: 0,
                problem: Problem::Snapshot("snapshot key space unreadable".into()),
            });
            return;
        };
        let stream = String::from_utf8_lossy(&key[1..]).into_owned();
        if matches!(store.head(&stream), Ok(h) if h.seq == 0) {
            report.snapshots += 1;
            let seq = value.get(..8).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes).unwrap_or(0);
            report.findings.push(Finding {
                stream,
                seq,
                problem: Problem::Snapshot("snapshot of a stream that has no events".into()),
            });
        }
    }
}

impl Finding {
    fn problem_text(&self) -> String {
        let full = self.to_string();
        full.split_once(": ").map(|(_, p)| p.to_string()).unwrap_or(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_actors::store::{Head, NewEvent, Snapshot};
    use relay_core::account::ledger::Ledger;
    use relay_core::account::{AccountEvent, AccountState};
    use relay_schemas::objects::DeliveryStatus;
    use relay_schemas::UnixSecs;
    use serde_json::value::RawValue;

    fn cursor(through: u64) -> NewEvent {
        let e = AccountEvent::CursorMoved { device_id: "phone".into(), through };
        NewEvent::new(e.event_type(), 1, UnixSecs(1), &e).unwrap()
    }

    fn raw(event_type: &str, data: &str) -> NewEvent {
        NewEvent { event_type: event_type.into(), version: 1, at: 1, data: RawValue::from_string(data.into()).unwrap() }
    }

    fn run(store: &Store) -> Vec<String> {
        verify(store, None, UnixSecs(1), Depth::Fold, &mut |_, _| {})
            .unwrap()
            .findings
            .iter()
            .map(|f| f.to_string())
            .collect()
    }

    #[test]
    fn a_sound_log_with_a_matching_snapshot_is_clean() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        let head = b.append("account/a", Head::default(), vec![cursor(1), cursor(2)]);
        let mut state = AccountState::new("a");
        state.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 1 });
        state.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 2 });
        b.put_snapshot("account/a", Snapshot { seq: 2, hash: head.hash, state: serde_json::to_vec(&state).unwrap() });
        store.commit_durable_blocking(b).unwrap();
        let report = verify(&store, None, UnixSecs(1), Depth::Fold, &mut |_, _| {}).unwrap();
        assert_eq!((report.streams, report.events, report.snapshots), (1, 2, 1));
        assert!(report.is_clean(), "{:?}", report.findings);
    }

    #[test]
    fn snapshots_at_a_missing_event_with_a_wrong_hash_or_without_events_are_found() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        let head = b.append("account/a", Head::default(), vec![cursor(1)]);
        b.append("account/b", Head::default(), vec![cursor(1)]);
        let state = serde_json::to_vec(&AccountState::new("a")).unwrap();
        b.put_snapshot("account/a", Snapshot { seq: 5, hash: head.hash, state: state.clone() });
        b.put_snapshot("account/b", Snapshot { seq: 1, hash: [7; 32], state: state.clone() });
        b.put_snapshot("account/c", Snapshot { seq: 3, hash: [0; 32], state });
        store.commit_durable_blocking(b).unwrap();
        let found = run(&store);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(found[0]
            .starts_with("stream \"account/a\" seq 5: snapshot: taken at seq 5 but the stream has no such event"));
        assert!(found[1].starts_with("stream \"account/b\" seq 1: snapshot: its hash"));
        assert!(found[2].starts_with("stream \"account/c\" seq 3: snapshot: snapshot of a stream that has no events"));
    }

    #[test]
    fn undecodable_events_broken_rules_and_unknown_streams_are_found() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        b.append(
            "account/a",
            Head::default(),
            vec![cursor(1), raw("cursor_moved", r#"{"cursor_moved":{"through":"x"}}"#)],
        );
        b.append(
            "delivery/a/m",
            Head::default(),
            vec![raw("attempt_started", r#"{"attempt_started":{"attempt":1,"targets":[],"revision":0}}"#)],
        );
        b.append("other/x", Head::default(), vec![raw("whatever", "{}")]);
        store.commit_durable_blocking(b).unwrap();
        let found = run(&store);
        assert_eq!(found.len(), 3, "{found:#?}");
        assert!(
            found[0].starts_with("stream \"account/a\" seq 2: undecodable event: event cursor_moved v1"),
            "{found:#?}"
        );
        assert!(found[1].starts_with(
            "stream \"delivery/a/m\" seq 1: event breaks a rule: a delivery stream must start with accepted"
        ));
        assert!(found[2].starts_with("stream \"other/x\" seq 0: stream of unknown kind"));
    }

    fn sent(message_id: &str) -> AccountEvent {
        AccountEvent::MessageSent {
            message_id: message_id.into(),
            to: "b".into(),
            digest: "d".into(),
            accepted_at: 10,
            deadline: 20,
            retention_until: 30,
            record: None,
            status: None,
        }
    }

    fn accepted(message_id: &str) -> AccountEvent {
        AccountEvent::DeliveryUpdated { message_id: message_id.into(), status: DeliveryStatus::target_accepted(10) }
    }

    fn new_event(e: &AccountEvent) -> NewEvent {
        NewEvent::new(e.event_type(), 1, UnixSecs(1), e).unwrap()
    }

    /// Account `a` with two sends, the first delivered, written as the actor
    /// writes them: the ledger entries and its version with the events
    /// (with `v1`, as the previous layout had them).
    fn account_with_a_ledger(store: &Store, v1: bool) -> Ledger {
        let events = [sent("m1"), sent("m2"), accepted("m1")];
        let mut ledger = Ledger::default();
        let mut b = store.batch();
        b.append("account/a", Head::default(), events.iter().map(new_event).collect());
        events.iter().for_each(|e| ledger.apply("a", e));
        for entry in ledger.entries() {
            match v1 {
                true => b.kv_put(&entry.v1_key("a"), &entry.value().unwrap()),
                false => b.blob_put(&entry.key("a"), &entry.value().unwrap()),
            }
        }
        match v1 {
            true => b.kv_put(&ledger::v1::version_key("a"), ledger::v1::VERSION),
            false => b.kv_put(&ledger::version_key("a"), ledger::VERSION),
        }
        store.commit_durable_blocking(b).unwrap();
        ledger
    }

    #[test]
    fn the_ledger_in_the_store_must_be_the_one_the_events_give() {
        let store = Store::temporary().unwrap();
        account_with_a_ledger(&store, false);
        assert!(run(&store).is_empty(), "{:?}", run(&store));
        let mut b = store.batch();
        let mut changed: SendEntry =
            serde_json::from_slice(&store.blob_get(&ledger::send_key("a", "m1")).unwrap().unwrap()).unwrap();
        changed.status = DeliveryStatus::delivering(10);
        b.blob_put(&ledger::send_key("a", "m1"), &serde_json::to_vec(&changed).unwrap());
        b.blob_remove(&ledger::send_key("a", "m2"));
        b.blob_put(&ledger::send_key("a", "m3"), b"{}");
        store.commit_durable_blocking(b).unwrap();
        let found = run(&store);
        let m3 = hex::encode(&ledger::send_key("a", "m3")[b"l/a/".len()..]);
        assert_eq!(
            found,
            [
                "stream \"account/a\" seq 3: ledger: sent m1: differs from the entry its events give".to_owned(),
                format!("stream \"account/a\" seq 3: ledger: l/a/{m3}: no event gives this entry"),
                "stream \"account/a\" seq 3: ledger: sent m2: missing".to_owned(),
            ]
        );
    }

    #[test]
    fn version_1_keys_left_beside_a_moved_ledger_are_reported() {
        let store = Store::temporary().unwrap();
        account_with_a_ledger(&store, false);
        let mut b = store.batch();
        b.kv_put(&ledger::v1::send_key("a", "m1"), b"{}");
        store.commit_durable_blocking(b).unwrap();
        assert_eq!(
            run(&store),
            ["stream \"account/a\" seq 3: ledger: 1 version 1 keys left beside the current ledger"]
        );
    }

    #[test]
    fn a_ledger_in_the_v1_layout_is_checked_in_that_layout() {
        let store = Store::temporary().unwrap();
        account_with_a_ledger(&store, true);
        assert!(run(&store).is_empty(), "{:?}", run(&store));
        let mut b = store.batch();
        b.kv_remove(&ledger::v1::send_key("a", "m2"));
        b.kv_put(&ledger::v1::send_key("a", "m3"), b"{}");
        store.commit_durable_blocking(b).unwrap();
        assert_eq!(
            run(&store),
            [
                "stream \"account/a\" seq 3: ledger: i/a/s/m3: no event gives this entry",
                "stream \"account/a\" seq 3: ledger: sent m2: missing",
            ]
        );
    }

    #[test]
    fn an_account_not_yet_upgraded_has_no_ledger_to_check() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        b.append("account/a", Head::default(), vec![new_event(&sent("m1"))]);
        store.commit_durable_blocking(b).unwrap();
        assert!(run(&store).is_empty(), "{:?}", run(&store));
    }

    #[test]
    fn a_snapshot_holding_the_ledger_is_checked_against_the_ledger_the_events_give() {
        let store = Store::temporary().unwrap();
        let ledger = account_with_a_ledger(&store, false);
        let head = store.head("account/a").unwrap();
        let mut state = AccountState::new("a");
        [sent("m1"), sent("m2"), accepted("m1")].iter().for_each(|e| state.apply(e));
        // As written before the ledger left the state.
        let mut old = serde_json::to_value(&state).unwrap();
        old["sends"] = serde_json::to_value(&ledger.sends).unwrap();
        old["receipts"] = serde_json::json!({});
        let put = |snapshot: &serde_json::Value| {
            let mut b = store.batch();
            let state = serde_json::to_vec(snapshot).unwrap();
            b.put_snapshot("account/a", Snapshot { seq: head.seq, hash: head.hash, state });
            store.commit_durable_blocking(b).unwrap();
        };
        put(&old);
        assert!(run(&store).is_empty(), "{:?}", run(&store));
        old["sends"]["m1"]["status"] = serde_json::to_value(DeliveryStatus::delivering(10)).unwrap();
        put(&old);
        let found = run(&store);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("stream \"account/a\" seq 3: snapshot: differs from the ledger rebuilt from events 1..=3 at /sends/m1/status"),
            "{found:?}"
        );
    }

    fn run_at(store: &Store, now: u64) -> Vec<String> {
        verify(store, None, UnixSecs(now), Depth::Fold, &mut |_, _| {})
            .unwrap()
            .findings
            .iter()
            .map(|f| f.to_string())
            .collect()
    }

    fn put_send(store: &Store, message_id: &str, entry: &SendEntry) {
        let mut b = store.batch();
        b.blob_put(&ledger::send_key("a", message_id), &serde_json::to_vec(entry).unwrap());
        store.commit_durable_blocking(b).unwrap();
    }

    #[test]
    fn a_ledger_entry_past_retention_may_be_swept_or_gone_and_nothing_else() {
        let store = Store::temporary().unwrap();
        let ledger = account_with_a_ledger(&store, false);
        put_send(&store, "m1", &SendEntry::swept(30));
        let mut b = store.batch();
        b.blob_remove(&ledger::send_key("a", "m2"));
        store.commit_durable_blocking(b).unwrap();
        // Before their retention ends (30), neither may be.
        assert_eq!(
            run_at(&store, 29),
            [
                "stream \"account/a\" seq 3: ledger: sent m1: swept before its retention ended (30)",
                "stream \"account/a\" seq 3: ledger: sent m2: missing",
            ]
        );
        assert_eq!(run_at(&store, 30), Vec::<String>::new());
        // Past retention, content that disagrees with the events is still found.
        put_send(&store, "m1", &SendEntry::swept(31));
        let mut changed = ledger.sends["m2"].clone();
        changed.digest = "other".into();
        put_send(&store, "m2", &changed);
        assert_eq!(
            run_at(&store, 100),
            [
                "stream \"account/a\" seq 3: ledger: sent m1: differs from the entry its events give",
                "stream \"account/a\" seq 3: ledger: sent m2: differs from the entry its events give",
            ]
        );
    }

    #[test]
    fn entries_of_pruned_events_are_accepted_when_swept_or_past_retention_at_the_pruning() {
        let store = Store::temporary().unwrap();
        account_with_a_ledger(&store, false);
        let first = store.read("account/a", 0).next().unwrap().unwrap();
        let prune = |at: u64| {
            let mut state = AccountState::new("a");
            state.apply(&sent("m1"));
            let mut b = store.batch();
            b.prune("account/a", 0, first.head(), UnixSecs(at), serde_json::to_vec(&state).unwrap());
            store.commit_durable_blocking(b).unwrap();
        };
        // m1's event is gone; its entry (delivered, retention 30) is not.
        prune(10);
        let key = hex::encode(&ledger::send_key("a", "m1")[b"l/a/".len()..]);
        let found = run_at(&store, 100);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with(&format!(
                "stream \"account/a\" seq 3: ledger: l/a/{key}: no kept event gives this entry, and it was not past retention when the stream was pruned through seq 1 at"
            )),
            "{found:?}"
        );
        prune(30);
        assert_eq!(run_at(&store, 100), Vec::<String>::new());
        prune(10);
        put_send(&store, "m1", &SendEntry::swept(30));
        assert_eq!(run_at(&store, 100), Vec::<String>::new());
    }

    #[test]
    fn a_marker_whose_state_is_not_the_accounts_is_found() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        let first = b.append("account/a", Head::default(), vec![cursor(1)]);
        b.append("account/a", first, vec![cursor(2)]);
        store.commit_durable_blocking(b).unwrap();
        let mut b = store.batch();
        b.prune("account/a", 0, first, UnixSecs(5), serde_json::to_vec(&AccountState::new("b")).unwrap());
        store.commit_durable_blocking(b).unwrap();
        assert_eq!(run(&store), ["stream \"account/a\" seq 1: pruned marker: its state is account b's"]);
    }

    #[test]
    fn one_stream_only_and_an_unknown_stream_is_a_usage_error() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        b.append("account/a", Head::default(), vec![cursor(1)]);
        b.append("account/b", Head::default(), vec![cursor(1), cursor(2)]);
        store.commit_durable_blocking(b).unwrap();
        let report = verify(&store, Some("account/b"), UnixSecs(1), Depth::Fold, &mut |_, _| {}).unwrap();
        assert_eq!((report.streams, report.events), (1, 2));
        assert!(matches!(
            verify(&store, Some("account/zz"), UnixSecs(1), Depth::Fold, &mut |_, _| {}),
            Err(AuditError::Usage(_))
        ));
    }
}
