//! A scripted fake peer relay for cross-relay delivery tests: a raw
//! HTTP/1.1 server on a loopback port (a thread per connection, one request
//! per connection, `Connection: close`), so it can also hang or drop a
//! connection without answering.
//!
//! It serves `POST /v1/relay/route.get` (a route per account, which may
//! change after a number of deliveries to that account) and
//! `POST /v1/relay/message.deliver` (answers from a script per
//! `message_id`, then a default), `account.devices.get` (a set answer per
//! account) and `timeline.replicate` (a partner home's scripted page per
//! account), and records every request it got (arrival time, headers,
//! body bytes) before answering. [`FakePeer::signing_key`] signs as it, for
//! requests it would send.

use relay_schemas::ErrorCode;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How the fake answers one `message.deliver`.
#[derive(Clone, Debug)]
pub enum Reply {
    /// 200 `{"status":"target_accepted","accepted_at":…}`; the message is
    /// committed here, and a duplicate gets the first `accepted_at`.
    Accept,
    /// HTTP status and `{"error":{"code","message","data"?}}`.
    Error(u16, String, Option<Value>),
    /// Answers nothing for this long, then closes the connection.
    Hang(Duration),
    /// Commits the message (as `Accept` would), then closes the connection
    /// without answering: a lost response.
    Drop,
    /// HTTP status and these body bytes, as a hostile peer would write them.
    Raw(u16, Vec<u8>),
    /// Answers nothing until the next [`FakePeer::release`] (at most 15 s),
    /// then as `Accept`: a call kept in flight as long as a test needs.
    Held,
}

impl Reply {
    /// The error answer for a code this protocol defines, with its HTTP status.
    pub fn error(code: &str) -> Reply {
        let status = ErrorCode::parse(code).map(|c| c.http_status()).unwrap_or(418);
        Reply::Error(status, code.to_string(), None)
    }

    pub fn error_with(code: &str, data: Value) -> Reply {
        match Reply::error(code) {
            Reply::Error(status, code, _) => Reply::Error(status, code, Some(data)),
            _ => unreachable!(),
        }
    }
}

/// How the fake answers `route.get` for an account.
#[derive(Clone, Debug)]
pub enum RouteReply {
    Route(Value),
    Error(u16, String),
}

/// One request the fake received.
#[derive(Clone, Debug)]
pub struct Request {
    /// Arrival order at this fake.
    pub seq: usize,
    pub at: Instant,
    /// Arrival time, Unix milliseconds.
    pub unix_ms: u64,
    /// The relay method (`message.deliver`, `route.get`, …).
    pub method: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// `envelope.message_id` of a delivery.
    pub fn message_id(&self) -> Option<String> {
        self.json()["envelope"]["message_id"].as_str().map(str::to_string)
    }

