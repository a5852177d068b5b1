//! Realtime devices over real WebSocket connections.

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::relay::RelayProc;
use common::schema::assert_valid;
use common::wait::eventually;
use common::ws::{close_code, RawWs, WsClient, WAIT};
use relay_schemas::client::key_box;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

#[actix_rt::test]
async fn recipient_device_is_notified_and_sender_sees_delivery_status() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut bob_ws = WsClient::connect(&relay.url, bob.token(0)).await;
    let mut alice_ws = WsClient::attach(&relay.url, alice.token(0).unwrap()).await;

    let status = alice_ws.ok("message.send", alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(status["status"], "target_accepted");
    let n = bob_ws.notification(WAIT).await.expect("timeline notification");
    assert_eq!(n, json!({"method": "message.timeline.changed", "params": {"account_id": bob.id(), "sequence": 1}}));
    let page = bob_ws.ok("message.timeline.sync", json!({"after": 0})).await;
    assert_eq!(page["records"][0]["envelope"]["message_id"], mid(1));

    let d1 = alice_ws.notification(WAIT).await.unwrap();
    assert_eq!(d1["method"], "message.delivery.changed");
    assert_eq!(d1["params"]["status"], "delivering");
    let d2 = alice_ws.notification(WAIT).await.unwrap();
    assert_eq!(d2["params"], json!({"message_id": mid(1), "status": "target_accepted"}));
}

// ---- helpers ---------------------------------------------------------------

/// A millisecond-scale timetable so retries happen within a test.
const FAST: &str = "[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\nattempt_timeout = \"1s\"\n";

/// The sequence of a `message.timeline.changed` notification for `account`
/// (checked against its schema).
fn timeline_seq(n: &Value, account: &str) -> u64 {
    assert_eq!(n["method"], "message.timeline.changed", "{n}");
    assert_valid("notifications/message.timeline.changed.params.schema.json", &n["params"]);
    assert_eq!(n["params"]["account_id"], account, "{n}");
    n["params"]["sequence"].as_u64().unwrap()
}

/// The next notification, which must be `message.timeline.changed`; its sequence.
async fn next_timeline(ws: &mut WsClient, account: &str) -> u64 {
    let n = ws.notification(WAIT).await.expect("a message.timeline.changed notification");
    timeline_seq(&n, account)
}

/// Reads notifications until `done` holds for those read so far (each wait
/// bounded by WAIT); returns them.
async fn notifications_until(ws: &mut WsClient, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut got = vec![];
    while !done(&got) {
        let n = ws.notification(WAIT).await.unwrap_or_else(|| panic!("no more notifications; so far {got:?}"));
        got.push(n);
    }
    got
}

/// The `message.delivery.changed` notifications among `ns`, as
/// (message_id, status, error code), each checked against its schema.
fn deliveries(ns: &[Value]) -> Vec<(String, String, Option<String>)> {
    ns.iter()
        .filter(|n| n["method"] == "message.delivery.changed")
        .map(|n| {
            assert_valid("notifications/message.delivery.changed.params.schema.json", &n["params"]);
            let p = &n["params"];
            (
                p["message_id"].as_str().unwrap().to_string(),
                p["status"].as_str().unwrap().to_string(),
                p["error"]["code"].as_str().map(str::to_string),
            )
        })
        .collect()
}

/// Whether `ns` hold both a `delivering` and a final status of `message_id`
/// (in any order).
fn has_both(ns: &[Value], message_id: &str) -> bool {
    let d = deliveries(ns);
    d.iter().any(|(m, s, _)| m == message_id && s == "delivering")
        && d.iter().any(|(m, s, _)| m == message_id && s != "delivering")
}

fn timeline_count(ns: &[Value]) -> usize {
    ns.iter().filter(|n| n["method"] == "message.timeline.changed").count()
}

/// All records readable from `after` over the socket, following pagination
/// with `limit`.
async fn sync_from(ws: &mut WsClient, after: u64, limit: u64) -> Vec<Value> {
    let (mut after, mut out) = (after, vec![]);
    loop {
        let page = ws.ok("message.timeline.sync", json!({"after": after, "limit": limit})).await;
        assert_valid("methods/message.timeline.sync.result.schema.json", &page);
        out.extend(page["records"].as_array().unwrap().iter().cloned());
        after = page["next"].as_u64().unwrap();
        if !page["has_more"].as_bool().unwrap() {
            return out;
        }
    }
}

fn sequences(records: &[Value]) -> Vec<u64> {
    records.iter().map(|r| r["sequence"].as_u64().unwrap()).collect()
}

fn message_ids(records: &[Value]) -> Vec<String> {
    common::client::message_ids(records)
}

/// `message.send` params from `from` (device 0) to `to` with a
/// `ciphertext_len`-byte ciphertext and recipient boxes for `devices`.
fn params_sized(from: &User, to: &User, message_id: &str, ciphertext_len: usize, devices: &[&str]) -> Value {
    let env = from.devices[0].envelope(from.id(), to.id(), message_id, now(), &vec![0x5a; ciphertext_len]);
    let rb: Vec<Value> = devices.iter().map(|d| key_box(d, format!("box for {d}").as_bytes())).collect();
    json!({"envelope": env, "recipient_boxes": rb})
}

