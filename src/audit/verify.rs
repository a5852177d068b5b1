//! `relay audit verify`: the whole log, or one stream, checked link by link.
//!
//! For every stream: the hash chain and sequence continuity
//! ([`verify_chain`]: seq 1, 2, 3…; each `prev` is the previous hash; each
//! hash is `blake3(prev ‖ body)`), every event decoded through the
//! upcasters and folded exactly as its actor folds it (plus the rules a fold
//! accepts silently, e.g. a delivery starts with `accepted`), and the
//! stream's snapshot: at an existing event, with that event's hash, and
//! equal to the state rebuilt from events `1..=snapshot.seq` (an account
//! snapshot from before the ledger left the state: its `sends`/`receipts`
//! equal to the ledger those events give). For an account, its idempotency
//! ledger in the store must be exactly the one its events give, in the
//! layout its markers name (`ledger::layout`: the hashed keys of
//! `ledger.rs`, or the readable kv keys `i/{account_id}/…` of version 1),
//! unless the relay has not moved it yet (it rebuilds that ledger at the
//! account's next load).
//! Snapshots of streams without events are reported too. Deleting a
//! stream's *last* events leaves a shorter valid chain; no log can show
//! that by itself.

use super::{first_difference, AccountFold, AuditError, Folded};
use relay_actors::account::{ledger, stored_layout, ReceiptEntry, SendEntry};
use relay_actors::store::{verify_chain, ChainProblem, Hash, Store, StoreError};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{mpsc, Mutex};

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
            Problem::Chain(ChainProblem::Gap { expected }) => {
                write!(f, "sequence gap: expected seq {expected} (events missing or out of place)")
            }
            Problem::Chain(ChainProblem::Decode(what)) => write!(f, "unreadable record: {what}"),
            Problem::Event(what) => write!(f, "undecodable event: {what}"),
            Problem::Rule(what) => write!(f, "event breaks a rule: {what}"),
            Problem::Snapshot(what) => write!(f, "snapshot: {what}"),
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
            let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).clamp(1, 8);
            verify_all(store, threads, &mut report, progress);
            orphan_snapshots(store, &mut report);
        }
    }
    Ok(report)
}

/// Every stream, `threads` streams at a time (streams are independent);
/// `progress` runs on the calling thread, the report keeps stream order.
fn verify_all(store: &Store, threads: usize, report: &mut Report, progress: &mut dyn FnMut(u64)) {
    let source = Mutex::new(store.streams().enumerate());
    let (tx, rx) = mpsc::channel::<(usize, Result<Report, Finding>)>();
    let mut parts = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            let (tx, source) = (tx.clone(), &source);
            scope.spawn(move || loop {
                let next = source.lock().unwrap_or_else(|e| e.into_inner()).next();
                let Some((i, stream)) = next else { break };
                let part = match stream {
                    Ok(stream) => {
                        let mut r = Report::default();
                        verify_stream(store, &stream, &mut r);
                        Ok(r)
                    }
                    // The key space itself is unreadable past here.
                    Err(e) => Err(finding_from_error(e)),
                };
                if tx.send((i, part)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for (i, part) in rx {
            if let Ok(r) = &part {
                progress(r.events);
            }
            parts.push((i, part));
        }
    });
    parts.sort_by_key(|(i, _)| *i);
    for (_, part) in parts {
        match part {
            Ok(r) => {
                report.streams += r.streams;
                report.events += r.events;
                report.snapshots += r.snapshots;
                report.findings.extend(r.findings);
            }
            Err(f) => report.findings.push(f),
        }
    }
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
        other => {
            Finding { stream: String::new(), seq: 0, problem: Problem::Chain(ChainProblem::Decode(other.to_string())) }
        }
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
    // (hash of the event at the snapshot's seq, the state and the ledger
    // there if sound)
    type Sound = Option<(serde_json::Value, Option<serde_json::Value>)>;
    let mut at_snapshot: Option<(Hash, Sound)> = None;
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
                        findings.push(Finding {
                            stream: ev.stream.clone(),
                            seq: ev.seq,
                            problem: Problem::Event(what),
                        });
                    }
                }
            }
            if Some(ev.seq) == snap_seq {
                let state = match (&folded, fold_ok) {
                    (Some(f), true) => Some((f.to_json(), f.ledger_json())),
                    _ => None,
                };
                at_snapshot = Some((ev.hash, state));
            }
        });
        verify_chain(events)
    };
    findings.extend(chain.into_iter().map(|c| Finding {
        stream: c.stream,
        seq: c.seq,
        problem: Problem::Chain(c.problem),
    }));
    report.events += count;
    report.streams += 1;

    if let Some(snap) = snapshot {
        report.snapshots += 1;
        let problem =
            |what: String| Finding { stream: stream.to_owned(), seq: snap.seq, problem: Problem::Snapshot(what) };
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
            (Some((_, Some((replayed, ledger)))), Some(f)) => match f.check_snapshot(&snap.state) {
                Err(what) => findings.push(problem(what)),
                Ok((stored, legacy)) => {
                    if let Some(diff) = first_difference(&stored, replayed) {
                        findings.push(problem(format!(
                            "differs from the state rebuilt from events 1..={} at {diff} (snapshot vs events)",
                            snap.seq
                        )));
                    }
                    if let (Some(stored), Some(replayed)) = (legacy, ledger) {
                        if let Some(diff) = first_difference(&stored, replayed) {
                            findings.push(problem(format!(
                                "differs from the ledger rebuilt from events 1..={} at {diff} (snapshot vs events)",
                                snap.seq
                            )));
                        }
                    }
                }
            },
            // The events up to the snapshot are already reported broken.
            _ => {}
        }
    }
    if let (Some(Folded::Account(account)), true) = (&folded, fold_ok && last_seq > 0) {
        findings.extend(check_ledger(store, account).into_iter().map(|what| Finding {
            stream: stream.to_owned(),
            seq: last_seq,
            problem: Problem::Ledger(what),
        }));
    }
    findings.sort_by_key(|f| f.seq);
    report.findings.extend(findings);
}

