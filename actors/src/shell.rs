//! What every event-sourced actor does, whatever its aggregate: start from
//! the latest snapshot or pruned-prefix marker, fold in the tail, and run
//! each command through the one loop, `Shell::run`: decide, stage the
//! events after the head with what the actor writes beside them, commit,
//! fold them in, snapshot on cadence, carry out the effects; the reply
//! waits for durability ([`EventSourced::durable`]) before anyone outside
//! hears of a write. The aggregate gives its event codec and `apply`
//! through [`Stream`] and its decisions through `relay_core`'s `Aggregate`;
//! its actor keeps what is its own (projections, effects, timers) in the
//! loop's hooks.

use crate::store::{Batch, Head, NewEvent, Snapshot, Store, StoreError, StoredEvent, Ticket};
use relay_core::aggregate::{Decided, Decision};
use relay_schemas::{RelayError, UnixMillis, UnixSecs};
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
        self.when_durable(store, true)
    }

    /// [`EventSourced::durable`]; with `ask` false the writer is not asked
    /// to hurry (a later commit that covers this one is asked for).
    pub fn when_durable(&self, store: &Store, ask: bool) -> impl Future<Output = Result<(), RelayError>> + 'static {
        let wait = self.last_ticket.map(|t| {
            if ask {
                store.ask_durable(t);
            }
            store.when_durable(t)
        });
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

/// What rides in a command's commit besides the aggregate's own events and
/// projections (another stream's events, index entries), and what writing
/// it gives back (those streams' heads).
pub(crate) trait Rides {
    type Written: Default;
    /// Whether it writes nothing: a decision without events then commits nothing.
    fn is_empty(&self) -> bool;
    /// Adds itself to `batch`, after the events.
    fn write(self, batch: &mut Batch) -> Self::Written;
}

/// Nothing rides along.
impl Rides for () {
    type Written = ();
    fn is_empty(&self) -> bool {
        true
    }
    fn write(self, _: &mut Batch) {}
}

/// The event of a shell's stream.
pub(crate) type Event<S> = <<S as Shell>::State as Stream>::Event;

/// An event-sourced actor: its aggregate's stream and the hooks of what is
/// its own. [`Shell::run`] is the loop every command of every aggregate
/// goes through; an actor writes none of its steps itself.
pub(crate) trait Shell {
    type State: Stream + Serialize;
    /// A command (a delivery's borrow what its step brought back).
    type Cmd<'c>;
    type Reply;
    type Effect;
    /// What the actor learns while projecting the events into the batch,
    /// kept for after the commit.
    type Projected;
    /// What rides in a commit, borrowed from its command.
    type Rides<'c>: Rides<Written = Self::Written>;
    /// What writing the rides gives back.
    type Written: Default;
    /// What a command answers.
    type Out;

    fn es(&mut self) -> &mut EventSourced<Self::State>;
    fn store(&self) -> Store;
    fn now_ms(&self) -> UnixMillis;
    /// A snapshot after this many events; `None`: never (short streams).
    fn snapshot_every(&self) -> Option<u64> {
        None
    }

