//! `relay audit`: what a relay did, proven from its event logs alone.
//!
//! Everything here works on the store of a *stopped* relay (sled holds an
//! exclusive lock while a relay runs; [`open_store`] turns that into
//! [`AuditError::InUse`]). The functions take a [`Store`] and return data;
//! [`cli`] only parses arguments and prints.
//!
//! - [`verify`]: every stream's hash chain, sequence continuity, event
//!   decoding (through the upcasters), every snapshot against the state
//!   rebuilt from the events, and each account's idempotency ledger (kv
//!   projection) against the one its events give;
//! - [`replay`]: one stream's state rebuilt from its events only;
//! - [`story`]: the whole story of one message on this relay;
//! - [`checkpoint`]: the latest signed checkpoint, whether the store
//!   extends a checkpoint (its own, or one a peer witnessed), the witness log;
//! - [`export`]: events as JSON lines (`schemas/json/audit/export-line.schema.json`);
//! - [`terminal`]: what every output passes through, so that text a stranger
//!   wrote cannot drive the terminal it is read on.

pub mod checkpoint;
pub mod cli;
pub mod export;
pub mod replay;
pub mod story;
pub mod terminal;
pub mod verify;

use relay_actors::store::{Pruned, Store, StoreError, StoredEvent};
use relay_actors::upcast::{self, EventText};
use relay_core::account::ledger::Ledger;
use relay_core::account::{AccountEvent, AccountState};
use relay_core::delivery::aggregate::{DeliveryEvent, DeliveryState};
use relay_schemas::{UnixMillis, UnixSecs};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("data dir {} is in use by a running relay; stop it first", .0.display())]
    InUse(PathBuf),
    #[error("no store in data dir {} (expected {}/store)", .0.display(), .0.display())]
    NoStore(PathBuf),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl AuditError {
    /// 2 for "cannot audit this" (in use, no store, bad arguments), 1 for a
    /// problem found in the data.
    pub fn exit_code(&self) -> u8 {
        match self {
            AuditError::InUse(_) | AuditError::NoStore(_) | AuditError::Usage(_) => 2,
            AuditError::Store(_) | AuditError::Io(_) => 1,
        }
    }
}

/// Opens the store in `data_dir/store` of a stopped relay. Never creates one.
pub fn open_store(data_dir: &Path) -> Result<Store, AuditError> {
    let dir = data_dir.join("store");
    // sled's files, in the store's directory or in the `tree.<n>` that
    // `tree` names (a rewritten store).
    if !["conf", "db", "tree"].iter().any(|f| dir.join(f).exists()) {
        return Err(AuditError::NoStore(data_dir.to_path_buf()));
    }
    Store::open_to_read(&dir).map_err(|e| {
        if relay::config::store_in_use(&e) {
            AuditError::InUse(data_dir.to_path_buf())
        } else {
            AuditError::Store(e)
        }
    })
}

/// What a stream id names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamKind<'a> {
    Account { account_id: &'a str },
    Delivery { from: &'a str, message_id: &'a str },
    Other,
}

pub fn stream_kind(stream: &str) -> StreamKind<'_> {
    if let Some(account_id) = stream.strip_prefix("account/") {
        if !account_id.is_empty() && !account_id.contains('/') {
            return StreamKind::Account { account_id };
        }
    }
    if let Some((from, message_id)) = stream.strip_prefix("delivery/").and_then(|r| r.split_once('/')) {
        if !from.is_empty() && !message_id.is_empty() && !message_id.contains('/') {
            return StreamKind::Delivery { from, message_id };
        }
    }
    StreamKind::Other
}

/// A stream's state as its actor folds it.
#[derive(Clone, Debug)]
pub enum Folded {
    Account(Box<AccountFold>),
    Delivery(Box<DeliveryState>),
}

/// An account's state (what its snapshot holds) and its idempotency ledger
/// (kept in the kv space, written with the events).
#[derive(Clone, Debug)]
pub struct AccountFold {
    pub state: AccountState,
    pub ledger: Ledger,
}

/// A decoded event (already upcast to the current version).
#[derive(Clone, Debug)]
pub enum Decoded {
    Account(Box<AccountEvent>),
    Delivery(Box<DeliveryEvent>),
}