    /// The account concerned: `account_id` of a route.get, `envelope.to` of a delivery.
    pub fn account(&self) -> Option<String> {
        let v = self.json();
        v["account_id"].as_str().or_else(|| v["envelope"]["to"].as_str()).map(str::to_string)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

#[derive(Default)]
struct State {
    requests: Vec<Request>,
    scripts: HashMap<String, VecDeque<Reply>>,
    default: Option<Reply>,
    /// Per account: (deliveries to it received so far ≥ n, answer); the last
    /// matching entry wins.
    routes: HashMap<String, Vec<(usize, RouteReply)>>,
    /// message_id → accepted_at of the first commit.
    committed: HashMap<String, u64>,
    /// `account.devices.get` answers per account.
    devices: HashMap<String, Value>,
    /// `timeline.replicate` pages per account.
    pages: HashMap<String, Value>,
    /// [`FakePeer::release`] calls so far.
    releases: u64,
}

enum Action {
    /// Wait for the release after `releases` ([`FakePeer::release`]), then answer.
    Held {
        releases: u64,
        status: u16,
        body: Vec<u8>,
    },
    Respond(u16, Vec<u8>),
    Hang(Duration),
    Drop,
}

pub struct FakePeer {
    pub id: String,
    pub url: String,
    /// A valid key for the source's `[[peers]]` entry (the fake does not sign).
    pub public_key: String,
    key_seed: u8,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl FakePeer {
    /// Starts a fake relay `id` on `127.0.0.1:0`; its `public_key` is
    /// written with `write_key` under `key_dir`.
    pub fn start(id: &str, key_dir: &std::path::Path, key_seed: u8) -> FakePeer {
        let public_key = super::cluster::write_key(&key_dir.join(format!("fake-{id}.key")), [key_seed; 32]);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let st = state.clone();
        super::http::serve_each(listener, stop.clone(), move |conn| serve(conn, &st));
        FakePeer { id: id.to_string(), url: format!("http://{addr}"), public_key, key_seed, state, stop, addr }
    }

    /// The key behind [`FakePeer::public_key`]: signs relay requests as this
    /// fake (`Client::relay_call`), as the peer it stands in for would.
    pub fn signing_key(&self) -> ed25519_dalek::SigningKey {
        ed25519_dalek::SigningKey::from_bytes(&[self.key_seed; 32])
    }

    /// `account.devices.get` for `account_id` answers `answer` (200).
    pub fn set_devices(&self, account_id: &str, answer: Value) {
        lock(&self.state).devices.insert(account_id.to_string(), answer);
    }

    /// `timeline.replicate` for `account_id` answers `page` to a request
    /// whose `after` is before the page's `next`, and an empty page (`next`
    /// = `after`) once the caller has passed it: a partner home with these
    /// items to offer.
    pub fn set_page(&self, account_id: &str, page: Value) {
        lock(&self.state).pages.insert(account_id.to_string(), page);
    }

    /// The requests of relay `method` so far.
    pub fn requests_of(&self, method: &str) -> Vec<Request> {
        self.requests().into_iter().filter(|r| r.method == method).collect()
    }

    /// The `[[peers]]` entry naming this fake.
    pub fn peer_toml(&self) -> String {
        format!("[[peers]]\nid = \"{}\"\nurl = \"{}\"\npublic_key = \"{}\"\n\n", self.id, self.url, self.public_key)
    }

    /// Answers `message.deliver` of `message_id` with these replies, in order.
    pub fn script(&self, message_id: &str, replies: impl IntoIterator<Item = Reply>) {
        lock(&self.state).scripts.entry(message_id.to_string()).or_default().extend(replies);
    }

    /// The answer once a message's script is used up (initially `Accept`).
    pub fn set_default(&self, reply: Reply) {
        lock(&self.state).default = Some(reply);
    }

    /// `route.get` for `account_id` answers `route` (from now on).
    pub fn set_route(&self, account_id: &str, route: Value) {
        self.set_route_after(account_id, 0, route);
    }

    /// `route.get` for `account_id` answers `route` once the fake has
    /// received `deliveries` `message.deliver` requests for that account.
    pub fn set_route_after(&self, account_id: &str, deliveries: usize, route: Value) {
        self.route_reply_after(account_id, deliveries, RouteReply::Route(route));
    }

    pub fn route_reply_after(&self, account_id: &str, deliveries: usize, reply: RouteReply) {
        lock(&self.state).routes.entry(account_id.to_string()).or_default().push((deliveries, reply));
    }

    /// Every request received so far.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.state).requests.clone()
    }

    /// The `message.deliver` requests for `message_id`.
    pub fn deliveries(&self, message_id: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "message.deliver" && r.message_id().as_deref() == Some(message_id))
            .collect()
    }

    /// The `route.get` requests for `account_id`.
    pub fn route_gets(&self, account_id: &str) -> Vec<Request> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "route.get" && r.account().as_deref() == Some(account_id))
            .collect()
    }

    /// Lets every [`Reply::Held`] answer held now go out.
    pub fn release(&self) {
        lock(&self.state).releases += 1;
    }

    /// Whether `message_id` was committed (accepted) here.
    pub fn committed(&self, message_id: &str) -> bool {
        lock(&self.state).committed.contains_key(message_id)
    }
}

impl Drop for FakePeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn error_body(code: &str, data: Option<&Value>) -> Vec<u8> {
    let mut e = json!({"code": code, "message": format!("fake peer answers {code}")});
    if let Some(d) = data {
        e["data"] = d.clone();
    }
    serde_json::to_vec(&json!({ "error": e })).unwrap()
}

