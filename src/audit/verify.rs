//! `relay audit verify`: the whole log, or one stream, checked link by link.
//!
//! For every stream: the hash chain and sequence continuity
//! ([`verify_chain`]: seq 1, 2, 3…; each `prev` is the previous hash; each
//! hash is `blake3(prev ‖ body)`), every event decoded through the
//! upcasters and folded exactly as its actor folds it (plus the rules a fold
//! accepts silently, e.g. a delivery starts with `accepted`), and the
//! stream's snapshot: at an existing event, with that event's hash, and
//! equal to the state rebuilt from events `1..=snapshot.seq`. Snapshots of
//! streams without events are reported too. Deleting a stream's *last*
//! events leaves a shorter valid chain; no log can show that by itself.

use super::{first_difference, AuditError, Folded};
use relay_actors::store::{verify_chain, ChainProblem, Hash, Store, StoreError};
use std::fmt;

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
            Problem::Chain(ChainProblem::Gap { expected }) => {
                write!(f, "sequence gap: expected seq {expected} (events missing or out of place)")
            }
            Problem::Chain(ChainProblem::Decode(what)) => write!(f, "unreadable record: {what}"),
            Problem::Event(what) => write!(f, "undecodable event: {what}"),
            Problem::Rule(what) => write!(f, "event breaks a rule: {what}"),
            Problem::Snapshot(what) => write!(f, "snapshot: {what}"),
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
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn is_clean(&self) -> bool {
        self.findings.is_empty()
    }
}

/// Verifies every stream (or only `only`), calling `progress(events)` after
/// each stream with the number of its events. Findings are in stream order,
/// then seq order.
pub fn verify(store: &Store, only: Option<&str>, progress: &mut dyn FnMut(u64)) -> Result<Report, AuditError> {
    let mut report = Report::default();
    match only {
        Some(stream) => {
            if store.head(stream)?.seq == 0 && store.load_snapshot(stream).ok().flatten().is_none() {
                return Err(AuditError::Usage(format!("no stream {stream:?} in this store")));
            }
            verify_stream(store, stream, &mut report);
            progress(report.events);
        }
        None => {
            for stream in store.streams() {
                let stream = match stream {
                    Ok(s) => s,
                    Err(e) => {
                        report.findings.push(finding_from_error(e));
                        break; // the key space itself is unreadable past here
                    }
                };
                let before = report.events;
                verify_stream(store, &stream, &mut report);
                progress(report.events - before);
            }
            orphan_snapshots(store, &mut report);
        }
    }
    Ok(report)
}

/// The number of streams (for a progress bar's length).
pub fn count_streams(store: &Store) -> u64 {
    store.streams().count() as u64
}

fn finding_from_error(e: StoreError) -> Finding {
    match e {
        StoreError::Corrupt { stream, seq, what } => {
            Finding { stream, seq, problem: Problem::Chain(ChainProblem::Decode(what)) }
        }
        StoreError::HashMismatch { stream, seq } => {
            Finding { stream, seq, problem: Problem::Chain(ChainProblem::HashMismatch) }
        }
        other => Finding { stream: String::new(), seq: 0, problem: Problem::Chain(ChainProblem::Decode(other.to_string())) },
    }
}

/// Checks one stream's events and snapshot, adding to `report`.
pub fn verify_stream(store: &Store, stream: &str, report: &mut Report) {
    let mut findings = Vec::new();
    let snapshot = match store.load_snapshot(stream) {
        Ok(s) => s,
        Err(e) => {
            let mut f = finding_from_error(e);
            f.problem = Problem::Snapshot(format!("unreadable: {}", f.problem_text()));
            findings.push(f);
            None
        }
    };
    let snap_seq = snapshot.as_ref().map(|s| s.seq);
    let mut folded = Folded::new(stream);
    if folded.is_none() {
        findings.push(Finding { stream: stream.to_owned(), seq: 0, problem: Problem::UnknownStream });
    }
    // While true, `folded` is the fold of events 1..=last_seq, all decoded.
    let mut fold_ok = true;
    let mut last_seq = 0;
    let mut count = 0u64;
    // (hash of the event at the snapshot's seq, the state there if sound)
    let mut at_snapshot: Option<(Hash, Option<serde_json::Value>)> = None;
    let chain = {
        let events = store.read(stream, 0).inspect(|item| {
            count += 1;
            let Ok(ev) = item else {
                fold_ok = false;
                return;
            };
            if ev.seq != last_seq + 1 {
                fold_ok = false;
            }
            last_seq = ev.seq;
            if let Some(f) = folded.as_mut() {
                match f.apply(ev) {
                    Ok(None) => {}
                    Ok(Some(rule)) => {
                        findings.push(Finding { stream: ev.stream.clone(), seq: ev.seq, problem: Problem::Rule(rule) })
                    }
                    Err(e) => {
                        fold_ok = false;
                        let what = match e {
                            StoreError::Corrupt { what, .. } => what,
                            other => other.to_string(),
                        };
                        findings.push(Finding { stream: ev.stream.clone(), seq: ev.seq, problem: Problem::Event(what) });
                    }
                }
            }
            if Some(ev.seq) == snap_seq {
                let state = match (&folded, fold_ok) {
                    (Some(f), true) => Some(f.to_json()),
                    _ => None,
                };
                at_snapshot = Some((ev.hash, state));
            }
        });
        verify_chain(events)
    };
    findings.extend(chain.into_iter().map(|c| Finding { stream: c.stream, seq: c.seq, problem: Problem::Chain(c.problem) }));
    report.events += count;
    report.streams += 1;

    if let Some(snap) = snapshot {
        report.snapshots += 1;
        let problem = |what: String| Finding { stream: stream.to_owned(), seq: snap.seq, problem: Problem::Snapshot(what) };
        match (&at_snapshot, &folded) {
            _ if snap.seq == 0 => findings.push(problem("taken at seq 0, before any event".into())),
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
            (Some((_, Some(replayed))), Some(f)) => match f.check_snapshot(&snap.state) {
                Err(what) => findings.push(problem(what)),
                Ok(stored) => {
                    if let Some(diff) = first_difference(&stored, replayed) {
                        findings.push(problem(format!(
                            "differs from the state rebuilt from events 1..={} at {diff} (snapshot vs events)",
                            snap.seq
                        )));
                    }
                }
            },
            // The events up to the snapshot are already reported broken.
            _ => {}
        }
    }
    findings.sort_by_key(|f| f.seq);
    report.findings.extend(findings);
}

/// Snapshots whose stream has no events at all.
fn orphan_snapshots(store: &Store, report: &mut Report) {
    for item in store.raw_db().scan_prefix(b"s") {
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