// ---- the protocol over the socket --------------------------------------------

#[actix_rt::test]
async fn every_client_method_is_callable_over_the_socket_with_id_correlation() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;

    let mut ws = WsClient::connect(&relay.url, None).await;
    // Methods without a session work before attaching.
    let route = ws.ok("route.get", json!({"account_id": alice.id()})).await;
    assert_eq!(route, c.ok("route.get", None, &json!({"account_id": alice.id()})).await);
    let phone = &alice.devices[0];
    let ch = ws.ok("session.challenge", json!({"account_id": alice.id(), "device_id": phone.id})).await;
    assert_valid("methods/session.challenge.result.schema.json", &ch);
    let challenge = ch["challenge"].as_str().unwrap();
    let sig = phone.session_proof(alice.id(), challenge, "relay-a");
    let opened = ws
        .ok(
            "session.open",
            json!({"account_id": alice.id(), "device_id": phone.id, "challenge": challenge, "signature": sig}),
        )
        .await;
    assert_valid("methods/session.open.result.schema.json", &opened);
    let token = opened["token"].as_str().unwrap();

    // Methods that need a session are refused until the socket is attached.
    let r = ws.call("message.timeline.sync", json!({"after": 0})).await;
    assert_eq!(r["error"]["code"], "unauthorized", "{r}");
    assert_valid("RelayError.schema.json", &r["error"]);
    let r = ws.call("session.attach", json!({"token": "bm90IGEgdG9rZW4"})).await;
    assert_eq!(r["error"]["code"], "unauthorized", "{r}");
    let r = ws.call("session.attach", json!({})).await;
    assert_eq!(r["error"]["code"], "invalid_params", "{r}");
    assert_eq!(ws.ok("session.attach", json!({"token": token})).await, json!({}));
    let r = ws.call("session.attach", json!({"token": token})).await;
    assert_eq!(r["error"]["code"], "invalid_state", "a socket attaches once: {r}");

    // Ids of any JSON type come back as sent; answers keep request order
    // even when requests are pipelined.
    let r = ws
        .call_raw(&json!({"id": "a-string", "method": "route.get", "params": {"account_id": bob.id()}}).to_string())
        .await;
    assert_eq!(r["id"], "a-string");
    assert_eq!(r["result"]["account_id"], bob.id());
    let r = ws.call_raw(&json!({"id": {"n": [1, 2]}, "method": "no.such.method", "params": {}}).to_string()).await;
    assert_eq!(r, json!({"id": {"n": [1, 2]}, "error": r["error"]}));
    assert_eq!(r["error"]["code"], "not_found", "{r}");
    let r = ws.call_raw("this is not JSON").await;
    assert_eq!(r["id"], Value::Null);
    assert_eq!(r["error"]["code"], "invalid_params", "{r}");
    let params = alice.send_params(&bob, &mid(1), true);
    for (id, method, p) in [
        (101, "message.send", params.clone()),
        (102, "message.delivery.status", json!({"message_id": mid(1)})),
        (103, "account.devices.get", json!({"account_id": bob.id()})),
        (104, "message.timeline.sync", json!({"after": 0})),
        (105, "account.settings.update", json!({"public_discovery": true})),
        (106, "message.timeline.ack", json!({"through": 1})),
    ] {
        ws.send_text(json!({"id": id, "method": method, "params": p}).to_string()).await;
    }
    let mut answers = vec![];
    for _ in 0..6 {
        let frame = ws.answer().await;
        answers.push(frame);
    }
    let ids: Vec<_> = answers.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [101, 102, 103, 104, 105, 106]);
    for a in &answers {
        assert!(a.get("error").is_none(), "{a}");
    }
    assert_valid("methods/message.send.result.schema.json", &answers[0]["result"]);
    assert_eq!(answers[0]["result"]["status"], "target_accepted");
    assert_valid("methods/message.delivery.status.result.schema.json", &answers[1]["result"]);
    assert_valid("methods/account.devices.get.result.schema.json", &answers[2]["result"]);
    assert_eq!(message_ids(answers[3]["result"]["records"].as_array().unwrap()), [mid(1)]);
    assert_eq!(answers[5]["result"], json!({}));
    // The same params over HTTP are a duplicate of the socket's send.
    let again = c.ok("message.send", alice.token(0), &params).await;
    assert_eq!(again["accepted_at"], answers[0]["result"]["accepted_at"]);

    // session.attach is a WebSocket method.
    assert_eq!(c.err("session.attach", None, &json!({"token": token})).await, "invalid_params");
}

#[actix_rt::test]
async fn a_bad_token_in_the_upgrade_header_is_refused_and_binary_or_oversized_frames_close_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[websocket]\nmax_frame_bytes = 4096\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    assert_eq!(WsClient::try_connect(&relay.url, Some("bm90IGEgdG9rZW4")).await.err(), Some(401));

    let mut ws = WsClient::connect(&relay.url, alice.token(0)).await;
    assert_eq!(ws.ok("message.timeline.sync", json!({"after": 0})).await["records"], json!([]));
    ws.send_binary(b"\x00\x01".to_vec()).await;
    let (code, reason) = close_code(&ws.closed(WAIT).await);
    assert_eq!(code, 1003, "{reason}");

    let mut ws = WsClient::connect(&relay.url, alice.token(0)).await;
    let big = json!({"id": 1, "method": "route.get", "params": {"account_id": "x".repeat(8192)}});
    ws.send_text(big.to_string()).await;
    let (code, reason) = close_code(&ws.closed(WAIT).await);
    assert_eq!(code, 1009, "a frame over max_frame_bytes: {reason}");
}

