//! What the JetStream store's test binaries share.

use relay_actors::store::{NewEvent, Store, StoreError};
use serde_json::value::RawValue;

/// Appends `n` small events to `stream` at its head, durably.
pub fn append(store: &Store, stream: &str, n: u64) -> Result<(), StoreError> {
    let mut batch = store.batch();
    let head = store.head(stream)?;
    let events = (0..n)
        .map(|i| NewEvent {
            event_type: "noted".into(),
            version: 1,
            at: i,
            data: RawValue::from_string(format!(r#"{{"n":{i}}}"#)).unwrap(),
        })
        .collect();
    batch.append(stream, head, events);
    store.commit_durable_blocking(batch)
}
