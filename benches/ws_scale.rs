//! Connection scale of `GET /v1/ws`: N (default 10,000) idle authenticated
//! WebSocket connections to a relay process built in release mode, all of
//! them sessions of ONE device of ONE account. Measures the relay's memory
//! per connection (VmRSS before and after) and the time from one
//! `message.send` (another account, a box for that device) until the
//! `message.timeline.changed` notification has reached every connection.
//!
//! ```text
//! cargo bench --bench ws_scale                      # 10,000 connections, 5 pushes
//! WS_SCALE_CONNECTIONS=2000 WS_SCALE_ROUNDS=3 cargo bench --bench ws_scale
//! ```
//!
//! The client is one epoll loop over non-blocking sockets (connections are
//! opened and authenticated by a few threads first); it answers the relay's
//! pings, so the connections stay idle but alive. The whole run is bounded
//! to 120 s. Not a criterion bench: one setup of 10,000 connections is the
//! expensive part, and the figures are a distribution over the connections.

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const LIMIT: Duration = Duration::from_secs(120);

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Raises the open-files limit to the hard limit (the relay inherits it).
fn raise_nofile(need: u64) -> Result<u64, String> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(format!("getrlimit: {}", std::io::Error::last_os_error()));
    }
    if lim.rlim_max < need {
        return Err(format!("RLIMIT_NOFILE hard limit {} < {need} needed", lim.rlim_max));
    }
    lim.rlim_cur = lim.rlim_max;
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
        return Err(format!("setrlimit: {}", std::io::Error::last_os_error()));
    }
    Ok(lim.rlim_cur)
}

// ---- the relay process -------------------------------------------------------

struct Relay {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Relay {
    fn start() -> Relay {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data).unwrap();
        let cfg = dir.path().join("relay.toml");
        std::fs::write(
            &cfg,
            format!(
                "[relay]\nid = \"relay-a\"\npublic_url = \"http://127.0.0.1:0\"\nlisten = \"127.0.0.1:0\"\n\
                 data_dir = {:?}\nkey_file = {:?}\n\n[limits]\nanonymous_rate = 1000000\nanonymous_burst = 1000000\n\
                 [http]\nmax_connections_per_ip = 1000000\n\n\
                 # Every connection is a session of the same device.\n\
                 [sessions]\nmax_per_device = 1000000\n",
                data.display().to_string(),
                data.join("relay.key").display().to_string()
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["serve", "--config"])
            .arg(&cfg)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn relay");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let addr = line.trim().rsplit("http://").next().unwrap().to_string();
        Relay { child, addr, _dir: dir }
    }

    /// VmRSS of the relay process, in KiB.
    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS")
    }
}

// ---- a minimal HTTP/1.1 client ---------------------------------------------

/// The bench's blocking keep-alive client (`relay_bench::http`).
struct Http(relay_bench::http::Conn);

impl Http {
    fn open(addr: &str) -> Http {
        Http(relay_bench::http::Conn::open(addr).unwrap())
    }

    fn call(&mut self, method: &str, token: Option<&str>, params: &Value) -> (u16, Value) {
        let request = relay_bench::http::rpc_request(method, token, &serde_json::to_vec(params).unwrap());
        let (status, body) = self.0.roundtrip(&request).unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    fn ok(&mut self, method: &str, token: Option<&str>, params: &Value) -> Value {
        let (status, v) = self.call(method, token, params);
        assert_eq!(status, 200, "{method}: {v}");
        v
    }

    /// Registers `account` with `device`; public discovery on.
    fn register(&mut self, account: &Account, device: &Device) {
        let route = account.route(1, &[("relay-a", "http://127.0.0.1")], now());
        let cert = account.certificate(device, now(), None);
        let p = account.register_params(&route, &cert, "relay-a", true, now());
        self.ok("account.register", None, &p);
    }

    /// A new session of `device`: its token.
    fn session(&mut self, account: &Account, device: &Device) -> String {
        loop {
            let ch = self.ok("session.challenge", None, &json!({"account_id": account.id, "device_id": device.id}));
            let challenge = ch["challenge"].as_str().unwrap();
            let signature = device.session_proof(&account.id, challenge, "relay-a");
            let p = json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": signature});
            match self.call("session.open", None, &p) {
                (200, s) => return s["token"].as_str().unwrap().to_string(),
                // A device keeps its latest few challenges: retry if ours was dropped.
                (401, _) => continue,
                (status, v) => panic!("session.open: {status} {v}"),
            }
        }
    }
}

// ---- WebSocket frames -------------------------------------------------------

// The tests' hand-written frames (their `RawWs` client uses the same).
#[path = "../tests/it/common/ws_frame.rs"]
mod ws_frame;
use ws_frame::{client_frame, parse_frame};

struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

/// Upgrades with `token` in the `Authorization` header and waits for the
/// answer to one request: the connection is then attached (attaching comes
/// before the relay reads the first frame).
fn open_ws(addr: &str, token: &str) -> Conn {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream.set_nodelay(true).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer {token}\r\n\r\n"
    );
    let ready = client_frame(
        0x1,
        br#"{"id":0,"method":"route.get","params":{"account_id":"00000000000000000000000000000000"}}"#,
    );
    stream.write_all(&[head.as_bytes(), &ready].concat()).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).expect("upgrade response");
        assert!(n > 0, "closed during the upgrade");
        buf.extend_from_slice(&chunk[..n]);
    };
    assert!(buf.starts_with(b"HTTP/1.1 101"), "{}", String::from_utf8_lossy(&buf[..end]));
    buf.drain(..end);
    loop {
        if let Some((_, op, payload, used)) = parse_frame(&buf) {
            let answered = op == 0x1 && serde_json::from_slice::<Value>(&payload).is_ok_and(|v| v["id"] == 0);
            buf.drain(..used);
            if answered {
                break;
            }
            continue;
        }
        let n = stream.read(&mut chunk).expect("ready answer");
        assert!(n > 0, "closed before the ready answer");
        buf.extend_from_slice(&chunk[..n]);
    }
    stream.set_nonblocking(true).unwrap();
    Conn { stream, buf }
}

