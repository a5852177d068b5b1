//! Outages of the recipient's relay before the sender's relay ever learned
//! the recipient's route (PROTOCOL §4 *Route resolution at acceptance*, §6
//! deadline), against real relays on loopback: such a send is accepted
//! (`delivering`), delivered once the relay returns, `failed` with
//! `message_expired` at the deadline fixed at acceptance, survives a
//! SIGKILL of the source, and `relay audit message` says why no route was
//! known. A send is refused with `route_not_found` only when every peer is
//! up and says not found.

use crate::common;

use common::client::{message_ids, mid, now, Client, User};
use common::cluster::Cluster;
use common::relay::{audit, RelayProc};
use common::schema::assert_valid;
use common::wait::eventually;
use serde_json::{json, Value};
use std::time::Duration;

/// A fast timetable (attempts every 300 ms) so a returning relay is met
/// within a second; the deadline comes from `age`.
fn fast(age: &str) -> String {
    format!(
        "[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\n\
         attempt_timeout = \"1s\"\n[limits]\ndelivery_age_limit = \"{age}\"\n"
    )
}

/// Polls `message.delivery.status` of `user`'s `message_id` until `done`
/// holds; panics after `secs`.
async fn wait_status(c: &Client, user: &User, message_id: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
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

fn terminal(st: &Value) -> bool {
    st["status"] != "delivering"
}

/// `bob` is registered on relay-b and relay-a has never learned his route:
/// relay-a answers a stranger's `route.get` (what it knows, without asking
/// its peers) with `route_not_found`.
async fn assert_route_unknown(ca: &Client, bob: &User) {
    let code = ca.err("route.get", None, &json!({"account_id": bob.id()})).await;
    assert_eq!(code, "route_not_found", "relay-a already knows bob's route");
}

/// Sends `mid(n)` from alice to bob (whose relay is up) and waits until it
/// is `target_accepted`: a later arrival, which a duplicate of an earlier
/// message would have come before.
async fn send_accepted(ca: &Client, alice: &User, bob: &User, n: u64) {
    let st = ca.ok("message.send", alice.token(0), &alice.send_params(bob, &mid(n), true)).await;
    if st["status"] == "delivering" {
        // The first attempt outlived `attempt_timeout` (a loaded machine).
        let st = wait_status(ca, alice, &mid(n), 20, terminal).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
    } else {
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
}

/// Waits until relay `c` has made an attempt that reached no relay (no
/// route known, or the target refused the connection): the message has
/// waited for the outage, not slipped through before it.
async fn wait_unreached_attempt(c: &Client) {
    eventually("an unreached attempt", Duration::from_secs(20), || async {
        match c.metric(r#"relay_delivery_attempts_total{outcome="not_attempted"}"#).await.unwrap_or(0.0) {
            n if n >= 1.0 => Ok(()),
            n => Err(format!("{n} unreached attempts")),
        }
    })
    .await
}

/// relay-a (age limit `age_limit`, the fast timetable) and relay-b, alice
/// at relay-a and bob at relay-b; relay-a has never learned bob's route.
struct Outage {
    _dir: tempfile::TempDir,
    cluster: Cluster,
    a: RelayProc,
    b: RelayProc,
    ca: Client,
    alice: User,
    bob: User,
}

async fn outage(age_limit: &str) -> Outage {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", &fast(age_limit));
    let b = cluster.start("relay-b", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&Client::new(&b.url), "relay-b", 2, true).await;
    assert_route_unknown(&ca, &bob).await;
    Outage { _dir: dir, cluster, a, b, ca, alice, bob }
}

#[actix_rt::test]
async fn a_first_message_to_an_account_whose_relay_is_down_is_accepted_and_delivered_once_when_it_returns() {
    let Outage { _dir, cluster: _cluster, a: _a, mut b, ca, alice, bob } = outage("30s").await;
    b.kill9();

    // Accepted, not refused: relay-b could not be asked.
    let params = alice.send_params(&bob, &mid(1), true);
    let sent = ca.ok("message.send", alice.token(0), &params).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    assert_valid("DeliveryStatus.schema.json", &sent);
    // The same request again is answered as the same acceptance.
    assert_eq!(ca.ok("message.send", alice.token(0), &params).await, sent);
    wait_unreached_attempt(&ca).await;

    b.restart();
    let cb = Client::new(&b.url);
    let st = wait_status(&ca, &alice, &mid(1), 20, terminal).await;
    assert_eq!(st, json!({"status": "target_accepted", "accepted_at": sent["accepted_at"]}));
    // Exactly once: a later message arrives after it, and nothing in between.
    send_accepted(&ca, &alice, &bob, 2).await;
    assert_eq!(message_ids(&bob.sync_all(&cb, 0).await), [mid(1), mid(2)]);
    let mine = alice.sync_all(&ca, 0).await;
    assert_eq!(mine[0]["delivery"], st);
}

#[actix_rt::test]
async fn a_first_message_to_an_account_whose_relay_stays_down_fails_with_message_expired() {
    let Outage { _dir, cluster: _cluster, a: _a, mut b, ca, alice, bob } = outage("4s").await;
    b.kill9();

    let sent = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    let st = wait_status(&ca, &alice, &mid(1), 20, terminal).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["code"], "message_expired", "{st}");
    assert_eq!(st["accepted_at"], sent["accepted_at"]);
    assert_valid("DeliveryStatus.schema.json", &st);
    assert_eq!(alice.sync_all(&ca, 0).await[0]["delivery"], st, "the sent record keeps the final status");

    // Terminal is terminal: relay-b back, a later message gets through
    // while the expired one never does.
    b.restart();
    let cb = Client::new(&b.url);
    send_accepted(&ca, &alice, &bob, 2).await;
    assert_eq!(message_ids(&bob.sync_all(&cb, 0).await), [mid(2)]);
    assert_eq!(ca.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await, st);
}

#[actix_rt::test]
async fn a_source_relay_killed_while_a_message_waits_for_an_unknown_route_delivers_it_once_after_restart() {
    let Outage { _dir, cluster: _cluster, mut a, mut b, ca, alice, bob } = outage("30s").await;
    b.kill9();
    let params = alice.send_params(&bob, &mid(1), true);
    let sent = ca.ok("message.send", alice.token(0), &params).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    wait_unreached_attempt(&ca).await;

    // SIGKILL mid-wait (no shutdown, no flush); relay-b still down after.
    a.kill9();
    a.restart();
    let ca = Client::new(&a.url);
    let st = ca.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await;
    assert_eq!(st, json!({"status": "delivering", "accepted_at": sent["accepted_at"]}));
    assert_eq!(ca.ok("message.send", alice.token(0), &params).await, st, "a retry answers the same acceptance");

    b.restart();
    let cb = Client::new(&b.url);
    let st = wait_status(&ca, &alice, &mid(1), 20, terminal).await;
    assert_eq!(st, json!({"status": "target_accepted", "accepted_at": sent["accepted_at"]}));
    send_accepted(&ca, &alice, &bob, 2).await;
    let received = bob.sync_all(&cb, 0).await;
    assert_eq!(message_ids(&received), [mid(1), mid(2)]);
    assert_eq!(received[0]["envelope"], params["envelope"]);
}

#[actix_rt::test]
async fn the_deadline_is_fixed_at_acceptance_and_a_longer_age_limit_after_restart_does_not_move_it() {
    let Outage { _dir, cluster: _cluster, mut a, b, ca, alice, bob } = outage("8s").await;
    drop(b); // killed, for good

    let created_at = now();
    let params = alice.params_to(0, bob.id(), &mid(1), created_at, &["phone"], Some(&["phone"]));
    let sent = ca.ok("message.send", alice.token(0), &params).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    // Accepted under an 8 s age limit; restarted with one of an hour
    // (before the deadline: the message is still delivering here).
    a.kill9();
    let config = std::fs::read_to_string(&a.config).unwrap();
    assert!(config.contains("delivery_age_limit = \"8s\""), "{config}");
    std::fs::write(&a.config, config.replace("delivery_age_limit = \"8s\"", "delivery_age_limit = \"1h\"")).unwrap();
    a.restart();
    let ca = Client::new(&a.url);
    // A message accepted under the new limit: its deadline is an hour away.
    let later = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(2), true)).await;
    assert_eq!(later["status"], "delivering", "{later}");

    let st = wait_status(&ca, &alice, &mid(1), 30, terminal).await;
    assert_eq!(st["status"], "failed", "{st}");
    assert_eq!(st["error"]["code"], "message_expired", "{st}");
    let st2 = ca.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(2)})).await;
    assert_eq!(st2["status"], "delivering", "the new limit is in force: {st2}");

    // The log keeps the deadline fixed at acceptance: created_at + 8 s.
    assert!(a.terminate().success());
    let (code, out, err) = audit(&["message", "--config", a.config.to_str().unwrap(), alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["acceptance"]["deadline"], created_at + 8, "{story}");
    assert_eq!(story["delivery"]["deadline"], created_at + 8, "{story}");
    assert_eq!(story["delivery"]["finished"]["status"], st);
    // Ended at the deadline, or at the last 300 ms slot before it (no slot
    // left: PROTOCOL §6), within its second.
    let ended = story["delivery"]["finished"]["at"].as_u64().unwrap();
    assert!((created_at + 7..created_at + 20).contains(&ended), "ended at {ended}, created at {created_at}");
}

