//! `message.deliver.batch` (PROTOCOL §5): the callee answers each item as a
//! single `message.deliver` would (idempotency included, so an item may be
//! retried singly), and a source sends the deliveries that queued behind a
//! call in flight to one peer as one batch, falling back to single calls
//! at a peer without the method. Real relays on loopback; the slow or old
//! peer is the fault proxy or a scripted fake.

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::fake_peer::{FakePeer, Reply};
use common::proxy::{Fault, Proxy};
use common::relay::RelayProc;
use common::schema::assert_valid_params;
use common::wait::eventually;
use relay_schemas::client::{Account, Device};
use relay_schemas::encoding::b64_encode;
use serde_json::{json, Value};
use std::time::Duration;

/// One call to a peer at a time, so deliveries queue behind it.
const ONE_IN_FLIGHT: &str = "[delivery]\nretry_timetable = [\"0s\", \"200ms\", \"500ms\", \"1s\"]\n\
retry_then_every = \"1s\"\nattempt_timeout = \"30s\"\nbatches_in_flight = 1\n";

fn key_box(device: &str) -> Value {
    json!({"device_id": device, "box": b64_encode(b"box")})
}

#[actix_rt::test]
async fn a_batch_answers_each_item_in_order_as_a_single_deliver_would() {
    // The test plays relay-t, a configured peer serving the sender dave.
    let peer_key = ed25519_dalek::SigningKey::from_bytes(&[42; 32]);
    let extra = format!(
        "[[peers]]\nid = \"relay-t\"\nurl = \"http://127.0.0.1:9\"\npublic_key = \"{}\"\n",
        b64_encode(peer_key.verifying_key().as_bytes())
    );
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", &extra);
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    let (dave, phone) = (Account::from_seed([67; 32]), Device::from_seed("phone", [167; 32]));
    let deliver = |to: &str, n: u64, served_by: &str| {
        json!({"envelope": phone.envelope(&dave.id, to, &mid(n), now(), b"ciphertext"),
               "recipient_boxes": [key_box("phone")],
               "sender_device_certificate": dave.certificate(&phone, now(), None),
               "sender_route": dave.route(1, &[(served_by, "http://127.0.0.1:9")], now())})
    };
    let ghost = Account::from_seed([66; 32]);
    let items = vec![
        deliver(bob.id(), 1, "relay-t"),
        // An account this relay does not serve.
        deliver(&ghost.id, 2, "relay-t"),
        // The sender's route does not name the caller.
        deliver(bob.id(), 3, "relay-z"),
        json!({"envelope": 5}),
        // Item 0 again: the stored answer.
        deliver(bob.id(), 1, "relay-t"),
    ];
    let batch = json!({ "items": items });
    assert_valid_params("message.deliver.batch", &json!({"items": [items[0].clone()]}));
    let (status, body) = c.relay_call("relay-a", "relay-t", &peer_key, "message.deliver.batch", &batch).await;
    assert_eq!(status, 200, "{body}");
    common::schema::assert_valid_result("message.deliver.batch", &body);
    let results = body["results"].as_array().unwrap();
    assert_eq!(results.len(), 5, "{body}");
    assert_eq!(results[0]["status"], "target_accepted", "{body}");
    assert_eq!(results[4], results[0], "a duplicate item is answered the stored result");
    let codes: Vec<_> = results[1..4].iter().map(|r| r["error"]["code"].as_str().unwrap_or("-")).collect();
    assert_eq!(codes, ["target_not_local", "forbidden", "invalid_params"], "{body}");
    // Each item alone gets what it got in the batch: item 0 is retried
    // singly with its first answer, the refusals are refused alike.
    for (i, item) in items.iter().enumerate() {
        let (_, single) = c.relay_call("relay-a", "relay-t", &peer_key, "message.deliver", item).await;
        if i == 3 {
            assert_eq!(single["error"]["code"], "invalid_params", "{single}");
        } else {
            assert_eq!(&single, &results[i], "item {i} alone");
        }
    }
    let records = bob.sync_all(&c, 0).await;
    assert_eq!(records.len(), 1, "one record for the item delivered twice in the batch and once alone");
    // Outside 1..=256 items, the batch is refused whole.
    for n in [0, 257] {
        let (status, body) = c
            .relay_call(
                "relay-a",
                "relay-t",
                &peer_key,
                "message.deliver.batch",
                &json!({"items": vec![items[0].clone(); n]}),
            )
            .await;
        assert_eq!((status, body["error"]["code"].as_str()), (400, Some("invalid_params")), "{n} items: {body}");
    }
    // A client cannot call it.
    assert_eq!(c.err("message.deliver.batch", bob.token(0), &batch).await, "not_found");
}

