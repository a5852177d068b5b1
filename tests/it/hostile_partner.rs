//! What a partner home is trusted with (PROTOCOL §5 *What a partner home
//! may replicate*), and what one peer's reads cost another's deliveries:
//! the reproductions of issue 38's items 2, 3 and 7 against real relays on
//! loopback, a scripted stand-in (`FakePeer`, holding a real relay key)
//! playing the hostile partner home or the remote home.

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::fake_peer::{FakePeer, Reply};
use common::relay::RelayProc;
use common::wait::eventually;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::b64_encode;
use serde_json::{json, Value};
use std::time::Duration;

/// Replication rounds and delivery retries within a test's time.
const FAST: &str = "[replication]\ninterval = \"300ms\"\n[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\nattempt_timeout = \"1s\"\n";

const LIMIT: Duration = Duration::from_secs(20);

/// relay-a, alice's home with the stand-in partner `relay-f` as her other
/// home, and bob's home `relay-g` (a stand-in that takes deliveries).
struct Homes {
    relay: RelayProc,
    c: Client,
    partner: FakePeer,
    bobs_home: FakePeer,
    alice: User,
    bob: Account,
    bob_phone: Device,
    /// Bob's one route (a relay refuses another route of the same revision).
    bob_route: Value,
    _dir: tempfile::TempDir,
}

async fn homes(limits: &str) -> Homes {
    let dir = tempfile::tempdir().unwrap();
    let partner = FakePeer::start("relay-f", dir.path(), 61);
    let bobs_home = FakePeer::start("relay-g", dir.path(), 62);
    let extra = format!("{}{}{FAST}{limits}", partner.peer_toml(), bobs_home.peer_toml());
    let relay = RelayProc::start(dir.path(), "relay-a", &extra);
    let c = Client::new(&relay.url);
    let alice = User::register_two_homes(&c, 1, [("relay-a", &relay.url), ("relay-f", &partner.url)], false).await;
    let bob = Account::from_seed([2; 32]);
    let bob_phone = Device::from_seed("phone", [102; 32]);
    let bob_route = bob.route(1, &[("relay-g", &bobs_home.url)], now());
    bobs_home.set_route(&bob.id, bob_route.clone());
    Homes { relay, c, partner, bobs_home, alice, bob, bob_phone, bob_route, _dir: dir }
}

fn alice_route(h: &Homes) -> Value {
    h.alice.account.route(1, &[("relay-a", &h.relay.url), ("relay-f", &h.partner.url)], now())
}

fn page(items: Vec<Value>) -> Value {
    let next = items.iter().filter_map(|i| i["sequence"].as_u64()).max().unwrap_or(0);
    json!({"items": items, "next": next, "has_more": false})
}

fn settings_item(sequence: u64, public_discovery: bool, at: u64) -> Value {
    json!({"sequence": sequence, "event": {"settings_updated": {"public_discovery": public_discovery, "at": at}}})
}

/// A `message_received` event as a home writes it: `envelope` for alice's phone.
fn received_item(sequence: u64, from: &str, envelope: Value, sender_certificate: Value) -> Value {
    let t = now();
    let message_id = envelope["message_id"].clone();
    json!({"sequence": sequence, "event": {"message_received": {
        "from": from, "message_id": message_id, "digest": "d", "accepted_at": t, "retention_until": t + 86_400,
        "record": {"sequence": 1, "expires_at": t + 86_400, "envelope": envelope,
                   "boxes": [key_box("phone", b"box")], "visible": ["phone"]},
        "sender_certificate": sender_certificate}}})
}

/// A `message_sent` of alice's still delivering at the partner: its event
/// (with `deadline`), its status and its delivery's params.
fn sent_item(h: &Homes, sequence: u64, device: usize, message_id: &str, created_at: u64, deadline: u64) -> Value {
    let d = &h.alice.devices[device];
    let envelope = d.envelope(h.alice.id(), &h.bob.id, message_id, created_at, b"ciphertext bytes");
    let deliver = json!({"envelope": envelope, "recipient_boxes": [key_box("phone", b"box")],
        "sender_device_certificate": h.alice.account.certificate(d, now() - 60, None),
        "sender_route": alice_route(h)});
    json!({"sequence": sequence,
        "event": {"message_sent": {"message_id": message_id, "to": h.bob.id, "digest": "d",
            "accepted_at": created_at, "deadline": deadline, "retention_until": now() + 86_400,
            "record": {"sequence": 1, "expires_at": now() + 86_400, "envelope": envelope,
                       "boxes": [key_box("phone", b"own box")], "visible": ["phone"]}}},
        "status": {"status": "delivering", "accepted_at": created_at},
        "deliver": deliver})
}

