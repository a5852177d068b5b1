//! Who may do what (PROTOCOL §2 *Registration*, §5 *Who may deliver*) and
//! what a stranger can make a relay hold: the reproductions of the attacks
//! on two peered relays and a standalone one, each against real relays on
//! loopback.

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::relay::RelayProc;
use common::wait::eventually;
use ed25519_dalek::SigningKey;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::encoding::b64_encode;
use relay_schemas::sign::Tag;
use serde_json::{json, Value};
use std::time::Duration;

/// relay-b's key in a two-member cluster plan (member 1).
fn relay_b_key() -> SigningKey {
    SigningKey::from_bytes(&[201; 32])
}

/// An account registered at `relay_id` under `route` with `devices[0]`,
/// with a session for each device (added with `device.add`).
async fn account_with(c: &Client, relay_id: &str, seed: u8, route: &Value, names: &[&str]) -> User {
    let account = Account::from_seed([seed; 32]);
    let devices: Vec<Device> =
        names.iter().enumerate().map(|(i, n)| Device::from_seed(n, [seed.wrapping_add(100 + i as u8); 32])).collect();
    let cert = account.certificate(&devices[0], now(), None);
    c.ok("account.register", None, &account.register_params(route, &cert, relay_id, false, now())).await;
    let mut user = User { account, devices, tokens: vec![], relay_id: relay_id.into() };
    let first = user.open_session(c, 0).await;
    user.tokens.push(first);
    for i in 1..user.devices.len() {
        let cert = user.account.certificate(&user.devices[i], now(), None);
        c.ok("device.add", user.token(0), &json!({"device_certificate": cert})).await;
        let token = user.open_session(c, i).await;
        user.tokens.push(token);
    }
    user
}

/// The reproduction: an account at revision 2 on relay-a revoked its
/// laptop; relay-b, its second home under the old revision 1, already knew
/// revision 2. A registration at relay-b from public objects alone (the old
/// route, the revoked certificate, unsigned `public_discovery: true`) must
/// not make relay-b serve the account.
#[actix_rt::test]
async fn a_registration_cannot_be_made_from_public_objects() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let (a, b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let r1 = Account::from_seed([5; 32]).route(1, &[("relay-a", &a.url), ("relay-b", &b.url)], now());
    let s = account_with(&ca, "relay-a", 5, &r1, &["phone", "laptop"]).await;
    let laptop_cert = s.account.certificate(&s.devices[1], now(), None);
    ca.ok("device.revoke", s.token(0), &json!({"revocation": s.account.revocation("laptop", now())})).await;
    let r2 = s.account.route(2, &[("relay-a", &a.url)], now());
    ca.ok("route.update", s.token(0), &json!({"route": r2})).await;
    // relay-b learns revision 2: from relay-a, which tells the home the
    // account left (`timeline.replicate` answers it `route_stale`).
    let r = User::register(&cb, "relay-b", 6, true).await;
    eventually("relay-b knows revision 2", Duration::from_secs(10), || async {
        let route = cb.ok("route.get", r.token(0), &json!({"account_id": s.id()})).await;
        if route["revision"] == 2 {
            Ok(())
        } else {
            Err(route.to_string())
        }
    })
    .await;

    // The attack as reproduced: public objects and unsigned settings.
    let replay = json!({"route": r1, "device_certificate": laptop_cert, "settings": {"public_discovery": true}});
    assert_eq!(cb.err("account.register", None, &replay).await, "invalid_params");
    // A registration signed by anyone but the account key.
    let attacker = Account::from_seed([66; 32]);
    let mut forged = s.account.registration("relay-b", true, now());
    forged = common::client::resign(Tag::Registration, &forged, &attacker.key);
    let with_forged = json!({"route": r1, "device_certificate": laptop_cert, "registration": forged});
    assert_eq!(cb.err("account.register", None, &with_forged).await, "invalid_signature");
    // A real registration of the account key made for another relay, or too
    // old to be fresh, does not travel either.
    let for_a = s.account.register_params(&r1, &laptop_cert, "relay-a", true, now());
    assert_eq!(cb.err("account.register", None, &for_a).await, "invalid_params");
    let stale = s.account.register_params(&r1, &laptop_cert, "relay-b", true, now() - 3600);
    assert_eq!(cb.err("account.register", None, &stale).await, "invalid_params");
    // Even the account key's own fresh registration cannot bring back the
    // old route: relay-b knows revision 2. (Or, when relay-b pulled the
    // account from relay-a before it moved, it knows the revocation too and
    // refuses the revoked laptop first.)
    let old_route = s.account.register_params(&r1, &laptop_cert, "relay-b", true, now());
    let body = cb.err_body("account.register", None, &old_route).await;
    match body["error"]["code"].as_str() {
        Some("route_stale") => assert_eq!(body["error"]["data"]["route"], r2),
        Some("device_unknown") => {}
        _ => panic!("{body}"),
    }

    // relay-b serves nothing for the account: no session for the laptop.
    // (`not_found` if the account moved before relay-b pulled it from
    // relay-a; `route_stale`, naming the new route, if relay-b holds a copy
    // from when it was a home.)
    let ask = json!({"account_id": s.id(), "device_id": "laptop"});
    let code = cb.err("session.challenge", None, &ask).await;
    assert!(code == "not_found" || code == "route_stale", "{code}");
}

