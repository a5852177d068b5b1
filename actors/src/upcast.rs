//! Decoding stored events, older versions first upcast to the current one.
//!
//! Every stored event carries its `type` and `version` (see `store/codec.rs`).
//! An actor kind has one current version ([`AccountEvent::VERSION`],
//! [`DeliveryEvent::VERSION`]), written with every new event of that kind.
//! When the JSON of one event type changes, the kind's version goes up by one
//! and an [`Upcaster`] for `(type, old version)` is added below: a function
//! that turns the old JSON into the JSON of the next version. Decoding an
//! event of version `v < current` runs, for each step `v → v+1 → … →
//! current`, the upcaster registered for `(type, step)` if there is one (a
//! type that did not change in that step passes unchanged), then
//! deserializes the result. The current version takes the fast path straight
//! into the type. A version newer than the current one is refused: that log
//! was written by a newer relay.
//!
//! Decoding also checks that the stored `type` names the variant the data
//! holds, so an event cannot silently change its kind.
//!
//! History:
//! - delivery v0 → v1: `attempt_failed` gained `may_switch` and
//!   `refresh_route` ([`attempt_failed_v0`]).
//! - account v1 → v2: the types `push_subscribed` and `push_unsubscribed`
//!   were added (Web Push, PROTOCOL §9). No existing type changed, so no
//!   upcaster: v0/v1 events pass as they are, and a relay that reads only
//!   v1 refuses a v2 log by its version rather than by an unknown type.
//! - account v2 → v3: the replication types (`replicated`, `replica_pulled`,
//!   `replica_served`, `replica_acked`, `replica_reset`) were added
//!   (`timeline.replicate`); again no existing type changed.

use crate::store::{RawEvent, StoreError, StoredEvent};
use relay_core::account::AccountEvent;
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_schemas::{DeliveryHandling, ErrorCode};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

/// Turns the data of one event type at `from_version` into its data at
/// `from_version + 1`. The data is the stored JSON, e.g.
/// `{"attempt_failed": {…}}`. An `Err` is a message for the audit finding.
pub type UpcastFn = fn(Value) -> Result<Value, String>;

/// One registered step of one event type.
#[derive(Clone, Copy)]
pub struct Upcaster {
    pub event_type: &'static str,
    pub from_version: u32,
    pub upcast: UpcastFn,
}

/// The oldest event version this relay can read.
pub const OLDEST_VERSION: u32 = 0;

/// Upcasters of account events (none yet: every type is as in v0; v2 and
/// v3 only added types).
pub const ACCOUNT_UPCASTERS: &[Upcaster] = &[];

/// Upcasters of delivery events.
pub const DELIVERY_UPCASTERS: &[Upcaster] =
    &[Upcaster { event_type: "attempt_failed", from_version: 0, upcast: attempt_failed_v0 }];

/// What decoding reads of a stored event: where it is (for errors), its
/// type, version and data. [`StoredEvent`] as `Store::read` gives it, or
/// [`Text`] over an event read without parsing its data (`Store::read_raw`).
pub trait EventText {
    fn stream(&self) -> &str;
    fn seq(&self) -> u64;
    fn event_type(&self) -> &str;
    fn version(&self) -> u32;
    fn data(&self) -> &str;
}

impl EventText for StoredEvent {
    fn stream(&self) -> &str {
        &self.stream
    }
    fn seq(&self) -> u64 {
        self.seq
    }
    fn event_type(&self) -> &str {
        &self.event_type
    }
    fn version(&self) -> u32 {
        self.version
    }
    fn data(&self) -> &str {
        self.data.get()
    }
}

/// An event of `stream` read by `Store::read_raw`, to decode.
pub struct Text<'a> {
    pub stream: &'a str,
    pub event: &'a RawEvent<'a>,
}

impl EventText for Text<'_> {
    fn stream(&self) -> &str {
        self.stream
    }
    fn seq(&self) -> u64 {
        self.event.seq
    }
    fn event_type(&self) -> &str {
        &self.event.event_type
    }
    fn version(&self) -> u32 {
        self.event.version
    }
    fn data(&self) -> &str {
        self.event.data()
    }
}