/// relay-a's `timeline.replicate` pulls of alice from the partner.
fn pulls(h: &Homes) -> Vec<Value> {
    let alice = h.alice.id();
    h.partner.requests_of("timeline.replicate").iter().map(|r| r.json()).filter(|v| v["account_id"] == alice).collect()
}

/// Waits until relay-a has pulled the partner's current page and then
/// pulled again twice (so it has decided that page).
async fn pulled_again(h: &Homes) -> Vec<Value> {
    let from = pulls(h).len();
    eventually("relay-a pulling the partner's page, then again twice", LIMIT, || async {
        match pulls(h) {
            p if p.len() >= from + 3 => Ok(p[from..].to_vec()),
            p => Err(format!("{} pulls", p.len() - from)),
        }
    })
    .await
}

#[actix_rt::test]
async fn a_replicated_received_record_with_a_forged_envelope_for_another_account_is_refused_with_its_page() {
    let h = homes("").await;
    let carol = Account::from_seed([3; 32]);
    let mut envelope = h.bob_phone.envelope(&h.bob.id, &carol.id, &mid(1), now(), b"ciphertext bytes");
    envelope["signature"] = json!(b64_encode(&[0u8; 64]));
    let cert = h.bob.certificate(&h.bob_phone, now() - 60, None);
    h.partner
        .set_page(h.alice.id(), page(vec![settings_item(1, true, now()), received_item(2, &h.bob.id, envelope, cert)]));

    let seen = pulled_again(&h).await;
    assert!(h.alice.sync_all(&h.c, 0).await.is_empty(), "the forged record landed in alice's timeline");
    // Nothing of the page was applied: relay-a never acknowledges it.
    assert!(seen.iter().all(|p| p["after"] == 0), "relay-a moved past the refused page: {seen:?}");
}

#[actix_rt::test]
async fn a_replicated_record_kept_without_its_certificate_is_checked_against_the_senders_home() {
    let h = homes("").await;
    let envelope = h.bob_phone.envelope(&h.bob.id, h.alice.id(), &mid(1), now(), b"ciphertext bytes");
    let cert = h.bob.certificate(&h.bob_phone, now() - 60, None);
    // As a partner stores a record it accepted before it kept certificates.
    let mut item = received_item(1, &h.bob.id, envelope, Value::Null);
    item["event"]["message_received"].as_object_mut().unwrap().remove("sender_certificate");
    h.bobs_home.set_devices(&h.bob.id, json!({"certificates": [cert], "revocations": []}));
    h.partner.set_page(h.alice.id(), page(vec![item]));
    eventually("the record at relay-a", LIMIT, || async {
        match h.alice.sync_all(&h.c, 0).await.len() {
            1 => Ok(()),
            n => Err(format!("{n} records")),
        }
    })
    .await;
    assert!(!h.bobs_home.requests_of("account.devices.get").is_empty(), "bob's home was asked for his devices");
}

#[actix_rt::test]
async fn a_replicated_send_from_a_device_this_relay_revoked_is_not_delivered() {
    let mut h = homes("").await;
    h.alice.add_device(&h.c, "laptop", 111).await;
    let created = now() - 5;
    // relay-a revokes the laptop; the partner offers a send of it still delivering.
    h.c.ok("device.revoke", h.alice.token(0), &json!({"revocation": h.alice.account.revocation("laptop", now())}))
        .await;
    // In the same page, a send from the phone, which is delivered: when it
    // is accepted after three attempts, the laptop's (due at the same
    // times) would have been attempted too.
    for _ in 0..2 {
        h.bobs_home.script(&mid(2), [Reply::error("temporarily_unavailable")]);
    }
    let far = now() + 3_600;
    h.partner.set_page(
        h.alice.id(),
        page(vec![sent_item(&h, 1, 1, &mid(1), created, far), sent_item(&h, 2, 0, &mid(2), created, far)]),
    );

    eventually("the phone's send delivered from relay-a", LIMIT, || async {
        match h.c.call("message.delivery.status", h.alice.token(0), &json!({"message_id": mid(2)})).await {
            (200, st) if st["status"] == "target_accepted" => Ok(()),
            (_, st) => Err(st.to_string()),
        }
    })
    .await;
    assert_eq!(h.bobs_home.deliveries(&mid(2)).len(), 3);
    assert!(h.bobs_home.deliveries(&mid(1)).is_empty(), "relay-a delivered the revoked laptop's message as its own");
}