/// Decodes an event of `stream` through the upcasters; `None` for a stream
/// of no known kind.
pub fn decode(ev: &impl EventText) -> Option<Result<Decoded, StoreError>> {
    match stream_kind(ev.stream()) {
        StreamKind::Account { .. } => Some(upcast::account_event(ev).map(|e| Decoded::Account(Box::new(e)))),
        StreamKind::Delivery { .. } => Some(upcast::delivery_event(ev).map(|e| Decoded::Delivery(Box::new(e)))),
        StreamKind::Other => None,
    }
}

/// The event's data upcast to the current version, as JSON (for printing).
pub fn decoded_json(ev: &StoredEvent) -> Result<Value, StoreError> {
    match stream_kind(&ev.stream) {
        StreamKind::Account { .. } => upcast::upcast_json(ev, AccountEvent::VERSION, upcast::ACCOUNT_UPCASTERS),
        StreamKind::Delivery { .. } => upcast::upcast_json(ev, DeliveryEvent::VERSION, upcast::DELIVERY_UPCASTERS),
        StreamKind::Other => serde_json::from_str(ev.data.get()).map_err(|e| StoreError::Corrupt {
            stream: ev.stream.clone(),
            seq: ev.seq,
            what: format!("data: {e}"),
        }),
    }
}

impl Folded {
    /// The empty state of `stream`, as its actor starts; `None` for a stream
    /// of no known kind.
    pub fn new(stream: &str) -> Option<Folded> {
        match stream_kind(stream) {
            StreamKind::Account { account_id } => Some(Folded::Account(Box::new(AccountFold {
                state: AccountState::new(account_id),
                ledger: Ledger::default(),
            }))),
            StreamKind::Delivery { .. } => Some(Folded::Delivery(Box::default())),
            StreamKind::Other => None,
        }
    }

    /// The state of `stream` folded through its pruned prefix, as the
    /// marker keeps it (an account's: its `AccountState` as a snapshot holds
    /// it; the ledger is not part of it). `Ok(None)`: the marker keeps no
    /// state, as for a delivery stream deleted whole (nothing to rebuild).
    /// `Err`: why the marker's state is not this stream's.
    pub fn from_marker(stream: &str, marker: &Pruned) -> Result<Option<Folded>, String> {
        if marker.state.is_empty() {
            return match stream_kind(stream) {
                StreamKind::Account { .. } => Err("keeps no state: an account's state is never deleted".into()),
                _ => Ok(None),
            };
        }
        match stream_kind(stream) {
            StreamKind::Account { account_id } => {
                let mut state: AccountState = serde_json::from_slice(&marker.state)
                    .map_err(|e| format!("its state does not decode as an account's: {e}"))?;
                if state.account_id != account_id {
                    return Err(format!("its state is account {}'s", state.account_id));
                }
                state.rebuild_caches();
                Ok(Some(Folded::Account(Box::new(AccountFold { state, ledger: Ledger::default() }))))
            }
            StreamKind::Delivery { .. } => serde_json::from_slice::<DeliveryState>(&marker.state)
                .map(|s| Some(Folded::Delivery(Box::new(s))))
                .map_err(|e| format!("its state does not decode as a delivery's: {e}")),
            StreamKind::Other => Ok(None),
        }
    }

    /// Decodes `ev` (upcasting older versions) and applies it, as the actor's
    /// `load` does. Also returns the rule an event breaks that `apply` would
    /// silently accept (a delivery must start with `accepted`, nothing
    /// follows `finished`), as `Ok(Some(what))`.
    pub fn apply(&mut self, ev: &impl EventText) -> Result<Option<String>, StoreError> {
        let mismatch = || StoreError::Corrupt {
            stream: ev.stream().to_owned(),
            seq: ev.seq(),
            what: "event of the wrong stream kind".into(),
        };
        match (self, decode(ev)) {
            (Folded::Account(a), Some(Ok(Decoded::Account(e)))) => {
                a.state.apply(&e);
                a.ledger.apply(&a.state.account_id, &e);
                Ok(None)
            }
            (Folded::Delivery(s), Some(Ok(Decoded::Delivery(e)))) => {
                let first = matches!(*e, DeliveryEvent::Accepted { .. });
                let anomaly = if ev.seq() == 1 && !first {
                    Some(format!("a delivery stream must start with accepted, not {}", ev.event_type()))
                } else if ev.seq() > 1 && first {
                    Some("accepted again after the start of the delivery".to_string())
                } else if s.finished.is_some() {
                    Some(format!("{} after the delivery finished", ev.event_type()))
                } else {
                    None
                };
                s.apply(&e);
                Ok(anomaly)
            }
            (_, Some(Err(e))) => Err(e),
            _ => Err(mismatch()),
        }
    }