fn corrupt(ev: &impl EventText, what: String) -> StoreError {
    StoreError::Corrupt { stream: ev.stream().to_owned(), seq: ev.seq(), what }
}

/// The event of an `account/…` stream, upcast to [`AccountEvent::VERSION`].
pub fn account_event(ev: &impl EventText) -> Result<AccountEvent, StoreError> {
    decode(ev, AccountEvent::VERSION, ACCOUNT_UPCASTERS, AccountEvent::event_type)
}

/// The event of a `delivery/…` stream, upcast to [`DeliveryEvent::VERSION`].
pub fn delivery_event(ev: &impl EventText) -> Result<DeliveryEvent, StoreError> {
    decode(ev, DeliveryEvent::VERSION, DELIVERY_UPCASTERS, DeliveryEvent::event_type)
}

/// The data of `ev` brought to version `current` (as JSON), without
/// deserializing it into the event type: for tools that print events.
pub fn upcast_json(ev: &impl EventText, current: u32, upcasters: &[Upcaster]) -> Result<Value, StoreError> {
    check_version(ev, current)?;
    let (event_type, version) = (ev.event_type(), ev.version());
    let mut data: Value =
        serde_json::from_str(ev.data()).map_err(|e| corrupt(ev, format!("{event_type} v{version}: {e}")))?;
    for from in version..current {
        if let Some(u) = upcasters.iter().find(|u| u.event_type == event_type && u.from_version == from) {
            data = (u.upcast)(data)
                .map_err(|e| corrupt(ev, format!("upcasting {event_type} v{from} to v{}: {e}", from + 1)))?;
        }
    }
    Ok(data)
}

fn check_version(ev: &impl EventText, current: u32) -> Result<(), StoreError> {
    if !(OLDEST_VERSION..=current).contains(&ev.version()) {
        let what = format!(
            "{} has version {}, this relay reads versions {OLDEST_VERSION}..={current}",
            ev.event_type(),
            ev.version()
        );
        return Err(corrupt(ev, what));
    }
    Ok(())
}

fn decode<E: DeserializeOwned>(
    ev: &impl EventText,
    current: u32,
    upcasters: &[Upcaster],
    type_of: fn(&E) -> &'static str,
) -> Result<E, StoreError> {
    let (event_type, version) = (ev.event_type(), ev.version());
    let event: E = if version == current {
        serde_json::from_str(ev.data()).map_err(|e| corrupt(ev, format!("event {event_type} v{current}: {e}")))?
    } else {
        let data = upcast_json(ev, current, upcasters)?;
        // Through text, not `from_value`: protocol objects keep their raw bytes.
        let text = data.to_string();
        serde_json::from_str(&text)
            .map_err(|e| corrupt(ev, format!("event {event_type} v{version} upcast to v{current}: {e}")))?
    };
    let found = type_of(&event);
    if found != event_type {
        return Err(corrupt(ev, format!("stored type {event_type:?} but the data is a {found:?} event")));
    }
    Ok(event)
}

/// The members of an externally tagged event (`{"<type>": {…}}`).
fn members<'a>(data: &'a mut Value, event_type: &str) -> Result<&'a mut Map<String, Value>, String> {
    data.get_mut(event_type).and_then(Value::as_object_mut).ok_or_else(|| format!("no {event_type:?} object"))
}

