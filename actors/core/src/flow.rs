//! What one client's connections may hold, the rules without the I/O:
//! connections per client address (`http.max_connections_per_ip`,
//! [`within_cap`]), requests a WebSocket reads ahead of its answers
//! ([`request_room`]), the deadline of a write ([`write_by`]) and the byte
//! budget of one WebSocket connection ([`Flow`]). The server's transport
//! (`server/src/http/`) counts, reads, writes and closes by them.
//!
//! **The byte budget.** actix-ws never says when written bytes reached the
//! client: a frame handed to its `Session` goes into a channel, then into
//! actix-http's write buffer, then into the kernel, and a client that stops
//! reading leaves it in relay memory. So the connection proves delivery
//! itself, with *flow pings*: once half the budget is unacknowledged, it
//! sends a ping with a payload of its own; the client's pong (browsers
//! answer pings by themselves) comes after the client read every frame
//! written before the ping, so everything up to the ping is acknowledged.
//! While the bytes not yet acknowledged reach the budget, the connection
//! takes no new requests and no notifications (they wait, bounded, in their
//! queues); if that lasts `websocket.write_timeout` without a pong, the
//! client is a slow consumer and is closed. What a connection holds in
//! relay memory is so bounded by the budget plus one frame. Time comes in
//! as `Instant`s the transport reads.

use std::time::{Duration, Instant};

/// The byte budget of one WebSocket connection (see the module's doc).
#[derive(Debug)]
pub struct Flow {
    budget: u64,
    written: u64,
    acked: u64,
    /// The flow ping on its way: its id and the bytes written before it.
    probe: Option<(u64, u64)>,
    next_probe: u64,
    /// Since when the budget has been exhausted without progress.
    blocked_since: Option<Instant>,
}

/// Flow ping payloads are 8 bytes (keepalive pings are empty).
pub type ProbePayload = [u8; 8];

impl Flow {
    pub fn new(budget: u64) -> Self {
        Flow { budget: budget.max(1), written: 0, acked: 0, probe: None, next_probe: 0, blocked_since: None }
    }

    /// Bytes written and not yet acknowledged by a pong.
    pub fn unacked(&self) -> u64 {
        self.written - self.acked
    }

    /// Whether the connection may write more: take a request or a push.
    pub fn open(&self) -> bool {
        self.unacked() < self.budget
    }

    /// `bytes` were handed to the socket at `now`.
    pub fn wrote(&mut self, bytes: usize, now: Instant) {
        self.written += bytes as u64;
        if !self.open() && self.blocked_since.is_none() {
            self.blocked_since = Some(now);
        }
    }

    /// The payload of a flow ping to send now, if one is due: half the
    /// budget is unacknowledged and no flow ping is on its way.
    pub fn probe(&mut self) -> Option<ProbePayload> {
        if self.probe.is_some() || self.unacked() < self.budget.div_ceil(2) {
            return None;
        }
        let id = self.next_probe;
        self.next_probe += 1;
        self.probe = Some((id, self.written));
        Some(id.to_be_bytes())
    }

    /// A pong arrived at `now`: if it answers the flow ping on its way,
    /// everything written before that ping is acknowledged.
    pub fn pong(&mut self, payload: &[u8], now: Instant) {
        let Some((id, mark)) = self.probe else { return };
        if payload != id.to_be_bytes() {
            return;
        }
        self.probe = None;
        self.acked = mark;
        // Progress: a still exhausted budget gets a fresh write timeout.
        self.blocked_since = (!self.open()).then_some(now);
    }

    /// When the connection is a slow consumer if no pong comes first.
    pub fn deadline(&self, write_timeout: Duration) -> Option<Instant> {
        self.blocked_since.map(|t| t + write_timeout)
    }
}

/// Whether a connection that makes `count` from its client address
/// (itself included) is within `http.max_connections_per_ip`.
pub fn within_cap(count: usize, max_per_ip: usize) -> bool {
    count <= max_per_ip
}

/// Whether a WebSocket may read another request while `in_flight` are read
/// and not answered and `queued_bytes` of them wait: fewer than
/// `max_in_flight`, and the waiting ones under `max_unread_bytes`. `Err`
/// says which bound is reached (the close reason of a client that sends
/// on regardless).
pub fn request_room(
    in_flight: usize,
    queued_bytes: usize,
    max_in_flight: usize,
    max_unread_bytes: usize,
) -> Result<(), String> {
    if queued_bytes >= max_unread_bytes {
        Err(format!("more than {max_unread_bytes} bytes of requests in flight"))
    } else if in_flight >= max_in_flight {
        Err(format!("more than {max_in_flight} requests in flight"))
    } else {
        Ok(())
    }
}