// ---- notifications ---------------------------------------------------------------

#[actix_rt::test]
async fn cross_relay_message_notifies_the_recipient_and_the_sender_sees_delivering_then_target_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let mut bob_ws = WsClient::connect(&b.url, bob.token(0)).await;
    let mut alice_ws = WsClient::attach(&a.url, alice.token(0).unwrap()).await;

    let status = alice_ws.ok("message.send", alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
    assert_eq!(next_timeline(&mut bob_ws, bob.id()).await, 1);
    let got = sync_from(&mut bob_ws, 0, 100).await;
    assert_eq!(message_ids(&got), [mid(1)]);
    assert_eq!(got[0]["direction"], "received");

    let ns = notifications_until(&mut alice_ws, |ns| has_both(ns, &mid(1)) && timeline_count(ns) == 1).await;
    assert_eq!(
        deliveries(&ns),
        [(mid(1), "delivering".into(), None), (mid(1), "target_accepted".into(), None)],
        "{ns:?}"
    );
    // Alice's own device also hears of her sent record (it holds a sender box).
    let mine: Vec<u64> =
        ns.iter().filter(|n| n["method"] == "message.timeline.changed").map(|n| timeline_seq(n, alice.id())).collect();
    assert_eq!(mine, [1], "{ns:?}");
}

#[actix_rt::test]
async fn sender_sees_delivering_then_failed_when_the_destination_stays_down() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", &format!("{FAST}[limits]\ndelivery_age_limit = \"2s\"\n"));
    let mut b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await; // relay-a learns bob's route
    b.kill9();

    let mut alice_ws = WsClient::connect(&a.url, alice.token(0)).await;
    let status = alice_ws.ok("message.send", alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(status["status"], "delivering", "{status}");
    let started = Instant::now();
    let ns = notifications_until(&mut alice_ws, |ns| has_both(ns, &mid(1))).await;
    println!("failed notified {:?} after the send", started.elapsed());
    assert_eq!(
        deliveries(&ns),
        [(mid(1), "delivering".into(), None), (mid(1), "failed".into(), Some("message_expired".into()))],
        "retries that change nothing notify nothing: {ns:?}"
    );
    let st = alice_ws.ok("message.delivery.status", json!({"message_id": mid(1)})).await;
    assert_eq!(st["status"], "failed");
}

#[actix_rt::test]
async fn a_device_outside_the_visible_set_gets_no_notification_and_cannot_sync_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let mut alice = User::register(&c, "relay-a", 1, false).await;
    alice.add_device(&c, "tablet", 60).await;
    let mut bob = User::register(&c, "relay-a", 2, true).await;
    bob.add_device(&c, "laptop", 70).await;
    let mut phone = WsClient::connect(&relay.url, bob.token(0)).await;
    let mut laptop = WsClient::attach(&relay.url, bob.token(1).unwrap()).await;
    let mut tablet = WsClient::connect(&relay.url, alice.token(1)).await;

    // Message 1: boxes for bob's phone only, and for alice's phone only.
    let p1 = alice.params_to(0, bob.id(), &mid(1), now(), &["phone"], Some(&["phone"]));
    c.ok("message.send", alice.token(0), &p1).await;
    // Message 2: boxes for both of bob's devices.
    let p2 = alice.params_to(0, bob.id(), &mid(2), now(), &["phone", "laptop"], None);
    c.ok("message.send", alice.token(0), &p2).await;

    assert_eq!(next_timeline(&mut phone, bob.id()).await, 1);
    assert_eq!(next_timeline(&mut phone, bob.id()).await, 2);
    // The laptop's first notification is record 2: it heard nothing of record 1.
    assert_eq!(next_timeline(&mut laptop, bob.id()).await, 2);
    let seen = sync_from(&mut laptop, 0, 100).await;
    assert_eq!(message_ids(&seen), [mid(2)]);
    assert_eq!(seen[0]["box"]["device_id"], "laptop", "only its own box");
    let page = laptop.ok("message.timeline.sync", json!({"after": 0, "limit": 1})).await;
    assert_eq!(page["records"][0]["sequence"], 2, "record 1 is skipped, not returned: {page}");
    assert_eq!(message_ids(&sync_from(&mut phone, 0, 100).await), [mid(1), mid(2)]);

    // On the sender's side the tablet (no sender box) hears the delivery
    // status of both messages but never of alice's sent record.
    let ns = notifications_until(&mut tablet, |ns| has_both(ns, &mid(1)) && has_both(ns, &mid(2))).await;
    assert!(ns.iter().all(|n| n["method"] == "message.delivery.changed"), "{ns:?}");
    assert!(sync_from(&mut tablet, 0, 100).await.is_empty());
}

