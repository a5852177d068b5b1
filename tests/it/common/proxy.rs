//! A fault-injecting HTTP/1.1 proxy between two relays, on loopback.
//!
//! The source relay's `[[peers]]` url for the destination points at the
//! proxy, which forwards each request to the real destination relay. One
//! request per client connection: the request is forwarded upstream with
//! `Connection: close`, the upstream answer is read to its end and relayed
//! with `Connection: close`, then both connections are closed. A thread
//! per connection.
//!
//! Faults apply to requests matching a [`Rule`] (relay method and,
//! optionally, the delivery's `envelope.message_id`), for a number of
//! requests or until cleared. Every request is logged (method, message id,
//! body bytes, the fault applied, the upstream's HTTP status if it
//! answered) before and after forwarding.

use super::http::{self, Message};
use super::wait::eventually_blocking;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// What the proxy does to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward and relay the answer unchanged.
    Pass,
    /// Wait this long before forwarding the request and again before
    /// relaying the answer (added latency both ways).
    Delay(Duration),
    /// Read the request, then close the connection (FIN) without
    /// forwarding anything: the destination never sees it.
    Drop,
    /// Forward the whole request (the destination processes and commits
    /// it), then reset the client's connection (RST) at once, before any
    /// answer exists; the upstream answer is read and discarded.
    ResetAfterRequest,
    /// Forward the request, wait for the destination's whole answer,
    /// discard it and reset the client's connection (RST).
    ResetBeforeResponse,
    /// Forward the request, wait for the whole answer, then relay it one
    /// byte at a time, this long apart (until the client goes away).
    SlowBytes(Duration),
    /// Hold the request until [`Proxy::release`] (at most the proxy's I/O
    /// limit), then forward it: a call kept in flight as long as a test
    /// needs.
    Hold,
}

impl Fault {
    pub fn name(&self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Delay(_) => "delay",
            Fault::Drop => "drop",
            Fault::ResetAfterRequest => "reset after request",
            Fault::ResetBeforeResponse => "reset before response",
            Fault::SlowBytes(_) => "slow bytes",
            Fault::Hold => "hold",
        }
    }
}

/// Which requests a fault applies to, and how often.
#[derive(Clone, Debug)]
pub struct Rule {
    /// Relay method (`message.deliver`, `route.get`, …); `None`: any.
    pub method: Option<String>,
    /// `envelope.message_id` of a delivery; `None`: any.
    pub message_id: Option<String>,
    pub fault: Fault,
    /// How many more requests it applies to; `None`: until cleared.
    pub remaining: Option<usize>,
}

/// One request the proxy received.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Arrival order.
    pub seq: usize,
    pub at: Instant,
    pub method: String,
    pub message_id: Option<String>,
    pub body: Vec<u8>,
    pub fault: Fault,
    /// Whether the request was written to the destination.
    pub forwarded: bool,
    /// The destination's HTTP status, once its whole answer was read.
    pub upstream_status: Option<u16>,
    /// The destination's answer body, once read.
    pub upstream_body: Option<Vec<u8>>,
}

#[derive(Default)]
struct State {
    rules: Vec<Rule>,
    log: Vec<Entry>,
    /// [`Fault::Hold`] requests go on.
    released: bool,
}

pub struct Proxy {
    /// The proxy's address as a peer url (`http://127.0.0.1:port`).
    pub url: String,
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

/// Longest wait on any socket read or write (a stuck peer ends a
/// connection thread, never the test).
const IO_LIMIT: Duration = Duration::from_secs(15);

impl Proxy {
    /// Starts a proxy on `127.0.0.1:0` forwarding to `upstream`
    /// (`http://127.0.0.1:port`).
    pub fn start(upstream: &str) -> Proxy {
        let upstream: SocketAddr =
            upstream.trim_start_matches("http://").trim_end_matches('/').parse().expect("upstream host:port");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let st = state.clone();
        http::serve_each(listener, stop.clone(), move |conn| serve(conn, upstream, &st));
        Proxy { url: format!("http://{addr}"), addr, state, stop }
    }

    /// Adds a rule; the first matching rule with uses left wins.
    pub fn add_rule(&self, rule: Rule) {
        lock(&self.state).rules.push(rule);
    }

