//! Cross-relay delivery between real relays on loopback.

use crate::common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use common::schema::assert_valid;
use common::wait::eventually;
use serde_json::json;
use std::time::Duration;

#[actix_rt::test]
async fn message_crosses_from_its_source_relay_to_the_recipients_home_relay() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;

    // A sender builds key boxes from the recipient's devices, fetched through its own relay.
    let devices = ca.ok("account.devices.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    assert_valid("methods/account.devices.get.result.schema.json", &devices);
    assert_eq!(devices["certificates"][0]["device_id"], "phone");

    let status = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
    let received = bob.sync_all(&cb, 0).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0]["envelope"]["message_id"], mid(1));
    let sent = alice.sync_all(&ca, 0).await;
    assert_eq!(sent[0]["delivery"]["status"], "target_accepted");
}

/// A millisecond-scale timetable so retries happen within a test.
pub(crate) const FAST: &str = "[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\nattempt_timeout = \"1s\"\n";

/// Polls `message.delivery.status` until `done` holds (bounded).
async fn wait_status(
    c: &Client,
    user: &User,
    message_id: &str,
    secs: u64,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    eventually(&format!("status of {message_id}"), Duration::from_secs(secs), || async {
        let st = c.ok("message.delivery.status", user.token(0), &json!({"message_id": message_id})).await;
        if done(&st) {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await
}

/// Waits until relay `c` has made `n` attempts that reached no relay.
pub(crate) async fn wait_unreached_attempts(c: &Client, n: f64) {
    eventually(&format!("{n} unreached attempts"), Duration::from_secs(20), || async {
        match c.metric(r#"relay_delivery_attempts_total{outcome="not_attempted"}"#).await.unwrap_or(0.0) {
            got if got >= n => Ok(()),
            got => Err(format!("{got} unreached attempts")),
        }
    })
    .await
}

/// Waits until relay `c` has no delivery armed (`relay_deliveries_in_flight` 0).
async fn wait_nothing_in_flight(c: &Client) {
    eventually("no delivery in flight", Duration::from_secs(20), || async {
        match c.metric("relay_deliveries_in_flight").await {
            Some(0.0) => Ok(()),
            n => Err(format!("relay_deliveries_in_flight {n:?}")),
        }
    })
    .await
}

fn terminal(st: &serde_json::Value) -> bool {
    st["status"] != "delivering"
}

#[actix_rt::test]
async fn destination_down_then_up_before_the_deadline_receives_the_message_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", &format!("{FAST}[limits]\ndelivery_age_limit = \"20s\"\n"));
    let mut b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await; // relay-a learns bob's route (asking its peers: a session holder may)
    b.kill9();

    let status = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "delivering", "{status}");
    wait_unreached_attempts(&ca, 3.0).await; // a few attempts fail
    b.restart();
    let cb = Client::new(&b.url);
    let st = wait_status(&ca, &alice, &mid(1), 15, terminal).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    assert_eq!(st["accepted_at"], status["accepted_at"]);
    assert_eq!(bob.sync_all(&cb, 0).await.len(), 1);
}

#[actix_rt::test]
async fn destination_down_past_the_deadline_fails_with_message_expired() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", &format!("{FAST}[limits]\ndelivery_age_limit = \"2s\"\n"));
    let mut b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    b.kill9();

    ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    let st = wait_status(&ca, &alice, &mid(1), 10, terminal).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["code"], "message_expired");
    assert_valid("DeliveryStatus.schema.json", &st);
    // The sent record stays, with the final status.
    let sent = alice.sync_all(&ca, 0).await;
    assert_eq!(sent[0]["delivery"]["status"], "failed");
    // Terminal is terminal: bringing the destination back changes nothing.
    // Not vacuous: a later message reaches relay-b, and then no delivery is
    // armed at relay-a, so none of the failed one can still come.
    b.restart();
    let later = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(2), true)).await;
    assert_ne!(later["status"], "failed", "{later}");
    let later = wait_status(&ca, &alice, &mid(2), 10, terminal).await;
    assert_eq!(later["status"], "target_accepted", "{later}");
    wait_nothing_in_flight(&ca).await;
    assert_eq!(wait_status(&ca, &alice, &mid(1), 1, terminal).await, st);
    let received = bob.sync_all(&Client::new(&b.url), 0).await;
    assert_eq!(common::client::message_ids(&received), [mid(2)], "only the later message");
}