#[actix_rt::test]
async fn a_duplicate_send_produces_no_notification() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut alice_ws = WsClient::attach(&relay.url, alice.token(0).unwrap()).await;
    let mut bob_ws = WsClient::connect(&relay.url, bob.token(0)).await;

    let p1 = alice.send_params(&bob, &mid(1), true);
    let first = alice_ws.ok("message.send", p1.clone()).await;
    assert_eq!(next_timeline(&mut bob_ws, bob.id()).await, 1);
    // The same request again, over the socket and over HTTP.
    assert_eq!(alice_ws.ok("message.send", p1.clone()).await["accepted_at"], first["accepted_at"]);
    assert_eq!(c.ok("message.send", alice.token(0), &p1).await["accepted_at"], first["accepted_at"]);
    alice_ws.ok("message.send", alice.send_params(&bob, &mid(2), true)).await;

    // Bob's next notification is message 2's record: the duplicates added none.
    assert_eq!(next_timeline(&mut bob_ws, bob.id()).await, 2);
    assert_eq!(message_ids(&sync_from(&mut bob_ws, 0, 100).await), [mid(1), mid(2)]);
    // Alice heard each status of each message once, and of her two sent records.
    let ns = notifications_until(&mut alice_ws, |ns| {
        has_both(ns, &mid(1)) && has_both(ns, &mid(2)) && timeline_count(ns) == 2
    })
    .await;
    let mut d = deliveries(&ns);
    d.sort();
    let expect = |m: String| [(m.clone(), "delivering".to_string(), None), (m, "target_accepted".to_string(), None)];
    assert_eq!(d, [expect(mid(1)), expect(mid(2))].concat(), "{ns:?}");
    let mine: Vec<u64> =
        ns.iter().filter(|n| n["method"] == "message.timeline.changed").map(|n| timeline_seq(n, alice.id())).collect();
    assert_eq!(mine, [1, 2], "{ns:?}");
    // Nothing else is pending for either (answers come after queued pushes).
    alice_ws.ok("route.get", json!({"account_id": bob.id()})).await;
    assert_eq!(alice_ws.buffered(), Vec::<Value>::new());
}

#[actix_rt::test]
async fn a_retried_cross_relay_delivery_produces_no_second_notification() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let mut bob_ws = WsClient::connect(&b.url, bob.token(0)).await;
    // Speak for relay-a (its key is member 0's of the cluster plan): the
    // same `message.deliver` twice, as a source does when it did not see
    // the first answer, then another message.
    let relay_a = ed25519_dalek::SigningKey::from_bytes(&[200; 32]);
    let devices = ca.ok("account.devices.get", alice.token(0), &json!({"account_id": alice.id()})).await;
    let cert = devices["certificates"][0].clone();
    let route = ca.ok("route.get", None, &json!({"account_id": alice.id()})).await;
    let deliver = |n: u64| {
        let mut p = alice.send_params(&bob, &mid(n), false);
        p["sender_device_certificate"] = cert.clone();
        p["sender_route"] = route.clone();
        p
    };
    let (p1, p2) = (deliver(1), deliver(2));
    let first = cb.relay_call("relay-b", "relay-a", &relay_a, "message.deliver", &p1).await;
    assert_eq!((first.0, &first.1["status"]), (200, &json!("target_accepted")), "{first:?}");
    let again = cb.relay_call("relay-b", "relay-a", &relay_a, "message.deliver", &p1).await;
    assert_eq!(again, first, "the duplicate gets the original answer");
    cb.relay_call("relay-b", "relay-a", &relay_a, "message.deliver", &p2).await;

    assert_eq!(next_timeline(&mut bob_ws, bob.id()).await, 1);
    assert_eq!(next_timeline(&mut bob_ws, bob.id()).await, 2, "no notification for the duplicate");
    assert_eq!(message_ids(&sync_from(&mut bob_ws, 0, 100).await), [mid(1), mid(2)]);
}

