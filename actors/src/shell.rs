//! What every event-sourced actor does with its stream, whatever its
//! aggregate: start from the latest snapshot or pruned-prefix marker, fold
//! in the tail, stage its new events in a batch after its head, follow a
//! commit (head, ticket, cadence of snapshots), snapshot, and wait for
//! durability before anyone outside hears of a write. The aggregate gives
//! its event codec and `apply` through [`Stream`]; its actor keeps what is
//! its own (projections riding in the batch, effects, timers).

use crate::store::{Batch, Head, NewEvent, Snapshot, Store, StoreError, StoredEvent, Ticket};
use relay_schemas::{RelayError, UnixSecs};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;

/// Any error as `internal`: for failures a caller cannot act on (the
/// store, encoding), told with their text.
pub(crate) fn internal(e: &dyn std::fmt::Display) -> RelayError {
    RelayError::internal(format!("{e}"))
}

/// An aggregate's state as its stream stores it.
pub trait Stream {
    type Event: Serialize;
    /// The version new events are written in.
    const VERSION: u32;

    fn event_type(event: &Self::Event) -> &'static str;
    /// Reads a stored event, upcasting one of an older version.
    fn decode(event: &StoredEvent) -> Result<Self::Event, StoreError>;
    /// Folds one written event in (the aggregate's `apply`).
    fn fold(&mut self, event: &Self::Event);
}

/// One actor's stream: its state, the head its next events follow, the
/// last commit it made (replies wait for it) and the events since its
/// last snapshot.
#[derive(Debug)]
pub struct EventSourced<S> {
    pub stream: String,
    pub head: Head,
    pub state: S,
    pub last_ticket: Option<Ticket>,
    pub since_snapshot: u64,
}

/// The state a stream's replay starts from, and where: its snapshot or its
/// pruned prefix's marker, whichever is later (a prefix pruned past the
/// snapshot: the marker holds the state there). `None`: from the start.
pub fn start<S: DeserializeOwned>(
    store: &Store,
    stream: &str,
    snapshot: Option<&Snapshot>,
) -> Result<Option<(S, Head)>, StoreError> {
    let from = match (store.pruned(stream)?, snapshot) {
        (Some(m), Some(s)) if m.head.seq <= s.seq => Some((s.state.clone(), Head { seq: s.seq, hash: s.hash })),
        (Some(m), _) => Some((m.state, m.head)),
        (None, s) => s.map(|s| (s.state.clone(), Head { seq: s.seq, hash: s.hash })),
    };
    from.map(|(bytes, head)| {
        let state = serde_json::from_slice(&bytes).map_err(|e| StoreError::Corrupt {
            stream: stream.to_owned(),
            seq: head.seq,
            what: format!("snapshot: {e}"),
        })?;
        Ok((state, head))
    })
    .transpose()
}

impl<S: Stream> EventSourced<S> {
    /// `state` at `head` of `stream`, nothing replayed yet.
    pub fn at(stream: String, state: S, head: Head) -> Self {
        EventSourced { stream, head, state, last_ticket: None, since_snapshot: 0 }
    }

    /// Folds in the events after the head, each shown to `seen` first.
    pub fn replay(&mut self, store: &Store, mut seen: impl FnMut(&S::Event)) -> Result<(), StoreError> {
        for stored in store.read(&self.stream, self.head.seq) {
            let stored = stored?;
            let event = S::decode(&stored)?;
            seen(&event);
            self.state.fold(&event);
            self.head = stored.head();
            self.since_snapshot += 1;
        }
        Ok(())
    }

    /// `events` as the store writes them, stamped `at`.
    pub fn encode(events: &[S::Event], at: UnixSecs) -> Result<Vec<NewEvent>, RelayError> {
        events
            .iter()
            .map(|e| {
                NewEvent::new(S::event_type(e), S::VERSION, at, e).map_err(|e| RelayError::internal(e.to_string()))
            })
            .collect()
    }

    /// Appends `events` to `batch` after the head; the head after them.
    pub fn stage(&self, batch: &mut Batch, events: &[S::Event], at: UnixSecs) -> Result<Head, RelayError> {
        Ok(batch.append(&self.stream, self.head, Self::encode(events, at)?))
    }

    /// Commits `batch`, which moves the stream to `head` with `written`
    /// events; the caller folds them in. On error nothing changes here.
    pub fn commit(&mut self, store: &Store, batch: Batch, head: Head, written: usize) -> Result<Ticket, RelayError> {
        let ticket = store.commit(batch).map_err(|e| e.to_relay_error())?;
        self.head = head;
        self.last_ticket = Some(ticket);
        self.since_snapshot += written as u64;
        Ok(ticket)
    }

    /// Folds in events that are written.
    pub fn apply(&mut self, events: &[S::Event]) {
        for e in events {
            self.state.fold(e);
        }
    }

    /// Completes once everything this actor committed is durable.
    pub fn durable(&self, store: &Store) -> impl Future<Output = Result<(), RelayError>> + 'static {
        let wait = self.last_ticket.map(|t| store.durable(t));
        async move {
            match wait {
                Some(w) => w.await.map_err(|e| e.to_relay_error()),
                None => Ok(()),
            }
        }
    }
}

