//! `relay audit replay`: one actor's state rebuilt from its events only
//! (never from its snapshot), as its actor's `load` folds them.
//!
//! The chain is checked on the way (each event's hash over its bytes,
//! sequence continuity and `prev` links): a state is only shown for a sound
//! prefix of the log; anything broken stops the replay naming the place.

use super::{decoded_json, AuditError, Folded};
use relay_actors::store::{Hash, Store, StoreError, StoredEvent, ZERO_HASH};
use serde_json::Value;

/// The result of a replay.
#[derive(Clone, Debug)]
pub struct Replayed {
    pub stream: String,
    /// The last event applied (0 if none).
    pub seq: u64,
    pub hash: Hash,
    pub events: u64,
    pub folded: Folded,
}

impl Replayed {
    /// `{"stream","seq","hash","events","state"}`, plus `"ledger"`
    /// (`{"sends","receipts"}`) for an account: what `relay audit replay`
    /// prints. The state is what the actor's snapshot holds; the ledger is
    /// kept in the kv space.
    pub fn to_json(&self) -> Value {
        let mut out = serde_json::json!({
            "stream": self.stream,
            "seq": self.seq,
            "hash": hex::encode(self.hash),
            "events": self.events,
            "state": self.folded.to_json(),
        });
        if let (Some(ledger), Value::Object(m)) = (self.folded.ledger_json(), &mut out) {
            m.insert("ledger".into(), ledger);
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
    let mut folded = Folded::new(stream).ok_or_else(|| {
        AuditError::Usage(format!("stream {stream:?} is neither account/ACCOUNT_ID nor delivery/FROM/MESSAGE_ID"))
    })?;
    let broken = |seq: u64, what: String| {
        AuditError::Store(StoreError::Corrupt {
            stream: stream.to_owned(),
            seq,
            what: format!("{what}; run `relay audit verify --stream {stream}`"),
        })
    };
    let (mut seq, mut hash, mut events) = (0u64, ZERO_HASH, 0u64);
    for item in store.read(stream, 0) {
        let ev = item?;
        if until.is_some_and(|u| ev.seq > u) {
            break;
        }
        if ev.seq != seq + 1 {
            return Err(broken(ev.seq, format!("expected seq {} (events missing or out of place)", seq + 1)));
        }
        if ev.prev != hash {
            return Err(broken(ev.seq, "prev is not the hash of the event before it".into()));
        }
        let json = decoded_json(&ev)?;
        on_event(&ev, &json);
        folded.apply(&ev)?;
        (seq, hash, events) = (ev.seq, ev.hash, events + 1);
    }
    if events == 0 {
        return Err(AuditError::Usage(format!("no events in stream {stream:?}")));
    }
    Ok(Replayed { stream: stream.to_owned(), seq, hash, events, folded })
}