#[actix_rt::test]
async fn in_flight_delivery_follows_the_recipient_when_it_moves_home() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    // The second attempt comes 5 s after the first: relay-b is back and Bob
    // has moved by then, so it meets the move (not the old home, as a
    // faster retry could), and then follows it.
    let slow_second =
        "[delivery]\nretry_timetable = [\"0s\", \"5s\"]\nretry_then_every = \"500ms\"\nattempt_timeout = \"1s\"\n";
    let a = cluster.start("relay-a", &format!("{slow_second}[limits]\ndelivery_age_limit = \"30s\"\n"));
    let mut b = cluster.start("relay-b", "");
    let c = cluster.start("relay-c", "");
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let mut bob = User::register(&cb, "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    b.kill9();
    ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;

    // Bob moves home to relay-c (route revision 2) while the delivery waits.
    b.restart();
    let cb = Client::new(&b.url);
    let route2 = bob.account.route(2, &[("relay-c", cluster.url("relay-c"))], common::client::now());
    let cert = bob.account.certificate(&bob.devices[0], common::client::now(), None);
    cc.ok(
        "account.register",
        None,
        &bob.account.register_params(&route2, &cert, "relay-c", true, common::client::now()),
    )
    .await;
    let moved = cb.ok("route.update", bob.token(0), &json!({"route": route2})).await;
    assert_eq!(moved["revision"], 2);
    // The old home keeps the new route and sends callers there.
    let stale = cb.call("message.send", bob.token(0), &bob.send_params(&bob, &mid(9), false)).await;
    assert_eq!(stale.1["error"]["code"], "route_stale", "{stale:?}");
    assert_eq!(stale.1["error"]["data"]["route"]["revision"], 2);

    let st = wait_status(&ca, &alice, &mid(1), 25, terminal).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    bob.relay_id = "relay-c".into();
    bob.tokens[0] = bob.open_session(&cc, 0).await;
    assert_eq!(bob.sync_all(&cc, 0).await.len(), 1, "delivered at the new home");
}

#[actix_rt::test]
async fn unauthenticated_relay_calls_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let http = awc::Client::default();
    let body = br#"{"account_id":"00000000000000000000000000000000"}"#;
    let url = format!("{}/v1/relay/route.get", a.url);
    let ts = common::client::now();
    let good_key = ed25519_dalek::SigningKey::from_bytes(&[201; 32]); // relay-b's seed (Cluster::plan)
    let wrong_key = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let sign = |k: &ed25519_dalek::SigningKey, ts: u64| {
        relay_schemas::sign::sign_relay_request(k, "route.get", "relay-a", ts, body)
    };
    let cases: Vec<(Option<&str>, u64, String)> = vec![
        (None, ts, sign(&good_key, ts)),
        (Some("relay-x"), ts, sign(&good_key, ts)),
        (Some("relay-b"), ts, sign(&wrong_key, ts)),
        (Some("relay-b"), ts - 3600, sign(&good_key, ts - 3600)),
    ];
    for (id, ts, sig) in cases {
        let mut req =
            http.post(&url).insert_header(("Relay-Timestamp", ts.to_string())).insert_header(("Relay-Signature", sig));
        if let Some(id) = id {
            req = req.insert_header(("Relay-Id", id));
        }
        let mut resp = req.send_body(&body[..]).await.unwrap();
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(resp.status().as_u16(), 401, "{id:?}: {v}");
        assert_eq!(v["error"]["code"], "unauthorized");
    }
    // The right key and a fresh timestamp get in (and learn nothing: no route).
    let mut resp = http
        .post(&url)
        .insert_header(("Relay-Id", "relay-b"))
        .insert_header(("Relay-Timestamp", ts.to_string()))
        .insert_header(("Relay-Signature", sign(&good_key, ts)))
        .send_body(&body[..])
        .await
        .unwrap();
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "route_not_found", "{v}");
}

/// Wake on inbound (Synapse resets a destination's backoff when it calls):
/// relay-b comes back after its deliveries' first attempts failed; their
/// next slot is an hour away, but as soon as relay-b calls relay-a they are
/// attempted and delivered, each once, with their acceptance unchanged.
#[actix_rt::test]
async fn a_peer_that_comes_back_and_calls_gets_its_pending_deliveries_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let hourly =
        "[delivery]\nretry_timetable = [\"0s\", \"1h\"]\nretry_then_every = \"1h\"\nattempt_timeout = \"1s\"\n\
                  [limits]\ndelivery_age_limit = \"2h\"\n";
    let a = cluster.start("relay-a", hourly);
    let mut b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, true).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let carol = User::register(&cb, "relay-b", 3, false).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    b.kill9();
    let mut accepted = vec![];
    for n in 1..=3 {
        let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), false)).await;
        assert_eq!(st["status"], "delivering", "{st}");
        accepted.push(st["accepted_at"].clone());
    }

    b.restart();
    let cb = Client::new(&b.url);
    // relay-b calls relay-a (Carol writes to Alice): relay-a hears it is up.
    let st = cb.ok("message.send", carol.token(0), &carol.send_params(&alice, &mid(100), false)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    for n in 1..=3 {
        let st = wait_status(&ca, &alice, &mid(n), 15, terminal).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
        assert_eq!(st["accepted_at"], accepted[n as usize - 1]);
    }
    // Each once (woken together, they may arrive in any order).
    let mut received = common::client::message_ids(&bob.sync_all(&cb, 0).await);
    received.sort();
    assert_eq!(received, [mid(1), mid(2), mid(3)]);
}