/// Sends `params[0]`; once its delivery is held at the peer (`held`),
/// sends the rest at once, and once each of those is accepted (its status
/// known at the source) calls `release`. A send answers after its first
/// attempt, so the answers come after the release: the statuses, in order.
async fn send_behind_a_held_call(
    c: &Client,
    alice: &User,
    params: &[Value],
    held: impl Fn() -> bool,
    release: impl Fn(),
) -> Vec<Value> {
    let send = |p: &Value| {
        let p = p.clone();
        async move { c.ok("message.send", alice.token(0), &p).await }
    };
    let status = |p: &Value| {
        let params = json!({ "message_id": p["envelope"]["message_id"] });
        async move { c.call("message.delivery.status", alice.token(0), &params).await }
    };
    let rest = async {
        eventually("the first delivery held at the peer", Duration::from_secs(10), || async {
            if held() {
                Ok(())
            } else {
                Err("not yet".to_string())
            }
        })
        .await;
        let accepted = async {
            eventually("every later send accepted", Duration::from_secs(20), || async {
                for p in &params[1..] {
                    let (code, st) = status(p).await;
                    if code != 200 {
                        return Err(format!("{}: {st}", p["envelope"]["message_id"]));
                    }
                }
                Ok(())
            })
            .await;
            release();
        };
        futures_util::future::join(futures_util::future::join_all(params[1..].iter().map(send)), accepted).await.0
    };
    let (first, rest) = futures_util::future::join(send(&params[0]), rest).await;
    std::iter::once(first).chain(rest).collect()
}

#[actix_rt::test]
async fn deliveries_queued_behind_a_call_in_flight_go_to_the_peer_as_one_batch() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let _b = cluster.start("relay-b", ONE_IN_FLIGHT);
    let proxy = Proxy::start(cluster.url("relay-b"));
    let a = cluster.start_via("relay-a", ("relay-b", &proxy.url), ONE_IN_FLIGHT);
    let (ca, cb) = (Client::new(&a.url), Client::new(cluster.url("relay-b")));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    // The first delivery is held at the proxy: the one call allowed is in
    // flight while the next twenty are accepted.
    proxy.fault_delivery(&mid(1), Fault::Hold, Some(1));
    let params: Vec<_> = (1..=21).map(|n| alice.send_params(&bob, &mid(n), false)).collect();
    let statuses =
        send_behind_a_held_call(&ca, &alice, &params, || !proxy.deliveries(&mid(1)).is_empty(), || proxy.release())
            .await;
    for st in &statuses {
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    let log = proxy.log();
    let batches: Vec<_> = log.iter().filter(|e| e.method == "message.deliver.batch").collect();
    assert_eq!(batches.len(), 1, "the twenty queued deliveries in one batch");
    assert_eq!(serde_json::from_slice::<Value>(&batches[0].body).unwrap()["items"].as_array().map(Vec::len), Some(20));
    assert_eq!(log.iter().filter(|e| e.method == "message.deliver").count(), 1, "only the first went alone");
    let mut ids = common::client::message_ids(&bob.sync_all(&cb, 0).await);
    ids.sort();
    assert_eq!(ids, (1..=21).map(mid).collect::<Vec<_>>(), "each message once");
}

#[actix_rt::test]
async fn a_peer_without_the_batch_method_gets_the_same_deliveries_singly() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakePeer::start("relay-b", dir.path(), 77);
    let mut extra = fake.peer_toml();
    extra.push_str(ONE_IN_FLIGHT);
    let a = RelayProc::start(dir.path(), "relay-a", &extra);
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = Account::from_seed([90; 32]);
    fake.set_route(&bob.id, bob.route(1, &[(fake.id.as_str(), fake.url.as_str())], now()));
    let params = |range: std::ops::RangeInclusive<u64>| -> Vec<Value> {
        range.map(|n| alice.params_to(0, &bob.id, &mid(n), now(), &["phone"], Some(&["phone"]))).collect()
    };
    // The first call is held, so the next ten queue behind it.
    fake.script(&mid(1), [Reply::Held]);
    let statuses = send_behind_a_held_call(
        &ca,
        &alice,
        &params(1..=11),
        || !fake.deliveries(&mid(1)).is_empty(),
        || fake.release(),
    )
    .await;
    for st in &statuses {
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    let batches = fake.requests_of("message.deliver.batch");
    assert_eq!(batches.len(), 1, "one batch tried, answered not_found");
    assert_eq!(batches[0].json()["items"].as_array().map(Vec::len), Some(10), "the ten queued deliveries");
    for n in 1..=11 {
        assert_eq!(fake.deliveries(&mid(n)).len(), 1, "{}: delivered alone, once", mid(n));
    }
    // The peer is remembered: deliveries queued again go singly, no batch.
    fake.script(&mid(12), [Reply::Held]);
    let statuses = send_behind_a_held_call(
        &ca,
        &alice,
        &params(12..=16),
        || !fake.deliveries(&mid(12)).is_empty(),
        || fake.release(),
    )
    .await;
    assert!(statuses.iter().all(|st| st["status"] == "target_accepted"), "{statuses:?}");
    assert_eq!(fake.requests_of("message.deliver.batch").len(), 1, "no second batch");
}
