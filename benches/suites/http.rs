//! `message.send` over HTTP to a real relay process, durable before reply:
//! one request in flight at a time, so each iteration is one send's latency.

use super::{Fixture, NOW};
use criterion::{criterion_group, BatchSize, Criterion, Throughput};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// The bench's blocking keep-alive client (`relay bench` uses it too): the
/// benchmark should measure the relay, not a client library.
struct Conn(relay_bench::http::Conn);

impl Conn {
    fn open(addr: &str) -> Conn {
        Conn(relay_bench::http::Conn::open(addr).unwrap())
    }

    fn post(&mut self, method: &str, token: Option<&str>, body: &[u8]) -> (u16, Vec<u8>) {
        self.0.roundtrip(&relay_bench::http::rpc_request(method, token, body)).unwrap()
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

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts relay `id` on `port` with a fixed key seed, peering with `peers`
/// (id, port, seed).
fn start_relay(id: &str, port: u16, seed: u8, peers: &[(&str, u16, u8)]) -> Relay {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("relay.toml");
    let data = dir.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let key = data.join("relay.key");
    std::fs::write(&key, relay_schemas::encoding::b64_encode(&[seed; 32])).unwrap();
    #[cfg(unix)]
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut peer_toml = String::new();
    for (pid, pport, pseed) in peers {
        let pk = ed25519_dalek::SigningKey::from_bytes(&[*pseed; 32]);
        peer_toml.push_str(&format!(
            "[[peers]]\nid = \"{pid}\"\nurl = \"http://127.0.0.1:{pport}\"\npublic_key = \"{}\"\n",
            relay_schemas::encoding::b64_encode(pk.verifying_key().as_bytes())
        ));
    }
    std::fs::write(
        &cfg,
        format!(
            "[relay]\nid = \"{id}\"\npublic_url = \"http://127.0.0.1:{port}\"\nlisten = \"127.0.0.1:{port}\"\ndata_dir = {:?}\nkey_file = {:?}\n\
             {peer_toml}[limits]\nclock_tolerance = \"100000d\"\ndelivery_age_limit = \"100000d\"\nsession_rate = 1000000\nsession_burst = 1000000\n\
             anonymous_rate = 1000000\nanonymous_burst = 1000000\n",
            data.display().to_string(),
            key.display().to_string()
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

/// Registers an account with one device on `relay_id` and returns its
/// session token.
fn register(
    c: &mut Conn,
    relay_id: &str,
    account: &relay_schemas::client::Account,
    device: &relay_schemas::client::Device,
    public: bool,
) -> String {
    let route = account.route(1, &[(relay_id, "http://127.0.0.1")], NOW);
    let cert = account.certificate(device, NOW, None);
    c.ok("account.register", None, &account.register_params(&route, &cert, relay_id, public, NOW));
    let ch = c.ok("session.challenge", None, &json!({"account_id": account.id, "device_id": device.id}));
    let challenge = ch["challenge"].as_str().unwrap();
    let sig = device.session_proof(&account.id, challenge, relay_id);
    let s = c.ok(
        "session.open",
        None,
        &json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": sig}),
    );
    s["token"].as_str().unwrap().to_string()
}

/// Sends `per_conn` messages on each of `conns` connections in parallel
/// threads (one request in flight per connection).
fn send_parallel(addr: &str, token: &str, bodies: Vec<Vec<Vec<u8>>>) {
    std::thread::scope(|s| {
        for chunk in bodies {
            s.spawn(move || {
                let mut conn = Conn::open(addr);
                for body in chunk {
                    let (status, reply) = conn.post("message.send", Some(token), &body);
                    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&reply));
                }
            });
        }
    });
}

fn http(c: &mut Criterion) {
    let (port_a, port_b) = (free_port(), free_port());
    let a = start_relay("relay-a", port_a, 11, &[("relay-b", port_b, 12)]);
    let b = start_relay("relay-b", port_b, 12, &[("relay-a", port_a, 11)]);
    let f = Fixture::new();
    let mut conn = Conn::open(&a.addr);
    let alice = register(&mut conn, "relay-a", &f.alice, &f.phone, false);
    register(&mut conn, "relay-a", &f.bob, &f.laptop, true);
    // Carol lives on relay-b: alice's messages to her cross relays.
    let carol = relay_schemas::client::Account::from_seed([5; 32]);
    let carol_phone = relay_schemas::client::Device::from_seed("laptop", [6; 32]);
    register(&mut Conn::open(&b.addr), "relay-b", &carol, &carol_phone, true);
    // With a session: only then does relay-a ask its peers (a stranger gets
    // only what relay-a knows).
    conn.ok("route.get", Some(&alice), &json!({"account_id": carol.id}));
    let to_carol = Fixture { bob: carol, laptop: carol_phone, ..Fixture::new() };

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
    // message.send answers after the first attempt, so this is the time
    // from send to target_accepted across two relays.
    g.bench_function("message_send_to_target_accepted_cross_relay", |b| {
        b.iter_batched(
            || {
                n += 1;
                serde_json::to_vec(&to_carol.send_params(n, 256)).unwrap()
            },
            |body| {
                let (status, reply) = conn.post("message.send", Some(&alice), &body);
                assert_eq!(status, 200);
                assert!(String::from_utf8_lossy(&reply).contains("target_accepted"));
            },
            BatchSize::SmallInput,
        )
    });
    const CONNS: usize = 16;
    const PER_CONN: usize = 16;
    g.throughput(Throughput::Elements((CONNS * PER_CONN) as u64));
    for (name, fixture) in [("local", &f), ("cross_relay", &to_carol)] {
        g.bench_function(format!("message_send_{name}_{CONNS}_connections"), |b| {
            b.iter_batched(
                || {
                    (0..CONNS)
                        .map(|_| {
                            (0..PER_CONN)
                                .map(|_| {
                                    n += 1;
                                    serde_json::to_vec(&fixture.send_params(n, 256)).unwrap()
                                })
                                .collect()
                        })
                        .collect()
                },
                |bodies| send_parallel(&a.addr, &alice, bodies),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, http);
