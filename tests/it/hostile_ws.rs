//! WebSocket clients that hold the relay's bytes hostage: a reader at a
//! crawl must be let go within the configured timeouts, whatever the write
//! side is doing.

use crate::common;

use common::client::{mid, now, Client, User};
use common::relay::RelayProc;
use common::ws::RawWs;
use relay_schemas::client::key_box;
use serde_json::json;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// Scaled-down timeouts: a frame must be taken within 1 s, a client that
/// sends nothing for 2 s is idle; pages up to 1 MiB.
const CRAWL: &str = "[websocket]\nwrite_timeout = \"1s\"\nidle_timeout = \"2s\"\nping_interval = \"500ms\"\n\
                     max_requests_in_flight = 64\n[limits]\nmax_page_bytes = 1048576\n";

#[actix_rt::test]
async fn a_socket_read_at_a_crawl_is_dropped_within_the_idle_and_write_timeouts() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", CRAWL);
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    let alice = User::register(&c, "relay-a", 1, false).await;
    // 60 records of ~80 KiB for Bob (about 4.8 MB of answers per full sync).
    for n in 1..=60 {
        let env = alice.devices[0].envelope(alice.id(), bob.id(), &mid(n), now(), &vec![0x5a; 60 << 10]);
        let params = json!({"envelope": env, "recipient_boxes": [key_box("phone", b"box")]});
        c.ok("message.send", alice.token(0), &params).await;
    }
    // A socket with a tiny receive window asks for the timeline a few
    // times, then never sends again (no pong, no close) and reads ~25 KiB/s.
    let mut crawler = RawWs::connect(&relay.url, bob.token(0), Some(4 << 10)).expect("upgrade");
    for i in 0..8 {
        crawler.send_text(&json!({"id": i, "method": "message.timeline.sync", "params": {"after": 0}}).to_string());
    }
    let last_sent = Instant::now();
    // Bound: idle (2 s) + a write cut short (≤ 1 s) + the close (1 s), with slack.
    let bound = Duration::from_secs(8);
    let mut read = 0usize;
    let ended = loop {
        match crawler.read_discard(1024, Duration::from_millis(200)) {
            Ok(0) => break "end of stream",
            Err(e) if e.kind() == ErrorKind::ConnectionReset => break "reset",
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) => panic!("read: {e}"),
            Ok(n) => read += n,
        }
        assert!(
            last_sent.elapsed() < bound,
            "the relay still sends to the crawling socket after {:?} ({read} bytes read)",
            last_sent.elapsed()
        );
        // The crawl: 1 KiB per 40 ms.
        std::thread::sleep(Duration::from_millis(40));
    };
    let after = last_sent.elapsed();
    println!("crawling socket: {ended} after {after:?}, {read} bytes read");

    // The relay is fine: the same device syncs over a new socket.
    let mut ws = common::ws::WsClient::connect(&relay.url, bob.token(0)).await;
    let page = ws.ok("message.timeline.sync", json!({"after": 0, "limit": 5})).await;
    assert_eq!(page["records"].as_array().map(Vec::len), Some(5));
}
