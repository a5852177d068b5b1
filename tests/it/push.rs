//! Web Push (PROTOCOL §9) against a push-service stand-in on loopback that
//! decrypts every push with the subscription's private key, as a browser
//! would, and checks its VAPID header.
//!
//! "No push" checks are made non-vacuous by a later push: the stand-in gets
//! the later record's push, so an earlier one would have been seen before it.

use crate::common;

use common::client::{mid, now, Client, User};
use common::push_service::{check_vapid, Answer, PushService, Subscriber};
use common::relay::{audit, RelayProc};
use common::schema::assert_valid;
use common::wait::eventually;
use common::ws::WsClient;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Bound of every wait for a push.
const WAIT: Duration = Duration::from_secs(20);

/// Push settings for tests: http endpoints on loopback, a short interval.
fn push_config(min_interval: &str) -> String {
    format!("[push]\nallow_http_endpoints = true\nallow_private_endpoints = true\nmin_interval = \"{min_interval}\"\nbackoff = \"200ms\"\n")
}

async fn subscribe(c: &Client, user: &User, device: usize, sub: &Subscriber) {
    let params = sub.params();
    assert_valid("methods/push.subscribe.params.schema.json", &params);
    let res = c.ok("push.subscribe", user.token(device), &params).await;
    assert_eq!(res, json!({}));
}

/// Alice (public discovery off is irrelevant: Bob allows anyone) and Bob
/// with devices `phone` (0) and `laptop` (1) on one relay.
async fn alice_and_bob(c: &Client) -> (User, User) {
    let alice = User::register(c, "relay-a", 1, false).await;
    let mut bob = User::register(c, "relay-a", 2, true).await;
    bob.add_device(c, "laptop", 77).await;
    (alice, bob)
}

/// One relay with `config`, a push-service stand-in, and Alice and Bob
/// ([`alice_and_bob`]). Destructured by each test; `_dir` keeps the data
/// dir alive.
struct World {
    _dir: tempfile::TempDir,
    service: PushService,
    relay: RelayProc,
    c: Client,
    alice: User,
    bob: User,
}

impl World {
    async fn start(config: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let service = PushService::start();
        let relay = RelayProc::start(dir.path(), "relay-a", config);
        let c = Client::new(&relay.url);
        let (alice, bob) = alice_and_bob(&c).await;
        World { _dir: dir, service, relay, c, alice, bob }
    }
}

/// Bob's device `device` (0 phone, 1 laptop) subscribed at the stand-in's
/// endpoint `name`.
async fn subscribed(c: &Client, service: &PushService, bob: &User, device: usize, name: &str) -> Subscriber {
    let sub = Subscriber::new(service.endpoint(name));
    subscribe(c, bob, device, &sub).await;
    sub
}

/// Alice sends message `n` to Bob with boxes for `devices`.
async fn send(c: &Client, alice: &User, bob: &User, n: u64, devices: &[&str]) {
    let params = alice.params_to(0, bob.id(), &mid(n), now(), devices, None);
    let status = c.ok("message.send", alice.token(0), &params).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
}

async fn metric(c: &Client, name: &str) -> f64 {
    c.metric(name).await.unwrap_or(0.0)
}

/// Polls `/metrics` until `name` reaches `want` (bounded by WAIT).
async fn wait_metric(c: &Client, name: &str, want: f64) {
    eventually(&format!("{name} reaches {want}"), WAIT, || async {
        match metric(c, name).await {
            got if got >= want => Ok(()),
            got => Err(format!("{name} = {got}")),
        }
    })
    .await
}

fn payload(bob: &User, sequence: u64) -> Value {
    json!({"type": "timeline.changed", "account_id": bob.id(), "sequence": sequence})
}