fn decide(state: &Mutex<State>, path: &str, headers: Vec<(String, String)>, body: Vec<u8>) -> Action {
    let mut st = lock(state);
    let method = path.strip_prefix("/v1/relay/").unwrap_or(path).to_string();
    let req = Request { seq: st.requests.len(), at: Instant::now(), unix_ms: unix_ms(), method, headers, body };
    st.requests.push(req.clone());
    match req.method.as_str() {
        "route.get" => {
            let account = req.account().unwrap_or_default();
            let delivered = st
                .requests
                .iter()
                .filter(|r| r.method == "message.deliver" && r.account().as_deref() == Some(&account))
                .count();
            let reply = st
                .routes
                .get(&account)
                .and_then(|rs| rs.iter().rfind(|(n, _)| *n <= delivered).map(|(_, r)| r.clone()));
            match reply {
                Some(RouteReply::Route(route)) => Action::Respond(200, serde_json::to_vec(&route).unwrap()),
                Some(RouteReply::Error(status, code)) => Action::Respond(status, error_body(&code, None)),
                None => Action::Respond(404, error_body("route_not_found", None)),
            }
        }
        "message.deliver" => {
            let message_id = req.message_id().unwrap_or_default();
            let scripted = st.scripts.get_mut(&message_id).and_then(|q| q.pop_front());
            let reply = scripted.or_else(|| st.default.clone()).unwrap_or(Reply::Accept);
            let now_s = req.unix_ms / 1000;
            match reply {
                Reply::Accept | Reply::Held => {
                    let accepted_at = *st.committed.entry(message_id).or_insert(now_s);
                    let body = serde_json::to_vec(&json!({"status": "target_accepted", "accepted_at": accepted_at}));
                    match reply {
                        Reply::Held => Action::Held { releases: st.releases, status: 200, body: body.unwrap() },
                        _ => Action::Respond(200, body.unwrap()),
                    }
                }
                Reply::Drop => {
                    st.committed.entry(message_id).or_insert(now_s);
                    Action::Drop
                }
                Reply::Error(status, code, data) => Action::Respond(status, error_body(&code, data.as_ref())),
                Reply::Hang(d) => Action::Hang(d),
                Reply::Raw(status, body) => Action::Respond(status, body),
            }
        }
        "account.devices.get" => match st.devices.get(&req.account().unwrap_or_default()) {
            Some(answer) => Action::Respond(200, serde_json::to_vec(answer).unwrap()),
            None => Action::Respond(404, error_body("not_found", None)),
        },
        "timeline.replicate" => {
            let v = req.json();
            let after = v["after"].as_u64().unwrap_or(0);
            match st.pages.get(&req.account().unwrap_or_default()) {
                Some(page) if after < page["next"].as_u64().unwrap_or(0) => {
                    Action::Respond(200, serde_json::to_vec(page).unwrap())
                }
                Some(_) => {
                    let empty = json!({"items": [], "next": after, "has_more": false});
                    Action::Respond(200, serde_json::to_vec(&empty).unwrap())
                }
                None => Action::Respond(404, error_body("not_found", None)),
            }
        }
        _ => Action::Respond(404, error_body("not_found", None)),
    }
}

fn serve(mut s: TcpStream, state: &Mutex<State>) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    let Some(request) = super::http::read_message(&mut s) else { return };
    let path = request.head.target().to_string();
    let headers = request.head.headers.into_iter().map(|(n, v)| (n.to_ascii_lowercase(), v)).collect();
    match decide(state, &path, headers, request.body) {
        Action::Held { releases, status, body } => {
            let held = Instant::now();
            while lock(state).releases == releases && held.elapsed() < Duration::from_secs(15) {
                std::thread::sleep(Duration::from_millis(10));
            }
            respond(&mut s, status, &body);
        }
        Action::Respond(status, body) => respond(&mut s, status, &body),
        Action::Hang(d) => {
            // Waits for the scripted hang: a destination that answers nothing for `d`, as this stand-in plays it.
            std::thread::sleep(d);
            let _ = s.shutdown(Shutdown::Both);
        }
        Action::Drop => {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn respond(s: &mut TcpStream, status: u16, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} Fake\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes()).and_then(|_| s.write_all(body)).and_then(|_| s.flush());
    let _ = s.shutdown(Shutdown::Write);
    // Let the client read the answer and close first.
    let mut sink = [0u8; 256];
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
}
