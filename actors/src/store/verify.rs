//! Chain verification, the core of `relay audit verify`.

use std::fmt;

use super::{Hash, StoreError, StoredEvent, ZERO_HASH};

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
    /// The seq is not the one expected (1 for a stream's first event, else
    /// the previous seq + 1): events are missing or out of place.
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
            ChainProblem::Gap { expected } => write!(f, "gap: expected seq {expected}"),
            ChainProblem::Decode(what) => write!(f, "undecodable: {what}"),
        }
    }
}

/// Checks events as `Store::read` yields them, one stream after another
/// (events of several streams may follow each other, e.g. a whole-store scan).
///
/// Checks: seq starts at 1 and grows by 1, each `prev` is the previous hash,
/// each hash is `blake3(prev ‖ body)`. `read` already checks the hash over
/// the exact stored bytes (and yields `StoreError::HashMismatch`); here it is
/// recomputed again from the decoded event, which also catches events that
/// were changed after reading. After an undecodable event the next `prev`
/// cannot be checked, but seqs still are. Deleting a stream's *last* events
/// leaves a valid shorter chain; the chain cannot show that.
pub fn verify_chain(events: impl IntoIterator<Item = Result<StoredEvent, StoreError>>) -> Vec<ChainFinding> {
    let mut findings = Vec::new();
    let mut report =
        |stream: &str, seq: u64, problem| findings.push(ChainFinding { stream: stream.to_owned(), seq, problem });
    // (stream, last seq, last stored hash if the record was readable)
    let mut last: Option<(String, u64, Option<Hash>)> = None;
    for item in events {
        let (stream, seq, hashes, problem) = match item {
            Ok(ev) => {
                let ok = ev.compute_hash().is_ok_and(|h| h == ev.hash);
                let problem = (!ok).then_some(ChainProblem::HashMismatch);
                (ev.stream, ev.seq, Some((ev.prev, ev.hash)), problem)
            }
            Err(StoreError::HashMismatch { stream, seq }) => (stream, seq, None, Some(ChainProblem::HashMismatch)),
            Err(StoreError::Corrupt { stream, seq, what }) => (stream, seq, None, Some(ChainProblem::Decode(what))),
            Err(e) => {
                let stream = last.as_ref().map(|l| l.0.clone()).unwrap_or_default();
                report(&stream, 0, ChainProblem::Decode(e.to_string()));
                continue;
            }
        };
        let (expected, expected_prev) = match &last {
            Some((s, n, h)) if *s == stream => (n + 1, *h),
            _ => (1, Some(ZERO_HASH)),
        };
        if seq != expected {
            report(&stream, seq, ChainProblem::Gap { expected });
        } else if let (Some((prev, _)), Some(want)) = (hashes, expected_prev) {
            if prev != want {
                report(&stream, seq, ChainProblem::PrevMismatch);
            }
        }
        if let Some(p) = problem {
            report(&stream, seq, p);
        }
        // The next event must link to the *stored* hash, altered body or not.
        last = Some((stream, seq, hashes.map(|(_, h)| h)));
    }
    findings
}
