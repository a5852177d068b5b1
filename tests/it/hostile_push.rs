//! Web Push (PROTOCOL §9) against hostile subscribers: endpoints that aim
//! the relay at its own machine, and endpoints that hold a connection and
//! never answer, on real relays on loopback.

use crate::common;

use common::client::{mid, now, Client, User};
use common::push_service::{PushService, Subscriber};
use common::relay::RelayProc;
use common::wait::eventually;
use serde_json::json;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A loopback listener that accepts connections, counts them and holds
/// them open without reading or answering: a black hole for the push
/// sender, and a witness that it connected at all.
struct BlackHole {
    port: u16,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl BlackHole {
    fn start() -> BlackHole {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let (accepted, stop) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
        let (n, stopped) = (accepted.clone(), stop.clone());
        std::thread::spawn(move || {
            let held: Mutex<Vec<TcpStream>> = Mutex::default();
            while !stopped.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        n.fetch_add(1, Ordering::SeqCst);
                        held.lock().unwrap().push(conn);
                    }
                    // Waits for the next connection: a non-blocking accept loop, so the listener can stop.
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        BlackHole { port, accepted, stop }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

async fn metric(c: &Client, name: &str) -> f64 {
    c.metric(name).await.unwrap_or(0.0)
}

/// `user` with `n` devices in all (the phone and `n - 1` more, seeds from `seed`).
async fn with_devices(c: &Client, user: &mut User, n: usize, seed: u8) -> Vec<String> {
    let mut names = vec!["phone".to_string()];
    for i in 1..n {
        let name = format!("device{i}");
        user.add_device(c, &name, seed + i as u8).await;
        names.push(name);
    }
    names
}

async fn subscribe(c: &Client, user: &User, device: usize, endpoint: String) -> Subscriber {
    let sub = Subscriber::new(endpoint);
    assert_eq!(c.ok("push.subscribe", user.token(device), &sub.params()).await, json!({}));
    sub
}

async fn send(c: &Client, from: &User, to: &User, n: u64, devices: &[String]) {
    let devices: Vec<&str> = devices.iter().map(String::as_str).collect();
    let params = from.params_to(0, to.id(), &mid(n), now(), &devices, None);
    let status = c.ok("message.send", from.token(0), &params).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
}

/// Hosts that getaddrinfo reads as 127.0.0.1 (or 0.0.0.0, which reaches
/// it) but a strict address parse does not: the endpoint's text passes,
/// the address connected to must not.
const LOOPBACK_SPELLINGS: [&str; 7] = ["127.1", "2130706433", "0x7f000001", "0177.0.0.1", "0x7f.1", "127.0.1", "0"];

#[actix_rt::test]
async fn a_push_endpoint_spelling_loopback_any_way_never_reaches_loopback_with_default_settings() {
    let dir = tempfile::tempdir().unwrap();
    let listener = BlackHole::start();
    // Default [push] settings: https only, private endpoints refused.
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let mut bob = User::register(&c, "relay-a", 2, true).await;
    let devices = with_devices(&c, &mut bob, LOOPBACK_SPELLINGS.len(), 150).await;
    for (i, host) in LOOPBACK_SPELLINGS.iter().enumerate() {
        subscribe(&c, &bob, i, format!("https://{host}:{}/push/{i}", listener.port)).await;
    }
    send(&c, &alice, &bob, 1, &devices).await;

    // Every push was attempted (and failed: counted for a retry) ...
    let want = LOOPBACK_SPELLINGS.len() as f64;
    eventually("each push is attempted", Duration::from_secs(20), || async {
        match metric(&c, "relay_push_sent_total{outcome=\"retry\"}").await {
            n if n >= want => Ok(()),
            n => Err(format!("{n} attempts failed, {} connections", listener.accepted())),
        }
    })
    .await;
    // ... and none of them connected to the listener on loopback.
    assert_eq!(listener.accepted(), 0, "the relay connected to loopback");
    assert_eq!(metric(&c, "relay_push_sent_total{outcome=\"sent\"}").await, 0.0);
}

#[actix_rt::test]
async fn one_accounts_devices_on_a_black_hole_endpoint_do_not_delay_another_accounts_push() {
    let dir = tempfile::tempdir().unwrap();
    let hole = BlackHole::start();
    let service = PushService::start();
    // Test endpoints are http on loopback; the other [push] settings are the
    // defaults (16 slots, 10 s per attempt, 4 per account, 8 per origin).
    let relay = RelayProc::start(
        dir.path(),
        "relay-a",
        "[push]\nallow_http_endpoints = true\nallow_private_endpoints = true\nmin_interval = \"1s\"\n",
    );
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut flood = User::register(&c, "relay-a", 3, true).await;
    // More devices than the sender has slots, each subscribed to the black hole.
    let flood_devices = with_devices(&c, &mut flood, 20, 150).await;
    for i in 0..flood_devices.len() {
        subscribe(&c, &flood, i, format!("http://127.0.0.1:{}/push/{i}", hole.port)).await;
    }
    let bob_phone = subscribe(&c, &bob, 0, service.endpoint("bob-phone")).await;

    send(&c, &alice, &flood, 1, &flood_devices).await;
    // The black hole holds the flood's pushes before Bob's message is sent.
    eventually("the black hole holds the flood's pushes", Duration::from_secs(10), || {
        std::future::ready(if hole.accepted() >= 4 { Ok(()) } else { Err(format!("{} connections", hole.accepted())) })
    })
    .await;
    let sent = Instant::now();
    send(&c, &alice, &bob, 2, &["phone".to_string()]).await;
    let pushes = service.wait_for("bob-phone", 1, Duration::from_secs(20)).await;
    let waited = pushes[0].at.duration_since(sent);
    println!("bob's push arrived {waited:?} after the send, the flood holding {} connections", hole.accepted());
    assert!(waited < Duration::from_secs(3), "bob's push waited {waited:?} behind the flood");
    assert_eq!(bob_phone.decrypt(&pushes[0])["account_id"], bob.id());
    assert!(hole.accepted() <= 4, "one account held {} slots at once", hole.accepted());
}
