//! The measured window: `concurrency` clients, each with one keep-alive
//! connection per relay, writing pre-built requests one at a time: as fast
//! as replies come (closed loop), or each at its due time under `--rate`
//! (open loop, released by a pacer thread). One thread drives every client
//! on tokio's current-thread runtime: a thread per client cost 44–47 µs of
//! CPU per send on this 2-core machine (a wake-up and a context switch per
//! reply), CPU the relay under test shares.

use super::http::AsyncConn;
use super::plan::Send;
use crate::setup::Target;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

#[derive(Default)]
pub struct Outcome {
    /// Every reply's latency (µs), whatever its status.
    pub send_us: Vec<u64>,
    /// Latency (µs) of replies whose status is `target_accepted`.
    pub deliver_us: Vec<u64>,
    /// `(when the reply came, in ms from the window's start, its latency
    /// in µs)` of every reply in `send_us`: the per-second series.
    pub replies: Vec<(u64, u64)>,
    pub sent: u64,
    pub target_accepted: u64,
    pub delivering: u64,
    pub cross: u64,
    pub errors: u64,
    /// The first few error descriptions.
    pub error_samples: Vec<String>,
    pub elapsed: Duration,
    /// `(send index, when its request was written)` of every reply whose
    /// status is `target_accepted` (the start of a `--ws` notification
    /// latency).
    pub accepted: Vec<(usize, Instant)>,
}

impl Outcome {
    fn merge(&mut self, o: Outcome) {
        self.send_us.extend(o.send_us);
        self.deliver_us.extend(o.deliver_us);
        self.replies.extend(o.replies);
        self.accepted.extend(o.accepted);
        self.sent += o.sent;
        self.target_accepted += o.target_accepted;
        self.delivering += o.delivering;
        self.cross += o.cross;
        self.errors += o.errors;
        for e in o.error_samples {
            if self.error_samples.len() < 5 {
                self.error_samples.push(e);
            }
        }
    }

    fn error(&mut self, e: String) {
        self.errors += 1;
        if self.error_samples.len() < 5 {
            self.error_samples.push(e);
        }
    }
}

fn status_of(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Reply {
        status: Option<String>,
    }
    serde_json::from_slice::<Reply>(body).ok()?.status
}

/// When send `index` is due under an offered `rate` (sends/s) from `start`.
fn due(start: Instant, rate: Option<f64>, index: usize) -> Option<Instant> {
    rate.filter(|r| *r > 0.0).map(|r| start + Duration::from_secs_f64(index as f64 / r))
}

/// Under `--rate`: lets each send go at its due time, from a thread of its
/// own. `thread::sleep` wakes within a fraction of a millisecond; tokio's
/// timer only at the next whole millisecond, which every latency (counted
/// from the due time) would carry.
fn pace(
    (start, rate, deadline): (Instant, f64, Option<Instant>),
    sends: usize,
    gates: Vec<mpsc::UnboundedSender<()>>,
    stop: &AtomicBool,
) {
    for index in 0..sends {
        let Some(at) = due(start, Some(rate), index) else { return };
        let wake = deadline.map_or(at, |d| at.min(d));
        if let Some(wait) = wake.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            return;
        }
        // A client that stopped has dropped its gate: nothing to release.
        let _ = gates[index % gates.len()].send(());
    }
}

