//! `--ws`: every device of every account holds an authenticated WebSocket
//! (`GET /v1/ws`) for the whole measured window, and the bench measures
//! **notification latency**: from the moment a `message.send` request is
//! written to the moment the recipient device reads the
//! `message.timeline.changed` notification for that message's record.
//!
//! The sockets live on one thread of their own running an actix `System`
//! (the load threads are blocking std threads); each socket's task stamps
//! every `message.timeline.changed` it reads with `Instant::now()` before
//! anything else and keeps `(sequence, instant)`.
//!
//! **Correlation.** The notification names `{account_id, sequence}`; the
//! `message.send` reply names no sequence. Arrival order is not a sound key:
//! several load threads send to one account at once, an account's `sent`
//! and `received` records share one sequence space, and cross-relay
//! deliveries are accepted in their own order. So the bench asks the
//! timeline itself, outside the measured window: it syncs each recipient
//! account's timeline (`message.timeline.sync` over HTTP, once the sends
//! are done), maps every `received` record's sequence to its envelope's
//! `message_id`, and `message_id` names the pre-built send (whose write
//! instant its load thread kept). Latency = notification read − request
//! written, once per recipient device of every send answered
//! `target_accepted`. The record exists once that answer is given, so the
//! sync sees every record to wait for; notifications still missing are
//! waited for up to `--notify-grace`, then counted as `notify_missing`.

use super::http::Conn;
use super::plan::{BenchAccount, Send};
use crate::setup::Target;
use awc::ws::{Frame, Message};
use futures_util::StreamExt;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What one socket heard: `(sequence, when read)`, in arrival order.
type Heard = Mutex<Vec<(u64, Instant)>>;

/// Sockets that closed or failed during the run: a count and the first
/// few reasons.
#[derive(Default)]
struct Failures {
    count: u64,
    samples: Vec<String>,
}

impl Failures {
    fn add(this: &Mutex<Failures>, why: String) {
        let mut f = this.lock().unwrap_or_else(|e| e.into_inner());
        f.count += 1;
        if f.samples.len() < 5 {
            f.samples.push(why);
        }
    }
}

/// The WebSocket side: one socket per (account, device), attached before
/// the measured window.
pub struct Listener {
    system: Option<actix_rt::System>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Socket `account * devices + device`.
    heard: Arc<Vec<Heard>>,
    devices: usize,
    failures: Arc<Mutex<Failures>>,
}

/// Upgrades and attaches must be done by then.
const CONNECT_WAIT: Duration = Duration::from_secs(60);

impl Listener {
    /// Connects and attaches a socket for every device of every account;
    /// returns once all are attached (or the first failure).
    pub fn start(targets: &[Target], accounts: &[BenchAccount]) -> Result<Listener, String> {
        let devices = accounts.first().map_or(0, |a| a.tokens.len());
        let plan: Vec<(String, String, String)> = accounts
            .iter()
            .flat_map(|a| {
                let url = format!("{}/v1/ws", targets[a.home].url.replacen("http://", "ws://", 1));
                a.tokens.iter().map(move |t| (url.clone(), t.clone(), a.account.id.clone()))
            })
            .collect();
        let heard: Arc<Vec<Heard>> = Arc::new(plan.iter().map(|_| Mutex::default()).collect());
        let failures = Arc::new(Mutex::new(Failures::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        let (h, f) = (heard.clone(), failures.clone());
        let thread = std::thread::Builder::new()
            .name("bench-ws".into())
            .spawn(move || {
                let system = actix_rt::System::new();
                let ready = system.block_on(async move {
                    let n = plan.len();
                    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::unbounded_channel();
                    for (slot, (url, token, account_id)) in plan.into_iter().enumerate() {
                        let socket = Socket { url, account_id, slot, heard: h.clone(), failures: f.clone() };
                        actix_rt::spawn(socket.run(token, ready_tx.clone()));
                    }
                    let all = async {
                        for _ in 0..n {
                            match ready_rx.recv().await {
                                Some(Ok(())) => {}
                                Some(Err(e)) => return Err(e),
                                None => return Err("websocket tasks ended".to_string()),
                            }
                        }
                        Ok(())
                    };
                    match actix_rt::time::timeout(CONNECT_WAIT, all).await {
                        Ok(Ok(())) => Ok(actix_rt::System::current()),
                        Ok(Err(e)) => Err(e),
                        Err(_) => Err(format!("websockets not attached within {CONNECT_WAIT:?}")),
                    }
                });
                let ok = ready.is_ok();
                let _ = tx.send(ready);
                if ok {
                    let _ = system.run();
                }
            })
            .map_err(|e| format!("websocket thread: {e}"))?;
        let system = match rx.recv() {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                let _ = thread.join();
                return Err(e);
            }
            Err(_) => {
                let _ = thread.join();
                return Err("websocket thread ended".into());
            }
        };
        Ok(Listener { system: Some(system), thread: Some(thread), heard, devices, failures })
    }

    /// Open sockets.
    pub fn sockets(&self) -> usize {
        self.heard.len()
    }

    /// For every socket, the first instant each sequence was heard.
    fn snapshot(&self) -> Vec<HashMap<u64, Instant>> {
        self.heard
            .iter()
            .map(|h| {
                let mut first = HashMap::new();
                for &(seq, at) in h.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                    first.entry(seq).or_insert(at);
                }
                first
            })
            .collect()
    }