    /// The aggregate's decision of `cmd` on the current state at `now`
    /// (the actor gives it policy and its reads).
    fn decide(&mut self, cmd: &Self::Cmd<'_>, now: UnixMillis) -> Decided<Event<Self>, Self::Reply, Self::Effect>;
    /// Where a decision's events are written: here (the default), or by
    /// another stream's writer in its own commit (a delivery's end, in its
    /// sender account's), when this answers for them, unwritten.
    fn hand_off(&mut self, events: Vec<Event<Self>>) -> Result<Vec<Event<Self>>, Self::Out> {
        Ok(events)
    }
    /// What rides in the commit of the decision of `cmd` at `now`. May
    /// fail: nothing is written then.
    fn rides<'c>(
        &mut self,
        cmd: &'c Self::Cmd<'_>,
        events: &[Event<Self>],
        effects: &[Self::Effect],
        now: UnixMillis,
    ) -> Result<Self::Rides<'c>, RelayError>;
    /// Writes the events' projections into `batch`, before the events.
    fn project(&mut self, batch: &mut Batch, events: &[Event<Self>]) -> Result<Self::Projected, RelayError>;
    /// `event`, the `n`th of the commit `ticket`, was just folded in.
    fn applied(&mut self, _n: usize, _event: &Event<Self>, _ticket: Ticket, _projected: &Self::Projected) {}
    /// All of the commit's events are folded in.
    fn committed(&mut self, _events: &[Event<Self>], _projected: Self::Projected) -> Result<(), RelayError> {
        Ok(())
    }
    /// Carries out the effects of a decision once it is written (`written`:
    /// what its rides gave back); the answer.
    fn carry_out(
        &mut self,
        reply: Self::Reply,
        effects: Vec<Self::Effect>,
        written: Self::Written,
    ) -> Result<Self::Out, RelayError>;

    /// The loop: decides `cmd`; writes its events, their projections and
    /// what rides with them in one commit (none when there is nothing to
    /// write), unless they are handed off; folds them in; snapshots on
    /// cadence; carries out the effects. On error before the commit nothing
    /// is written and nothing changes in memory. The caller replies once
    /// [`EventSourced::durable`].
    fn run(&mut self, cmd: &Self::Cmd<'_>) -> Result<Self::Out, RelayError> {
        let now = self.now_ms();
        let Decision { events, reply, effects } = self.decide(cmd, now)?;
        let events = match self.hand_off(events) {
            Ok(events) => events,
            Err(answer) => return Ok(answer),
        };
        let rides = self.rides(cmd, &events, &effects, now)?;
        let written =
            if events.is_empty() && rides.is_empty() { Default::default() } else { self.write(events, rides)? };
        self.carry_out(reply, effects, written)
    }

    /// Writes `events` with their projections and `rides` in one commit,
    /// then folds them in.
    fn write(&mut self, events: Vec<Event<Self>>, rides: Self::Rides<'_>) -> Result<Self::Written, RelayError> {
        let store = self.store();
        let now = self.now_ms().secs();
        let mut batch = store.batch();
        let projected = self.project(&mut batch, &events)?;
        let head = self.es().stage(&mut batch, &events, now)?;
        let written = rides.write(&mut batch);
        let ticket = self.es().commit(&store, batch, head, events.len())?;
        for (n, e) in events.iter().enumerate() {
            self.es().state.fold(e);
            self.applied(n, e, ticket, &projected);
        }
        self.committed(&events, projected)?;
        let every = self.snapshot_every();
        if every.is_some_and(|every| self.es().snapshot_due(every)) {
            self.es().snapshot(&store);
        }
        Ok(written)
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

    /// A shell of [`Sum`]: a command adds its number (0 is refused, above
    /// 100 handed off unwritten); its projection keeps the last number, its
    /// ride the number of effects; it snapshots every 3 events.
    struct Adder {
        es: EventSourced<Sum>,
        store: Store,
        /// What each command answered, and the events it was told were folded in.
        folded: Vec<u64>,
    }

    struct Count(usize);

    impl Rides for Count {
        type Written = usize;
        fn is_empty(&self) -> bool {
            self.0 == 0
        }
        fn write(self, batch: &mut Batch) -> usize {
            batch.kv_put(b"effects", &[self.0 as u8]);
            self.0
        }
    }

    impl Shell for Adder {
        type State = Sum;
        type Cmd<'c> = u64;
        type Reply = u64;
        type Effect = ();
        type Projected = u64;
        type Rides<'c> = Count;
        type Written = usize;
        type Out = (u64, usize);

        fn es(&mut self) -> &mut EventSourced<Sum> {
            &mut self.es
        }
        fn store(&self) -> Store {
            self.store.clone()
        }
        fn now_ms(&self) -> UnixMillis {
            UnixMillis(0)
        }
        fn snapshot_every(&self) -> Option<u64> {
            Some(3)
        }
        fn decide(&mut self, n: &u64, _: UnixMillis) -> Decided<u64, u64, ()> {
            match *n {
                0 => Err(RelayError::internal("zero")),
                // Even numbers have an effect.
                n => Ok(Decision {
                    events: vec![n],
                    reply: self.es.state.0 + n,
                    effects: vec![(); (n % 2 == 0) as usize],
                }),
            }
        }
        fn hand_off(&mut self, events: Vec<u64>) -> Result<Vec<u64>, (u64, usize)> {
            match events.as_slice() {
                [n] if *n > 100 => Err((*n, 0)),
                _ => Ok(events),
            }
        }
        fn rides<'c>(&mut self, _: &u64, _: &[u64], effects: &[()], _: UnixMillis) -> Result<Count, RelayError> {
            Ok(Count(effects.len()))
        }
        fn project(&mut self, batch: &mut Batch, events: &[u64]) -> Result<u64, RelayError> {
            batch.kv_put(b"last", &events[0].to_be_bytes());
            Ok(events[0])
        }
        fn applied(&mut self, _: usize, event: &u64, _: Ticket, projected: &u64) {
            assert_eq!(event, projected);
            self.folded.push(self.es.state.0);
        }
        fn carry_out(&mut self, reply: u64, _: Vec<()>, written: usize) -> Result<(u64, usize), RelayError> {
            Ok((reply, written))
        }
    }