    /// `fault` for `message.deliver` of `message_id`: the next `times`
    /// requests, or every one until [`Proxy::clear`] if `None`.
    pub fn fault_delivery(&self, message_id: &str, fault: Fault, times: Option<usize>) {
        self.add_rule(Rule {
            method: Some("message.deliver".into()),
            message_id: Some(message_id.into()),
            fault,
            remaining: times,
        });
    }

    /// `fault` for every request, until cleared.
    pub fn fault_all(&self, fault: Fault) {
        self.add_rule(Rule { method: None, message_id: None, fault, remaining: None });
    }

    /// Removes every rule: from now on requests pass unchanged.
    pub fn clear(&self) {
        lock(&self.state).rules.clear();
    }

    /// Lets every held request ([`Fault::Hold`]) go on, and later ones pass.
    pub fn release(&self) {
        lock(&self.state).released = true;
    }

    /// Every request so far.
    pub fn log(&self) -> Vec<Entry> {
        lock(&self.state).log.clone()
    }

    /// The `message.deliver` requests for `message_id`.
    pub fn deliveries(&self, message_id: &str) -> Vec<Entry> {
        self.log()
            .into_iter()
            .filter(|e| e.method == "message.deliver" && e.message_id.as_deref() == Some(message_id))
            .collect()
    }

    /// Waits (bounded) until `done` holds for the log.
    pub fn wait_for(&self, what: &str, limit: Duration, done: impl Fn(&[Entry]) -> bool) -> Vec<Entry> {
        eventually_blocking(&format!("proxy: {what}"), limit, || {
            let log = self.log();
            if done(&log) {
                Ok(log)
            } else {
                Err(format!("log: {log:#?}"))
            }
        })
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

/// Closes `s` with a TCP reset: SO_LINGER on with a zero timeout, then close.
pub fn reset(s: TcpStream) {
    use std::os::unix::io::AsRawFd;
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid open socket fd and a correctly sized `linger`.
    let rc = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &linger as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "setsockopt(SO_LINGER): {}", std::io::Error::last_os_error());
    drop(s);
}

/// The relay method of a request (`message.deliver`, …).
fn relay_method(req: &Message) -> String {
    let path = req.head.target();
    path.strip_prefix("/v1/relay/").unwrap_or(path).to_string()
}

/// `envelope.message_id` of a delivery.
fn message_id(req: &Message) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&req.body).ok()?;
    v["envelope"]["message_id"].as_str().map(str::to_string)
}

/// The request as sent upstream: `Connection: close`, the body with its
/// length (chunked bodies are de-chunked).
fn upstream_bytes(req: &Message) -> Vec<u8> {
    let mut out = format!("{}\r\n", req.head.line);
    for (n, v) in &req.head.headers {
        let lower = n.to_ascii_lowercase();
        if lower == "connection" || lower == "keep-alive" || lower == "transfer-encoding" || lower == "content-length" {
            continue;
        }
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\nConnection: close\r\n\r\n", req.body.len()));
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&req.body);
    bytes
}

/// The upstream answer read to EOF (it was asked to close): the whole
/// bytes, rewritten to carry `Connection: close`, its status and body.
fn read_response(s: &mut TcpStream) -> Option<(Vec<u8>, u16, Vec<u8>)> {
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let (head, start) = http::parse_head(&buf)?;
    let status = head.status()?;
    let mut out = format!("{}\r\n", head.line);
    for (n, v) in &head.headers {
        if n.eq_ignore_ascii_case("connection") || n.eq_ignore_ascii_case("keep-alive") {
            continue;
        }
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("Connection: close\r\n\r\n");
    let raw_body = &buf[start..];
    let body = if head.chunked() { http::dechunk(raw_body).map(|(b, _)| b) } else { None };
    let body = body.unwrap_or_else(|| raw_body.to_vec());
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(raw_body);
    Some((bytes, status, body))
}

/// Takes the fault for a request (using up one use of the rule).
fn decide(state: &Mutex<State>, method: &str, message_id: Option<&str>) -> Fault {
    let mut st = lock(state);
    let rule = st.rules.iter_mut().find(|r| {
        r.remaining != Some(0)
            && r.method.as_deref().is_none_or(|m| m == method)
            && r.message_id.as_deref().is_none_or(|id| Some(id) == message_id)
    });
    match rule {
        Some(r) => {
            if let Some(n) = r.remaining.as_mut() {
                *n -= 1;
            }
            r.fault.clone()
        }
        None => Fault::Pass,
    }
}

fn update(state: &Mutex<State>, seq: usize, f: impl FnOnce(&mut Entry)) {
    if let Some(e) = lock(state).log.get_mut(seq) {
        f(e);
    }
}

/// Sends the request upstream; the connection to read the answer from.
fn forward(upstream: SocketAddr, req: &Message) -> Option<TcpStream> {
    let mut up = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)).ok()?;
    let _ = up.set_read_timeout(Some(IO_LIMIT));
    let _ = up.set_write_timeout(Some(IO_LIMIT));
    up.write_all(&upstream_bytes(req)).ok()?;
    up.flush().ok()?;
    Some(up)
}

