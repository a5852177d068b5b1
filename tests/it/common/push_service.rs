//! A Web Push service stand-in on a loopback port (RFC 8030 push resources
//! at `http://127.0.0.1:PORT/push/NAME`): a raw HTTP/1.1 server, a thread
//! per connection, one request per connection. It records every push
//! (arrival time, headers, body) and answers from a per-resource script,
//! then `201 Created`.
//!
//! [`Subscriber`] plays the browser: it holds the subscription's private
//! ECDH key and auth secret, and decrypts a push (RFC 8291 `aes128gcm`,
//! with `web-push-native`, as a user agent would). [`check_vapid`] checks
//! the `Authorization: vapid t=…, k=…` header (RFC 8292).

use super::wait::eventually;
use relay_schemas::encoding::{b64_decode, b64_encode};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One push the stand-in received.
#[derive(Clone, Debug)]
pub struct Push {
    pub at: Instant,
    /// The push resource name (`/push/NAME`).
    pub resource: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Push {
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }
}

/// An answer: status and extra headers.
#[derive(Clone, Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Announce a body, then send none and hold the connection (bounded).
    pub stall_body: bool,
}

impl Answer {
    pub fn status(status: u16) -> Self {
        Answer { status, headers: vec![], stall_body: false }
    }
    /// This answer's head, then a body that never comes.
    pub fn stalling(mut self) -> Self {
        self.stall_body = true;
        self
    }
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

#[derive(Default)]
struct State {
    pushes: Vec<Push>,
    scripts: HashMap<String, VecDeque<Answer>>,
    /// Answers after a resource's script, per resource (default 201).
    defaults: HashMap<String, Answer>,
}

pub struct PushService {
    pub base: String,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    s.lock().unwrap_or_else(|e| e.into_inner())
}

impl PushService {
    pub fn start() -> PushService {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        listener.set_nonblocking(true).unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, stopped) = (state.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let st = st.clone();
                        std::thread::spawn(move || serve(conn, &st));
                    }
                    // Waits for the next connection: a non-blocking accept loop, so the stand-in can stop.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        PushService { base, state, stop }
    }

    /// The endpoint URL of push resource `name`.
    pub fn endpoint(&self, name: &str) -> String {
        format!("{}/push/{name}", self.base)
    }

    /// The next answers for `name`, in order.
    pub fn script(&self, name: &str, answers: Vec<Answer>) {
        lock(&self.state).scripts.entry(name.into()).or_default().extend(answers);
    }

    /// The answer for `name` after its script (instead of 201).
    pub fn always(&self, name: &str, answer: Answer) {
        lock(&self.state).defaults.insert(name.into(), answer);
    }

    /// Every push to `name` so far.
    pub fn pushes(&self, name: &str) -> Vec<Push> {
        lock(&self.state).pushes.iter().filter(|p| p.resource == name).cloned().collect()
    }

    /// Every push so far.
    pub fn all(&self) -> Vec<Push> {
        lock(&self.state).pushes.clone()
    }

    /// Waits (at most `wait`) until `name` got `n` pushes; returns them.
    pub async fn wait_for(&self, name: &str, n: usize, wait: Duration) -> Vec<Push> {
        eventually(&format!("{name}: {n} pushes"), wait, || {
            let got = self.pushes(name);
            std::future::ready(if got.len() >= n { Ok(got) } else { Err(format!("{} pushes", got.len())) })
        })
        .await
    }
}

