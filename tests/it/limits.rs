//! One test per limit: session and peer rate limits, request-head timeout
//! (slow-loris), connection cap, WebSocket frame size, and the per-destination
//! bound on in-flight attempts (a dead relay does not delay a healthy one).

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::fake_peer::{FakePeer, Reply};
use common::relay::RelayProc;
use common::wait::eventually;
use common::ws::WsClient;
use relay_schemas::client::{key_box, Account};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[actix_rt::test]
async fn a_session_over_its_rate_is_rate_limited_with_retry_after() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[limits]\nsession_rate = 1\nsession_burst = 5\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let mut limited = None;
    for _ in 0..10 {
        let (status, v) = c.call("message.timeline.sync", alice.token(0), &json!({"after": 0})).await;
        if status != 200 {
            limited = Some((status, v));
            break;
        }
    }
    let (status, v) = limited.expect("the session was never limited");
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["code"], "rate_limited");
    assert!(v["error"]["data"]["retry_after"].as_u64().unwrap() >= 1, "{v}");
    common::schema::assert_valid("ErrorResponse.schema.json", &v);
}

#[actix_rt::test]
async fn a_peer_over_its_rate_is_rate_limited() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    // route.get spends the peer's lookup budget (deliveries have their own).
    let a = cluster.start("relay-a", "[limits]\npeer_lookup_rate = 1\npeer_lookup_burst = 3\n");
    let key = ed25519_dalek::SigningKey::from_bytes(&[201; 32]); // relay-b (Cluster::plan)
    let http = awc::Client::default();
    let mut codes = vec![];
    for n in 0..6 {
        // Six requests, not one six times: a repeated signature is answered
        // from the replay window without spending budget.
        let body = format!(r#"{{"account_id":"{n:032}"}}"#).into_bytes();
        let ts = now();
        let sig = relay_schemas::sign::sign_relay_request(&key, "route.get", "relay-a", ts, &body);
        let mut resp = http
            .post(format!("{}/v1/relay/route.get", a.url))
            .insert_header(("Relay-Id", "relay-b"))
            .insert_header(("Relay-Timestamp", ts.to_string()))
            .insert_header(("Relay-Signature", sig))
            .send_body(body)
            .await
            .unwrap();
        let v: serde_json::Value = resp.json().await.unwrap();
        codes.push(v["error"]["code"].as_str().unwrap().to_owned());
    }
    assert_eq!(&codes[..3], ["route_not_found", "route_not_found", "route_not_found"]);
    assert!(codes[3..].iter().any(|c| c == "rate_limited"), "{codes:?}");
}

#[actix_rt::test]
async fn a_request_head_sent_too_slowly_is_cut_off() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[http]\nrequest_timeout = \"300ms\"\n");
    let mut s = TcpStream::connect(relay.url.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"POST /v1/rpc/route.get HTTP/1.1\r\nHost: x\r\n").unwrap(); // never finishes the head
    let started = Instant::now();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf); // the relay answers 408 and closes
    let took = started.elapsed();
    assert!(took < Duration::from_secs(4), "connection held for {took:?}");
    let text = String::from_utf8_lossy(&buf);
    assert!(text.is_empty() || text.starts_with("HTTP/1.1 408"), "{text}");
}

/// Sends a complete keep-alive request on `s` and reads the status line.
fn healthz(s: &mut TcpStream) -> Option<String> {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).ok()?;
    (n > 0).then(|| String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_owned())
}

#[actix_rt::test]
async fn connections_beyond_the_cap_wait_until_one_closes() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[http]\nworkers = 1\nmax_connections = 2\n");
    let addr = relay.url.trim_start_matches("http://").to_owned();
    let mut open: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    for s in &mut open {
        assert_eq!(healthz(s).as_deref(), Some("HTTP/1.1 200 OK"));
    }
    let mut third = TcpStream::connect(&addr).unwrap(); // queued in the backlog
    third.set_read_timeout(Some(Duration::from_millis(700))).unwrap();
    assert_eq!(healthz(&mut third), None, "a third connection was served past the cap");
    drop(open.pop());
    third.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 512];
    let n = third.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"), "served once a slot freed");
}

#[actix_rt::test]
async fn a_websocket_frame_over_the_limit_closes_the_connection() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[websocket]\nmax_frame_bytes = 1024\n");
    let mut ws = WsClient::connect(&relay.url, None).await;
    ws.send_text(format!("{{\"id\":1,\"method\":\"route.get\",\"params\":{{\"pad\":\"{}\"}}}}", "x".repeat(4096)))
        .await;
    let reason = ws.closed(Duration::from_secs(5)).await;
    assert_eq!(reason.map(|r| u16::from(r.code)), Some(1009));
}