/// When a write starting at `now` must have been taken: within
/// `write_timeout`, and not past the idle deadline (`last_heard` +
/// `idle_timeout`). `true`: the idle deadline comes first, so a write not
/// taken by then closes for idleness, not as a slow consumer.
pub fn write_by(last_heard: Instant, idle_timeout: Duration, now: Instant, write_timeout: Duration) -> (Instant, bool) {
    let (idle_at, by) = (last_heard + idle_timeout, now + write_timeout);
    if idle_at < by {
        (idle_at, true)
    } else {
        (by, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flow_ping_is_due_at_half_the_budget_and_only_one_at_a_time() {
        let t = Instant::now();
        let mut f = Flow::new(1000);
        f.wrote(499, t);
        assert_eq!(f.probe(), None);
        f.wrote(1, t);
        assert_eq!(f.probe(), Some(0u64.to_be_bytes()));
        f.wrote(100, t);
        assert_eq!(f.probe(), None, "one flow ping on its way at a time");
        assert!(f.open());
    }

    #[test]
    fn the_budget_closes_when_unacknowledged_bytes_reach_it_and_a_pong_reopens_it() {
        let t = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut f = Flow::new(1000);
        f.wrote(600, t);
        let p = f.probe().unwrap();
        f.wrote(400, t);
        assert!(!f.open());
        assert_eq!(f.deadline(timeout), Some(t + timeout));
        // A keepalive pong or a stale payload acknowledges nothing.
        f.pong(b"", t);
        f.pong(&7u64.to_be_bytes(), t);
        assert!(!f.open());
        // The flow ping's pong acknowledges the 600 bytes before it.
        f.pong(&p, t + Duration::from_secs(1));
        assert_eq!(f.unacked(), 400);
        assert!(f.open());
        assert_eq!(f.deadline(timeout), None);
        assert_eq!(f.probe(), None, "400 of 1000 is under half");
    }

    #[test]
    fn a_pong_that_leaves_the_budget_exhausted_restarts_the_write_timeout_and_the_next_ping_is_due() {
        let t = Instant::now();
        let later = t + Duration::from_secs(3);
        let timeout = Duration::from_secs(10);
        let mut f = Flow::new(1000);
        f.wrote(500, t);
        let p = f.probe().unwrap();
        f.wrote(1500, t); // one large frame past the budget
        f.pong(&p, later);
        assert_eq!(f.unacked(), 1500);
        assert!(!f.open());
        assert_eq!(f.deadline(timeout), Some(later + timeout));
        assert_eq!(f.probe(), Some(1u64.to_be_bytes()));
    }

    #[test]
    fn the_write_timeout_counts_from_when_the_budget_ran_out() {
        let t = Instant::now();
        let timeout = Duration::from_secs(10);
        let mut f = Flow::new(1000);
        f.wrote(900, t);
        assert_eq!(f.deadline(timeout), None);
        let out = t + Duration::from_secs(5);
        f.wrote(200, out);
        f.wrote(200, out + Duration::from_secs(1));
        assert_eq!(f.deadline(timeout), Some(out + timeout));
    }
    #[test]
    fn connections_are_within_the_cap_up_to_max_per_ip_themselves_included() {
        assert!(within_cap(1, 2) && within_cap(2, 2));
        assert!(!within_cap(3, 2));
        assert!(!within_cap(1, 0), "a cap of 0 refuses every connection");
    }

    #[test]
    fn a_websocket_reads_another_request_only_under_both_the_in_flight_count_and_the_unread_bytes() {
        assert_eq!(request_room(3, 999, 4, 1000), Ok(()));
        assert_eq!(request_room(4, 0, 4, 1000), Err("more than 4 requests in flight".into()));
        assert_eq!(request_room(0, 1000, 4, 1000), Err("more than 1000 bytes of requests in flight".into()));
        assert!(request_room(4, 1000, 4, 1000).unwrap_err().contains("bytes"), "the bytes are named first");
    }

    #[test]
    fn a_write_must_be_taken_by_the_earlier_of_the_idle_deadline_and_the_write_timeout() {
        let t = Instant::now();
        let (idle, write) = (Duration::from_secs(60), Duration::from_secs(10));
        assert_eq!(write_by(t, idle, t, write), (t + write, false));
        let late = t + Duration::from_secs(55);
        assert_eq!(write_by(t, idle, late, write), (t + idle, true), "the idle deadline comes first");
        assert_eq!(write_by(t, idle, t + Duration::from_secs(50), write), (t + idle, false), "a tie is the write's");
    }
}