#[actix_rt::test]
async fn a_message_to_an_offline_device_is_one_push_that_decrypts_to_the_documented_payload() {
    let World { _dir, service, relay: _relay, c, alice, bob } = World::start(&push_config("1s")).await;
    let vapid = c.ok("push.vapid_key", None, &json!({})).await;
    assert_valid("methods/push.vapid_key.result.schema.json", &vapid);
    let vapid = vapid["public_key"].as_str().unwrap().to_string();
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;

    send(&c, &alice, &bob, 1, &["phone"]).await;
    let pushes = service.wait_for("bob-phone", 1, WAIT).await;
    let push = &pushes[0];
    // Exactly the documented payload: no content, no sender.
    assert_eq!(phone.decrypt(push), payload(&bob, 1));
    check_vapid(push, &vapid, &service.base);
    assert_eq!(push.header("urgency"), Some("high"));
    assert!(push.header("ttl").and_then(|t| t.parse::<u64>().ok()).is_some_and(|t| t > 0));
    assert!(!String::from_utf8_lossy(&push.body).contains("ciphertext"));

    // One push per record: the next record's push is the second one.
    // Waits for push.min_interval (1 s) to pass: the relay process's per-device push timer, not observable.
    actix_rt::time::sleep(Duration::from_millis(1100)).await;
    send(&c, &alice, &bob, 2, &["phone"]).await;
    let pushes = service.wait_for("bob-phone", 2, WAIT).await;
    let got: Vec<Value> = pushes.iter().map(|p| phone.decrypt(p)).collect();
    assert_eq!(got, [payload(&bob, 1), payload(&bob, 2)]);
    assert_eq!(service.all().len(), 2, "nothing else was pushed");
    assert_eq!(metric(&c, "relay_push_sent_total{outcome=\"sent\"}").await, 2.0);
}