#[actix_rt::test]
async fn delivery_notifications_of_a_message_arrive_in_status_order() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut alice_ws = WsClient::attach(&relay.url, alice.token(0).unwrap()).await;
    const N: u64 = 30;
    for n in 1..=N {
        let st = alice_ws.ok("message.send", alice.send_params(&bob, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted");
    }
    let ns = notifications_until(&mut alice_ws, |ns| {
        (1..=N).all(|n| has_both(ns, &mid(n))) && timeline_count(ns) == N as usize
    })
    .await;
    let d = deliveries(&ns);
    let out_of_order: Vec<String> = (1..=N)
        .map(mid)
        .filter(|m| {
            let statuses: Vec<&str> = d.iter().filter(|(x, _, _)| x == m).map(|(_, s, _)| s.as_str()).collect();
            statuses != ["delivering", "target_accepted"]
        })
        .collect();
    assert!(out_of_order.is_empty(), "final status heard before `delivering` for {out_of_order:?}: {ns:?}");
    // The sent records' notifications come in sequence order.
    let seqs: Vec<u64> =
        ns.iter().filter(|n| n["method"] == "message.timeline.changed").map(|n| timeline_seq(n, alice.id())).collect();
    assert_eq!(seqs, (1..=N).collect::<Vec<_>>());
}

// ---- cursor and backlog -----------------------------------------------------

#[actix_rt::test]
async fn reconnect_after_missed_messages_delivers_the_backlog_exactly_once_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let send = |n: u64| {
        let (c, p) = (c.clone(), alice.send_params(&bob, &mid(n), false));
        let token = alice.token(0).unwrap().to_string();
        async move { c.ok("message.send", Some(&token), &p).await }
    };

    // Online: two messages, synced and acked.
    let mut ws = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    assert!(ws.buffered().is_empty(), "nothing to catch up on yet");
    send(1).await;
    send(2).await;
    assert_eq!(next_timeline(&mut ws, bob.id()).await, 1);
    assert_eq!(next_timeline(&mut ws, bob.id()).await, 2);
    let mut cursor = 0;
    let got = sync_from(&mut ws, cursor, 100).await;
    assert_eq!(message_ids(&got), [mid(1), mid(2)]);
    cursor = *sequences(&got).last().unwrap();
    assert_eq!(ws.ok("message.timeline.ack", json!({"through": cursor})).await, json!({}));
    ws.close().await;

    // Offline: five more.
    for n in 3..=7 {
        send(n).await;
    }

    // Reconnect (header): one notification naming the latest record, then
    // the backlog from the cursor, in pages, in order, each record once.
    let mut ws = WsClient::connect(&relay.url, bob.token(0)).await;
    assert_eq!(next_timeline(&mut ws, bob.id()).await, 7);
    let backlog = sync_from(&mut ws, cursor, 2).await;
    assert_eq!(sequences(&backlog), [3, 4, 5, 6, 7]);
    assert_eq!(message_ids(&backlog), (3..=7).map(mid).collect::<Vec<_>>());
    // Partly acked, then offline again.
    ws.ok("message.timeline.ack", json!({"through": 5})).await;
    drop(ws);

    // Reconnect (attach frame): the backlog is again what lies beyond the
    // cursor, and the backlog notification precedes the attach answer.
    let mut ws = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    let early = ws.buffered();
    assert_eq!(early.len(), 1, "{early:?}");
    assert_eq!(timeline_seq(&early[0], bob.id()), 7);
    assert_eq!(sequences(&sync_from(&mut ws, 5, 100).await), [6, 7]);
    ws.ok("message.timeline.ack", json!({"through": 7})).await;
    // Live again: a new message arrives as a notification, not as backlog.
    send(8).await;
    assert_eq!(next_timeline(&mut ws, bob.id()).await, 8);
    assert_eq!(message_ids(&sync_from(&mut ws, 7, 100).await), [mid(8)]);
    ws.ok("message.timeline.ack", json!({"through": 8})).await;
    drop(ws);

    // All acked: reconnecting brings no backlog notification (it would come
    // before any answer).
    let mut ws = WsClient::connect(&relay.url, bob.token(0)).await;
    assert_eq!(ws.ok("message.timeline.sync", json!({"after": 8})).await["records"], json!([]));
    assert_eq!(ws.buffered(), Vec::<Value>::new());
    let mut ws2 = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    assert_eq!(ws2.buffered(), Vec::<Value>::new());
}

#[actix_rt::test]
async fn ack_moves_only_the_sessions_own_cursor_and_only_forward() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let mut bob = User::register(&c, "relay-a", 2, true).await;
    bob.add_device(&c, "laptop", 70).await;
    for n in 1..=3 {
        c.ok("message.send", alice.token(0), &alice.params_to(0, bob.id(), &mid(n), now(), &["phone", "laptop"], None))
            .await;
    }
    let mut phone = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    assert_eq!(timeline_seq(&phone.buffered()[0], bob.id()), 3);

    // Beyond the last sequence: rejected.
    let r = phone.call("message.timeline.ack", json!({"through": 4})).await;
    assert_eq!(r["error"]["code"], "invalid_params", "{r}");
    assert_valid("RelayError.schema.json", &r["error"]);
    // A device named in the params is not the device acked: the session's is.
    assert_eq!(phone.ok("message.timeline.ack", json!({"through": 3, "device_id": "laptop"})).await, json!({}));
    // Backwards and repeated: ignored, `{}`.
    assert_eq!(phone.ok("message.timeline.ack", json!({"through": 1})).await, json!({}));
    assert_eq!(phone.ok("message.timeline.ack", json!({"through": 3})).await, json!({}));
    assert_eq!(phone.ok("message.timeline.ack", json!({"through": 0})).await, json!({}));
    let r = phone.call("message.timeline.ack", json!({"through": -1})).await;
    assert_eq!(r["error"]["code"], "invalid_params", "{r}");

    // The phone's cursor stayed at 3: no backlog on reconnect.
    let mut phone2 = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    assert_eq!(phone2.buffered(), Vec::<Value>::new());
    // The laptop's cursor never moved: its backlog is all three records.
    let mut laptop = WsClient::attach(&relay.url, bob.token(1).unwrap()).await;
    assert_eq!(timeline_seq(&laptop.buffered()[0], bob.id()), 3);
    assert_eq!(sequences(&sync_from(&mut laptop, 0, 100).await), [1, 2, 3]);
}

// ---- robustness -----------------------------------------------------------

