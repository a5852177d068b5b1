//! Chain verification, the core of `relay audit verify`.

use std::fmt;

use super::types::{Hash, Head, RawEvent, StoreError, StoredEvent};

/// One problem found in a log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainFinding {
    pub stream: String,
    pub seq: u64,
    pub problem: ChainProblem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChainProblem {
    /// The stored hash is not `blake3(prev ‖ body)`: the event was altered.
    HashMismatch,
    /// The event's `prev` is not the hash of the event before it.
    PrevMismatch,
    /// The first event after a pruned prefix: its `prev` is not the hash
    /// the stream's marker keeps (of the last event deleted).
    MarkerMismatch,
    /// The seq is not the one expected (1 for a stream's first event, the
    /// marker's seq + 1 after a pruned prefix, else the previous seq + 1):
    /// events are missing or out of place.
    Gap { expected: u64 },
    /// The record could not be decoded (or read).
    Decode(String),
}

impl fmt::Display for ChainFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stream {:?} seq {}: ", self.stream, self.seq)?;
        match &self.problem {
            ChainProblem::HashMismatch => write!(f, "hash mismatch"),
            ChainProblem::PrevMismatch => write!(f, "prev does not match the previous event"),
            ChainProblem::MarkerMismatch => write!(f, "prev does not match the pruned marker"),
            ChainProblem::Gap { expected } => write!(f, "gap: expected seq {expected}"),
            ChainProblem::Decode(what) => write!(f, "undecodable: {what}"),
        }
    }
}

/// Checks events as `Store::read` yields them, one stream after another
/// (events of several streams may follow each other, e.g. a whole-store
/// scan), each stream from seq 1: [`verify_chain_from`] for streams that
/// may have been pruned.
pub fn verify_chain(events: impl IntoIterator<Item = Result<StoredEvent, StoreError>>) -> Vec<ChainFinding> {
    verify_chain_from(|_| Head::default(), events)
}

/// Like [`verify_chain`], each stream checked from where `start` says it
/// starts: its pruned marker's head (`Store::pruned`), or the empty head.
///
/// Checks: seq starts at `start.seq + 1` and grows by 1, each `prev` is the
/// previous hash (the first one the marker's), each hash is
/// `blake3(prev ‖ body)`. `read` already checks the hash over the exact
/// stored bytes (and yields `StoreError::HashMismatch`); here it is
/// recomputed again from the decoded event, which also catches events that
/// were changed after reading. After an undecodable event the next `prev`
/// cannot be checked, but seqs still are. Deleting a stream's *last* events
/// leaves a valid shorter chain; the chain cannot show that.
pub fn verify_chain_from(
    start: impl FnMut(&str) -> Head,
    events: impl IntoIterator<Item = Result<StoredEvent, StoreError>>,
) -> Vec<ChainFinding> {
    let mut check = ChainCheck::new(start);
    for item in events {
        check.stored(item);
    }
    check.finish()
}

/// The chain check one event at a time, for a caller that does more with
/// each event as it goes (the audit): [`verify_chain_from`] is a loop over
/// it.
pub struct ChainCheck<F> {
    start: F,
    /// (stream, last seq, last stored hash if the record was readable)
    last: Option<(String, u64, Option<Hash>)>,
    findings: Vec<ChainFinding>,
}

impl<F: FnMut(&str) -> Head> ChainCheck<F> {
    /// `start(stream)`: the head a stream starts from (its marker's).
    pub fn new(start: F) -> Self {
        ChainCheck { start, last: None, findings: Vec::new() }
    }

    /// An event as `Store::read` gives it (its hash recomputed from its
    /// decoded fields).
    pub fn stored(&mut self, item: Result<StoredEvent, StoreError>) {
        match item {
            Ok(ev) => {
                let sound = ev.compute_hash().is_ok_and(|h| h == ev.hash);
                self.link(&ev.stream, ev.seq, Some((ev.prev, ev.hash)), sound);
            }
            Err(e) => self.error(e),
        }
    }

    /// An event of `stream` as `Store::read_raw` gives it.
    pub fn raw(&mut self, stream: &str, item: &Result<RawEvent<'_>, StoreError>) {
        match item {
            Ok(ev) => self.link(stream, ev.seq, Some((ev.prev, ev.hash)), ev.sound),
            Err(StoreError::HashMismatch { stream, seq }) => self.unreadable(stream, *seq, ChainProblem::HashMismatch),
            Err(StoreError::Corrupt { stream, seq, what }) => {
                self.unreadable(stream, *seq, ChainProblem::Decode(what.clone()))
            }
            Err(e) => self.other(e.to_string()),
        }
    }

    fn error(&mut self, e: StoreError) {
        match e {
            StoreError::HashMismatch { stream, seq } => self.unreadable(&stream, seq, ChainProblem::HashMismatch),
            StoreError::Corrupt { stream, seq, what } => self.unreadable(&stream, seq, ChainProblem::Decode(what)),
            e => self.other(e.to_string()),
        }
    }

    fn other(&mut self, what: String) {
        let stream = self.last.as_ref().map(|l| l.0.clone()).unwrap_or_default();
        self.report(&stream, 0, ChainProblem::Decode(what));
    }

    fn unreadable(&mut self, stream: &str, seq: u64, problem: ChainProblem) {
        self.check_seq(stream, seq, None);
        self.report(stream, seq, problem);
        self.last = Some((stream.to_owned(), seq, None));
    }

    fn link(&mut self, stream: &str, seq: u64, hashes: Option<(Hash, Hash)>, sound: bool) {
        self.check_seq(stream, seq, hashes.map(|(prev, _)| prev));
        if !sound {
            self.report(stream, seq, ChainProblem::HashMismatch);
        }
        // The next event must link to the *stored* hash, altered body or not.
        match &mut self.last {
            Some(last) if last.0 == stream => (last.1, last.2) = (seq, hashes.map(|(_, h)| h)),
            last => *last = Some((stream.to_owned(), seq, hashes.map(|(_, h)| h))),
        }
    }

    /// The seq and (when readable) the `prev` of the next event of `stream`.
    fn check_seq(&mut self, stream: &str, seq: u64, prev: Option<Hash>) {
        let (expected, want, first) = match &self.last {
            Some((s, n, h)) if s == stream => (n + 1, *h, None),
            _ => {
                let start = (self.start)(stream);
                (start.seq + 1, Some(start.hash), Some(start.seq))
            }
        };
        if seq != expected {
            self.report(stream, seq, ChainProblem::Gap { expected });
        } else if let (Some(prev), Some(want)) = (prev, want) {
            if prev != want {
                let problem = match first {
                    Some(marker) if marker > 0 => ChainProblem::MarkerMismatch,
                    _ => ChainProblem::PrevMismatch,
                };
                self.report(stream, seq, problem);
            }
        }
    }

    fn report(&mut self, stream: &str, seq: u64, problem: ChainProblem) {
        self.findings.push(ChainFinding { stream: stream.to_owned(), seq, problem });
    }

    pub fn finish(self) -> Vec<ChainFinding> {
        self.findings
    }
}