    /// Like [`Folded::apply`], decoding only what the fold reads
    /// ([`verify::Depth::Fold`]): a timeline record's envelope, key boxes
    /// and sender certificate, and (unless `params`: a snapshot holds them)
    /// a delivery's params, are read past as JSON, not decoded into their
    /// types. Gives the same state, ledger and rules as `apply`
    /// (`the_fold_that_skips_record_bodies_gives_what_the_full_one_gives`).
    pub fn apply_fold(&mut self, ev: &impl EventText, params: bool) -> Result<Option<String>, StoreError> {
        let current = |upcasters: &[upcast::Upcaster], version: u32| {
            (upcast::OLDEST_VERSION..=version).contains(&ev.version())
                && !upcasters.iter().any(|u| u.event_type == ev.event_type() && u.from_version >= ev.version())
        };
        match self {
            Folded::Account(a)
                if matches!(ev.event_type(), "message_sent" | "self_delivered" | "message_received")
                    && current(upcast::ACCOUNT_UPCASTERS, AccountEvent::VERSION) =>
            {
                let e = lite::account_event(ev)?;
                a.state.apply(&e);
                a.ledger.apply(&a.state.account_id, &e);
                Ok(None)
            }
            Folded::Delivery(s)
                if !params
                    && ev.event_type() == "accepted"
                    && current(upcast::DELIVERY_UPCASTERS, DeliveryEvent::VERSION) =>
            {
                // Its members checked; the state (never compared without a
                // snapshot) keeps what the rules read: it has not finished.
                lite::accepted(ev)?;
                Ok(if ev.seq() > 1 {
                    Some("accepted again after the start of the delivery".to_string())
                } else if s.finished.is_some() {
                    Some("accepted after the delivery finished".to_string())
                } else {
                    None
                })
            }
            _ => self.apply(ev),
        }
    }

    /// The state as its snapshot would hold it, with object keys sorted.
    pub fn to_json(&self) -> Value {
        let v = match self {
            Folded::Account(a) => serde_json::to_value(&a.state),
            Folded::Delivery(s) => serde_json::to_value(s),
        };
        sorted(v.unwrap_or_else(|e| Value::String(format!("unserializable state: {e}"))))
    }

    /// An account's ledger as `{"sends","receipts"}` (keys sorted); `None`
    /// for other streams.
    pub fn ledger_json(&self) -> Option<Value> {
        match self {
            Folded::Account(a) => Some(sorted(
                serde_json::to_value(&a.ledger)
                    .unwrap_or_else(|e| Value::String(format!("unserializable ledger: {e}"))),
            )),
            Folded::Delivery(_) => None,
        }
    }

    /// Checks that `bytes` decode as this kind's snapshot state. Returns the
    /// state (keys sorted) and, for an account snapshot written before the
    /// ledger left the state, the ledger it held (`{"sends","receipts"}`),
    /// which is not part of the state any more.
    pub fn check_snapshot(&self, bytes: &[u8]) -> Result<(Value, Option<Value>), String> {
        let typed = match self {
            Folded::Account(_) => serde_json::from_slice::<AccountState>(bytes).map(|_| ()),
            Folded::Delivery(_) => serde_json::from_slice::<DeliveryState>(bytes).map(|_| ()),
        };
        typed.map_err(|e| format!("snapshot state does not decode: {e}"))?;
        let mut state =
            serde_json::from_slice::<Value>(bytes).map_err(|e| format!("snapshot state is not JSON: {e}"))?;
        let mut legacy = None;
        if let (Folded::Account(_), Value::Object(m)) = (self, &mut state) {
            let (sends, receipts) = (m.remove("sends"), m.remove("receipts"));
            if sends.is_some() || receipts.is_some() {
                let empty = || Value::Object(Map::new());
                legacy = Some(sorted(serde_json::json!({
                    "sends": sends.unwrap_or_else(empty),
                    "receipts": receipts.unwrap_or_else(empty),
                })));
            }
        }
        Ok((sorted(state), legacy))
    }
}

