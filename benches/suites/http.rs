//! `message.send` over HTTP to a real relay process, durable before reply:
//! one request in flight at a time, so each iteration is one send's latency.

use super::{Fixture, NOW};
use criterion::{criterion_group, BatchSize, Criterion};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

/// A minimal HTTP/1.1 keep-alive client: the benchmark should measure the
/// relay, not a client library.
struct Conn {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: &str) -> Conn {
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { reader: BufReader::new(s.try_clone().unwrap()), writer: s }
    }

    fn post(&mut self, method: &str, token: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "POST /v1/rpc/{method} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n",
            body.len()
        );
        self.writer.write_all(head.as_bytes()).unwrap();
        self.writer.write_all(body).unwrap();
        let mut line = String::new();
        self.reader.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap().parse().unwrap();
        let mut len = 0;
        loop {
            line.clear();
            self.reader.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.reader.read_exact(&mut body).unwrap();
        (status, body)
    }

    fn ok(&mut self, method: &str, token: Option<&str>, params: &Value) -> Value {
        let (status, body) = self.post(method, token, &serde_json::to_vec(params).unwrap());
        assert_eq!(status, 200, "{method}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    }
}

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

fn start_relay() -> Relay {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("relay.toml");
    let data = dir.path().join("data");
    std::fs::write(
        &cfg,
        format!(
            "[relay]\nid = \"relay-a\"\npublic_url = \"http://127.0.0.1\"\nlisten = \"127.0.0.1:0\"\ndata_dir = {:?}\nkey_file = {:?}\n\
             [limits]\nclock_tolerance = \"100000d\"\ndelivery_age_limit = \"100000d\"\n",
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
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_string();
    Relay { child, addr, _dir: dir }
}

/// Registers an account with one device and returns its session token.
fn register(c: &mut Conn, account: &relay_schemas::client::Account, device: &relay_schemas::client::Device, public: bool) -> String {
    let route = account.route(1, &[("relay-a", "http://127.0.0.1")], NOW);
    let cert = account.certificate(device, NOW, None);
    c.ok("account.register", None, &json!({"route": route, "device_certificate": cert, "settings": {"public_discovery": public}}));
    let ch = c.ok("session.challenge", None, &json!({"account_id": account.id, "device_id": device.id}));
    let challenge = ch["challenge"].as_str().unwrap();
    let sig = device.session_proof(&account.id, challenge, "relay-a");
    let s = c.ok(
        "session.open",
        None,
        &json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": sig}),
    );
    s["token"].as_str().unwrap().to_string()
}

fn http(c: &mut Criterion) {
    let relay = start_relay();
    let f = Fixture::new();
    let mut conn = Conn::open(&relay.addr);
    let alice = register(&mut conn, &f.alice, &f.phone, false);
    register(&mut conn, &f.bob, &f.laptop, true);
    let mut n = 0u64;
    let mut g = c.benchmark_group("http");
    g.bench_function("message_send_local_durable", |b| {
        b.iter_batched(
            || {
                n += 1;
                serde_json::to_vec(&f.send_params(n, 256)).unwrap()
            },
            |body| {
                let (status, reply) = conn.post("message.send", Some(&alice), &body);
                assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, http);
