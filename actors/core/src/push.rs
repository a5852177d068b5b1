//! Web Push (PROTOCOL §9): the sender's pure core. Which devices get a push
//! is decided by the account ([`crate::account::decide::push_targets`]);
//! this module holds what happens to a wake-up after that: a bounded
//! queue that coalesces per device, at most one push per device per
//! `min_interval`, and the retry rules by the push service's answer. Time
//! comes in as arguments (milliseconds); the HTTP shell (encryption,
//! VAPID, the request) is in the binary (`src/push.rs`).

use crate::account::PushSubscription;
use relay_schemas::{UnixMillis, UnixSecs};
use std::collections::{BTreeSet, HashMap, HashSet};

/// One wake-up owed to a device: its account's timeline reached `sequence`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushJob {
    pub account_id: String,
    pub device_id: String,
    pub sequence: u64,
    pub subscription: PushSubscription,
    /// Attempts already made for this wake-up.
    pub attempt: u32,
}

impl PushJob {
    pub fn key(&self) -> Key {
        (self.account_id.clone(), self.device_id.clone())
    }
}

/// Where accounts hand their wake-ups; never waits (the binary's sender
/// counts what it cannot take).
pub trait PushSink: Send + Sync + 'static {
    fn offer(&self, job: PushJob);
}

/// A device: (account_id, device_id).
pub type Key = (String, String);

/// What became of an offered wake-up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offered {
    /// Waiting for its due time.
    Queued,
    /// Folded into the device's waiting wake-up (the later sequence wins).
    Coalesced,
    /// The queue is full: not kept. The device learns of the record when it
    /// next connects (backlog), so nothing is lost but the wake-up.
    Dropped,
}

/// Wake-ups waiting, per device at most one, each with its due time.
/// Bounded by `cap` devices waiting; a device whose push is in flight
/// counts apart (at most the sender's concurrency).
#[derive(Debug)]
pub struct PushQueue {
    cap: usize,
    min_interval_ms: u64,
    waiting: HashMap<Key, (UnixMillis, PushJob)>,
    due: BTreeSet<(UnixMillis, Key)>,
    in_flight: HashSet<Key>,
    /// When each device's last push was accepted by its push service.
    last_sent: HashMap<Key, UnixMillis>,
}

impl PushQueue {
    pub fn new(cap: usize, min_interval_ms: u64) -> Self {
        PushQueue {
            cap: cap.max(1),
            min_interval_ms,
            waiting: HashMap::new(),
            due: BTreeSet::new(),
            in_flight: HashSet::new(),
            last_sent: HashMap::new(),
        }
    }

    /// Devices with a wake-up waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Pushes in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// The earliest time a push to `key` may leave: `min_interval` after
    /// its last one, and not while one is in flight (then the interval is
    /// counted from now, and moved on once that one is answered).
    fn earliest(&self, key: &Key, now_ms: UnixMillis) -> UnixMillis {
        if self.in_flight.contains(key) {
            return now_ms.plus(self.min_interval_ms);
        }
        match self.last_sent.get(key) {
            Some(at) => now_ms.max(at.plus(self.min_interval_ms)),
            None => now_ms,
        }
    }

    fn put(&mut self, due_ms: UnixMillis, job: PushJob) {
        let key = job.key();
        if let Some((old, _)) = self.waiting.remove(&key) {
            self.due.remove(&(old, key.clone()));
        }
        self.due.insert((due_ms, key.clone()));
        self.waiting.insert(key, (due_ms, job));
    }

    /// A new record for a device at `now_ms`.
    pub fn offer(&mut self, job: PushJob, now_ms: UnixMillis) -> Offered {
        let key = job.key();
        if let Some((_, waiting)) = self.waiting.get_mut(&key) {
            if job.sequence >= waiting.sequence {
                // The latest sequence and subscription, the earlier's attempts.
                let attempt = waiting.attempt;
                *waiting = PushJob { attempt, ..job };
            }
            return Offered::Coalesced;
        }
        if self.waiting.len() >= self.cap {
            return Offered::Dropped;
        }
        let due = self.earliest(&key, now_ms);
        self.put(due, job);
        Offered::Queued
    }

    /// The next due time, if any wake-up waits.
    pub fn next_due(&self) -> Option<UnixMillis> {
        self.due.iter().find(|(_, k)| !self.in_flight.contains(k)).map(|(due, _)| *due)
    }

    /// Takes the earliest wake-up due at `now_ms` (none in flight for its
    /// device), marking it in flight.
    pub fn pop_due(&mut self, now_ms: UnixMillis) -> Option<PushJob> {
        let (due, key) = self.due.iter().find(|(due, k)| *due <= now_ms && !self.in_flight.contains(k))?.clone();
        self.due.remove(&(due, key.clone()));
        let (_, job) = self.waiting.remove(&key)?;
        self.in_flight.insert(key);
        Some(job)
    }