impl Drop for PushService {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn serve(mut conn: TcpStream, state: &Mutex<State>) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let Some(request) = super::http::read_message(&mut conn) else { return };
    let at = Instant::now();
    let path = request.head.target().to_string();
    let headers = request.head.headers.into_iter().map(|(n, v)| (n.to_ascii_lowercase(), v)).collect();
    let body = request.body;
    let resource = path.strip_prefix("/push/").unwrap_or(&path).to_string();
    let answer = {
        let mut s = lock(state);
        s.pushes.push(Push { at, resource: resource.clone(), headers, body });
        let scripted = s.scripts.get_mut(&resource).and_then(VecDeque::pop_front);
        scripted.or_else(|| s.defaults.get(&resource).cloned()).unwrap_or(Answer::status(201))
    };
    let length = if answer.stall_body { 100 } else { 0 };
    let mut out = format!("HTTP/1.1 {} Push\r\nContent-Length: {length}\r\nConnection: close\r\n", answer.status);
    for (n, v) in &answer.headers {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let _ = conn.write_all(out.as_bytes());
    if answer.stall_body {
        // Waits for the stalled body's time: a push service that never finishes its answer (past every wait of the tests).
        std::thread::sleep(Duration::from_secs(30));
    }
}

/// A browser's push subscription: the private half the relay never sees.
pub struct Subscriber {
    pub endpoint: String,
    secret: p256::SecretKey,
    auth: [u8; 16],
}

impl Subscriber {
    pub fn new(endpoint: String) -> Self {
        let secret = loop {
            if let Ok(k) = p256::SecretKey::from_slice(&rand::random::<[u8; 32]>()) {
                break k;
            }
        };
        Subscriber { endpoint, secret, auth: rand::random() }
    }

    /// `push.subscribe` params, as `PushSubscription.toJSON()` gives them.
    pub fn params(&self) -> Value {
        use p256::elliptic_curve::sec1::ToEncodedPoint;
        let point = self.secret.public_key().to_encoded_point(false);
        json!({
            "endpoint": self.endpoint,
            "expirationTime": null,
            "keys": {"p256dh": b64_encode(point.as_bytes()), "auth": b64_encode(&self.auth)}
        })
    }

    /// Decrypts a push as the user agent would (RFC 8291); the JSON payload.
    pub fn decrypt(&self, push: &Push) -> Value {
        assert_eq!(push.header("content-encoding"), Some("aes128gcm"));
        let auth = web_push_native::Auth::clone_from_slice(&self.auth);
        let plain = web_push_native::decrypt(push.body.clone(), &self.secret, &auth).expect("the push decrypts");
        serde_json::from_slice(&plain).expect("a JSON payload")
    }
}

/// Checks a push's VAPID header (RFC 8292) against the relay's key
/// `vapid_key` (from `push.vapid_key`) and the push service's origin
/// `audience`: an ES256 JWT signed by that key, for that audience,
/// expiring within 24 h, with a contact.
pub fn check_vapid(push: &Push, vapid_key: &str, audience: &str) {
    use p256::ecdsa::signature::Verifier;
    let auth = push.header("authorization").expect("an Authorization header");
    let rest = auth.strip_prefix("vapid t=").unwrap_or_else(|| panic!("not a vapid header: {auth}"));
    let (jwt, k) = rest.split_once(", k=").expect("t= and k=");
    assert_eq!(k, vapid_key, "k is the relay's VAPID key");
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "a JWS compact serialization");
    let header: Value = serde_json::from_slice(&b64_decode("h", parts[0]).unwrap()).unwrap();
    assert_eq!(header["alg"], "ES256");
    let claims: Value = serde_json::from_slice(&b64_decode("c", parts[1]).unwrap()).unwrap();
    assert_eq!(claims["aud"], audience);
    let exp = claims["exp"].as_u64().expect("exp");
    let now = super::client::now();
    assert!(exp > now && exp <= now + 24 * 3600, "exp {exp} within 24 h of {now}");
    let sub = claims["sub"].as_str().expect("sub");
    assert!(sub.starts_with("mailto:") || sub.starts_with("https://") || sub.starts_with("http://"), "{sub}");
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&b64_decode("k", k).unwrap()).unwrap();
    let sig = p256::ecdsa::Signature::from_slice(&b64_decode("s", parts[2]).unwrap()).expect("r ‖ s");
    key.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).expect("the ES256 signature verifies");
}