// ---- epoll ------------------------------------------------------------------

struct Epoll(i32);

impl Epoll {
    fn new(conns: &[Conn]) -> Epoll {
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0, "epoll_create1: {}", std::io::Error::last_os_error());
        for (i, c) in conns.iter().enumerate() {
            let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: i as u64 };
            let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, c.stream.as_raw_fd(), &mut ev) };
            assert_eq!(r, 0, "epoll_ctl: {}", std::io::Error::last_os_error());
        }
        Epoll(ep)
    }

    /// Indices of readable connections (waits at most `ms`).
    fn wait(&self, events: &mut [libc::epoll_event], ms: i32) -> Vec<usize> {
        let n = unsafe { libc::epoll_wait(self.0, events.as_mut_ptr(), events.len() as i32, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), std::io::ErrorKind::Interrupted, "epoll_wait: {e}");
            return vec![];
        }
        events[..n as usize].iter().map(|e| e.u64 as usize).collect()
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        unsafe { libc::close(self.0) };
    }
}

/// Reads what `c` has; answers pings; returns the sequences of the
/// `message.timeline.changed` notifications read. Err: closed or bad frame.
fn pump(c: &mut Conn) -> Result<Vec<u64>, String> {
    let mut chunk = [0u8; 16384];
    loop {
        match c.stream.read(&mut chunk) {
            Ok(0) => return Err("connection closed by the relay".into()),
            Ok(n) => c.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("read: {e}")),
        }
    }
    let mut seqs = vec![];
    let mut pongs = vec![];
    while let Some((_, op, payload, used)) = parse_frame(&c.buf) {
        match op {
            0x1 => {
                let v: Value = serde_json::from_slice(&payload).map_err(|e| format!("frame: {e}"))?;
                if v["method"] == "message.timeline.changed" {
                    seqs.push(v["params"]["sequence"].as_u64().unwrap_or(0));
                }
            }
            0x8 => return Err(format!("closed by the relay: {:?}", String::from_utf8_lossy(&payload))),
            0x9 => pongs.push(client_frame(0xA, &payload)),
            _ => {}
        }
        c.buf.drain(..used);
    }
    for p in pongs {
        // Small and rare: the send buffer has room.
        c.stream.write_all(&p).map_err(|e| format!("pong: {e}"))?;
    }
    Ok(seqs)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn run() -> Result<(), String> {
    let started = Instant::now();
    let over = |what: &str| -> Result<(), String> {
        if started.elapsed() > LIMIT {
            return Err(format!("aborted after {LIMIT:?} while {what}"));
        }
        Ok(())
    };
    let n = env_usize("WS_SCALE_CONNECTIONS", 10_000);
    let rounds = env_usize("WS_SCALE_ROUNDS", 5);
    let nofile = raise_nofile(n as u64 + 512)?;
    let relay = Relay::start();
    println!("ws_scale: relay (release) pid {} at {}; RLIMIT_NOFILE {nofile}", relay.child.id(), relay.addr);

    let alice = Account::from_seed([1; 32]);
    let alice_phone = Device::from_seed("phone", [2; 32]);
    let bob = Account::from_seed([3; 32]);
    let bob_phone = Device::from_seed("phone", [4; 32]);
    let mut http = Http::open(&relay.addr);
    http.register(&alice, &alice_phone);
    http.register(&bob, &bob_phone);
    let alice_token = http.session(&alice, &alice_phone);

    // N sessions of bob's one device (6 threads: a device keeps its latest
    // 8 challenges).
    let t = Instant::now();
    const THREADS: usize = 6;
    let tokens: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|i| {
                let (bob, bob_phone, addr) = (&bob, &bob_phone, &relay.addr);
                s.spawn(move || {
                    let mut h = Http::open(addr);
                    (i..n).step_by(THREADS).map(|_| h.session(bob, bob_phone)).collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    println!("ws_scale: {n} sessions of one device opened in {:.1} s", t.elapsed().as_secs_f64());
    over("opening sessions")?;

    std::thread::sleep(Duration::from_millis(500));
    let rss_before = relay.rss_kib();

    // N connections, each upgraded with its token and attached.
    let t = Instant::now();
    let mut conns: Vec<Conn> = std::thread::scope(|s| {
        let handles: Vec<_> = tokens
            .chunks(n.div_ceil(THREADS).max(1))
            .map(|chunk| {
                let addr = &relay.addr;
                s.spawn(move || chunk.iter().map(|tok| open_ws(addr, tok)).collect::<Vec<_>>())
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let connect_secs = t.elapsed().as_secs_f64();
    println!("ws_scale: {n} WebSocket connections upgraded and attached in {connect_secs:.1} s");
    over("connecting")?;
    std::thread::sleep(Duration::from_millis(500));
    let rss_after = relay.rss_kib();
    let per_conn = (rss_after.saturating_sub(rss_before)) as f64 * 1024.0 / n as f64;
    println!(
        "ws_scale: relay VmRSS {:.1} MiB before, {:.1} MiB with {n} connections: {:.1} KiB per connection",
        rss_before as f64 / 1024.0,
        rss_after as f64 / 1024.0,
        per_conn / 1024.0
    );

    // Pushes: one message from alice to bob's device; every connection must
    // hear `message.timeline.changed` with its sequence.
    let epoll = Epoll::new(&conns);
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 1024];
    let mut totals = vec![];
    for round in 1..=rounds as u64 {
        let mut arrived: Vec<Option<Duration>> = vec![None; n];
        let mut left = n;
        let env = alice_phone.envelope(&alice.id, &bob.id, &format!("ws-scale-{round:08}"), now(), &[7u8; 64]);
        let params = json!({"envelope": env, "recipient_boxes": [key_box("phone", &[9u8; 64])]});
        // The send on its own thread, so this one reads the sockets from the
        // start (the relay answers the send about when it has written the
        // notifications of the worker thread that serves it).
        let (replied, status, reply) = std::thread::scope(|s| -> Result<_, String> {
            let t0 = Instant::now();
            let (http, token, params) = (&mut http, &alice_token, &params);
            let send = s.spawn(move || {
                let (status, reply) = http.call("message.send", Some(token), params);
                (t0.elapsed(), status, reply)
            });
            while left > 0 {
                over("waiting for notifications")?;
                for i in epoll.wait(&mut events, 100) {
                    let seqs = pump(&mut conns[i]).map_err(|e| format!("connection {i}: {e}"))?;
                    if seqs.contains(&round) && arrived[i].is_none() {
                        arrived[i] = Some(t0.elapsed());
                        left -= 1;
                    }
                }
            }
            Ok(send.join().unwrap())
        })?;
        if status != 200 || reply["status"] != "target_accepted" {
            return Err(format!("message.send: {status} {reply}"));
        }
        let mut times: Vec<Duration> = arrived.into_iter().map(Option::unwrap).collect();
        times.sort();
        let all = *times.last().unwrap();
        println!(
            "ws_scale: push {round}: message.send answered in {}; notified first {}, p50 {}, p90 {}, p99 {}, all {n} in {}",
            ms(replied),
            ms(times[0]),
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.9)),
            ms(percentile(&times, 0.99)),
            ms(all)
        );
        totals.push(all);
    }
    totals.sort();
    if !totals.is_empty() {
        println!(
            "ws_scale: SUMMARY {n} idle connections, {:.1} KiB relay RSS per connection; send -> all {n} notified: median {} (min {}, max {}) over {rounds} pushes",
            per_conn / 1024.0,
            ms(percentile(&totals, 0.5)),
            ms(totals[0]),
            ms(*totals.last().unwrap())
        );
    }
    // Still all alive.
    for (i, c) in conns.iter_mut().enumerate() {
        pump(c).map_err(|e| format!("connection {i} after the pushes: {e}"))?;
    }
    drop(epoll);
    drop(conns);
    drop(relay);
    Ok(())
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` does not: then
    // there is nothing to check in a debug build.
    if !std::env::args().any(|a| a == "--bench") {
        println!("ws_scale: run with `cargo bench --bench ws_scale`");
        return;
    }
    if let Err(e) = run() {
        eprintln!("ws_scale: {e}");
        std::process::exit(1);
    }
}