#[actix_rt::test]
async fn a_replicated_deliverys_deadline_is_recomputed_not_taken_from_the_page() {
    let h = homes("[limits]\ndelivery_age_limit = \"6s\"\n").await;
    h.bobs_home.set_default(Reply::error("temporarily_unavailable"));
    let created = now();
    h.partner.set_page(h.alice.id(), page(vec![sent_item(&h, 1, 0, &mid(1), created, now() + 1_000_000_000)]));

    // created_at + delivery_age_limit: failed then, however long the page said.
    let st = eventually("the replicated send failing at its recomputed deadline", LIMIT, || async {
        match h.c.call("message.delivery.status", h.alice.token(0), &json!({"message_id": mid(1)})).await {
            (200, st) if st["status"] == "failed" => Ok(st),
            (_, st) => Err(format!("{st} after {} attempts at relay-g", h.bobs_home.deliveries(&mid(1)).len())),
        }
    })
    .await;
    assert_eq!(st["error"]["code"], "message_expired", "{st}");
    assert!(!h.bobs_home.deliveries(&mid(1)).is_empty(), "relay-a delivered it meanwhile");
}

/// bob's `message.deliver` to alice at relay-a without authorization,
/// signed as bob's home: accepted only while alice allows public discovery.
async fn strangers_delivery(h: &Homes, n: u64) -> (u16, Value) {
    let env = h.bob_phone.envelope(&h.bob.id, h.alice.id(), &mid(n), now(), b"ciphertext bytes");
    let p = json!({"envelope": env, "recipient_boxes": [key_box("phone", b"box")],
        "sender_device_certificate": h.bob.certificate(&h.bob_phone, now() - 60, None),
        "sender_route": h.bob_route});
    h.c.relay_call("relay-a", "relay-g", &h.bobs_home.signing_key(), "message.deliver", &p).await
}

#[actix_rt::test]
async fn a_replicated_settings_time_in_the_far_future_is_clamped_and_pins_nothing() {
    let h = homes("[limits]\nclock_tolerance = \"2s\"\n").await;
    let t0 = now();
    let pinned = settings_item(1, true, t0 + 1_000_000_000);
    h.partner.set_page(h.alice.id(), page(vec![pinned.clone()]));
    eventually("public discovery on at relay-a", LIMIT, || async {
        match strangers_delivery(&h, 1).await {
            (200, st) if st["status"] == "target_accepted" => Ok(()),
            (_, e) => Err(e.to_string()),
        }
    })
    .await;
    // A real change at the partner, later than t0 + clock_tolerance (where
    // the far-future time is clamped to): it wins.
    eventually("the clock past t0 + 2s", LIMIT, || async {
        if now() > t0 + 2 {
            Ok(())
        } else {
            Err(now().to_string())
        }
    })
    .await;
    h.partner.set_page(h.alice.id(), page(vec![pinned, settings_item(2, false, now())]));
    // A new message each time: one accepted proves discovery is still on.
    let n = std::cell::Cell::new(100);
    eventually("public discovery off again at relay-a", LIMIT, || async {
        n.set(n.get() + 1);
        match strangers_delivery(&h, n.get()).await {
            (403, e) if e["error"]["code"] == "forbidden" => Ok(()),
            (_, v) => Err(v.to_string()),
        }
    })
    .await;
}

#[actix_rt::test]
async fn replication_does_not_bring_an_account_back_on_a_route_it_left() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-c", "relay-d"]);
    // relay-o: the relay the account left, holding its revision-1 route.
    let old = FakePeer::start("relay-o", dir.path(), 63);
    let c = cluster.start("relay-c", &format!("{}{FAST}", old.peer_toml()));
    let d = cluster.start("relay-d", &format!("{}{FAST}", old.peer_toml()));
    let (cc, cd) = (Client::new(&c.url), Client::new(&d.url));
    let alice = Account::from_seed([1; 32]);
    let phone = Device::from_seed("phone", [101; 32]);
    let t = now();
    let r1 = alice.route(1, &[("relay-o", &old.url), ("relay-c", &c.url)], t - 60);
    let r2 = alice.route(2, &[("relay-d", &d.url)], t);
    // The account lives at relay-d now (relay-c never had it).
    let cert = alice.certificate(&phone, t - 60, None);
    cd.ok("account.register", None, &alice.register_params(&r2, &cert, "relay-d", true, t)).await;
    old.set_route(&alice.id, r1.clone());
    let registered = json!({"registered": {"route": r1, "device_certificate": cert, "public_discovery": true,
        "params_digest": "d", "registration": alice.registration("relay-o", true, t - 60)}});
    old.set_page(
        &alice.id,
        json!({"items": [{"sequence": 1, "event": registered}], "next": 1, "has_more": false, "route": r1}),
    );

    // relay-o nudges relay-c: "pull alice from me".
    let nudge = json!({"account_id": alice.id, "after": 0, "limit": 100, "notify": true});
    let (status, v) = cc.relay_call("relay-c", "relay-o", &old.signing_key(), "timeline.replicate", &nudge).await;
    assert_eq!(status, 200, "{v}");
    let challenge = json!({"account_id": alice.id, "device_id": "phone"});
    // relay-c pulled the page, then took the account, or refused the page.
    let refused = "relay_replication_items_total{outcome=\"refused\"}";
    let took = eventually("relay-c deciding relay-o's page", LIMIT, || async {
        if cc.call("session.challenge", None, &challenge).await.0 == 200 {
            return Ok(true);
        }
        match cc.metric(refused).await {
            Some(n) if n >= 1.0 => Ok(false),
            n => Err(format!("{} pulls, {n:?} refused", old.requests_of("timeline.replicate").len())),
        }
    })
    .await;
    assert!(!took, "relay-c took the account on the route it left");
    assert!(cc.call("session.challenge", None, &challenge).await.0 != 200, "nothing of the account is stored");

    // A message to alice at relay-c is not accepted into a copy nobody uses.
    let bob = Account::from_seed([2; 32]);
    let bob_phone = Device::from_seed("phone", [102; 32]);
    let br = bob.route(1, &[("relay-d", &d.url)], now());
    cd.ok(
        "account.register",
        None,
        &bob.register_params(&br, &bob.certificate(&bob_phone, now(), None), "relay-d", false, now()),
    )
    .await;
    let env = bob_phone.envelope(&bob.id, &alice.id, &mid(1), now(), b"ciphertext bytes");
    let p = json!({"envelope": env, "recipient_boxes": [key_box("phone", b"box")],
        "sender_device_certificate": bob.certificate(&bob_phone, now(), None), "sender_route": br});
    let d_key = ed25519_dalek::SigningKey::from_bytes(&[201; 32]); // relay-d (Cluster::plan member 1)
    let (status, v) = cc.relay_call("relay-c", "relay-d", &d_key, "message.deliver", &p).await;
    assert_ne!(v["status"], "target_accepted", "{status} {v}");
    let code = v["error"]["code"].as_str().unwrap_or_default();
    assert!(code == "route_stale" || code == "target_not_local", "{v}");
    if code == "route_stale" {
        assert_eq!(v["error"]["data"]["route"]["revision"], 2, "the route it has now: {v}");
    }
}

