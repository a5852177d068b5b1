//! The retry timetable's queue (the scheduler in relay-actors holds one
//! and arms one timer for its earliest entry): which deliveries are due
//! when, and which wait for which destination, so a peer that comes back
//! wakes its own deliveries (and those with no route known yet) at once,
//! at most once per `delivery.wake_min_interval`. Time comes in as
//! arguments.
//!
//! **Bounded.** Memory holds at most `delivery.timers_in_memory` entries:
//! the earliest ones. Every pending delivery is also in the store's due
//! index (`due/ ‖ due ms ‖ stream`, written in the commit that schedules
//! it), so an entry memory cannot hold is *spilled*: left to the index,
//! with the queue remembering the lowest index key it did not keep. The
//! rule that makes this safe: memory holds an entry only if it sorts
//! before that key, so everything earlier than it is in memory and the
//! earliest timer is always armed. When memory (with what waits to start)
//! falls to half the bound, the shell reads the index from that key and
//! [`DueQueue::refill`]s. A spilled delivery is not woken early by its
//! peer's return; it runs at its due time (never later).
//!
//! **Throttled.** Due and woken deliveries start through [`Starts`]: at
//! most [`Starts::BATCH`] per turn, turns [`Starts::PAUSE`] apart, so a
//! flood of due or woken deliveries never starts all at once.

use relay_schemas::UnixMillis;
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::Duration;

/// The key of deliveries that know no destination yet: any peer that comes
/// back may be theirs.
const NO_DESTINATION: &str = "";

/// Entries looked at from the back of a full queue for one to spill.
const EVICT_TRIES: usize = 16;

/// Pending attempts in due order, and who waits for which destination.
pub struct DueQueue {
    /// (due ms, delivery stream); a stream scheduled twice (a stale timer
    /// and its real due time) is woken twice and `step_due` sorts it out.
    due: BTreeSet<(UnixMillis, String)>,
    /// Each waiting stream's due times and destinations.
    waiting: HashMap<String, (Vec<UnixMillis>, Vec<String>)>,
    /// Destination relay → streams waiting for it.
    by_destination: HashMap<String, BTreeSet<String>>,
    /// When each destination last woke its streams (ms).
    woken_at: HashMap<String, UnixMillis>,
    /// Entries held at most (together with what the shell holds to start).
    capacity: usize,
    /// The lowest (due, stream) left to the store's index only; memory holds
    /// every entry before it. `None`: memory holds every pending entry.
    spilled: Option<(UnixMillis, String)>,
}

impl Default for DueQueue {
    fn default() -> Self {
        DueQueue::bounded(usize::MAX)
    }
}

impl DueQueue {
    /// A queue holding at most `capacity` entries (at least 2).
    pub fn bounded(capacity: usize) -> Self {
        DueQueue {
            due: BTreeSet::new(),
            waiting: HashMap::new(),
            by_destination: HashMap::new(),
            woken_at: HashMap::new(),
            capacity: capacity.max(2),
            spilled: None,
        }
    }

    /// A queue that holds nothing yet while the store's due index may hold
    /// entries (a start): the first [`DueQueue::refill`] reads it from its
    /// lowest key.
    pub fn bounded_over_index(capacity: usize) -> Self {
        DueQueue { spilled: Some((UnixMillis(0), String::new())), ..DueQueue::bounded(capacity) }
    }

    /// Entries held in memory.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    /// Whether the store's index holds entries memory does not.
    pub fn spilled(&self) -> bool {
        self.spilled.is_some()
    }

    /// `stream` is due at `due_ms`, waiting for `destinations` (none: no
    /// route known yet, so any peer that comes back may be its).
    pub fn insert(&mut self, due_ms: UnixMillis, stream: String, destinations: Vec<String>) {
        self.insert_bounded(due_ms, stream, destinations, 0, |_, _| true)
    }