fn serve(mut client: TcpStream, upstream: SocketAddr, state: &Mutex<State>) {
    let _ = client.set_read_timeout(Some(IO_LIMIT));
    let _ = client.set_write_timeout(Some(IO_LIMIT));
    let _ = client.set_nodelay(true);
    let Some(req) = http::read_message(&mut client) else { return };
    let (method, message_id) = (relay_method(&req), message_id(&req));
    let fault = decide(state, &method, message_id.as_deref());
    let seq = {
        let mut st = lock(state);
        let seq = st.log.len();
        st.log.push(Entry {
            seq,
            at: Instant::now(),
            method,
            message_id,
            body: req.body.clone(),
            fault: fault.clone(),
            forwarded: false,
            upstream_status: None,
            upstream_body: None,
        });
        seq
    };
    if fault == Fault::Drop {
        let _ = client.shutdown(Shutdown::Both);
        return;
    }
    if let Fault::Delay(d) = fault {
        // Waits for the fault's added latency: a slow network, as this stand-in plays it.
        std::thread::sleep(d);
    }
    if fault == Fault::Hold {
        let held = Instant::now();
        while !lock(state).released && held.elapsed() < IO_LIMIT {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let Some(mut up) = forward(upstream, &req) else {
        // The destination is down: look like it (close without answering).
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    update(state, seq, |e| e.forwarded = true);
    if fault == Fault::ResetAfterRequest {
        reset(client);
        if let Some((_, status, body)) = read_response(&mut up) {
            update(state, seq, |e| {
                e.upstream_status = Some(status);
                e.upstream_body = Some(body);
            });
        }
        return;
    }
    let Some((bytes, status, body)) = read_response(&mut up) else {
        let _ = client.shutdown(Shutdown::Both);
        return;
    };
    update(state, seq, |e| {
        e.upstream_status = Some(status);
        e.upstream_body = Some(body);
    });
    match fault {
        Fault::ResetBeforeResponse => reset(client),
        Fault::SlowBytes(gap) => {
            let until = Instant::now() + IO_LIMIT;
            for b in &bytes {
                if client.write_all(std::slice::from_ref(b)).and_then(|_| client.flush()).is_err()
                    || Instant::now() > until
                {
                    break;
                }
                // Waits for the fault's gap between bytes: a trickling response, as this stand-in plays it.
                std::thread::sleep(gap);
            }
            let _ = client.shutdown(Shutdown::Both);
        }
        Fault::Delay(d) => {
            // Waits for the fault's added latency: a slow network, as this stand-in plays it.
            std::thread::sleep(d);
            relay_answer(client, &bytes);
        }
        _ => relay_answer(client, &bytes),
    }
}

/// Writes the answer, then lets the client read it and close first.
fn relay_answer(mut client: TcpStream, bytes: &[u8]) {
    if client.write_all(bytes).and_then(|_| client.flush()).is_err() {
        return;
    }
    let _ = client.shutdown(Shutdown::Write);
    let mut sink = [0u8; 256];
    let _ = client.set_read_timeout(Some(Duration::from_secs(2)));
    while matches!(client.read(&mut sink), Ok(n) if n > 0) {}
}