impl<S: Stream + Serialize> EventSourced<S> {
    /// Whether `every` events were written since the last snapshot.
    pub fn snapshot_due(&self, every: u64) -> bool {
        self.since_snapshot >= every
    }

    /// Writes a snapshot of the state at the head. A failed snapshot only
    /// costs a longer replay next time.
    pub fn snapshot(&mut self, store: &Store) {
        let Ok(state) = serde_json::to_vec(&self.state) else { return };
        let mut batch = store.batch();
        batch.put_snapshot(&self.stream, Snapshot { seq: self.head.seq, hash: self.head.hash, state });
        match store.commit(batch) {
            Ok(t) => {
                self.last_ticket = Some(t);
                self.since_snapshot = 0;
            }
            Err(e) => tracing::warn!(stream = %self.stream, error = %e, "snapshot failed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream of numbers whose state is their sum.
    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Sum(u64);

    impl Stream for Sum {
        type Event = u64;
        const VERSION: u32 = 1;

        fn event_type(_: &u64) -> &'static str {
            "added"
        }

        fn decode(event: &StoredEvent) -> Result<u64, StoreError> {
            serde_json::from_str(event.data.get()).map_err(|e| StoreError::Invalid(e.to_string()))
        }

        fn fold(&mut self, event: &u64) {
            self.0 += event;
        }
    }

    const STREAM: &str = "sum/a";

    /// `1, 2, 3, 4` written one commit each; the stream's heads after each.
    fn written(store: &Store) -> Vec<Head> {
        let mut es = EventSourced::at(STREAM.into(), Sum::default(), Head::default());
        (1..=4)
            .map(|n| {
                let mut batch = store.batch();
                let head = es.stage(&mut batch, &[n], UnixSecs(0)).unwrap();
                es.commit(store, batch, head, 1).unwrap();
                es.apply(&[n]);
                head
            })
            .collect()
    }

    fn loaded(store: &Store) -> EventSourced<Sum> {
        let snapshot = store.load_snapshot(STREAM).unwrap();
        let (state, head) = start(store, STREAM, snapshot.as_ref()).unwrap().unwrap_or_default();
        let mut es = EventSourced::at(STREAM.into(), state, head);
        es.replay(store, |_| {}).unwrap();
        es
    }

    fn snapshot_at(store: &Store, head: Head, sum: u64) {
        let mut batch = store.batch();
        let state = serde_json::to_vec(&Sum(sum)).unwrap();
        batch.put_snapshot(STREAM, Snapshot { seq: head.seq, hash: head.hash, state });
        store.commit(batch).unwrap();
    }

    fn pruned_through(store: &Store, head: Head, sum: u64) {
        let mut batch = store.batch();
        batch.prune(STREAM, 0, head, UnixSecs(0), serde_json::to_vec(&Sum(sum)).unwrap());
        store.commit(batch).unwrap();
    }

    #[test]
    fn a_stream_without_snapshot_replays_every_event_and_counts_them_toward_the_next_snapshot() {
        let store = Store::temporary().unwrap();
        let heads = written(&store);
        let es = loaded(&store);
        assert_eq!((es.state, es.head, es.since_snapshot), (Sum(10), heads[3], 4));
    }

    #[test]
    fn replay_starts_at_the_snapshot_and_folds_only_the_tail() {
        let store = Store::temporary().unwrap();
        let heads = written(&store);
        // A snapshot whose sum differs from the events': only what follows it is replayed.
        snapshot_at(&store, heads[1], 100);
        let es = loaded(&store);
        assert_eq!((es.state, es.head, es.since_snapshot), (Sum(107), heads[3], 2));
    }

    #[test]
    fn a_prefix_pruned_past_the_snapshot_starts_replay_at_its_marker() {
        let store = Store::temporary().unwrap();
        let heads = written(&store);
        snapshot_at(&store, heads[0], 100);
        pruned_through(&store, heads[2], 1000);
        let es = loaded(&store);
        assert_eq!((es.state, es.head), (Sum(1004), heads[3]));
    }

    #[test]
    fn a_snapshot_later_than_the_pruned_prefix_is_where_replay_starts() {
        let store = Store::temporary().unwrap();
        let heads = written(&store);
        pruned_through(&store, heads[0], 1000);
        snapshot_at(&store, heads[2], 100);
        let es = loaded(&store);
        assert_eq!((es.state, es.head), (Sum(104), heads[3]));
    }

    #[test]
    fn a_snapshot_is_due_after_the_cadences_number_of_events_and_resets_the_count() {
        let store = Store::temporary().unwrap();
        written(&store);
        let mut es = loaded(&store);
        assert!(es.snapshot_due(4) && !es.snapshot_due(5));
        es.snapshot(&store);
        assert!(!es.snapshot_due(1));
        assert_eq!(loaded(&store).since_snapshot, 0, "the next load replays nothing");
    }
}
