//! Web Push (PROTOCOL §9): the sender's pure core. Which devices get a push
//! is decided by the account ([`crate::account::method::push_subscribe::push_targets`]);
//! this module holds what happens to a wake-up after that: a bounded
//! queue that coalesces per device, at most one push per device per
//! `min_interval`, fair shares of the sender's slots (per account and per
//! endpoint origin, accounts served round-robin), and the retry rules by
//! the push service's answer. Time
//! comes in as arguments (milliseconds); the HTTP shell (encryption,
//! VAPID, the request) is in the binary (`server/src/push.rs`).

use crate::account::PushSubscription;
use relay_schemas::{UnixMillis, UnixSecs};
use std::collections::{BTreeSet, HashMap};

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
///
/// Slots are shared fairly: one account has at most `per_account` pushes in
/// flight and one endpoint origin at most `per_origin`, and of the wake-ups
/// due the next one taken is of the account with the fewest in flight (the
/// earliest due among those): accounts are served round-robin. So the many
/// devices of one account, or endpoints that hold a connection and never
/// answer, cannot keep another account's push waiting for more than the
/// time one slot takes to come free.
#[derive(Debug)]
pub struct PushQueue {
    cap: usize,
    min_interval_ms: u64,
    per_account: usize,
    per_origin: usize,
    waiting: HashMap<Key, (UnixMillis, PushJob)>,
    due: BTreeSet<(UnixMillis, Key)>,
    /// Devices with a push in flight, and that push's endpoint origin.
    in_flight: HashMap<Key, String>,
    /// Pushes in flight per account and per origin (absent: none).
    account_flying: HashMap<String, usize>,
    origin_flying: HashMap<String, usize>,
    /// When each device's last push was accepted by its push service.
    last_sent: HashMap<Key, UnixMillis>,
}

impl PushQueue {
    pub fn new(cap: usize, min_interval_ms: u64) -> Self {
        PushQueue {
            cap: cap.max(1),
            min_interval_ms,
            per_account: usize::MAX,
            per_origin: usize::MAX,
            waiting: HashMap::new(),
            due: BTreeSet::new(),
            in_flight: HashMap::new(),
            account_flying: HashMap::new(),
            origin_flying: HashMap::new(),
            last_sent: HashMap::new(),
        }
    }

    /// At most `per_account` pushes of one account and `per_origin` to one
    /// endpoint origin in flight at once (each at least 1).
    pub fn with_shares(mut self, per_account: usize, per_origin: usize) -> Self {
        self.per_account = per_account.max(1);
        self.per_origin = per_origin.max(1);
        self
    }

    /// Pushes of `account` in flight.
    pub fn account_in_flight(&self, account: &str) -> usize {
        self.account_flying.get(account).copied().unwrap_or(0)
    }

    /// Whether a wake-up for `key` to `endpoint` may start now as far as
    /// the shares go (its device has none in flight, its account and its
    /// origin are under their share).
    fn may_start(&self, key: &Key, endpoint: &str) -> bool {
        !self.in_flight.contains_key(key)
            && self.account_in_flight(&key.0) < self.per_account
            && self.origin_flying.get(&origin_of(endpoint)).copied().unwrap_or(0) < self.per_origin
    }

    fn take_off(&mut self, job: &PushJob) {
        let key = job.key();
        let origin = origin_of(&job.subscription.endpoint);
        *self.account_flying.entry(key.0.clone()).or_default() += 1;
        *self.origin_flying.entry(origin.clone()).or_default() += 1;
        self.in_flight.insert(key, origin);
    }

    /// `key`'s push came back (answered or not): its slot is free.
    fn land(&mut self, key: &Key) {
        let Some(origin) = self.in_flight.remove(key) else { return };
        for (map, name) in [(&mut self.account_flying, &key.0), (&mut self.origin_flying, &origin)] {
            if let Some(n) = map.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    map.remove(name);
                }
            }
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
        if self.in_flight.contains_key(key) {
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

    /// Whether the waiting wake-up of `key` may start as far as the shares go.
    fn startable(&self, key: &Key) -> bool {
        self.waiting.get(key).is_some_and(|(_, job)| self.may_start(key, &job.subscription.endpoint))
    }

    /// The next due time of a wake-up that may start then, if any: one held
    /// back by its device's, account's or origin's push in flight waits for
    /// that push's answer, not for a time.
    pub fn next_due(&self) -> Option<UnixMillis> {
        self.due.iter().find(|(_, k)| self.startable(k)).map(|(due, _)| *due)
    }

    /// Takes a wake-up due at `now_ms` that may start (see [`Self::next_due`]),
    /// marking it in flight: of the account with the fewest pushes in
    /// flight, the earliest due.
    pub fn pop_due(&mut self, now_ms: UnixMillis) -> Option<PushJob> {
        let mut best: Option<(usize, &(UnixMillis, Key))> = None;
        for entry in self.due.iter().take_while(|(due, _)| *due <= now_ms) {
            if !self.startable(&entry.1) {
                continue;
            }
            let flying = self.account_in_flight(&entry.1 .0);
            if best.is_none_or(|(least, _)| flying < least) {
                best = Some((flying, entry));
                if flying == 0 {
                    break; // none can have fewer; the earliest of those
                }
            }
        }
        let (due, key) = best?.1.clone();
        self.due.remove(&(due, key.clone()));
        let (_, job) = self.waiting.remove(&key)?;
        self.take_off(&job);
        Some(job)
    }

    /// The push service accepted `job` at `now_ms`: the device's next push
    /// waits `min_interval` from now.
    pub fn sent(&mut self, job: &PushJob, now_ms: UnixMillis) {
        let key = job.key();
        self.land(&key);
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
        self.land(&key);
        let merged = match self.waiting.get(&key).cloned() {
            Some((due, newer)) => (due.max(at_ms), PushJob { attempt: job.attempt, ..newer }),
            None => (at_ms, job),
        };
        self.put(merged.0, merged.1);
    }

    /// `job` ended without being sent (gone, rejected, given up).
    pub fn done(&mut self, job: &PushJob) {
        self.land(&job.key());
    }
}

/// The origin of a push endpoint, as the per-origin share counts it:
/// scheme and host lowercased, a trailing dot and the scheme's default
/// port dropped (`https://Push.Example:443/x` and `https://push.example./y`
/// are one origin). Text that is no URL is its own origin.
pub fn origin_of(endpoint: &str) -> String {
    let lower = endpoint.to_ascii_lowercase();
    let Some((scheme, rest)) = lower.split_once("://") else { return lower };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') && p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
        _ => (authority, None),
    };
    let host = host.trim_end_matches('.');
    let default = match scheme {
        "https" => Some("443"),
        "http" => Some("80"),
        _ => None,
    };
    match port {
        Some(p) if Some(p) != default && !p.is_empty() => format!("{scheme}://{host}:{p}"),
        _ => format!("{scheme}://{host}"),
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
        job_of("acct", device, &format!("https://push.invalid/{device}"), sequence)
    }