#[actix_rt::test]
async fn a_dead_destination_with_many_pending_deliveries_does_not_delay_a_healthy_one() {
    const PENDING: u64 = 600;
    let dir = tempfile::tempdir().unwrap();
    // relay-x answers route.get but never answers message.deliver: every
    // attempt there holds its slot until the attempt timeout.
    let dead = FakePeer::start("relay-x", dir.path(), 40);
    dead.set_default(Reply::Hang(Duration::from_secs(30)));
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let extra = format!(
        "{}[limits]\nmax_in_flight_per_destination = 16\nsession_rate = 100000\nsession_burst = 100000\n\
         [delivery]\nattempt_timeout = \"2s\"\n",
        dead.peer_toml()
    );
    let a = cluster.start("relay-a", &extra);
    let b = cluster.start("relay-b", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&Client::new(&b.url), "relay-b", 2, true).await;
    let xavier = Account::from_seed([77; 32]);
    dead.set_route(&xavier.id, xavier.route(1, &[("relay-x", &dead.url)], now()));
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": xavier.id})).await;

    // Hundreds of sends to the dead relay, 50 at a time, in the background.
    let token = alice.tokens[0].clone();
    let bodies: Vec<Vec<u8>> = (0..PENDING)
        .map(|n| {
            let env = alice.devices[0].envelope(alice.id(), &xavier.id, &mid(n), now(), b"x");
            serde_json::to_vec(&json!({"envelope": env, "recipient_boxes": [key_box("phone", b"k")]})).unwrap()
        })
        .collect();
    let senders: Vec<_> = bodies
        .chunks(PENDING as usize / 50)
        .map(|chunk| {
            let (c, token, chunk) = (ca.clone(), token.clone(), chunk.to_vec());
            actix_rt::spawn(async move {
                for body in chunk {
                    assert_eq!(c.raw("message.send", Some(&token), body).await.0, 200);
                }
            })
        })
        .collect();
    // Once the dead relay's slots are all taken, a message to the healthy relay:
    eventually("16 attempts at the dead relay", Duration::from_secs(20), || {
        let n = dead.requests().len();
        std::future::ready(if n >= 16 { Ok(()) } else { Err(format!("{n} attempts")) })
    })
    .await;
    let started = Instant::now();
    let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(10_000), false)).await;
    let delay = started.elapsed();
    eprintln!("send to the healthy relay while {PENDING} wait for a dead one: {delay:?}");
    assert_eq!(st["status"], "target_accepted", "{st}");
    assert!(delay < Duration::from_secs(2), "healthy delivery delayed {delay:?} by the dead relay");
    for s in senders {
        s.await.unwrap();
    }
}

#[actix_rt::test]
async fn an_idle_keep_alive_connection_is_closed() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[http]\nkeep_alive = \"300ms\"\n");
    let mut s = TcpStream::connect(relay.url.trim_start_matches("http://")).unwrap();
    assert_eq!(healthz(&mut s).as_deref(), Some("HTTP/1.1 200 OK"));
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0); // the relay closes the idle connection
    assert_eq!(n, 0, "no more bytes, only the close");
    assert!(started.elapsed() < Duration::from_secs(4), "idle connection kept {:?}", started.elapsed());
}

/// Reads one HTTP response from `s`: its status line and JSON body.
fn response(s: &mut TcpStream) -> (String, serde_json::Value) {
    let m = common::http::read_message(s).expect("a whole response");
    (m.head.line, serde_json::from_slice(&m.body).unwrap_or(serde_json::Value::Null))
}

#[actix_rt::test]
async fn connections_from_one_ip_over_the_cap_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[http]\nmax_connections_per_ip = 3\n");
    let addr = relay.url.trim_start_matches("http://").to_owned();
    let mut open: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    for s in &mut open {
        assert_eq!(healthz(s).as_deref(), Some("HTTP/1.1 200 OK"));
    }
    // A fourth connection from the same address: refused, then closed.
    let mut fourth = TcpStream::connect(&addr).unwrap();
    fourth.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    fourth.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let (head, body) = response(&mut fourth);
    assert!(head.starts_with("HTTP/1.1 429"), "{head}");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("max_connections_per_ip"), "{body}");
    let mut rest = Vec::new();
    assert_eq!(fourth.read_to_end(&mut rest).unwrap_or(0), 0, "the refused connection is closed");
    // A WebSocket upgrade over the cap is refused the same way.
    assert_eq!(WsClient::try_connect(&relay.url, None).await.err(), Some(429));

    // Once one of the three closes, a new connection is served.
    drop(open.pop());
    eventually("a new connection is served", Duration::from_secs(10), || {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::future::ready(match healthz(&mut s).as_deref() {
            Some("HTTP/1.1 200 OK") => Ok(()),
            other => Err(format!("refused: {other:?}")),
        })
    })
    .await;
}