#[actix_rt::test]
async fn a_slow_consumer_does_not_delay_another_device_of_the_same_account() {
    let dir = tempfile::tempdir().unwrap();
    // More requests may wait than the phone sends: what closes it is its
    // unread bytes, not the request cap.
    let relay = RelayProc::start(dir.path(), "relay-a", "[websocket]\nqueue = 4\nmax_requests_in_flight = 100\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let mut bob = User::register(&c, "relay-a", 2, true).await;
    bob.add_device(&c, "laptop", 70).await;
    let both = ["phone", "laptop"];

    // Large records, for the slow device to ask for.
    const BIG: u64 = 8;
    for n in 1..=BIG {
        c.ok("message.send", alice.token(0), &params_sized(&alice, &bob, &mid(n), 48 << 10, &both)).await;
    }
    let mut laptop = WsClient::connect(&relay.url, bob.token(1)).await;
    assert_eq!(next_timeline(&mut laptop, bob.id()).await, BIG);
    assert_eq!(sync_from(&mut laptop, 0, 100).await.len(), BIG as usize);
    laptop.ok("message.timeline.ack", json!({"through": BIG})).await;

    // Sends one small message to both devices: its sequence and the time
    // from the send to the laptop's notification.
    let mut seq = BIG;
    let mut one = async |laptop: &mut WsClient| {
        seq += 1;
        let started = Instant::now();
        c.ok("message.send", alice.token(0), &params_sized(&alice, &bob, &mid(seq), 64, &both)).await;
        assert_eq!(next_timeline(laptop, bob.id()).await, seq);
        (seq, started.elapsed())
    };
    let mut baseline = vec![];
    for _ in 0..5 {
        baseline.push(one(&mut laptop).await.1);
    }

    // The phone attaches, asks for large pages again and again and never
    // reads: its TCP buffers, the socket's writer and then its relay-side
    // queue fill up.
    let mut phone = RawWs::connect(&relay.url, bob.token(0), Some(8 << 10)).expect("upgrade");
    const PAGES: usize = 80;
    for i in 0..PAGES {
        phone.send_text(
            &json!({"id": i, "method": "message.timeline.sync", "params": {"after": 0, "limit": 4}}).to_string(),
        );
    }
    // At least LIVE messages, and on (at most 10 × LIVE) until the relay
    // has dropped the phone's connection (its writer's timeout): on a
    // loaded machine the phone's buffers may fill only after the first
    // LIVE, and the check below needs messages sent while it was stuck.
    const LIVE: usize = 30;
    let mut live = vec![];
    while live.len() < LIVE || (live.len() < 10 * LIVE && c.metric("relay_websocket_connections ").await != Some(1.0)) {
        live.push(one(&mut laptop).await);
    }
    let seq = live.last().unwrap().0;

    // The phone, once it reads, finds its answers, the notifications its
    // writer took before it got stuck, and the close: slow consumer.
    let (frames, close) = phone.drain(Duration::from_secs(20));
    let answers = frames.iter().filter(|f| f.get("id").is_some()).count();
    let notified: Vec<u64> =
        frames.iter().filter(|f| f.get("id").is_none()).map(|f| timeline_seq(f, bob.id())).collect();
    println!("slow consumer: the phone got {answers} of {PAGES} answers, notifications {notified:?}, then {close:?}");
    let (code, reason) = close.expect("the relay closed the slow connection");
    assert_eq!(code, 4002);
    assert!(reason.starts_with("slow consumer"), "{reason}");
    // Messages past the last notification the phone's writer took were sent
    // while it was stuck (its queue of 4 then overflowed).
    let stuck_after = notified.iter().copied().max().unwrap_or(0);
    let mut stuck: Vec<Duration> = live.iter().filter(|(s, _)| *s > stuck_after).map(|(_, d)| *d).collect();
    assert!(stuck.len() >= 5, "the phone was stuck for only {} messages", stuck.len());
    let stats = |d: &mut Vec<Duration>| {
        d.sort();
        (d[d.len() / 2], d[d.len() - 1])
    };
    let (b_med, b_max) = stats(&mut baseline);
    let (s_med, s_max) = stats(&mut stuck);
    println!(
        "slow consumer: send -> laptop notified: before the phone connected median {b_med:?} max {b_max:?} (5 messages); \
         while the phone was stuck median {s_med:?} max {s_max:?} ({} messages)",
        stuck.len()
    );
    assert!(s_max < Duration::from_secs(2), "the laptop waited {s_max:?} for a notification");

    // Nothing is lost: the phone reconnects and syncs from its cursor (0).
    let mut phone = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    assert_eq!(timeline_seq(&phone.buffered()[0], bob.id()), seq);
    assert_eq!(sequences(&sync_from(&mut phone, 0, 500).await), (1..=seq).collect::<Vec<_>>());
}

#[actix_rt::test]
async fn a_revoked_device_is_disconnected_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let mut bob = User::register(&c, "relay-a", 2, true).await;
    bob.add_device(&c, "laptop", 70).await;
    let mut laptop_header = WsClient::connect(&relay.url, bob.token(1)).await;
    let mut laptop_attach = WsClient::attach(&relay.url, bob.token(1).unwrap()).await;
    let mut phone = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;

    let revocation = bob.account.revocation("laptop", now());
    assert_eq!(phone.ok("device.revoke", json!({"revocation": revocation})).await, json!({}));
    for ws in [&mut laptop_header, &mut laptop_attach] {
        let (code, reason) = close_code(&ws.closed(WAIT).await);
        assert_eq!((code, reason.as_str()), (4002, "device revoked"));
    }
    // The revoked device's session is refused over the socket.
    let mut again = WsClient::connect(&relay.url, None).await;
    let r = again.call("session.attach", json!({"token": bob.token(1).unwrap()})).await;
    assert_eq!(r["error"]["code"], "unauthorized", "{r}");
    // The phone's socket is untouched.
    assert_eq!(phone.ok("message.timeline.sync", json!({"after": 0})).await["records"], json!([]));
    assert!(!phone.is_closed());
}