/// The reproduction: an account living only on relay-a revoked its laptop;
/// relay-b signed a `message.deliver` carrying an envelope of that laptop
/// to relay-a itself. Only a home relay of the sender under the route the
/// message was accepted with may deliver, and the sender's own home checks
/// the device.
#[actix_rt::test]
async fn a_peer_cannot_deliver_as_a_sender_it_does_not_serve() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let (a, _b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let ca = Client::new(&a.url);
    let r1 = Account::from_seed([5; 32]).route(1, &[("relay-a", &a.url)], now());
    let s = account_with(&ca, "relay-a", 5, &r1, &["phone", "laptop"]).await;
    ca.ok("device.revoke", s.token(0), &json!({"revocation": s.account.revocation("laptop", now())})).await;
    let r = User::register(&ca, "relay-a", 6, true).await;

    let deliver = |device: usize, n: u64, sender_route: Option<&Value>| {
        let d = &s.devices[device];
        let env = d.envelope(s.id(), r.id(), &mid(n), now(), b"ciphertext bytes");
        let mut p = json!({"envelope": env, "recipient_boxes": [key_box("phone", b"box")],
                           "sender_device_certificate": s.account.certificate(d, now(), None)});
        if let Some(route) = sender_route {
            p["sender_route"] = route.clone();
        }
        p
    };
    let key = relay_b_key();
    let call = |p: Value| {
        let (ca, key) = (ca.clone(), key.clone());
        async move { ca.relay_call("relay-a", "relay-b", &key, "message.deliver", &p).await }
    };
    let forbidden = |(status, body): (u16, Value)| {
        assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    };
    // As reproduced: no sender_route at all.
    forbidden(call(deliver(1, 1, None)).await);
    // The sender's real route names relay-a only.
    forbidden(call(deliver(1, 2, Some(&r1))).await);
    // A route naming relay-b, signed by anyone but the account key.
    let forged = common::client::resign(Tag::Route, &s.account.route(3, &[("relay-b", "http://b")], now()), &key);
    forbidden(call(deliver(1, 3, Some(&forged))).await);
    assert!(r.sync_all(&ca, 0).await.is_empty(), "nothing reached the recipient");

    // The account makes relay-b its second home: relay-b may now deliver
    // as it, but relay-a, which serves it too, still refuses the revoked
    // laptop; the phone's message is accepted once.
    let r2 = s.account.route(2, &[("relay-a", &a.url), ("relay-b", "http://b")], now());
    ca.ok("route.update", s.token(0), &json!({"route": r2})).await;
    forbidden(call(deliver(1, 4, Some(&r2))).await);
    let (status, body) = call(deliver(0, 5, Some(&r2))).await;
    assert_eq!((status, body["status"].as_str()), (200, Some("target_accepted")), "{body}");
    let records = r.sync_all(&ca, 0).await;
    assert_eq!(common::client::message_ids(&records), [mid(5)]);
}