async fn client(
    targets: &[Target],
    sends: &[(usize, &Send)],
    (start, rate, deadline): (Instant, Option<f64>, Option<Instant>),
    mut gate: Option<mpsc::UnboundedReceiver<()>>,
    done: &AtomicU64,
    stop: &AtomicBool,
) -> Outcome {
    let mut out = Outcome::default();
    let mut conns: Vec<Option<AsyncConn>> = targets.iter().map(|_| None).collect();
    for &(index, s) in sends {
        if stop.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        // Open loop: the pacer lets the send go at its due time, and the
        // latency counts from then, whatever made the send later (the client
        // busy with an earlier reply, its wake-up delayed on cores the relay
        // shares): not ours to hide. Every send takes its release, even one
        // whose connection then fails, so the next is not let go early.
        let t0 = match (due(start, rate, index), gate.as_mut()) {
            (Some(at), Some(gate)) => {
                if gate.recv().await.is_none() {
                    break;
                }
                at
            }
            _ => Instant::now(),
        };
        let conn = match &mut conns[s.relay] {
            Some(c) => c,
            slot => match AsyncConn::open(&targets[s.relay].addr).await {
                Ok(c) => slot.insert(c),
                Err(e) => {
                    out.error(e);
                    done.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
            },
        };
        let r = conn.roundtrip(&s.request).await;
        let now = Instant::now();
        let us = now.duration_since(t0).as_micros() as u64;
        let reply = (now.duration_since(start).as_millis() as u64, us);
        out.sent += 1;
        out.cross += s.cross as u64;
        done.fetch_add(1, Ordering::Relaxed);
        match r {
            Err(e) => {
                conns[s.relay] = None;
                out.error(e);
            }
            Ok((200, body)) => {
                out.send_us.push(us);
                out.replies.push(reply);
                match status_of(&body).as_deref() {
                    Some("target_accepted") => {
                        out.target_accepted += 1;
                        out.deliver_us.push(us);
                        out.accepted.push((index, t0));
                    }
                    Some("delivering") => out.delivering += 1,
                    _ => out.error(format!("message.send: {}", String::from_utf8_lossy(&body))),
                }
            }
            Ok((status, body)) => {
                out.send_us.push(us);
                out.replies.push(reply);
                out.error(format!("message.send: HTTP {status}: {}", String::from_utf8_lossy(&body)))
            }
        }
    }
    out
}

/// Runs the sends over `concurrency` clients; `tick` is called about every
/// 100 ms, and once at the end, with the number of replies so far and the
/// time since the window started (the progress bar, the resource samples).
pub fn run(
    targets: &[Target],
    sends: &[Send],
    concurrency: usize,
    duration: Option<Duration>,
    rate: Option<f64>,
    tick: &mut dyn FnMut(u64, Duration),
) -> Outcome {
    let concurrency = concurrency.max(1).min(sends.len().max(1));
    // Client t takes sends t, t + C, …: contiguous chunks would give one
    // client all of one sender's messages.
    let mut shards: Vec<Vec<(usize, &Send)>> = (0..concurrency).map(|_| Vec::new()).collect();
    for (i, s) in sends.iter().enumerate() {
        shards[i % concurrency].push((i, s));
    }
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let deadline = duration.map(|d| start + d);
    let mut total = Outcome::default();
    let paced = rate.filter(|r| *r > 0.0);
    let (gates, mut opened): (Vec<_>, Vec<_>) = match paced {
        Some(_) => (0..concurrency).map(|_| mpsc::unbounded_channel()).map(|(tx, rx)| (tx, Some(rx))).unzip(),
        None => (Vec::new(), (0..concurrency).map(|_| None).collect()),
    };
    std::thread::scope(|scope| {
        if let Some(r) = paced {
            let stop = &stop;
            scope.spawn(move || pace((start, r, deadline), sends.len(), gates, stop));
        }
        let (done, stop) = (&done, &stop);
        let driver = scope.spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build();
            let rt = rt.map_err(|e| format!("the load's runtime: {e}"))?;
            let clients = shards
                .iter()
                .zip(opened.iter_mut())
                .map(|(shard, gate)| client(targets, shard, (start, rate, deadline), gate.take(), done, stop));
            Ok::<_, String>(rt.block_on(futures_util::future::join_all(clients)))
        });
        while !driver.is_finished() {
            tick(done.load(Ordering::Relaxed), start.elapsed());
            std::thread::sleep(Duration::from_millis(100));
        }
        total.elapsed = start.elapsed();
        match driver.join() {
            Ok(Ok(outcomes)) => outcomes.into_iter().for_each(|o| total.merge(o)),
            Ok(Err(e)) => total.error(e),
            Err(_) => total.error("the load's thread panicked".into()),
        }
    });
    tick(done.load(Ordering::Relaxed), total.elapsed);
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_a_rate_send_i_is_due_at_i_over_rate() {
        let start = Instant::now();
        assert_eq!(due(start, None, 7), None);
        assert_eq!(due(start, Some(1000.0), 0), Some(start));
        assert_eq!(due(start, Some(1000.0), 2500), Some(start + Duration::from_millis(2500)));
    }
}