/// relay-a (strangers' and senders' relay) and relay-b (alice's home, with
/// a scaled-down delivery budget per peer).
#[actix_rt::test]
async fn a_strangers_loop_of_remote_device_reads_does_not_hold_up_anothers_delivery() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", FAST);
    let b = cluster.start("relay-b", &format!("{FAST}[limits]\npeer_rate = 2\npeer_burst = 2\n"));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&cb, "relay-b", 1, true).await;
    let stranger = User::register(&ca, "relay-a", 3, false).await;
    let sender = User::register(&ca, "relay-a", 4, false).await;
    let read = json!({"account_id": alice.id()});
    let ask = ca.ok("account.devices.get", stranger.token(0), &read).await;
    assert_eq!(ask["certificates"].as_array().map(Vec::len), Some(1), "{ask}");

    let sent = std::cell::Cell::new(false);
    let reads = async {
        // The loop, for as long as the message is under way (bounded).
        for _ in 0..2_000 {
            if sent.get() {
                break;
            }
            ca.call("account.devices.get", stranger.token(0), &read).await;
        }
    };
    let delivery = async {
        ca.ok("message.send", sender.token(0), &sender.send_params(&alice, &mid(1), false)).await;
        let st = eventually("the sender's message accepted at relay-b", Duration::from_secs(5), || async {
            match ca.call("message.delivery.status", sender.token(0), &json!({"message_id": mid(1)})).await {
                (200, st) if st["status"] == "target_accepted" => Ok(st),
                (_, st) => Err(st.to_string()),
            }
        });
        let st = st.await;
        sent.set(true);
        st
    };
    let (_, st) = futures_util::join!(reads, delivery);
    assert_eq!(st["status"], "target_accepted");
}

#[actix_rt::test]
async fn repeated_reads_of_a_remote_accounts_devices_make_one_upstream_call() {
    let dir = tempfile::tempdir().unwrap();
    let home = FakePeer::start("relay-h", dir.path(), 64);
    let a = RelayProc::start(dir.path(), "relay-a", &home.peer_toml());
    let ca = Client::new(&a.url);
    let stranger = User::register(&ca, "relay-a", 3, false).await;
    let remote = Account::from_seed([9; 32]);
    let phone = Device::from_seed("phone", [109; 32]);
    home.set_route(&remote.id, remote.route(1, &[("relay-h", &home.url)], now()));
    home.set_devices(&remote.id, json!({"certificates": [remote.certificate(&phone, now(), None)], "revocations": []}));
    let read = json!({"account_id": remote.id});
    for _ in 0..10 {
        let v = ca.ok("account.devices.get", stranger.token(0), &read).await;
        assert_eq!(v["certificates"].as_array().map(Vec::len), Some(1), "{v}");
    }
    assert_eq!(
        home.requests_of("account.devices.get").len(),
        1,
        "one upstream call for ten reads within the cache time"
    );
}