/// Every stream of the store in name order: those with events and those
/// pruned whole (a marker and no events).
pub fn all_streams(store: &Store) -> impl Iterator<Item = Result<String, StoreError>> + Send + 'static {
    let mut markers = Vec::new();
    let mut failed = None;
    for item in store.pruned_markers() {
        match item {
            Ok((stream, _)) => markers.push(stream),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let mut markers = markers.into_iter().peekable();
    let mut streams = store.streams().peekable();
    let merged = std::iter::from_fn(move || match (streams.peek(), markers.peek()) {
        (Some(Ok(s)), Some(m)) if m < s => markers.next().map(Ok),
        (Some(Ok(s)), Some(m)) if m == s => {
            markers.next();
            streams.next()
        }
        (Some(_), _) => streams.next(),
        (None, _) => markers.next().map(Ok),
    });
    failed.map(Err).into_iter().chain(merged)
}

/// What a stream's marker says, for people: `pruned through seq N at T`.
pub fn pruned_text(marker: &Pruned) -> String {
    format!("pruned through seq {} at {}", marker.head.seq, fmt_secs(UnixSecs(marker.at)))
}

/// `v` with every object's keys in sorted order (stable output whatever the
/// map types inside the state).
pub fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect::<Map<_, _>>())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Where two JSON values first differ, as `path: left X, right Y`
/// (values shortened); `None` when equal.
pub fn first_difference(left: &Value, right: &Value) -> Option<String> {
    fn short(v: Option<&Value>) -> String {
        match v {
            None => "absent".into(),
            Some(v) => {
                let s = v.to_string();
                if s.chars().count() > 80 {
                    format!("{}…", s.chars().take(80).collect::<String>())
                } else {
                    s
                }
            }
        }
    }
    fn walk(path: &str, l: Option<&Value>, r: Option<&Value>) -> Option<(String, String, String)> {
        if l == r {
            return None;
        }
        match (l, r) {
            (Some(Value::Object(a)), Some(Value::Object(b))) => {
                let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
                keys.sort();
                keys.dedup();
                keys.into_iter().find_map(|k| walk(&format!("{path}/{k}"), a.get(k), b.get(k)))
            }
            (Some(Value::Array(a)), Some(Value::Array(b))) if a.len() == b.len() => {
                (0..a.len()).find_map(|i| walk(&format!("{path}/{i}"), a.get(i), b.get(i)))
            }
            _ => Some((if path.is_empty() { "/".into() } else { path.to_string() }, short(l), short(r))),
        }
    }
    walk("", Some(left), Some(right)).map(|(p, l, r)| format!("{p}: {l} vs {r}"))
}

/// Unix seconds as RFC 3339 (UTC).
pub fn fmt_secs(secs: UnixSecs) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(secs.0)).to_string()
}

/// Unix milliseconds as RFC 3339 (UTC) with milliseconds.
pub fn fmt_ms(ms: UnixMillis) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.0)).to_string()
}

/// `T` of `--since T`: unix seconds, or an RFC 3339 time.
pub fn parse_time(s: &str) -> Result<u64, AuditError> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(n);
    }
    let t = humantime::parse_rfc3339_weak(s)
        .map_err(|e| AuditError::Usage(format!("time {s:?}: {e} (use unix seconds or RFC 3339)")))?;
    Ok(t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stream_kinds_are_told_apart() {
        assert_eq!(stream_kind("account/ab"), StreamKind::Account { account_id: "ab" });
        assert_eq!(stream_kind("delivery/ab/m1"), StreamKind::Delivery { from: "ab", message_id: "m1" });
        assert_eq!(stream_kind("delivery/ab"), StreamKind::Other);
        assert_eq!(stream_kind("account/"), StreamKind::Other);
        assert_eq!(stream_kind("bench/1"), StreamKind::Other);
    }

    #[test]
    fn first_difference_names_the_path() {
        let a = json!({"a": 1, "b": {"c": [1, 2]}});
        let b = json!({"a": 1, "b": {"c": [1, 3]}});
        assert_eq!(first_difference(&a, &b).unwrap(), "/b/c/1: 2 vs 3");
        assert_eq!(first_difference(&a, &a), None);
        assert_eq!(first_difference(&json!({"x": 1}), &json!({})).unwrap(), "/x: 1 vs absent");
    }

    #[test]
    fn times_parse_as_unix_seconds_or_rfc3339() {
        assert_eq!(parse_time("1700000000").unwrap(), 1_700_000_000);
        assert_eq!(parse_time("2023-11-14T22:13:20Z").unwrap(), 1_700_000_000);
        assert!(parse_time("yesterday").is_err());
        assert_eq!(fmt_secs(UnixSecs(1_700_000_000)), "2023-11-14T22:13:20Z");
    }
}