    fn adder(store: &Store) -> Adder {
        Adder {
            es: EventSourced::at(STREAM.into(), Sum::default(), Head::default()),
            store: store.clone(),
            folded: vec![],
        }
    }

    #[test]
    fn the_loop_writes_events_projections_and_rides_in_one_commit_then_folds_them_in() {
        let store = Store::temporary().unwrap();
        let mut shell = adder(&store);
        assert_eq!(shell.run(&2).unwrap(), (2, 1), "the reply, and what the ride wrote");
        assert_eq!((shell.es.state.0, &shell.folded, shell.es.head.seq), (2, &vec![2], 1));
        assert_eq!(store.kv_get(b"last").unwrap(), Some(2u64.to_be_bytes().to_vec()));
        assert_eq!(store.kv_get(b"effects").unwrap(), Some(vec![1]));
        assert_eq!(loaded(&store).state, Sum(2), "the event is in the stream");
    }

    #[test]
    fn a_refused_command_writes_nothing_and_changes_nothing() {
        let store = Store::temporary().unwrap();
        let mut shell = adder(&store);
        shell.run(&1).unwrap();
        let committed = store.committed();
        assert!(shell.run(&0).is_err());
        assert_eq!((store.committed(), shell.es.state.0, shell.es.head.seq), (committed, 1, 1));
    }

    #[test]
    fn a_decision_handed_off_is_answered_unwritten() {
        let store = Store::temporary().unwrap();
        let mut shell = adder(&store);
        assert_eq!(shell.run(&101).unwrap(), (101, 0));
        assert_eq!((shell.es.state.0, shell.es.head.seq, shell.es.last_ticket), (0, 0, None));
        assert_eq!(store.head(STREAM).unwrap(), Head::default());
    }

    #[test]
    fn the_loop_snapshots_on_its_cadence_and_a_load_replays_only_the_tail() {
        let store = Store::temporary().unwrap();
        let mut shell = adder(&store);
        for n in [1, 3, 5, 7] {
            shell.run(&n).unwrap();
        }
        assert_eq!(store.load_snapshot(STREAM).unwrap().map(|s| s.seq), Some(3));
        let es = loaded(&store);
        assert_eq!((es.state, es.since_snapshot), (Sum(16), 1));
    }
}