#[actix_rt::test]
async fn no_push_while_the_device_has_a_websocket_open() {
    let World { _dir, service, relay, c, alice, bob } = World::start(&push_config("1s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    let laptop = subscribed(&c, &service, &bob, 1, "bob-laptop").await;

    let ws = WsClient::attach(&relay.url, bob.token(0).unwrap()).await;
    send(&c, &alice, &bob, 1, &["phone", "laptop"]).await;
    // The laptop, offline, is woken; the phone, connected, is not.
    let laptop_pushes = service.wait_for("bob-laptop", 1, WAIT).await;
    assert_eq!(laptop.decrypt(&laptop_pushes[0]), payload(&bob, 1));

    ws.close().await;
    wait_for_no_connections(&c).await;
    send(&c, &alice, &bob, 2, &["phone"]).await;
    let phone_pushes = service.wait_for("bob-phone", 1, WAIT).await;
    assert_eq!(phone_pushes.len(), 1);
    assert_eq!(phone.decrypt(&phone_pushes[0]), payload(&bob, 2), "record 1 was never pushed to the phone");
}

async fn wait_for_no_connections(c: &Client) {
    eventually("the socket closes", WAIT, || async {
        match metric(c, "relay_websocket_connections").await {
            n if n > 0.0 => Err(format!("{n} connections")),
            _ => Ok(()),
        }
    })
    .await
}

#[actix_rt::test]
async fn no_push_for_a_device_outside_the_records_visible_set() {
    let World { _dir, service, relay: _relay, c, alice, bob } = World::start(&push_config("1s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    let laptop = subscribed(&c, &service, &bob, 1, "bob-laptop").await;

    // Record 1 has a box for the phone only: the laptop may not read it.
    send(&c, &alice, &bob, 1, &["phone"]).await;
    let phone_pushes = service.wait_for("bob-phone", 1, WAIT).await;
    assert_eq!(phone.decrypt(&phone_pushes[0]), payload(&bob, 1));
    // Record 2 is the laptop's: its first and only push names record 2.
    send(&c, &alice, &bob, 2, &["laptop"]).await;
    let laptop_pushes = service.wait_for("bob-laptop", 1, WAIT).await;
    assert_eq!(laptop_pushes.len(), 1);
    assert_eq!(laptop.decrypt(&laptop_pushes[0]), payload(&bob, 2));
    assert_eq!(service.pushes("bob-phone").len(), 1, "record 2 is not the phone's either");
}

#[actix_rt::test]
async fn a_410_answer_removes_the_subscription_as_an_account_event() {
    let World { _dir, service, mut relay, c, alice, bob } = World::start(&push_config("1s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    let laptop = subscribed(&c, &service, &bob, 1, "bob-laptop").await;
    service.always("bob-phone", Answer::status(410));

    send(&c, &alice, &bob, 1, &["phone"]).await;
    service.wait_for("bob-phone", 1, WAIT).await;
    wait_metric(&c, "relay_push_sent_total{outcome=\"gone\"}", 1.0).await;
    // The subscription is gone once its event is written: records to both
    // devices until one wakes the laptop and not the phone (were it kept,
    // every record would reach the phone's endpoint again, and this would
    // run into its deadline).
    let mut n = 2;
    let deadline = Instant::now() + WAIT;
    loop {
        // Waits for push.min_interval (1 s) to pass: the relay process's per-device push timer, not observable.
        actix_rt::time::sleep(Duration::from_millis(1100)).await;
        send(&c, &alice, &bob, n, &["phone", "laptop"]).await;
        let pushes = service.wait_for("bob-laptop", (n - 1) as usize, WAIT).await;
        assert_eq!(laptop.decrypt(pushes.last().unwrap()), payload(&bob, n));
        if service.pushes("bob-phone").len() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "the gone subscription is still used");
        n += 1;
    }
    assert_eq!(service.pushes("bob-phone").len(), 1, "no push after 410");

    // It was an account event: the audit of the stopped relay shows it.
    relay.terminate();
    let stream = format!("account/{}", bob.id());
    let config = relay.config.to_str().unwrap();
    let (code, out, err) = audit(&["--config", config, "export", "--stream", &stream]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for l in &lines {
        assert_valid("audit/export-line.schema.json", l);
    }
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(types.iter().filter(|t| **t == "push_subscribed").count(), 2, "{types:?}");
    let gone: Vec<&Value> = lines.iter().filter(|l| l["type"] == "push_unsubscribed").collect();
    assert_eq!(gone.len(), 1, "{types:?}");
    assert_eq!(
        gone[0]["data"]["push_unsubscribed"],
        json!({"device_id": "phone", "endpoint": phone.endpoint, "reason": "gone"})
    );
    let (code, out, _) = audit(&["--config", config, "verify"]);
    assert_eq!(code, 0, "{out}");
}

#[actix_rt::test]
async fn a_429_with_retry_after_is_honoured() {
    let World { _dir, service, relay: _relay, c, alice, bob } = World::start(&push_config("1s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    service.script("bob-phone", vec![Answer::status(429).with_header("Retry-After", "2")]);

    send(&c, &alice, &bob, 1, &["phone"]).await;
    let pushes = service.wait_for("bob-phone", 2, WAIT).await;
    let gap = pushes[1].at - pushes[0].at;
    assert!(gap >= Duration::from_secs(2), "retried after {gap:?}, before Retry-After: 2");
    assert!(gap < Duration::from_secs(10), "retried after {gap:?}");
    assert_eq!(phone.decrypt(&pushes[1]), payload(&bob, 1));
    wait_metric(&c, "relay_push_sent_total{outcome=\"sent\"}", 1.0).await;
    assert_eq!(metric(&c, "relay_push_sent_total{outcome=\"retry\"}").await, 1.0);
}

#[actix_rt::test]
async fn a_flood_of_messages_is_coalesced_by_min_interval() {
    let interval = Duration::from_secs(2);
    let World { _dir, service, relay: _relay, c, alice, bob } = World::start(&push_config("2s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;

    let started = Instant::now();
    const FLOOD: u64 = 20;
    for n in 1..=FLOOD {
        send(&c, &alice, &bob, n, &["phone"]).await;
    }
    let flood_took = started.elapsed();
    // Wait for the push that names the last record.
    let pushes = eventually(&format!("a push naming record {FLOOD}"), WAIT, || {
        let pushes = service.pushes("bob-phone");
        std::future::ready(if pushes.last().is_some_and(|p| phone.decrypt(p)["sequence"] == FLOOD) {
            Ok(pushes)
        } else {
            Err(format!("{} pushes", pushes.len()))
        })
    })
    .await;
    let sequences: Vec<u64> = pushes.iter().map(|p| phone.decrypt(p)["sequence"].as_u64().unwrap()).collect();
    assert_eq!(sequences[0], 1, "the first record wakes the device at once");
    assert!(sequences.windows(2).all(|w| w[0] < w[1]), "{sequences:?}");
    for w in pushes.windows(2) {
        assert!(w[1].at - w[0].at >= interval, "two pushes within push.min_interval: {sequences:?}");
    }
    // At most one push per interval while the flood lasted, plus the first.
    let most = 2 + (flood_took.as_millis() / interval.as_millis()) as usize;
    assert!(pushes.len() <= most, "{} pushes for {FLOOD} records in {flood_took:?}", pushes.len());
    assert!(metric(&c, "relay_push_sent_total{outcome=\"coalesced\"}").await >= 1.0);
}

#[actix_rt::test]
async fn subscriptions_survive_a_restart_leave_with_a_revoked_device_and_unsubscribe_stops_pushes() {
    let World { _dir, service, mut relay, c, alice, mut bob } = World::start(&push_config("1s")).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    let laptop = subscribed(&c, &service, &bob, 1, "bob-laptop").await;

    relay.restart();
    let c = Client::new(&relay.url);
    let alice = User { tokens: vec![alice.open_session(&c, 0).await], ..alice };
    bob.tokens = vec![bob.open_session(&c, 0).await, bob.open_session(&c, 1).await];
    send(&c, &alice, &bob, 1, &["phone", "laptop"]).await;
    assert_eq!(phone.decrypt(&service.wait_for("bob-phone", 1, WAIT).await[0]), payload(&bob, 1));
    assert_eq!(laptop.decrypt(&service.wait_for("bob-laptop", 1, WAIT).await[0]), payload(&bob, 1));

    // The laptop is revoked; the phone unsubscribes and subscribes anew.
    let revocation = bob.account.revocation("laptop", now());
    c.ok("device.revoke", bob.token(0), &json!({"revocation": revocation})).await;
    c.ok("push.unsubscribe", bob.token(0), &json!({})).await;
    // Waits for push.min_interval (1 s) to pass: the relay process's per-device push timer, not observable.
    actix_rt::time::sleep(Duration::from_millis(1100)).await;
    send(&c, &alice, &bob, 2, &["phone", "laptop"]).await;
    let phone2 = subscribed(&c, &service, &bob, 0, "bob-phone-2").await;
    send(&c, &alice, &bob, 3, &["phone", "laptop"]).await;
    let pushes = service.wait_for("bob-phone-2", 1, WAIT).await;
    assert_eq!(phone2.decrypt(&pushes[0]), payload(&bob, 3));
    assert_eq!(service.pushes("bob-phone").len(), 1, "unsubscribed: no push for record 2 or 3");
    assert_eq!(service.pushes("bob-laptop").len(), 1, "revoked: no push for record 2 or 3");
}

#[actix_rt::test]
async fn push_subscribe_checks_its_params_and_needs_a_session() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let bob = User::register(&c, "relay-a", 2, true).await;
    let good = Subscriber::new("https://push.example.net/x".into()).params();
    assert_eq!(c.err("push.subscribe", None, &good).await, "unauthorized");
    assert_eq!(c.ok("push.subscribe", bob.token(0), &good).await, json!({}));
    let mut http = good.clone();
    http["endpoint"] = json!("http://push.example.net/x");
    assert_eq!(c.err("push.subscribe", bob.token(0), &http).await, "invalid_params", "http refused by default");
    // No probing of the operator's own network through push endpoints.
    for inward in ["https://127.0.0.1:8443/x", "https://[::1]/x", "https://localhost/x", "https://10.1.2.3/x"] {
        let mut p = good.clone();
        p["endpoint"] = json!(inward);
        assert_eq!(c.err("push.subscribe", bob.token(0), &p).await, "invalid_params", "{inward} refused by default");
    }
    let mut off_curve = good.clone();
    let mut point = vec![4u8];
    point.extend([1u8; 64]);
    off_curve["keys"]["p256dh"] = json!(relay_schemas::encoding::b64_encode(&point));
    assert_eq!(c.err("push.subscribe", bob.token(0), &off_curve).await, "invalid_params");
    let mut short_auth = good.clone();
    short_auth["keys"]["auth"] = json!("AAAA");
    assert_eq!(c.err("push.subscribe", bob.token(0), &short_auth).await, "invalid_params");
    assert_eq!(c.err("push.unsubscribe", None, &json!({})).await, "unauthorized");
    assert_eq!(c.ok("push.unsubscribe", bob.token(0), &json!({})).await, json!({}));
    let key = c.ok("push.vapid_key", None, &json!({})).await;
    let bytes = relay_schemas::encoding::b64_decode("k", key["public_key"].as_str().unwrap()).unwrap();
    assert_eq!((bytes.len(), bytes[0]), (65, 4), "an uncompressed P-256 point");
    // The key was generated on first start, private to the relay's user.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(relay.data_dir.join("vapid.key")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

/// A push service that sends its answer's head and then stalls the body
/// does not hold the device's slot: the next record's push still goes out.
#[actix_rt::test]
async fn a_push_service_stalling_its_answer_does_not_block_the_next_push() {
    let World { _dir, service, relay: _relay, c, alice, bob } =
        World::start(&format!("{}timeout = \"500ms\"\n", push_config("200ms"))).await;
    let phone = subscribed(&c, &service, &bob, 0, "bob-phone").await;
    service.script("bob-phone", vec![Answer::status(201).stalling()]);

    send(&c, &alice, &bob, 1, &["phone"]).await;
    service.wait_for("bob-phone", 1, WAIT).await;
    send(&c, &alice, &bob, 2, &["phone"]).await;
    let pushes = service.wait_for("bob-phone", 2, WAIT).await;
    assert_eq!(phone.decrypt(&pushes[1]), payload(&bob, 2));
}