/// A stranger's garbage (random account ids, bad signatures) is refused
/// before any actor exists: with 3,000 refused registrations the relay
/// holds no account actor and its memory grows by less than 32 MiB (it
/// used to keep one actor per request, ~1.8 KB each, for good).
#[actix_rt::test]
async fn a_flood_of_refused_registrations_leaves_no_actor_and_bounded_memory() {
    const N: usize = 3_000;
    const BOUND: u64 = 32 << 20;
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    c.assert_healthy().await;
    let before = relay_bench::report::rss_bytes(relay.pid()).unwrap();
    let bodies: Vec<Value> = (0..N)
        .map(|i| {
            let key = b64_encode(&rand::random::<[u8; 32]>());
            let id = hex::encode(rand::random::<[u8; 16]>());
            let sig = b64_encode(&[i as u8; 64]);
            json!({
                "route": {"account_id": id, "account_key": key, "revision": 1,
                          "relays": [{"id": "relay-a", "url": relay.url}], "issued_at": now(), "signature": sig},
                "device_certificate": {"account_id": id, "account_key": key, "device_id": "phone",
                    "device_key": key, "box_key": key, "issued_at": now(), "signature": sig},
                "registration": {"account_id": id, "relay_id": "relay-a", "public_discovery": true,
                                 "issued_at": now(), "signature": sig},
            })
        })
        .collect();
    for chunk in bodies.chunks(N / 8) {
        let calls = chunk.iter().map(|b| c.call("account.register", None, b));
        for (status, body) in futures_util::future::join_all(calls).await {
            assert!(matches!(status, 400), "{body}");
        }
    }
    let after = relay_bench::report::rss_bytes(relay.pid()).unwrap();
    assert_eq!(c.metric("relay_account_actors_resident").await.unwrap_or(0.0), 0.0);
    assert!(after.saturating_sub(before) < BOUND, "RSS {before} -> {after} bytes after {N} refused registrations");
    c.assert_healthy().await;
}

/// The reproduction: random `route.get`s from strangers at relay-b were
/// fanned out to relay-a, spent relay-b's budget there, and a real user's
/// send to a new relay-a account got `route_not_found`. Strangers are now
/// answered from relay-b's own route book: relay-a hears none of them.
#[actix_rt::test]
async fn a_route_get_flood_from_strangers_does_not_starve_a_real_send() {
    const N: usize = 2_000;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let (a, b) = (cluster.start("relay-a", ""), cluster.start("relay-b", ""));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let sender = User::register(&cb, "relay-b", 1, false).await;
    let recipient = User::register(&ca, "relay-a", 2, true).await;

    // (Registering asked the peers once per account.)
    let lookups = r#"relay_requests_total{method="relay/route.get""#;
    let before = ca.metric(lookups).await.unwrap_or(0.0);
    let ids: Vec<Value> = (0..N).map(|_| json!({"account_id": hex::encode(rand::random::<[u8; 16]>())})).collect();
    for chunk in ids.chunks(N / 8) {
        let calls = chunk.iter().map(|p| cb.call("route.get", None, p));
        for (status, body) in futures_util::future::join_all(calls).await {
            assert_eq!((status, body["error"]["code"].as_str()), (404, Some("route_not_found")), "{body}");
        }
    }
    assert_eq!(ca.metric(lookups).await.unwrap_or(0.0), before, "strangers' lookups reached relay-a");

    // The first message to that account: relay-b asks relay-a and delivers.
    let st = cb.ok("message.send", sender.token(0), &sender.send_params(&recipient, &mid(1), false)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    assert_eq!(recipient.sync_all(&ca, 0).await.len(), 1);
}