/// Differences between an account's ledger in the store and the one its
/// events give, in whichever layout its markers name (nothing for an
/// account the relay has not moved yet: it rebuilds that ledger at the
/// account's next load).
fn check_ledger(store: &Store, account: &AccountFold) -> Vec<String> {
    let id = &account.state.account_id;
    let v1 = match stored_layout(store, id) {
        Ok(Ok(ledger::Layout::Current)) => false,
        Ok(Ok(ledger::Layout::V1)) => true,
        Ok(Ok(ledger::Layout::Rebuild)) => return vec![],
        Ok(Err(what)) => return vec![what],
        Err(e) => return vec![format!("unreadable: {e}")],
    };
    let mut found = Vec::new();
    let entries: Vec<_> = match v1 {
        true => store
            .kv_scan_prefix(&ledger::v1::prefix(id))
            .filter(|kv| !matches!(kv, Ok((k, _)) if *k == ledger::v1::version_key(id)))
            .collect(),
        false => {
            // A move removes every version 1 key with the marker.
            let left = store.kv_scan_prefix(&ledger::v1::prefix(id)).count();
            if left > 0 {
                found.push(format!("{left} version 1 keys left beside the current ledger"));
            }
            store.blob_scan_prefix(&ledger::prefix(id)).collect()
        }
    };
    let key = |e: &ledger::Entry| if v1 { e.v1_key(id) } else { e.key(id) };
    let mut expected: BTreeMap<Vec<u8>, ledger::Entry> = account.ledger.entries().map(|e| (key(&e), e)).collect();
    for item in entries {
        let (key, value) = match item {
            Ok(kv) => kv,
            Err(e) => {
                found.push(format!("unreadable: {e}"));
                break;
            }
        };
        let entry = match expected.remove(&key) {
            None => {
                found.push(format!("{}: no event gives this entry", key_name(id, &key)));
                continue;
            }
            Some(entry) => entry,
        };
        let same = match &entry {
            ledger::Entry::Send { entry, .. } => {
                serde_json::from_slice::<SendEntry>(&value).ok().as_ref() == Some(entry)
            }
            ledger::Entry::Receipt { entry, .. } => {
                serde_json::from_slice::<ReceiptEntry>(&value).ok().as_ref() == Some(entry)
            }
        };
        if !same {
            found.push(format!("{}: differs from the entry its events give", entry.name()));
        }
    }
    found.extend(expected.values().map(|e| format!("{}: missing", e.name())));
    found
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
    use relay_actors::account::{AccountEvent, AccountState, Ledger};
    use relay_actors::store::{Head, NewEvent, Snapshot};
    use relay_schemas::{DeliveryStatus, UnixSecs};
    use serde_json::value::RawValue;

    fn cursor(through: u64) -> NewEvent {
        let e = AccountEvent::CursorMoved { device_id: "phone".into(), through };
        NewEvent::new(e.event_type(), 1, UnixSecs(1), &e).unwrap()
    }

    fn raw(event_type: &str, data: &str) -> NewEvent {
        NewEvent { event_type: event_type.into(), version: 1, at: 1, data: RawValue::from_string(data.into()).unwrap() }
    }

    fn run(store: &Store) -> Vec<String> {
        verify(store, None, &mut |_| {}).unwrap().findings.iter().map(|f| f.to_string()).collect()
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
        let report = verify(&store, None, &mut |_| {}).unwrap();
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

    #[test]
    fn one_stream_only_and_an_unknown_stream_is_a_usage_error() {
        let store = Store::temporary().unwrap();
        let mut b = store.batch();
        b.append("account/a", Head::default(), vec![cursor(1)]);
        b.append("account/b", Head::default(), vec![cursor(1), cursor(2)]);
        store.commit_durable_blocking(b).unwrap();
        let report = verify(&store, Some("account/b"), &mut |_| {}).unwrap();
        assert_eq!((report.streams, report.events), (1, 2));
        assert!(matches!(verify(&store, Some("account/zz"), &mut |_| {}), Err(AuditError::Usage(_))));
    }
}
