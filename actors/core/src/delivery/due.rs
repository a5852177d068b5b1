//! The retry timetable's queue (the scheduler in relay-actors holds one
//! and arms one timer for its earliest entry): which deliveries are due
//! when, and which wait for which destination, so a peer that comes back
//! wakes its own deliveries (and those with no route known yet) at once,
//! at most once per `delivery.wake_min_interval`. Time comes in as
//! arguments.

use relay_schemas::UnixMillis;
use std::collections::{BTreeSet, HashMap};

/// The key of deliveries that know no destination yet: any peer that comes
/// back may be theirs.
const NO_DESTINATION: &str = "";

/// Pending attempts in due order, and who waits for which destination.
#[derive(Default)]
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
}

impl DueQueue {
    /// `stream` is due at `due_ms`, waiting for `destinations` (none: no
    /// route known yet, so any peer that comes back may be its).
    pub fn insert(&mut self, due_ms: UnixMillis, stream: String, destinations: Vec<String>) {
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

    /// The earliest due time, if any.
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

#[cfg(test)]
mod tests {
    use super::DueQueue;
    use relay_schemas::UnixMillis as Ms;

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
}