    /// [`DueQueue::insert`] within the bound, `held_elsewhere` entries
    /// being taken out and not started yet (they count in the bound, as in
    /// [`DueQueue::wants_refill`]): held in memory only if it sorts before
    /// what is spilled; when memory is full the latest entry is spilled to
    /// make room, or this one is. `indexed` tells whether the store's due
    /// index holds an entry (asked only of one about to be spilled): one it
    /// does not (a timer set without writing, e.g. a retry after a failed
    /// write) is held past the bound, since spilling it would lose it.
    pub fn insert_bounded(
        &mut self,
        due_ms: UnixMillis,
        stream: String,
        destinations: Vec<String>,
        held_elsewhere: usize,
        mut indexed: impl FnMut(UnixMillis, &str) -> bool,
    ) {
        let later_than_spilled =
            self.spilled.as_ref().is_some_and(|s| (due_ms, stream.as_str()) >= (s.0, s.1.as_str()));
        if later_than_spilled && indexed(due_ms, &stream) {
            return;
        }
        let full = self.due.len() + held_elsewhere >= self.capacity;
        if !later_than_spilled && full && !self.due.contains(&(due_ms, stream.clone())) {
            // Memory may hold none of its own while the bound is taken by
            // what waits to start: this one is then the latest.
            let latest_before = self.due.last().is_none_or(|l| (due_ms, &stream) > (l.0, &l.1));
            if latest_before && indexed(due_ms, &stream) {
                self.spill(due_ms, stream);
                return;
            }
            // The latest entry the index holds (a few from the back: those
            // it does not are timers of the rare retry without a write).
            let evict = self.due.iter().rev().take(EVICT_TRIES).find(|(d, s)| indexed(*d, s)).cloned();
            if let Some(entry) = evict {
                self.remove_entry(&entry);
                self.spill(entry.0, entry.1);
            }
        }
        self.hold(due_ms, stream, destinations);
    }

    /// Lowers the spill mark to (`due_ms`, `stream`).
    fn spill(&mut self, due_ms: UnixMillis, stream: String) {
        if self.spilled.as_ref().is_none_or(|s| (due_ms, &stream) < (s.0, &s.1)) {
            self.spilled = Some((due_ms, stream));
        }
    }

    /// Removes one (due, stream) entry, and the stream's bookkeeping with
    /// its last due time.
    fn remove_entry(&mut self, entry: &(UnixMillis, String)) {
        self.due.remove(entry);
        let (at, stream) = entry;
        let done = self.waiting.get_mut(stream).is_none_or(|(dues, _)| {
            dues.retain(|d| d != at);
            dues.is_empty()
        });
        if done {
            self.forget(stream);
        }
    }

    /// With `held_elsewhere` entries taken out and not started yet: where to
    /// read the store's due index from, and how many entries to take, when
    /// memory has fallen to half its bound and the index holds more.
    pub fn wants_refill(&self, held_elsewhere: usize) -> Option<((UnixMillis, &str), usize)> {
        let from = self.spilled.as_ref()?;
        // What memory holds from the spill mark on are timers the index does
        // not hold; they must not keep what is due before them out.
        let first_past_mark = self.due.first().is_none_or(|f| (f.0, f.1.as_str()) >= (from.0, from.1.as_str()));
        let held = if first_past_mark { held_elsewhere } else { self.due.len() + held_elsewhere };
        (held <= self.capacity / 2).then(|| ((from.0, from.1.as_str()), self.capacity - held))
    }

    /// The index entries read from the [`DueQueue::wants_refill`] key in
    /// key order (at most the room it gave), and `rest`: the first entry of
    /// the index after them (`None`: they were the last). Restored entries
    /// wait for any peer, as after a restart (their destinations are in
    /// their streams, not in the index).
    pub fn refill(&mut self, entries: Vec<(UnixMillis, String)>, rest: Option<(UnixMillis, String)>) {
        self.spilled = rest;
        for (due_ms, stream) in entries {
            // Within the room asked for: nothing to spill.
            self.hold(due_ms, stream, Vec::new());
        }
    }

    fn hold(&mut self, due_ms: UnixMillis, stream: String, destinations: Vec<String>) {
        let mut destinations = destinations;
        if destinations.is_empty() {
            destinations.push(NO_DESTINATION.to_owned());
        }
        self.due.insert((due_ms, stream.clone()));
        let entry = self.waiting.entry(stream.clone()).or_default();
        entry.0.push(due_ms);
        for old in std::mem::replace(&mut entry.1, destinations.clone()) {
            if let Some(set) = self.by_destination.get_mut(&old) {
                set.remove(&stream);
            }
        }
        for d in destinations {
            self.by_destination.entry(d).or_default().insert(stream.clone());
        }
    }

    /// The earliest due time held, if any (a spilled entry is never
    /// earlier: see the module doc).
    pub fn next(&self) -> Option<UnixMillis> {
        self.due.first().map(|(due, _)| *due)
    }