    /// Closes every socket and ends the thread.
    fn stop(&mut self) {
        if let Some(s) = self.system.take() {
            s.stop();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One device's socket.
struct Socket {
    url: String,
    account_id: String,
    slot: usize,
    heard: Arc<Vec<Heard>>,
    failures: Arc<Mutex<Failures>>,
}

/// `Framed::write` + flush (the bin has no `SinkExt`).
macro_rules! send {
    ($socket:expr, $msg:expr) => {
        match Pin::new(&mut $socket).write($msg) {
            Ok(()) => std::future::poll_fn(|cx| Pin::new(&mut $socket).flush::<Message>(cx)).await,
            Err(e) => Err(e),
        }
    };
}

impl Socket {
    async fn run(self, token: String, ready: tokio::sync::mpsc::UnboundedSender<Result<(), String>>) {
        let url = &self.url;
        let mut socket = match awc::Client::new().ws(url.as_str()).connect().await {
            Ok((_, s)) => s,
            Err(e) => {
                let _ = ready.send(Err(format!("{url}: websocket upgrade: {e}")));
                return;
            }
        };
        // Attach with a first frame rather than the header: its answer comes
        // once the relay has registered the socket for notifications (a
        // header-authenticated upgrade attaches after the 101), so no
        // notification of the window can be missed.
        let attach = json!({"id": 1, "method": "session.attach", "params": {"token": token}}).to_string();
        if let Err(e) = send!(socket, Message::Text(attach.into())) {
            let _ = ready.send(Err(format!("{url}: session.attach: {e}")));
            return;
        }
        let mut ready = Some(ready);
        let why = loop {
            match socket.next().await {
                Some(Ok(Frame::Text(bytes))) => {
                    let at = Instant::now();
                    let Ok(v) = serde_json::from_slice::<Value>(&bytes) else {
                        break format!("{url}: a frame that is not JSON");
                    };
                    if v["method"] == "message.timeline.changed" {
                        if v["params"]["account_id"] == self.account_id.as_str() {
                            if let Some(seq) = v["params"]["sequence"].as_u64() {
                                self.heard[self.slot].lock().unwrap_or_else(|e| e.into_inner()).push((seq, at));
                            }
                        }
                    } else if v["id"] == 1 {
                        if let Some(r) = ready.take() {
                            let answer = match v.get("error") {
                                Some(e) => Err(format!("{url}: session.attach: {e}")),
                                None => Ok(()),
                            };
                            let failed = answer.is_err();
                            let _ = r.send(answer);
                            if failed {
                                return;
                            }
                        }
                    }
                }
                Some(Ok(Frame::Ping(b))) => {
                    if let Err(e) = send!(socket, Message::Pong(b)) {
                        break format!("{url}: pong: {e}");
                    }
                }
                Some(Ok(Frame::Close(reason))) => break format!("{url}: closed by the relay: {reason:?}"),
                Some(Ok(_)) => {}
                Some(Err(e)) => break format!("{url}: {e}"),
                None => break format!("{url}: connection lost"),
            }
        };
        match ready {
            Some(r) => {
                let _ = r.send(Err(why));
            }
            None => Failures::add(&self.failures, why),
        }
    }
}

/// The notification figures.
#[derive(Default)]
pub struct Notify {
    /// Latency (µs) of every notification correlated to a send.
    pub us: Vec<u64>,
    /// (send, recipient device) pairs notified.
    pub notified: u64,
    /// (send, recipient device) pairs of `target_accepted` sends never
    /// notified within the grace period.
    pub missing: u64,
    pub sockets: usize,
    /// Sockets that closed or failed during the run.
    pub socket_failures: u64,
    pub failure_samples: Vec<String>,
}

/// Syncs `account`'s whole timeline: `message_id` → sequence of the records
/// it received (and of self-deliveries, which make one record).
fn received_records(target: &Target, account: &BenchAccount) -> Result<HashMap<String, u64>, String> {
    let mut c = Conn::open(&target.addr)?;
    let mut out = HashMap::new();
    let mut after = 0u64;
    loop {
        let page = c.ok("message.timeline.sync", Some(&account.tokens[0]), &json!({"after": after, "limit": 500}))?;
        for r in page["records"].as_array().into_iter().flatten() {
            let env = &r["envelope"];
            let to_me = env["to"] == account.account.id.as_str();
            if to_me && (r["direction"] == "received" || env["from"] == env["to"]) {
                if let (Some(mid), Some(seq)) = (env["message_id"].as_str(), r["sequence"].as_u64()) {
                    out.insert(mid.to_string(), seq);
                }
            }
        }
        let next = page["next"].as_u64().unwrap_or(after);
        if page["has_more"] != true || next <= after {
            return Ok(out);
        }
        after = next;
    }
}

/// Correlates the notifications with the sends answered `target_accepted`
/// (`accepted`: send index, write instant), waiting up to `grace` for the
/// missing ones; then closes the sockets.
pub fn correlate(
    mut listener: Listener,
    targets: &[Target],
    accounts: &[BenchAccount],
    sends: &[Send],
    accepted: &[(usize, Instant)],
    grace: Duration,
) -> Result<Notify, String> {
    let devices = listener.devices;
    let mut seqs: HashMap<usize, HashMap<String, u64>> = HashMap::new();
    for &(m, _) in accepted {
        let to = sends[m].to;
        if let std::collections::hash_map::Entry::Vacant(e) = seqs.entry(to) {
            e.insert(received_records(&targets[accounts[to].home], &accounts[to])?);
        }
    }
    // (socket, sequence, write instant) for every recipient device.
    let mut unrecorded = 0u64;
    let mut expected = Vec::with_capacity(accepted.len() * devices);
    for &(m, written) in accepted {
        let to = sends[m].to;
        match seqs.get(&to).and_then(|s| s.get(&sends[m].message_id)) {
            Some(&seq) => expected.extend((0..devices).map(|d| (to * devices + d, seq, written))),
            None => unrecorded += devices as u64, // accepted, yet not in the timeline
        }
    }
    let deadline = Instant::now() + grace;
    let mut heard = listener.snapshot();
    while Instant::now() < deadline && !expected.iter().all(|(s, seq, _)| heard[*s].contains_key(seq)) {
        std::thread::sleep(Duration::from_millis(50));
        heard = listener.snapshot();
    }
    listener.stop();
    let heard = listener.snapshot();
    let mut n = Notify { sockets: listener.sockets(), missing: unrecorded, ..Notify::default() };
    for (s, seq, written) in expected {
        match heard[s].get(&seq) {
            Some(at) => {
                n.notified += 1;
                n.us.push(at.saturating_duration_since(written).as_micros() as u64);
            }
            None => n.missing += 1,
        }
    }
    let f = listener.failures.lock().unwrap_or_else(|e| e.into_inner());
    n.socket_failures = f.count;
    n.failure_samples = f.samples.clone();
    Ok(n)
}