#[actix_rt::test]
async fn relay_audit_message_says_no_route_was_known_and_which_peer_could_not_be_asked() {
    let Outage { _dir, cluster: _cluster, mut a, mut b, ca, alice, bob } = outage("30s").await;
    b.kill9();
    let sent = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    wait_unreached_attempt(&ca).await;
    b.restart();
    let st = wait_status(&ca, &alice, &mid(1), 20, terminal).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    // The account has recorded the final status once the sent record shows it.
    assert_eq!(alice.sync_all(&ca, 0).await[0]["delivery"], st);
    assert!(a.terminate().success());

    let config = a.config.to_str().unwrap();
    let (code, out, err) = audit(&["message", "--config", config, alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    let attempts = story["delivery"]["attempts"].as_array().unwrap();
    let (first, last) = (&attempts[0], attempts.last().unwrap());
    // The first attempt (at acceptance) knew no route: relay-b was down.
    assert_eq!(first["targets"], json!([]), "{first}");
    assert_eq!(first["outcome"]["result"], "failed", "{first}");
    assert_eq!(first["outcome"]["error"]["code"], "route_not_found", "{first}");
    let why = first["outcome"]["error"]["message"].as_str().unwrap();
    assert_eq!(
        why,
        "no route known for the recipient: not every peer could be asked: relay-b unreachable (cannot connect)"
    );
    assert_eq!(last["targets"], json!(["relay-b"]), "{last}");
    assert_eq!(last["outcome"]["status"], st, "{last}");
    assert_eq!(story["final_status"], st);

    let (code, text, err) = audit(&["message", "--config", config, alice.id(), &mid(1)]);
    assert_eq!(code, 0, "{text}{err}");
    eprintln!("{text}");
    for needle in [
        "#1 ",
        "-> no route known: failed: route_not_found: no route known for the recipient: \
         not every peer could be asked: relay-b unreachable (cannot connect); next attempt due",
        "-> relay-b (route revision 1): target_accepted",
        "final status: target_accepted",
    ] {
        assert!(text.contains(needle), "no {needle:?} in:\n{text}");
    }
}

#[actix_rt::test]
async fn a_send_is_refused_with_route_not_found_only_when_every_peer_is_up_and_says_not_found() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    // The default attempt timeout (also the peers' time to answer route.get).
    let a = cluster.start("relay-a", "");
    let _b = cluster.start("relay-b", "");
    let _c = cluster.start("relay-c", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let nobody = relay_schemas::client::Account::from_seed([7; 32]);

    let params = alice.params_to(0, &nobody.id, &mid(1), now(), &["phone"], Some(&["phone"]));
    let refused = ca.err_body("message.send", alice.token(0), &params).await;
    assert_eq!(refused["error"]["code"], "route_not_found", "{refused}");
    // Nothing was accepted: a retry under the same key is refused again,
    // the message has no status and the sender no record.
    assert_eq!(ca.err("message.send", alice.token(0), &params).await, "route_not_found");
    assert_eq!(ca.err("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await, "not_found");
    assert!(alice.sync_all(&ca, 0).await.is_empty());
}

#[actix_rt::test]
async fn a_send_to_an_unknown_account_is_accepted_while_a_peer_is_down() {
    let dir = tempfile::tempdir().unwrap();
    // relay-c is a configured peer that is not running: it cannot be asked.
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    let a = cluster.start("relay-a", &fast("30s"));
    let _b = cluster.start("relay-b", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let carol_account = relay_schemas::client::Account::from_seed([3; 32]);

    // relay-b says not found, relay-c cannot be asked: accepted.
    let params = alice.params_to(0, &carol_account.id, &mid(1), now(), &["phone"], Some(&["phone"]));
    let sent = ca.ok("message.send", alice.token(0), &params).await;
    assert_eq!(sent["status"], "delivering", "{sent}");

    // relay-c comes up and Carol registers there: the waiting message finds
    // her route at its next attempt and is delivered, once.
    let c = cluster.start("relay-c", "");
    let cc = Client::new(&c.url);
    let carol = User::register(&cc, "relay-c", 3, true).await;
    assert_eq!(carol.id(), carol_account.id);
    let st = wait_status(&ca, &alice, &mid(1), 20, terminal).await;
    assert_eq!(st, json!({"status": "target_accepted", "accepted_at": sent["accepted_at"]}));
    assert_eq!(message_ids(&carol.sync_all(&cc, 0).await), [mid(1)]);
}