#[actix_rt::test]
async fn a_body_sent_one_byte_a_second_gets_a_timeout_error() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[http]\nbody_timeout = \"1s\"\n");
    let addr = relay.url.trim_start_matches("http://").to_owned();
    for path in ["/v1/rpc/route.get", "/v1/relay/route.get"] {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let body = br#"{"account_id":"00000000000000000000000000000000"}"#;
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).unwrap();
        // One byte a second from another thread, until the relay answers.
        let mut writer = s.try_clone().unwrap();
        let trickle = std::thread::spawn(move || {
            for b in body {
                if writer.write_all(&[*b]).is_err() {
                    return;
                }
                // Waits for a second between bytes: a client this slow is what the relay's body_timeout is for.
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let started = Instant::now();
        let (head, v) = response(&mut s);
        let took = started.elapsed();
        assert!(head.starts_with("HTTP/1.1 503"), "{path}: {head}");
        assert_eq!(v["error"]["code"], "temporarily_unavailable", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("http.body_timeout"), "{v}");
        assert!(took < Duration::from_secs(5), "{path}: answered after {took:?}");
        drop(s);
        trickle.join().unwrap();
    }
}

/// Starts `relay serve` with RLIMIT_NOFILE set to (soft, hard) in the child;
/// Ok(the start line) or Err(stderr) when it exits.
fn start_with_nofile(dir: &std::path::Path, extra: &str, soft: u64, hard: u64) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let cfg = common::relay::write_config(dir, "relay-a", extra);
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_relay"));
    cmd.args(["serve", "--config"]).arg(&cfg);
    // SAFETY: only setrlimit between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit { rlim_cur: soft, rlim_max: hard };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    common::relay::start_line_or_exit(cmd)
}

#[test]
fn connections_that_cannot_fit_the_open_file_limit_are_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let too_many = "[http]\nworkers = 2\nmax_connections = 1000\n";
    let err = start_with_nofile(dir.path(), too_many, 1024, 1024).expect_err("started over the open-file limit");
    for needle in ["http.max_connections (1000)", "http.workers (2)", "RLIMIT_NOFILE", "hard 1024"] {
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }
    // A soft limit under the need is raised up to the hard one.
    start_with_nofile(dir.path(), too_many, 1024, 4096).expect("the soft limit was not raised");
    // Fewer connections fit the low limit.
    start_with_nofile(dir.path(), "[http]\nworkers = 2\nmax_connections = 300\n", 1024, 1024)
        .expect("a relay that fits did not start");
}

/// The value of a counter in the relay's `/metrics`.
async fn counter(c: &Client, name: &str) -> u64 {
    let (_, text) = c.get("/metrics").await;
    text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse().ok()).unwrap_or(0)
}

#[actix_rt::test]
async fn expired_sessions_are_swept_from_memory_and_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "[sessions]\nttl = \"1s\"\nsweep_interval = \"200ms\"\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    alice.open_session(&c, 0).await;
    // Both sessions expire after a second; the sweep then takes them.
    eventually("both sessions swept", Duration::from_secs(15), || async {
        match counter(&c, "relay_sessions_swept_total").await {
            n if n >= 2 => Ok(()),
            n => Err(format!("relay_sessions_swept_total {n}")),
        }
    })
    .await;
    assert_eq!(c.err("message.timeline.sync", alice.token(0), &json!({"after": 0})).await, "unauthorized");
    assert!(relay.terminate().success());
    let store = relay_actors::store::Store::open(&relay.data_dir.join("store")).unwrap();
    assert_eq!(store.kv_scan_prefix(b"sess/").count(), 0, "sessions left in the store");
    assert_eq!(store.kv_scan_prefix(b"sessd/").count(), 0, "device index entries left in the store");
}

#[actix_rt::test]
async fn a_device_opening_more_sessions_than_the_cap_loses_its_oldest() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[sessions]\nmax_per_device = 2\n");
    let c = Client::new(&relay.url);
    let mut alice = User::register(&c, "relay-a", 1, false).await;
    alice.add_device(&c, "laptop", 70).await;
    let second = alice.open_session(&c, 0).await;
    let third = alice.open_session(&c, 0).await;
    let sync = json!({"after": 0});
    assert_eq!(c.err("message.timeline.sync", alice.token(0), &sync).await, "unauthorized", "the oldest is gone");
    c.ok("message.timeline.sync", Some(&second), &sync).await;
    c.ok("message.timeline.sync", Some(&third), &sync).await;
    c.ok("message.timeline.sync", alice.token(1), &sync).await; // another device's session is not counted
}