    /// Removes and returns the streams due at `now_ms`, earliest first.
    pub fn pop_due(&mut self, now_ms: UnixMillis) -> Vec<String> {
        let later = self.due.split_off(&(now_ms.plus(1), String::new()));
        let due = std::mem::replace(&mut self.due, later);
        due.into_iter()
            .map(|(at, stream)| {
                let done = self.waiting.get_mut(&stream).is_none_or(|(dues, _)| {
                    dues.retain(|d| *d != at);
                    dues.is_empty()
                });
                if done {
                    self.forget(&stream);
                }
                stream
            })
            .collect()
    }

    /// Destination `relay` is up at `now_ms`: removes and returns the
    /// streams waiting for it or for no known destination, unless it woke
    /// some less than `min_interval_ms` ago (no request loop with a peer
    /// that keeps calling while its deliveries keep failing).
    pub fn wake(&mut self, relay: &str, now_ms: UnixMillis, min_interval_ms: u64) -> Vec<String> {
        if self.woken_at.get(relay).is_some_and(|at| now_ms < at.plus(min_interval_ms)) {
            return Vec::new();
        }
        let mut streams: Vec<String> = [relay, NO_DESTINATION]
            .iter()
            .filter_map(|d| self.by_destination.get(*d))
            .flat_map(|set| set.iter().cloned())
            .collect();
        streams.sort();
        streams.dedup();
        if !streams.is_empty() {
            self.woken_at.insert(relay.to_owned(), now_ms);
        }
        for stream in &streams {
            if let Some((dues, _)) = self.waiting.get(stream) {
                for at in dues.clone() {
                    self.due.remove(&(at, stream.clone()));
                }
            }
            self.forget(stream);
        }
        streams
    }

    fn forget(&mut self, stream: &str) {
        if let Some((_, destinations)) = self.waiting.remove(stream) {
            for d in destinations {
                if let Some(set) = self.by_destination.get_mut(&d) {
                    set.remove(stream);
                    if set.is_empty() {
                        self.by_destination.remove(&d);
                    }
                }
            }
        }
    }
}

/// Deliveries waiting to start, oldest first, each with whether it was
/// woken (its destination came back) rather than due; counted in the
/// queue's bound ([`DueQueue::wants_refill`]).
#[derive(Debug, Default)]
pub struct Starts {
    ready: VecDeque<(String, bool)>,
    /// Whether a next turn is planned.
    planned: bool,
}

impl Starts {
    /// Deliveries started per turn; the rest wait for the next turn.
    pub const BATCH: usize = 128;
    /// The pause between two turns.
    pub const PAUSE: Duration = Duration::from_millis(20);

    /// `streams` are due.
    pub fn due(&mut self, streams: Vec<String>) {
        self.ready.extend(streams.into_iter().map(|s| (s, false)));
    }

    /// `streams` are woken: their destination came back.
    pub fn woken(&mut self, streams: Vec<String>) {
        self.ready.extend(streams.into_iter().map(|s| (s, true)));
    }

    /// How many wait to start.
    pub fn len(&self) -> usize {
        self.ready.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ready.is_empty()
    }

    /// This turn's starts: at most [`Starts::BATCH`], oldest first.
    pub fn turn(&mut self) -> Vec<(String, bool)> {
        let n = self.ready.len().min(Self::BATCH);
        self.ready.drain(..n).collect()
    }

    /// After a turn: whether to plan the next one, [`Starts::PAUSE`] from
    /// now. So it is while some wait, or while the index can be read back
    /// (`refill_wanted`: the starts made room), unless one is planned.
    pub fn plan_next(&mut self, refill_wanted: bool) -> bool {
        let more = !self.ready.is_empty() || refill_wanted;
        let plan = more && !self.planned;
        self.planned |= plan;
        plan
    }

    /// The planned turn has come.
    pub fn next_turn_begins(&mut self) {
        self.planned = false;
    }
}

#[cfg(test)]
mod tests {
    use super::{DueQueue, Starts};
    use relay_schemas::UnixMillis as Ms;

    fn streams(range: std::ops::Range<usize>) -> Vec<String> {
        range.map(|n| format!("d{n}")).collect()
    }