#[actix_rt::test]
async fn a_revoked_devices_token_cannot_open_a_socket_by_header() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let mut alice = User::register(&c, "relay-a", 1, false).await;
    alice.add_device(&c, "laptop", 70).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    c.ok("device.revoke", alice.token(0), &json!({"revocation": alice.account.revocation("laptop", now())})).await;

    match WsClient::try_connect(&relay.url, alice.token(1)).await {
        Err(status) => assert_eq!(status, 401),
        Ok(mut ws) => {
            // What the revoked device hears: its former account's delivery
            // statuses.
            c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
            let heard = ws.notification(Duration::from_secs(2)).await;
            panic!("the upgrade succeeded for a revoked device; it then heard {heard:?}");
        }
    }
}

#[actix_rt::test]
async fn session_expiry_closes_the_socket_with_a_clear_reason() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[sessions]\nttl = \"2s\"\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let started = Instant::now();
    let mut by_header = WsClient::connect(&relay.url, alice.token(0)).await;
    let mut by_attach = WsClient::attach(&relay.url, alice.token(0).unwrap()).await;
    for ws in [&mut by_header, &mut by_attach] {
        let (code, reason) = close_code(&ws.closed(WAIT).await);
        assert_eq!((code, reason.as_str()), (4001, "session expired"));
    }
    println!("closed {:?} after attaching a 2 s session", started.elapsed());
    assert_eq!(WsClient::try_connect(&relay.url, alice.token(0)).await.err(), Some(401));
}

#[actix_rt::test]
async fn pongs_keep_a_connection_open_and_a_silent_one_is_closed_as_idle() {
    let dir = tempfile::tempdir().unwrap();
    let relay =
        RelayProc::start(dir.path(), "relay-a", "[websocket]\nping_interval = \"200ms\"\nidle_timeout = \"800ms\"\n");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let mut answering = WsClient::connect(&relay.url, alice.token(0)).await;
    // A raw client reads (so it sees the pings) but never answers them; on
    // its own thread, while the other client keeps reading here.
    // Timed from before the upgrade, which starts the relay's idle clock:
    // the thread below may start well after it on a loaded machine.
    let started = Instant::now();
    let mut silent = RawWs::connect(&relay.url, alice.token(0), None).expect("upgrade");
    let silent = std::thread::spawn(move || {
        let mut pings = 0;
        loop {
            match silent.frame(WAIT) {
                Some(common::ws::RawFrame::Ping) => pings += 1,
                Some(common::ws::RawFrame::Close(code, reason)) => return (started.elapsed(), pings, (code, reason)),
                other => panic!("unexpected {other:?}"),
            }
        }
    });
    // The client that answers pings (when it reads) outlives the timeout.
    assert_eq!(answering.notification(Duration::from_millis(2000)).await, None);
    assert!(!answering.is_closed());
    assert_eq!(answering.ok("message.timeline.sync", json!({"after": 0})).await["records"], json!([]));

    let (idle, pings, close) = silent.join().unwrap();
    println!("silent connection closed after {idle:?} and {pings} pings: {close:?}");
    assert_eq!(close, (1001, "idle timeout".to_string()));
    assert!(pings >= 2, "{pings}");
    assert!(idle >= Duration::from_millis(700), "{idle:?}");
}

#[test]
fn a_zero_ping_interval_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = common::relay::write_config(dir.path(), "relay-a", "[websocket]\nping_interval = \"0s\"\n");
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_relay"));
    cmd.args(["serve", "--config"]).arg(&cfg);
    match common::relay::start_line_or_exit(cmd) {
        Ok(line) => panic!("the relay started with websocket.ping_interval = 0s: {line}"),
        Err(err) => assert!(err.contains("ping_interval"), "{err}"),
    }
}

// ---- bounded memory for clients that do not read ----------------------------

/// VmRSS of a process, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Small budgets so the test is quick: 1 MiB pages, 1 MiB unread per
/// socket, writes and flow pings answered within 1 s.
const TIGHT: &str = "[websocket]\nwrite_timeout = \"1s\"\nmax_unread_bytes = 1048576\nmax_requests_in_flight = 64\n\
                     [limits]\nmax_page_bytes = 1048576\n";

/// 60 messages of 60 KiB ciphertext (~80 KiB of base64 each) from a new
/// account to `bob` (a public account), sent over HTTP.
async fn big_timeline(c: &Client, bob: &User) {
    let alice = User::register(c, "relay-a", 1, false).await;
    for n in 1..=60 {
        c.ok("message.send", alice.token(0), &params_sized(&alice, bob, &mid(n), 60 << 10, &["phone"])).await;
    }
}