    /// The push service accepted `job` at `now_ms`: the device's next push
    /// waits `min_interval` from now.
    pub fn sent(&mut self, job: &PushJob, now_ms: UnixMillis) {
        let key = job.key();
        self.in_flight.remove(&key);
        self.last_sent.insert(key.clone(), now_ms);
        let next = now_ms.plus(self.min_interval_ms);
        if let Some((due, waiting)) = self.waiting.get(&key).cloned() {
            if due < next {
                self.put(next, waiting);
            }
        }
        // Devices whose interval has passed need no memory.
        if self.last_sent.len() > self.cap {
            let keep_after = now_ms.minus(self.min_interval_ms);
            self.last_sent.retain(|_, at| *at > keep_after);
        }
    }

    /// `job` is to be tried again at `at_ms` (429/5xx, no answer). A
    /// wake-up that arrived for the device meanwhile is folded in: the later
    /// sequence, this one's attempts, the later of the two due times.
    pub fn retry(&mut self, job: PushJob, at_ms: UnixMillis) {
        let key = job.key();
        self.in_flight.remove(&key);
        let merged = match self.waiting.get(&key).cloned() {
            Some((due, newer)) => (due.max(at_ms), PushJob { attempt: job.attempt, ..newer }),
            None => (at_ms, job),
        };
        self.put(merged.0, merged.1);
    }

    /// `job` ended without being sent (gone, rejected, given up).
    pub fn done(&mut self, job: &PushJob) {
        self.in_flight.remove(&job.key());
    }
}

/// The push service's answer to one attempt (`status` None: no answer,
/// timeout or connection error).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: the push service took it.
    Sent,
    /// 429, 5xx or no answer: try again at this time (ms).
    Retry { at_ms: UnixMillis },
    /// 404/410: the subscription has expired or was removed; drop it.
    Gone,
    /// Any other answer (400, 401/403 VAPID refused, 413): not retried.
    Rejected,
    /// Retryable, but `max_attempts` were made.
    GaveUp,
}

/// The retry rules: `attempt` is the number of this attempt (1 = first);
/// `retry_after_s` the `Retry-After` seconds the answer carried (honoured,
/// up to `max_retry_after_ms`); without one the wait is `backoff_ms`
/// doubled per attempt, up to the same cap.
pub fn judge(
    status: Option<u16>,
    retry_after_s: Option<u64>,
    attempt: u32,
    max_attempts: u32,
    backoff_ms: u64,
    max_retry_after_ms: u64,
    now_ms: UnixMillis,
) -> Verdict {
    let retryable = match status {
        Some(200..=299) => return Verdict::Sent,
        Some(404 | 410) => return Verdict::Gone,
        Some(429 | 500..=599) | None => true,
        Some(_) => false,
    };
    if !retryable {
        return Verdict::Rejected;
    }
    if attempt >= max_attempts {
        return Verdict::GaveUp;
    }
    let wait = match retry_after_s {
        Some(s) => s.saturating_mul(1000),
        None => backoff_ms.saturating_mul(1u64 << attempt.saturating_sub(1).min(20)),
    };
    Verdict::Retry { at_ms: now_ms.plus(wait.min(max_retry_after_ms)) }
}

/// `Retry-After` as seconds: delay-seconds, or an HTTP-date (IMF-fixdate)
/// relative to `now` (Unix seconds). Anything else is ignored.
pub fn parse_retry_after(value: &str, now: UnixSecs) -> Option<u64> {
    let v = value.trim();
    if let Ok(s) = v.parse::<u64>() {
        return Some(s);
    }
    let at = httpdate_to_unix(v)?;
    Some(UnixSecs(at).since(now))
}

