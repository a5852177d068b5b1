//! `relay audit replay`: one actor's state rebuilt from its events only
//! (never from its snapshot), as its actor's `load` folds them; a stream
//! whose prefix was pruned from the state its marker keeps, then the events
//! after it (the ledger then holds what the kept events give).
//!
//! The chain is checked on the way (each event's hash over its bytes,
//! sequence continuity and `prev` links, the first one to the marker): a
//! state is only shown for a sound prefix of the log; anything broken stops
//! the replay naming the place.

use super::{decoded_json, fmt_secs, AuditError, Folded};
use relay_actors::store::{Hash, Pruned, Store, StoreError, StoredEvent};
use relay_schemas::UnixSecs;
use serde_json::Value;

/// The result of a replay.
#[derive(Clone, Debug)]
pub struct Replayed {
    pub stream: String,
    /// The last event applied (0 if none).
    pub seq: u64,
    pub hash: Hash,
    pub events: u64,
    /// The stream's pruned marker: the replay started from it.
    pub pruned: Option<Pruned>,
    /// `None`: the marker keeps no state (a delivery stream deleted whole).
    pub folded: Option<Folded>,
}

impl Replayed {
    /// `{"stream","seq","hash","events","state"}`, plus `"ledger"`
    /// (`{"sends","receipts"}`) for an account, and `"pruned"`
    /// (`{"seq","hash","at","text"}`) when the replay started from a
    /// marker: what `relay audit replay` prints. The state is what the
    /// actor's snapshot holds (`null` when nothing is left to rebuild); the
    /// ledger is kept in the kv space.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::json!({
            "stream": self.stream,
            "seq": self.seq,
            "hash": hex::encode(self.hash),
            "events": self.events,
            "state": self.folded.as_ref().map(Folded::to_json),
        });
        let Value::Object(m) = &mut out else { return out };
        if let Some(ledger) = self.folded.as_ref().and_then(Folded::ledger_json) {
            m.insert("ledger".into(), ledger);
        }
        if let Some(p) = &self.pruned {
            m.insert(
                "pruned".into(),
                serde_json::json!({
                    "seq": p.head.seq,
                    "hash": hex::encode(p.head.hash),
                    "at": p.at,
                    "text": format!("events 1..={} pruned at {}", p.head.seq, fmt_secs(UnixSecs(p.at))),
                }),
            );
        }
        out
    }
}

/// Rebuilds `stream` from its events with seq <= `until` (all when `None`;
/// a stream shorter than `until` replays whole: see `Replayed::seq`),
/// calling `on_event(event, its data upcast to the current version)` for
/// each one before applying it.
pub fn replay(
    store: &Store,
    stream: &str,
    until: Option<u64>,
    on_event: &mut dyn FnMut(&StoredEvent, &Value),
) -> Result<Replayed, AuditError> {
    let empty = Folded::new(stream).ok_or_else(|| {
        AuditError::Usage(format!("stream {stream:?} is neither account/ACCOUNT_ID nor delivery/FROM/MESSAGE_ID"))
    })?;
    let broken = |seq: u64, what: String| {
        AuditError::Store(StoreError::Corrupt {
            stream: stream.to_owned(),
            seq,
            what: format!("{what}; run `relay audit verify --stream {stream}`"),
        })
    };
    let pruned = store.pruned(stream)?;
    let mut folded = match &pruned {
        None => Some(empty),
        Some(p) => {
            Folded::from_marker(stream, p).map_err(|what| broken(p.head.seq, format!("pruned marker: {what}")))?
        }
    };
    if let (Some(p), Some(u)) = (&pruned, until) {
        if u < p.head.seq {
            return Err(AuditError::Usage(format!(
                "stream {stream:?}: {}; a replay can stop at seq {} or later",
                super::pruned_text(p),
                p.head.seq
            )));
        }
    }
    let start = pruned.as_ref().map(|p| p.head).unwrap_or_default();
    let (mut seq, mut hash, mut events) = (start.seq, start.hash, 0u64);
    for item in store.read(stream, 0) {
        let ev = item?;
        if until.is_some_and(|u| ev.seq > u) {
            break;
        }
        if ev.seq != seq + 1 {
            return Err(broken(ev.seq, format!("expected seq {} (events missing or out of place)", seq + 1)));
        }
        if ev.prev != hash {
            let what = match seq == start.seq && start.seq > 0 {
                true => "prev is not the hash the pruned marker keeps",
                false => "prev is not the hash of the event before it",
            };
            return Err(broken(ev.seq, what.into()));
        }
        let json = decoded_json(&ev)?;
        on_event(&ev, &json);
        match folded.as_mut() {
            Some(f) => f.apply(&ev).map(drop)?,
            None => return Err(broken(ev.seq, "an event after a marker that keeps no state".into())),
        }
        (seq, hash, events) = (ev.seq, ev.hash, events + 1);
    }
    if events == 0 && pruned.is_none() {
        return Err(AuditError::Usage(format!("no events in stream {stream:?}")));
    }
    Ok(Replayed { stream: stream.to_owned(), seq, hash, events, pruned, folded })
}