    #[test]
    fn a_turn_starts_at_most_a_batch_of_deliveries_oldest_first() {
        let mut starts = Starts::default();
        starts.due(streams(0..Starts::BATCH + 10));
        starts.woken(vec!["w".into()]);
        let turn = starts.turn();
        assert_eq!(turn.len(), Starts::BATCH);
        assert_eq!(turn[0], ("d0".to_string(), false));
        assert_eq!(starts.len(), 11, "the rest wait for the next turn");
        let last = starts.turn();
        assert_eq!(last.last(), Some(&("w".to_string(), true)), "a woken one says so");
        assert!(starts.is_empty());
    }

    #[test]
    fn a_next_turn_is_planned_once_while_deliveries_wait_or_the_index_can_be_read_back() {
        let mut starts = Starts::default();
        assert!(!starts.plan_next(false), "nothing waits, nothing to read back");
        assert!(starts.plan_next(true), "room to read the index back");
        starts.next_turn_begins();
        starts.due(streams(0..1));
        assert!(starts.plan_next(false));
        assert!(!starts.plan_next(false), "one turn planned at a time");
        starts.next_turn_begins();
        assert!(starts.plan_next(false));
    }

    #[test]
    fn due_queue_pops_what_is_due_earliest_first_and_keeps_the_rest() {
        let mut q = DueQueue::default();
        q.insert(Ms(3_000), "c".into(), vec![]);
        q.insert(Ms(1_000), "a".into(), vec![]);
        q.insert(Ms(2_000), "b".into(), vec![]);
        q.insert(Ms(1_000), "a".into(), vec![]); // the same timer twice is one entry
        assert_eq!(q.next(), Some(Ms(1_000)));
        assert_eq!(q.pop_due(Ms(999)), Vec::<String>::new());
        assert_eq!(q.pop_due(Ms(2_000)), vec!["a".to_string(), "b".to_string()]);
        assert_eq!(q.next(), Some(Ms(3_000)));
        assert_eq!(q.pop_due(Ms(u64::MAX - 1)), vec!["c".to_string()]);
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_stream_due_twice_is_woken_twice() {
        let mut q = DueQueue::default();
        q.insert(Ms(1_000), "a".into(), vec![]);
        q.insert(Ms(5_000), "a".into(), vec![]);
        assert_eq!(q.pop_due(Ms(1_000)), vec!["a".to_string()]);
        assert_eq!(q.next(), Some(Ms(5_000)));
    }

    fn to(relay: &str) -> Vec<String> {
        vec![relay.to_string()]
    }

    #[test]
    fn a_destination_that_comes_back_wakes_only_its_own_and_unrouted_deliveries() {
        let mut q = DueQueue::default();
        q.insert(Ms(60_000), "to-b".into(), to("relay-b"));
        q.insert(Ms(60_000), "to-c".into(), to("relay-c"));
        q.insert(Ms(90_000), "no-route".into(), vec![]);
        assert_eq!(q.wake("relay-b", Ms(1_000), 10_000), vec!["no-route".to_string(), "to-b".to_string()]);
        // Woken ones left the queue: their old timers do not fire again.
        assert_eq!(q.pop_due(Ms(u64::MAX - 1)), vec!["to-c".to_string()]);
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_destination_wakes_its_deliveries_at_most_once_per_interval() {
        let mut q = DueQueue::default();
        // A call while nothing waits does not use up the interval.
        assert!(q.wake("relay-b", Ms(500), 10_000).is_empty());
        q.insert(Ms(60_000), "one".into(), to("relay-b"));
        assert_eq!(q.wake("relay-b", Ms(1_000), 10_000).len(), 1);
        q.insert(Ms(60_000), "two".into(), to("relay-b"));
        assert!(q.wake("relay-b", Ms(10_999), 10_000).is_empty(), "within the interval");
        assert_eq!(q.next(), Some(Ms(60_000)), "still waiting for its slot");
        assert_eq!(q.wake("relay-b", Ms(11_000), 10_000), vec!["two".to_string()]);
    }

    #[test]
    fn a_rescheduled_delivery_waits_for_its_latest_destination_only() {
        let mut q = DueQueue::default();
        q.insert(Ms(60_000), "m".into(), to("relay-b"));
        q.insert(Ms(120_000), "m".into(), to("relay-c"));
        assert!(q.wake("relay-b", Ms(1_000), 0).is_empty());
        assert_eq!(q.wake("relay-c", Ms(1_000), 0), vec!["m".to_string()]);
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_full_queue_holds_the_earliest_entries_and_leaves_the_latest_to_the_index() {
        let mut q = DueQueue::bounded(2);
        q.insert(Ms(3_000), "c".into(), vec![]);
        q.insert(Ms(1_000), "a".into(), vec![]);
        // Full: an earlier entry pushes the latest out; a later one stays out.
        q.insert(Ms(2_000), "b".into(), vec![]);
        q.insert(Ms(4_000), "d".into(), vec![]);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next(), Some(Ms(1_000)));
        // Entries after the spill mark wait in the index even with room.
        assert_eq!(q.pop_due(Ms(1_000)), vec!["a".to_string()]);
        q.insert(Ms(5_000), "e".into(), vec![]);
        assert_eq!(q.len(), 1, "e sorts after c, which only the index holds");
        assert_eq!(q.wants_refill(0), Some(((Ms(3_000), "c"), 1)));
        q.refill(vec![(Ms(3_000), "c".into())], Some((Ms(4_000), "d".into())));
        assert_eq!(q.pop_due(Ms(3_000)), vec!["b".to_string(), "c".to_string()]);
        assert_eq!(q.wants_refill(0), Some(((Ms(4_000), "d"), 2)));
        q.refill(vec![(Ms(4_000), "d".into()), (Ms(5_000), "e".into())], None);
        assert!(!q.spilled());
        assert_eq!(q.pop_due(Ms(9_000)), vec!["d".to_string(), "e".to_string()]);
    }

    #[test]
    fn a_timer_the_index_does_not_hold_is_never_spilled() {
        let mut q = DueQueue::bounded(2);
        let c_unindexed = |_: Ms, s: &str| s != "c";
        q.insert_bounded(Ms(1_000), "a".into(), vec![], 0, c_unindexed);
        q.insert_bounded(Ms(2_000), "b".into(), vec![], 0, c_unindexed);
        // A retry after a failed write: later than all, but not in the
        // index: held, and b (which the index holds) makes room.
        q.insert_bounded(Ms(3_000), "c".into(), vec![], 0, c_unindexed);
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_due(Ms(1_000)), vec!["a".to_string()]);
        // c, held past the mark, does not keep b out.
        assert_eq!(q.wants_refill(0), Some(((Ms(2_000), "b"), 2)));
        q.refill(vec![(Ms(2_000), "b".into())], None);
        assert_eq!(q.pop_due(Ms(9_000)), vec!["b".to_string(), "c".to_string()]);
        // Full of timers the index does not hold: held past the bound.
        let none_indexed = |_: Ms, _: &str| false;
        for (i, s) in ["x", "y", "z"].into_iter().enumerate() {
            q.insert_bounded(Ms(10_000 - i as u64), s.into(), vec![], 0, none_indexed);
        }
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn a_queue_started_over_a_full_index_reads_it_from_its_lowest_key() {
        let q = DueQueue::bounded_over_index(8);
        assert_eq!(q.next(), None);
        assert_eq!(q.wants_refill(0), Some(((Ms(0), ""), 8)));
        assert_eq!(q.wants_refill(5), None, "five wait to start: more than half the bound");
    }

    #[test]
    fn what_waits_to_start_counts_in_the_bound_of_a_new_timer() {
        let mut q = DueQueue::bounded(4);
        let all_indexed = |_: Ms, _: &str| true;
        q.insert_bounded(Ms(1_000), "a".into(), vec![], 2, all_indexed);
        q.insert_bounded(Ms(3_000), "c".into(), vec![], 2, all_indexed);
        // Two held and two waiting to start: full. An earlier one pushes
        // the latest out, a later one stays in the index.
        q.insert_bounded(Ms(2_000), "b".into(), vec![], 2, all_indexed);
        q.insert_bounded(Ms(4_000), "d".into(), vec![], 2, all_indexed);
        assert_eq!(q.len(), 2);
        assert_eq!(q.wants_refill(2), None);
        assert_eq!(q.wants_refill(0), Some(((Ms(3_000), "c"), 2)));
        // Everything taken by what waits to start: memory holds none.
        let mut q = DueQueue::bounded(2);
        q.insert_bounded(Ms(5_000), "e".into(), vec![], 2, all_indexed);
        assert_eq!(q.len(), 0);
        assert_eq!(q.wants_refill(0), Some(((Ms(5_000), "e"), 2)));
    }

    proptest::proptest! {
        /// The scheduler's use of the queue against the store's index, as
        /// the shell does it: due entries wait in a ready list and start a
        /// few at a time; a delivery is scheduled when accepted and again
        /// after each attempt (its index entry moved in the same write),
        /// or retried after a failed write without one. No timer fires late
        /// or is lost, whatever the bound, and memory (queue and ready list)
        /// holds at most the bound plus the retries without a write.
        #[test]
        fn a_bounded_queue_fires_every_timer_on_time(
            capacity in 2usize..12,
            ops in proptest::collection::vec((0u64..6, 1u64..200, 0u8..24), 1..300),
        ) {
            use std::collections::{BTreeMap, BTreeSet};
            let mut q = DueQueue::bounded_over_index(capacity);
            // The store's due index: (due, stream) for every pending delivery.
            let mut index: BTreeSet<(Ms, String)> = BTreeSet::new();
            // Retries without a write: stream -> when.
            let mut retries: BTreeMap<String, Ms> = BTreeMap::new();
            let mut ready: std::collections::VecDeque<String> = Default::default();
            let mut now = 0u64;
            let mut step = 0u64;
            for (op, t, n) in ops {
                let stream = format!("s{n}");
                let pending = index.iter().any(|(_, s)| *s == stream) || retries.contains_key(&stream);
                if op <= 2 {
                    if !pending {
                        index.insert((Ms(now + t), stream.clone()));
                        q.insert_bounded(Ms(now + t), stream, vec![], 0, |d, s| index.contains(&(d, s.to_owned())));
                    }
                } else {
                    now += t;
                    loop {
                        if let Some(((due, s), room)) = q.wants_refill(ready.len()) {
                            let mut read = index.range((due, s.to_owned())..).cloned();
                            let entries: Vec<_> = read.by_ref().take(room).collect();
                            let rest = read.next();
                            q.refill(entries, rest);
                        }
                        let fired = q.pop_due(Ms(now));
                        ready.extend(fired);
                        if ready.is_empty() && q.wants_refill(0).is_none() {
                            break;
                        }
                        // A turn starts a few; the others wait while the
                        // started ones are scheduled again.
                        for _ in 0..2 {
                            let Some(s) = ready.pop_front() else { break };
                            let entry = index.iter().find(|(_, x)| *x == s).cloned();
                            let retry_due = retries.get(&s).is_some_and(|at| at.0 <= now);
                            let due = entry.as_ref().is_some_and(|(d, _)| d.0 <= now);
                            if !(due || retry_due) {
                                continue; // a stale timer: not due yet
                            }
                            retries.remove(&s);
                            step += 1;
                            match step % 4 {
                                0 => {
                                    index.retain(|(_, x)| *x != s);
                                }
                                1 | 2 => {
                                    index.retain(|(_, x)| *x != s);
                                    let next = Ms(now + 1 + step % 97);
                                    index.insert((next, s.clone()));
                                    q.insert_bounded(next, s, vec![], ready.len(), |d, x| index.contains(&(d, x.to_owned())));
                                }
                                _ => {
                                    // The write failed: the index keeps its
                                    // entry, a timer without one retries.
                                    let at = Ms(now + 1);
                                    retries.insert(s.clone(), at);
                                    q.insert_bounded(at, s, vec![], ready.len(), |d, x| index.contains(&(d, x.to_owned())));
                                }
                            }
                            proptest::prop_assert!(
                                q.len() + ready.len() <= capacity + retries.len(),
                                "{} held and {} ready, bound {} + {} retries", q.len(), ready.len(), capacity, retries.len()
                            );
                        }
                    }
                    let late: Vec<_> = index.iter().filter(|(d, s)| d.0 <= now && !retries.contains_key(s)).collect();
                    let late_retries: Vec<_> = retries.iter().filter(|(_, at)| at.0 <= now).collect();
                    proptest::prop_assert!(late_retries.is_empty(), "retries late at {}: {:?}", now, late_retries);
                    proptest::prop_assert!(late.is_empty(), "late at {}: {:?} (retries {:?})", now, late, retries);
                }
                proptest::prop_assert!(
                    q.len() + ready.len() <= capacity + retries.len(),
                    "{} held and {} ready, bound {} + {} retries", q.len(), ready.len(), capacity, retries.len()
                );
            }
        }
    }
}