/// An HTTP-date (the three formats of RFC 9110, by `httpdate`) to Unix seconds.
fn httpdate_to_unix(s: &str) -> Option<u64> {
    let at = httpdate::parse_http_date(s).ok()?;
    at.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use relay_schemas::UnixMillis as Ms;

    fn job(device: &str, sequence: u64) -> PushJob {
        PushJob {
            account_id: "acct".into(),
            device_id: device.into(),
            sequence,
            subscription: PushSubscription {
                endpoint: format!("https://push.invalid/{device}"),
                p256dh: "k".into(),
                auth: "a".into(),
            },
            attempt: 0,
        }
    }

    #[test]
    fn a_first_wake_up_is_due_at_once() {
        let mut q = PushQueue::new(8, 10_000);
        assert_eq!(q.offer(job("phone", 1), Ms(1_000)), Offered::Queued);
        assert_eq!(q.next_due(), Some(Ms(1_000)));
        assert_eq!(q.pop_due(Ms(1_000)).unwrap().sequence, 1);
        assert!(q.pop_due(Ms(1_000)).is_none());
    }

    #[test]
    fn a_flood_for_one_device_is_one_push_per_min_interval_with_the_latest_sequence() {
        let mut q = PushQueue::new(8, 10_000);
        q.offer(job("phone", 1), Ms(0));
        let first = q.pop_due(Ms(0)).unwrap();
        // Records 2..=50 arrive while the first push is in flight and after.
        for seq in 2..=20 {
            q.offer(job("phone", seq), Ms(10));
        }
        q.sent(&first, Ms(100));
        for seq in 21..=50 {
            assert_eq!(q.offer(job("phone", seq), Ms(200 + seq)), Offered::Coalesced);
        }
        assert_eq!(q.len(), 1, "one wake-up waits for the device");
        assert!(q.pop_due(Ms(10_099)).is_none(), "not before min_interval after the last push");
        assert_eq!(q.next_due(), Some(Ms(10_100)));
        let second = q.pop_due(Ms(10_100)).unwrap();
        assert_eq!(second.sequence, 50, "the latest record");
        q.sent(&second, Ms(10_150));
        assert_eq!(q.offer(job("phone", 51), Ms(12_000)), Offered::Queued);
        assert_eq!(q.next_due(), Some(Ms(20_150)));
    }

    #[test]
    fn devices_are_coalesced_apart() {
        let mut q = PushQueue::new(8, 10_000);
        q.offer(job("phone", 1), Ms(0));
        q.offer(job("laptop", 1), Ms(0));
        let a = q.pop_due(Ms(0)).unwrap();
        let b = q.pop_due(Ms(0)).unwrap();
        assert_ne!(a.device_id, b.device_id);
        q.sent(&a, Ms(5));
        assert_eq!(q.offer(job(&b.device_id, 2), Ms(6)), Offered::Queued, "b's push is in flight, a's interval is a's");
    }

    #[test]
    fn a_full_queue_drops_new_devices_but_still_coalesces_waiting_ones() {
        let mut q = PushQueue::new(2, 10_000);
        assert_eq!(q.offer(job("a", 1), Ms(0)), Offered::Queued);
        assert_eq!(q.offer(job("b", 1), Ms(0)), Offered::Queued);
        assert_eq!(q.offer(job("c", 1), Ms(0)), Offered::Dropped);
        assert_eq!(q.offer(job("a", 2), Ms(0)), Offered::Coalesced);
        assert_eq!(q.len(), 2);
        q.pop_due(Ms(0)).unwrap();
        assert_eq!(q.offer(job("c", 1), Ms(0)), Offered::Queued, "room again once one left");
    }

    #[test]
    fn a_retry_keeps_its_time_and_takes_in_a_newer_record() {
        let mut q = PushQueue::new(8, 1_000);
        q.offer(job("phone", 1), Ms(0));
        let j = q.pop_due(Ms(0)).unwrap();
        q.offer(job("phone", 2), Ms(50));
        q.retry(PushJob { attempt: 1, ..j }, Ms(5_000));
        assert!(q.pop_due(Ms(4_999)).is_none(), "Retry-After is honoured");
        let again = q.pop_due(Ms(5_000)).unwrap();
        assert_eq!((again.sequence, again.attempt), (2, 1));
    }

    #[test]
    fn judge_follows_the_push_service_answer() {
        let j = |status, ra, attempt| judge(status, ra, attempt, 3, 1_000, 3_600_000, Ms(10_000));
        assert_eq!(j(Some(201), None, 1), Verdict::Sent);
        assert_eq!(j(Some(410), None, 1), Verdict::Gone);
        assert_eq!(j(Some(404), None, 1), Verdict::Gone);
        assert_eq!(j(Some(400), None, 1), Verdict::Rejected);
        assert_eq!(j(Some(403), None, 1), Verdict::Rejected);
        assert_eq!(j(Some(429), Some(7), 1), Verdict::Retry { at_ms: Ms(17_000) });
        assert_eq!(j(Some(503), None, 1), Verdict::Retry { at_ms: Ms(11_000) });
        assert_eq!(j(Some(503), None, 2), Verdict::Retry { at_ms: Ms(12_000) }, "backoff doubles");
        assert_eq!(j(None, None, 1), Verdict::Retry { at_ms: Ms(11_000) }, "no answer is retried");
        assert_eq!(j(Some(500), None, 3), Verdict::GaveUp);
        assert_eq!(j(Some(429), Some(1_000_000), 1), Verdict::Retry { at_ms: Ms(3_610_000) }, "capped");
    }

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        assert_eq!(parse_retry_after("3", UnixSecs(0)), Some(3));
        // 1994-11-06T08:49:37Z = 784111777
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", UnixSecs(784_111_770)), Some(7));
        assert_eq!(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", UnixSecs(784_111_800)), Some(0));
        assert_eq!(parse_retry_after("soon", UnixSecs(0)), None);
    }
}