    fn job_of(account: &str, device: &str, endpoint: &str, sequence: u64) -> PushJob {
        PushJob {
            account_id: account.into(),
            device_id: device.into(),
            sequence,
            subscription: PushSubscription { endpoint: endpoint.into(), p256dh: "k".into(), auth: "a".into() },
            attempt: 0,
        }
    }

    /// The account of every job `pop_due` gives at `now` until it gives none.
    fn drain(q: &mut PushQueue, now: Ms) -> Vec<(String, String)> {
        std::iter::from_fn(|| q.pop_due(now)).map(|j| (j.account_id, j.device_id)).collect()
    }

    #[test]
    fn one_account_holds_at_most_its_share_of_the_slots_and_another_account_is_not_kept_waiting() {
        let mut q = PushQueue::new(1000, 10_000).with_shares(4, 100);
        // 64 devices of one account, due first; then one device of another.
        for d in 0..64 {
            q.offer(job_of("flood", &format!("d{d}"), &format!("https://hole{d}.example/p"), 1), Ms(0));
        }
        q.offer(job_of("alice", "phone", "https://push.example/a", 1), Ms(70));
        let started = drain(&mut q, Ms(100));
        assert_eq!(started.len(), 5, "four of the flood, then alice: {started:?}");
        assert_eq!(started.iter().filter(|(a, _)| a == "flood").count(), 4);
        assert!(started.contains(&("alice".into(), "phone".into())));
        assert_eq!(q.account_in_flight("flood"), 4);
        assert_eq!(q.next_due(), None, "the rest of the flood waits for an answer, not for a time");
        // An answer frees one of the flood's slots: the next of the flood starts.
        let first = q.pop_due(Ms(100));
        assert!(first.is_none());
        let gone = job_of("flood", "d0", "https://hole0.example/p", 1);
        q.done(&gone);
        assert_eq!(q.next_due(), Some(Ms(0)));
        assert_eq!(drain(&mut q, Ms(200)).len(), 1);
        assert_eq!(q.account_in_flight("flood"), 4);
    }

    #[test]
    fn accounts_with_wake_ups_due_are_served_round_robin() {
        let mut q = PushQueue::new(1000, 10_000).with_shares(8, 100);
        // a's ten devices are due before b's and c's.
        for d in 0..10 {
            q.offer(job_of("a", &format!("a{d}"), &format!("https://a.example/{d}"), 1), Ms(d));
        }
        for d in 0..3 {
            q.offer(job_of("b", &format!("b{d}"), &format!("https://b.example/{d}"), 1), Ms(20 + d));
            q.offer(job_of("c", &format!("c{d}"), &format!("https://c.example/{d}"), 1), Ms(30 + d));
        }
        let order: Vec<String> = drain(&mut q, Ms(100)).into_iter().take(9).map(|(a, _)| a).collect();
        assert_eq!(order, ["a", "b", "c", "a", "b", "c", "a", "b", "c"]);
    }

    #[test]
    fn one_endpoint_origin_holds_at_most_its_share_of_the_slots() {
        let mut q = PushQueue::new(1000, 10_000).with_shares(100, 3);
        for a in 0..6 {
            // The same origin spelt three ways.
            let endpoint = ["https://Hole.example:443/x", "https://hole.example./y", "https://hole.example/z"][a % 3];
            q.offer(job_of(&format!("acct{a}"), "phone", endpoint, 1), Ms(0));
        }
        q.offer(job_of("other", "phone", "https://hole.example:8443/z", 1), Ms(5));
        let started = drain(&mut q, Ms(10));
        assert_eq!(started.len(), 4, "three to the origin, one to another port: {started:?}");
        assert!(started.contains(&("other".into(), "phone".into())));
        assert_eq!(q.len(), 3);
    }

    #[test]
    fn an_endpoint_origin_is_its_scheme_host_and_non_default_port() {
        assert_eq!(origin_of("https://FCM.googleapis.com:443/fcm/send/x"), "https://fcm.googleapis.com");
        assert_eq!(origin_of("https://push.example./a?b"), "https://push.example");
        assert_eq!(origin_of("http://127.0.0.1:8080/push/a"), "http://127.0.0.1:8080");
        assert_eq!(origin_of("https://[2001:db8::1]:443/p"), "https://[2001:db8::1]");
        assert_eq!(origin_of("https://[2001:db8::1]/p"), "https://[2001:db8::1]");
        assert_eq!(origin_of("https://[2001:db8::1]:8443/p"), "https://[2001:db8::1]:8443");
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