/// The decoding of [`Folded::apply_fold`]: the members the folds read, the
/// rest read past as JSON.
mod lite {
    use super::EventText;
    use relay_actors::store::StoreError;
    use relay_core::account::{AccountEvent, Record};
    use relay_schemas::objects::DeliveryStatus;
    use relay_schemas::objects::{MessageEnvelope, Wire};
    use serde::de::IgnoredAny;
    use serde::Deserialize;
    use std::sync::OnceLock;

    #[derive(Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Lite {
        MessageSent {
            message_id: String,
            to: String,
            digest: String,
            accepted_at: u64,
            deadline: u64,
            retention_until: u64,
            record: Option<Box<LiteRecord>>,
            #[serde(default)]
            status: Option<DeliveryStatus>,
        },
        SelfDelivered {
            message_id: String,
            digest: String,
            accepted_at: u64,
            retention_until: u64,
            record: Box<LiteRecord>,
        },
        MessageReceived {
            from: String,
            message_id: String,
            digest: String,
            accepted_at: u64,
            retention_until: u64,
            record: Box<LiteRecord>,
            #[serde(default)]
            #[allow(dead_code)]
            sender_certificate: Option<IgnoredAny>,
        },
    }

    /// A [`Record`] without its protocol objects.
    #[derive(Deserialize)]
    struct LiteRecord {
        sequence: u64,
        expires_at: u64,
        #[allow(dead_code)]
        envelope: IgnoredAny,
        #[allow(dead_code)]
        boxes: IgnoredAny,
        visible: Vec<String>,
    }

    /// The stand-in for a record's envelope: no fold reads one.
    fn no_envelope() -> Wire<MessageEnvelope> {
        static EMPTY: OnceLock<Wire<MessageEnvelope>> = OnceLock::new();
        EMPTY
            .get_or_init(|| {
                let empty = r#"{"message_id":"","from":"","from_device_id":"","to":"","created_at":0,"ciphertext":"","signature":""}"#;
                Wire::parse(empty).expect("an empty envelope parses")
            })
            .clone()
    }

    fn record(r: LiteRecord) -> Box<Record> {
        Box::new(Record {
            sequence: r.sequence,
            expires_at: r.expires_at,
            envelope: no_envelope(),
            boxes: Vec::new(),
            visible: r.visible,
        })
    }

    fn corrupt(ev: &impl EventText, what: String) -> StoreError {
        StoreError::Corrupt { stream: ev.stream().to_owned(), seq: ev.seq(), what }
    }

    /// A `message_sent`, `self_delivered` or `message_received`, its record
    /// standing in for the one stored (same sequence, expiry and devices).
    pub fn account_event(ev: &impl EventText) -> Result<AccountEvent, StoreError> {
        let m: Lite = serde_json::from_str(ev.data())
            .map_err(|e| corrupt(ev, format!("event {} v{}: {e}", ev.event_type(), ev.version())))?;
        let e = match m {
            Lite::MessageSent { message_id, to, digest, accepted_at, deadline, retention_until, record: r, status } => {
                AccountEvent::MessageSent {
                    message_id,
                    to,
                    digest,
                    accepted_at,
                    deadline,
                    retention_until,
                    record: r.map(|r| record(*r)),
                    status,
                }
            }
            Lite::SelfDelivered { message_id, digest, accepted_at, retention_until, record: r } => {
                AccountEvent::SelfDelivered { message_id, digest, accepted_at, retention_until, record: record(*r) }
            }
            Lite::MessageReceived { from, message_id, digest, accepted_at, retention_until, record: r, .. } => {
                AccountEvent::MessageReceived {
                    from,
                    message_id,
                    digest,
                    accepted_at,
                    retention_until,
                    record: record(*r),
                    sender_certificate: None,
                }
            }
        };
        if e.event_type() != ev.event_type() {
            let what = format!("stored type {:?} but the data is a {:?} event", ev.event_type(), e.event_type());
            return Err(corrupt(ev, what));
        }
        Ok(e)
    }

    #[derive(Deserialize)]
    #[serde(rename_all = "snake_case")]
    #[allow(dead_code)]
    enum Accepted {
        Accepted {
            from: String,
            message_id: String,
            to: String,
            accepted_at: u64,
            deadline: u64,
            digest: String,
            params: IgnoredAny,
            first_due_ms: u64,
        },
    }

    /// An `accepted` delivery event, its params read past.
    pub fn accepted(ev: &impl EventText) -> Result<(), StoreError> {
        serde_json::from_str::<Accepted>(ev.data())
            .map(drop)
            .map_err(|e| corrupt(ev, format!("event {} v{}: {e}", ev.event_type(), ev.version())))
    }
}