/// Delivery v0 → v1: `attempt_failed` had no `may_switch`/`refresh_route`.
/// A v0 relay refreshed the route and followed a higher revision only after
/// a route error (`route_stale`, `target_not_local`, `route_not_found`,
/// `not_found`, `invalid_state`), so both are derived from the error code:
/// true for those, false otherwise (never switching on a doubtful answer is
/// the safe side: the next attempt confirms with the same target).
pub fn attempt_failed_v0(mut data: Value) -> Result<Value, String> {
    let m = members(&mut data, "attempt_failed")?;
    let code = m.get("error").and_then(|e| e.get("code")).and_then(Value::as_str).ok_or("no error.code")?;
    let route_error =
        ErrorCode::parse(code).is_some_and(|c| c.delivery_handling() == DeliveryHandling::RefreshRouteAndRetry);
    m.entry("may_switch").or_insert(Value::Bool(route_error));
    m.entry("refresh_route").or_insert(Value::Bool(route_error));
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Head, NewEvent, Store};
    use relay_core::delivery::aggregate::DeliveryState;
    use relay_schemas::objects::Status;
    use serde_json::json;

    fn deliver_params() -> Value {
        json!({"envelope":{"message_id":"msg-0000000000000001","from":"a","from_device_id":"d","to":"b","created_at":1,
                "ciphertext":"AA","signature":"s"},
               "recipient_boxes":[{"device_id":"d","box":"AA"}],
               "sender_device_certificate":{"account_id":"a","account_key":"k","device_id":"d","device_key":"k",
                "box_key":"k","issued_at":1,"signature":"s"}})
    }

    fn new_event(event_type: &str, version: u32, data: Value) -> NewEvent {
        NewEvent::new(event_type, version, relay_schemas::UnixSecs(1000), &data).unwrap()
    }

    /// A delivery log as a v0 relay wrote it: every event at version 0, and
    /// `attempt_failed` without `may_switch`/`refresh_route`.
    fn v0_log() -> Vec<NewEvent> {
        let failed = |attempt: u32, code: &str, next: u64| {
            new_event(
                "attempt_failed",
                0,
                json!({"attempt_failed": {"attempt": attempt, "error": {"code": code, "message": "x"}, "next_due_ms": next}}),
            )
        };
        vec![
            new_event(
                "accepted",
                0,
                json!({"accepted": {"from": "a", "message_id": "msg-0000000000000001", "to": "b", "accepted_at": 1000,
                    "deadline": 6400, "digest": "dd", "params": deliver_params(), "first_due_ms": 1_000_000}}),
            ),
            new_event(
                "route_refreshed",
                0,
                json!({"route_refreshed": {"revision": 1, "relays": [{"id": "relay-b", "url": "http://b"}]}}),
            ),
            new_event(
                "attempt_started",
                0,
                json!({"attempt_started": {"attempt": 1, "targets": ["relay-b"], "revision": 1}}),
            ),
            failed(1, "temporarily_unavailable", 1_030_000),
            new_event(
                "attempt_started",
                0,
                json!({"attempt_started": {"attempt": 2, "targets": ["relay-b"], "revision": 1}}),
            ),
            failed(2, "route_stale", 1_300_000),
        ]
    }

    #[test]
    fn attempt_failed_v0_gets_may_switch_and_refresh_route_from_its_error_code() {
        let up = |code: &str| {
            attempt_failed_v0(
                json!({"attempt_failed": {"attempt": 1, "error": {"code": code, "message": "x"}, "next_due_ms": 5}}),
            )
            .unwrap()
        };
        assert_eq!(up("route_stale")["attempt_failed"]["may_switch"], true);
        assert_eq!(up("route_stale")["attempt_failed"]["refresh_route"], true);
        assert_eq!(up("bad_gateway")["attempt_failed"]["may_switch"], false);
        assert_eq!(up("some_future_code")["attempt_failed"]["refresh_route"], false);
        assert!(attempt_failed_v0(json!({"attempt_failed": {"attempt": 1}})).is_err());
    }

    #[test]
    fn a_delivery_log_written_by_event_version_0_still_replays() {
        let store = Store::temporary().unwrap();
        let mut batch = store.batch();
        batch.append("delivery/a/msg-0000000000000001", Head::default(), v0_log());
        store.commit_durable_blocking(batch).unwrap();

        let mut state = DeliveryState::default();
        for ev in store.read("delivery/a/msg-0000000000000001", 0) {
            let ev = ev.unwrap();
            assert_eq!(ev.version, 0);
            state.apply(&delivery_event(&ev).unwrap());
        }
        assert_eq!(state.attempts, 2);
        assert_eq!(state.next_due_ms, Some(relay_schemas::UnixMillis(1_300_000)));
        assert!(state.may_switch && state.refresh_route, "the last failure was a route error");
        assert_eq!(state.status().status, Status::Delivering);
        assert_eq!(state.target.as_ref().map(|t| t.revision), Some(1));
    }

    #[test]
    fn the_current_version_decodes_unchanged() {
        let store = Store::temporary().unwrap();
        let event = DeliveryEvent::AttemptStarted { attempt: 3, targets: vec!["relay-b".into()], revision: 2 };
        let mut batch = store.batch();
        let ne = NewEvent::new(event.event_type(), DeliveryEvent::VERSION, relay_schemas::UnixSecs(1), &event).unwrap();
        batch.append("delivery/a/m", Head::default(), vec![ne]);
        store.commit_durable_blocking(batch).unwrap();
        let ev = store.read("delivery/a/m", 0).next().unwrap().unwrap();
        assert!(matches!(delivery_event(&ev).unwrap(), DeliveryEvent::AttemptStarted { attempt: 3, revision: 2, .. }));
    }

    fn stored(event_type: &str, version: u32, data: Value) -> StoredEvent {
        StoredEvent {
            stream: "delivery/a/m".into(),
            seq: 7,
            event_type: event_type.into(),
            version,
            at: 1,
            data: serde_json::value::RawValue::from_string(data.to_string()).unwrap(),
            prev: [0; 32],
            hash: [0; 32],
        }
    }

    #[test]
    fn a_newer_version_is_refused_naming_stream_and_seq() {
        let ev = stored("finished", DeliveryEvent::VERSION + 1, json!({"finished": {}}));
        let err = delivery_event(&ev).unwrap_err().to_string();
        assert!(err.contains("delivery/a/m") && err.contains("seq 7") && err.contains("version 2"), "{err}");
    }

    #[test]
    fn a_stored_type_that_does_not_match_the_data_is_refused() {
        let ev = stored(
            "attempt_failed",
            DeliveryEvent::VERSION,
            json!({"attempt_started": {"attempt": 1, "targets": [], "revision": 0}}),
        );
        let err = delivery_event(&ev).unwrap_err().to_string();
        assert!(err.contains("stored type \"attempt_failed\""), "{err}");
    }

    #[test]
    fn account_events_of_version_0_pass_unchanged() {
        let ev = StoredEvent {
            stream: "account/a".into(),
            event_type: "cursor_moved".into(),
            ..stored("cursor_moved", 0, json!({"cursor_moved": {"device_id": "phone", "through": 4}}))
        };
        assert!(matches!(account_event(&ev).unwrap(), AccountEvent::CursorMoved { through: 4, .. }));
    }

    #[test]
    fn account_events_of_version_1_replay_under_version_2_and_push_events_decode() {
        let v1 = StoredEvent {
            stream: "account/a".into(),
            ..stored("cursor_moved", 1, json!({"cursor_moved": {"device_id": "phone", "through": 4}}))
        };
        assert!(matches!(account_event(&v1).unwrap(), AccountEvent::CursorMoved { through: 4, .. }));
        let sub = json!({"push_subscribed": {"device_id": "phone",
            "subscription": {"endpoint": "https://push.example/x", "p256dh": "BA", "auth": "AA"}}});
        let ev = StoredEvent { stream: "account/a".into(), ..stored("push_subscribed", AccountEvent::VERSION, sub) };
        assert!(matches!(account_event(&ev).unwrap(), AccountEvent::PushSubscribed { .. }));
        let gone = json!({"push_unsubscribed": {"device_id": "phone", "endpoint": "https://push.example/x", "reason": "gone"}});
        let ev = StoredEvent { stream: "account/a".into(), ..stored("push_unsubscribed", AccountEvent::VERSION, gone) };
        assert!(matches!(account_event(&ev).unwrap(), AccountEvent::PushUnsubscribed { .. }));
        // A v1 relay's reader would refuse these by version; this one refuses v4.
        let future = StoredEvent {
            stream: "account/a".into(),
            ..stored("push_subscribed", AccountEvent::VERSION + 1, json!({}))
        };
        assert!(account_event(&future).unwrap_err().to_string().contains("version 4"));
    }
}