#[actix_rt::test]
async fn a_socket_that_stops_reading_is_closed_and_the_relay_memory_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", TIGHT);
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    big_timeline(&c, &bob).await;
    // Warm up: the whole timeline read once over HTTP (caches filled).
    assert_eq!(bob.sync_all(&c, 0).await.len(), 60);
    let baseline = rss_kib(relay.pid());

    // 40 syncs of the whole timeline (~4.8 MB each without the page cap)
    // on a socket that never reads and never answers pings.
    let mut reader = RawWs::connect(&relay.url, bob.token(0), Some(8 << 10)).expect("upgrade");
    for i in 0..40 {
        reader.send_text(&json!({"id": i, "method": "message.timeline.sync", "params": {"after": 0}}).to_string());
    }
    let started = Instant::now();
    let mut peak = baseline;
    eventually("the relay closes the non-reading socket", Duration::from_secs(15), || {
        // Sampled at every look, so the peak is seen while the socket is held.
        peak = peak.max(rss_kib(relay.pid()));
        std::future::ready(if reader.relay_holds_it() { Err("still open".to_string()) } else { Ok(()) })
    })
    .await;
    let closed_after = started.elapsed();
    // Memory comes back once the relay let go of the socket.
    let after = eventually("the relay's RSS comes back", Duration::from_secs(10), || {
        let after = rss_kib(relay.pid());
        std::future::ready(if after > baseline + 16 * 1024 { Err(format!("{after} KiB")) } else { Ok(after) })
    })
    .await;
    println!(
        "non-reading socket closed after {closed_after:?}; relay RSS baseline {baseline} KiB, peak {peak} KiB \
         (+{} KiB), after {after} KiB",
        peak - baseline
    );
    assert!(peak < baseline + 32 * 1024, "RSS grew by {} KiB during the flood", peak - baseline);
    assert!(after <= baseline + 16 * 1024, "RSS {after} KiB did not come back near {baseline} KiB");

    // The relay is fine: the same device syncs everything over a new socket.
    let mut ws = WsClient::connect(&relay.url, bob.token(0)).await;
    assert_eq!(sync_from(&mut ws, 0, 100).await.len(), 60);
}

#[actix_rt::test]
async fn a_socket_that_reads_gets_every_answer_in_order_in_pages_capped_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", TIGHT);
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    big_timeline(&c, &bob).await;

    // Over HTTP: a page of 100 stops at 1 MiB with has_more; the pages
    // together hold all 60 records, in order.
    let page = c.ok("message.timeline.sync", bob.token(0), &json!({"after": 0, "limit": 100})).await;
    let first = page["records"].as_array().unwrap().len();
    assert!((1..60).contains(&first), "{first} records in a 1 MiB page");
    assert!(serde_json::to_vec(&page).unwrap().len() <= 1 << 20);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["next"], first as u64, "next is the last record served, not the one left out");
    assert_eq!(sequences(&bob.sync_all(&c, 0).await), (1..=60).collect::<Vec<_>>());

    // Over the socket: the same 40 requests, pipelined, from a client that
    // reads (and answers the relay's flow pings as it reads).
    let mut ws = WsClient::connect(&relay.url, bob.token(0)).await;
    for i in 0..40 {
        ws.send_text(json!({"id": i, "method": "message.timeline.sync", "params": {"after": 0}}).to_string()).await;
    }
    for i in 0..40 {
        let a = ws.answer().await;
        assert_eq!(a["id"], i, "answers keep request order");
        assert_eq!(a["result"]["records"].as_array().unwrap().len(), first, "{}", a["id"]);
    }
    assert!(!ws.is_closed());
    assert_eq!(ws.ok("route.get", json!({"account_id": bob.id()})).await["account_id"], bob.id());
}

#[actix_rt::test]
async fn requests_past_the_cap_in_flight_close_the_socket_with_a_clear_reason() {
    let dir = tempfile::tempdir().unwrap();
    let relay =
        RelayProc::start(dir.path(), "relay-a", "[websocket]\nmax_requests_in_flight = 4\nmax_unread_bytes = 1024\n");
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    // A client that sends without reading (nor answering pings): once a few
    // error answers used up its 1 KiB budget, requests 1..4 wait (or run)
    // and the fifth is one too many.
    let mut raw = RawWs::connect(&relay.url, bob.token(0), None).expect("upgrade");
    let slow = "{\"id\":0,\"method\":\"message.send\",\"params\":{}}";
    for _ in 0..50 {
        raw.send_text(slow);
    }
    let (_, close) = raw.drain(WAIT);
    let (code, reason) = close.expect("the relay closed the socket");
    assert_eq!((code, reason.as_str()), (1008, "more than 4 requests in flight"));
}

#[actix_rt::test]
async fn a_socket_that_never_attaches_is_closed_after_the_attach_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[websocket]\nattach_timeout = \"500ms\"\n");
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut attached = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    let mut stranger = WsClient::connect(&relay.url, None).await;
    let started = Instant::now();
    // Session-less methods work meanwhile.
    assert_eq!(stranger.ok("route.get", json!({"account_id": bob.id()})).await["account_id"], bob.id());
    let (code, reason) = close_code(&stranger.closed(WAIT).await);
    assert_eq!((code, reason.as_str()), (1008, "no session attached within websocket.attach_timeout"));
    assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
    // The attached socket, older than the timeout, stays.
    assert_eq!(attached.ok("message.timeline.sync", json!({"after": 0})).await["records"], json!([]));
    assert!(!attached.is_closed());
}
