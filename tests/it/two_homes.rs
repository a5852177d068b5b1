//! Accounts with two home relays (SHiNE's access-server pair): the account,
//! its timeline and its sends kept the same at both by `timeline.replicate`
//! (PROTOCOL §5), real relays on loopback. Alice's homes are relay-a and
//! relay-b; bob lives on relay-c.

use crate::common;

use common::client::{message_ids, mid, now, Client, User};
use common::cluster::Cluster;
use common::proxy::{Fault, Proxy, Rule};
use common::relay::{audit, RelayProc};
use common::wait::eventually;
use relay_schemas::client::Device;
use serde_json::{json, Value};
use std::time::Duration;

/// Replication rounds and retries within a test's time.
const FAST: &str = "[replication]\ninterval = \"300ms\"\n[delivery]\nretry_timetable = [\"0s\", \"300ms\", \"600ms\"]\nretry_then_every = \"300ms\"\nattempt_timeout = \"1s\"\n";

const ALICE: u8 = 1;
const BOB: u8 = 2;

/// How long an account may take to arrive at its other home.
const REPLICATED: Duration = Duration::from_secs(20);

/// The records device 0 syncs, once there are `n` (bounded wait).
async fn wait_records(user: &User, c: &Client, n: usize) -> Vec<Value> {
    eventually(&format!("{n} records at {}", user.relay_id), Duration::from_secs(20), || async {
        let records = user.sync_all(c, 0).await;
        match records.len() {
            got if got == n => Ok(records),
            got => Err(format!("{got} records: {:?}", message_ids(&records))),
        }
    })
    .await
}

/// The order both homes agree on: `(envelope.created_at, envelope.message_id)`.
fn conversation(records: &[Value]) -> Vec<(String, String)> {
    let mut keyed: Vec<(u64, String, String)> = records
        .iter()
        .map(|r| {
            let env = &r["envelope"];
            let id = env["message_id"].as_str().unwrap().to_owned();
            (env["created_at"].as_u64().unwrap(), id, r["direction"].as_str().unwrap().to_owned())
        })
        .collect();
    keyed.sort();
    keyed.into_iter().map(|(_, id, dir)| (id, dir)).collect()
}

async fn status(c: &Client, user: &User, message_id: &str) -> Value {
    c.ok("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await
}

async fn wait_status(c: &Client, user: &User, message_id: &str, want: &str, secs: u64) -> Value {
    eventually(&format!("{message_id} {want} at {}", user.relay_id), Duration::from_secs(secs), || async {
        let (code, st) = c.call("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await;
        if code == 200 && st["status"] == want {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await
}

async fn wait_metric_at_least(c: &Client, metric: &str, n: f64) {
    eventually(&format!("{metric} >= {n}"), Duration::from_secs(20), || async {
        match c.metric(metric).await.unwrap_or(0.0) {
            got if got >= n => Ok(()),
            got => Err(format!("{got}")),
        }
    })
    .await
}

/// relay-a, relay-b (alice's homes) and relay-c (bob's), peering with
/// each other, on the fast timetable. The folder goes last.
fn three_relays() -> (tempfile::TempDir, Cluster, [RelayProc; 3]) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    let relays = ["relay-a", "relay-b", "relay-c"].map(|id| cluster.start(id, FAST));
    (dir, cluster, relays)
}

fn homes(cluster: &Cluster) -> [(&str, &str); 2] {
    [("relay-a", cluster.url("relay-a")), ("relay-b", cluster.url("relay-b"))]
}

#[actix_rt::test]
async fn an_account_made_at_one_home_is_served_at_the_other_and_both_show_one_timeline() {
    let (_dir, cluster, [a, b, c]) = three_relays();
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let mut alice = User::register_two_homes(&ca, ALICE, homes(&cluster), true).await;
    let bob = User::register(&cc, "relay-c", BOB, true).await;

    // Registered at relay-a, the account opens sessions at relay-b; a device
    // added at relay-b reaches relay-a.
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    let laptop = Device::from_seed("laptop", [77; 32]);
    let cert = alice.account.certificate(&laptop, now(), None);
    cb.ok("device.add", alice_b.token(0), &json!({ "device_certificate": cert })).await;
    alice.devices.push(laptop);
    let alice_a = alice.at_other_home(&ca, "relay-a", REPLICATED).await;
    assert_eq!(alice_a.tokens.len(), 2, "both devices open sessions at relay-a");

    // Bob's relay delivers to both homes in parallel; each keeps one record.
    for n in 1..=3 {
        let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    // Alice answers from her other home.
    let st = cb.ok("message.send", alice_b.token(0), &alice_b.send_params(&bob, &mid(4), true)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");

    let at_a = wait_records(&alice, &ca, 4).await;
    let at_b = wait_records(&alice_b, &cb, 4).await;
    assert_eq!(conversation(&at_a), conversation(&at_b), "one timeline, in the order both homes agree on");
    let mut ids = message_ids(&at_a);
    ids.sort();
    assert_eq!(ids, [mid(1), mid(2), mid(3), mid(4)], "one record per message");
    assert_eq!(status(&ca, &alice, &mid(4)).await["status"], "target_accepted", "the send's status at either home");
    assert_eq!(bob.sync_all(&cc, 0).await.iter().filter(|r| r["direction"] == "received").count(), 1);
}

#[actix_rt::test]
async fn a_recipient_home_that_was_down_has_the_record_exactly_once_after_it_returns() {
    let (_dir, cluster, [a, mut b, c]) = three_relays();
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), true).await;
    let bob = User::register(&cc, "relay-c", BOB, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;

    b.kill9();
    let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(1), false)).await;
    assert_eq!(st["status"], "target_accepted", "delivered via the home that is up: {st}");
    b.restart();
    let cb = Client::new(&b.url);
    let records = wait_records(&alice_b, &cb, 1).await;
    assert_eq!(message_ids(&records), [mid(1)]);

    // More news makes another round: still one record of the first message.
    let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(2), false)).await;
    assert_eq!(st["status"], "target_accepted");
    let records = wait_records(&alice_b, &cb, 2).await;
    let mut ids = message_ids(&records);
    ids.sort();
    assert_eq!(ids, [mid(1), mid(2)]);
    assert_eq!(message_ids(&wait_records(&alice, &ca, 2).await).len(), 2);
}

#[actix_rt::test]
async fn a_sender_home_killed_mid_delivery_leaves_the_other_to_finish_with_the_original_deadline() {
    let (_dir, cluster, [mut a, mut b, mut c]) = three_relays();
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), false).await;
    let bob = User::register(&Client::new(&c.url), "relay-c", BOB, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await; // relay-a knows bob's route
    c.kill9();

    let sent = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    // relay-b has taken the send on (after relay-a's first attempt).
    let at_b = wait_status(&cb, &alice_b, &mid(1), "delivering", 20).await;
    assert_eq!(at_b["accepted_at"], sent["accepted_at"]);
    wait_metric_at_least(&cb, "relay_deliveries_in_flight", 1.0).await;
    a.kill9();
    c.restart();

    let done = wait_status(&cb, &alice_b, &mid(1), "target_accepted", 30).await;
    assert_eq!(done["accepted_at"], sent["accepted_at"]);
    let cc = Client::new(&c.url);
    let bob_c = User { tokens: vec![bob.open_session(&cc, 0).await], ..bob };
    assert_eq!(message_ids(&wait_records(&bob_c, &cc, 1).await), [mid(1)]);

    b.terminate();
    let data = b.data_dir.to_str().unwrap().to_owned();
    let (code, out, err) = audit(&["message", "--data-dir", &data, alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(story["delivery"]["deadline"], story["acceptance"]["deadline"], "relay-b kept the original deadline");
    assert_eq!(story["delivery"]["accepted_at"], sent["accepted_at"]);
    let steps: Vec<&str> =
        story["replication"].as_array().unwrap().iter().map(|r| r["step"].as_str().unwrap()).collect();
    assert!(steps.contains(&"received_from_partner"), "{steps:?}");
    exported_types_include(&data, &["replicated", "replica_pulled"]);
}

/// relay-b's attempts: two while relay-c is down, the third long after.
const SLOW_B: &str = "[replication]\ninterval = \"300ms\"\n[delivery]\nretry_timetable = [\"0s\", \"1s\", \"2s\", \"15s\"]\nretry_then_every = \"15s\"\nattempt_timeout = \"1s\"\n";

/// Alice (homes relay-a and relay-b) sends to bob (relay-c) at relay-a
/// while relay-c is down; relay-b takes the send on and its own first two
/// attempts find relay-c down; then relay-c returns and relay-a delivers.
/// `cut`: from when relay-b has the send, its pulls from relay-a are
/// dropped (it learns nothing more by replication). Returns once relay-b's
/// delivery ended, with relay-b stopped: relay-c's inbound request counts
/// by peer, and relay-b's story of the message.
async fn second_home_ends_its_delivery(cut: bool) -> (f64, f64, Value, Vec<common::proxy::Entry>) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    let a = cluster.start("relay-a", FAST);
    let proxy = Proxy::start(cluster.url("relay-a"));
    let (mut b, mut c) = (start_b_through(&cluster, &proxy, SLOW_B), cluster.start("relay-c", FAST));
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), false).await;
    let bob = User::register(&Client::new(&c.url), "relay-c", BOB, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    c.kill9();

    let sent = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    wait_status(&cb, &alice_b, &mid(1), "delivering", 20).await;
    if cut {
        proxy.add_rule(Rule {
            method: Some("timeline.replicate".into()),
            message_id: None,
            fault: Fault::Drop,
            remaining: None,
        });
    }
    wait_metric_at_least(&cb, r#"relay_delivery_attempts_total{outcome="not_attempted"}"#, 2.0).await;
    c.restart();
    wait_status(&ca, &alice, &mid(1), "target_accepted", 20).await;
    eventually("relay-b's delivery ended", Duration::from_secs(30), || async {
        match cb.metric("relay_deliveries_in_flight").await {
            Some(0.0) => Ok(()),
            n => Err(format!("in flight {n:?}")),
        }
    })
    .await;
    let (_, metrics) = Client::new(&c.url).get("/metrics").await;
    let from = |peer: &str| -> f64 {
        let prefix = format!("relay_peer_requests_total{{peer=\"{peer}\",direction=\"in\"");
        metrics
            .lines()
            .filter(|l| l.starts_with(&prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let (from_a, from_b) = (from("relay-a"), from("relay-b"));
    b.terminate();
    let data = b.data_dir.to_str().unwrap().to_owned();
    let (code, out, err) = audit(&["message", "--data-dir", &data, alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{err}");
    (from_a, from_b, serde_json::from_str(&out).unwrap(), proxy.log())
}

/// relay-b's delivery of the message ended `target_accepted` after its two
/// own attempts, confirmed by the other home rather than by an attempt.
fn ended_by_the_other_home(story: &Value) {
    let delivery = &story["delivery"];
    assert_eq!(delivery["finished"]["status"]["status"], "target_accepted", "{delivery}");
    assert_eq!(delivery["finished"]["by_attempt"], Value::Null, "{delivery}");
    assert_eq!(delivery["attempts"].as_array().unwrap().len(), 2, "{delivery}");
}

#[actix_rt::test]
async fn peer_status_ends_the_second_homes_delivery_without_contacting_the_recipient() {
    let (from_a, from_b, story, log) = second_home_ends_its_delivery(true).await;
    assert!(from_a >= 1.0, "relay-a delivered (and the metric is read right)");
    assert_eq!(from_b, 0.0, "relay-c never heard from relay-b");
    ended_by_the_other_home(&story);
    let asked = log.iter().filter(|e| e.method == "message.delivery.peer_status" && e.upstream_status == Some(200));
    let said = |e: &&common::proxy::Entry| {
        e.upstream_body.as_ref().is_some_and(|b| String::from_utf8_lossy(b).contains("target_accepted"))
    };
    assert!(asked.clone().any(|e| said(&e)), "relay-b asked relay-a, which had delivered it");
    assert!(log.iter().any(|e| e.method == "timeline.replicate" && e.fault == Fault::Drop), "replication was cut");
}

#[actix_rt::test]
async fn a_home_that_learns_its_partner_delivered_ends_its_own_delivery_without_contacting_the_recipient() {
    let (from_a, from_b, story, log) = second_home_ends_its_delivery(false).await;
    assert!(from_a >= 1.0);
    assert_eq!(from_b, 0.0, "relay-c never heard from relay-b");
    ended_by_the_other_home(&story);
    // (Whether relay-b still asked relay-a depends on which came first: its
    // wake-up when relay-a called, or the replicated result.)
    let _ = log;
}

/// relay-b reaches relay-a only through `proxy`.
fn start_b_through(cluster: &Cluster, proxy: &Proxy, extra: &str) -> RelayProc {
    cluster.start_via("relay-b", ("relay-a", &proxy.url), extra)
}

#[actix_rt::test]
async fn replication_cut_in_the_middle_of_a_page_loses_nothing_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    // Rounds every second: the cuts below meet the pulls the sends cause,
    // not idle polls.
    let slow_rounds = FAST.replace("interval = \"300ms\"", "interval = \"1s\"");
    let mut a = cluster.start("relay-a", &slow_rounds);
    let proxy = Proxy::start(cluster.url("relay-a"));
    let b = start_b_through(&cluster, &proxy, &slow_rounds);
    let c = cluster.start("relay-c", &slow_rounds);
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), true).await;
    let bob = User::register(&cc, "relay-c", BOB, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;

    // relay-a serves each of the next pages, and the answer never reaches relay-b.
    let rule = |fault| Rule { method: Some("timeline.replicate".into()), message_id: None, fault, remaining: Some(3) };
    proxy.add_rule(rule(Fault::ResetBeforeResponse));
    for n in 1..=5 {
        let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    let records = wait_records(&alice_b, &cb, 5).await;
    let mut ids = message_ids(&records);
    ids.sort();
    assert_eq!(ids, (1..=5).map(mid).collect::<Vec<_>>(), "each sent record once");
    let cut: Vec<_> = proxy.log().into_iter().filter(|e| e.fault == Fault::ResetBeforeResponse).collect();
    assert_eq!(cut.len(), 3, "the cuts happened");
    assert!(cut.iter().all(|e| e.upstream_status == Some(200)), "relay-a served each page it lost");
    assert!(
        cut.iter().any(|e| e.upstream_body.as_ref().is_some_and(|b| String::from_utf8_lossy(b).contains(&mid(1)))),
        "a page with items was lost"
    );
    // Every page as served matches the documented result schema.
    for e in proxy.log().iter().filter(|e| e.method == "timeline.replicate" && e.upstream_status == Some(200)) {
        let page: Value = serde_json::from_slice(e.upstream_body.as_ref().unwrap()).unwrap();
        common::schema::assert_valid("methods/timeline.replicate.result.schema.json", &page);
        let params: Value = serde_json::from_slice(&e.body).unwrap();
        common::schema::assert_valid("methods/timeline.replicate.params.schema.json", &params);
    }
    // The sender's own sends were never delivered twice.
    assert_eq!(bob.sync_all(&cc, 0).await.len(), 5);

    // relay-b's next request acknowledges what it stored: one more answered
    // page after the records appeared (an empty one: caught up).
    let caught_up = |log: &[common::proxy::Entry]| {
        log.iter()
            .filter(|e| e.method == "timeline.replicate" && e.fault == Fault::Pass && e.upstream_status == Some(200))
            .filter(|e| e.upstream_body.as_ref().is_some_and(|b| String::from_utf8_lossy(b).contains("\"items\":[]")))
            .count()
    };
    let before = caught_up(&proxy.log());
    proxy.wait_for("relay-b acknowledges", Duration::from_secs(10), |log| caught_up(log) > before);

    // relay-a's story of a message: sent to relay-b, then acknowledged.
    a.terminate();
    let data = a.data_dir.to_str().unwrap().to_owned();
    let (code, out, err) = audit(&["message", "--data-dir", &data, alice.id(), &mid(1), "--json"]);
    assert_eq!(code, 0, "{err}");
    let story: Value = serde_json::from_str(&out).unwrap();
    let steps: Vec<&str> =
        story["replication"].as_array().unwrap().iter().map(|r| r["step"].as_str().unwrap()).collect();
    assert!(steps.contains(&"sent_to_partner") && steps.contains(&"acked_by_partner"), "{steps:?}");
    exported_types_include(&data, &["replica_served", "replica_acked"]);
}

/// `relay audit export` of a stopped relay: every line matches the
/// documented line schema, and these event types are among them.
fn exported_types_include(data_dir: &str, wanted: &[&str]) {
    let (code, out, err) = audit(&["export", "--data-dir", data_dir]);
    assert_eq!(code, 0, "{err}");
    let types: std::collections::BTreeSet<String> = out
        .lines()
        .map(|line| {
            let v: Value = serde_json::from_str(line).unwrap();
            common::schema::assert_valid("audit/export-line.schema.json", &v);
            v["type"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(wanted.iter().all(|t| types.contains(*t)), "{types:?}");
}

#[actix_rt::test]
async fn two_home_accounts_on_four_relays_keep_one_timeline_through_a_home_outage() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c", "relay-d"]);
    let (a, b) = (cluster.start("relay-a", FAST), cluster.start("relay-b", FAST));
    let (c, mut d) = (cluster.start("relay-c", FAST), cluster.start("relay-d", FAST));
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), true).await;
    let bob_homes = [("relay-c", cluster.url("relay-c")), ("relay-d", cluster.url("relay-d"))];
    let bob = User::register_two_homes(&cc, BOB, bob_homes, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    let bob_d = bob.at_other_home(&Client::new(&d.url), "relay-d", REPLICATED).await;

    // One of bob's homes is down: both directions still deliver.
    d.kill9();
    let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(2), true)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    d.restart();
    let cd = Client::new(&d.url);
    // Both homes reachable: a send from alice's other home reaches both of bob's.
    let st = cb.ok("message.send", alice_b.token(0), &alice_b.send_params(&bob, &mid(3), true)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");

    let alice_timelines = [wait_records(&alice, &ca, 3).await, wait_records(&alice_b, &cb, 3).await];
    let bob_timelines = [wait_records(&bob, &cc, 3).await, wait_records(&bob_d, &cd, 3).await];
    for [one, other] in [alice_timelines, bob_timelines] {
        assert_eq!(conversation(&one), conversation(&other), "the same timeline at both homes");
        let mut ids = message_ids(&one);
        ids.sort();
        assert_eq!(ids, [mid(1), mid(2), mid(3)], "one record per message");
    }
}

#[actix_rt::test]
async fn a_reset_sends_history_again_and_delivers_nothing_twice() {
    let (_dir, cluster, [mut a, b, c]) = three_relays();
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register_two_homes(&ca, ALICE, homes(&cluster), true).await;
    let bob = User::register(&cc, "relay-c", BOB, true).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    for n in 1..=2 {
        let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), true)).await;
        assert_eq!(st["status"], "target_accepted", "{st}");
    }
    let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(3), false)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    let before = conversation(&wait_records(&alice_b, &cb, 3).await);
    let delivered = cc.metric(r#"relay_requests_total{method="relay/message.deliver",code="ok"}"#).await;
    assert!(delivered.is_some_and(|n| n >= 2.0), "relay-c counts the deliveries it took: {delivered:?}");

    a.terminate();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
        .args(["replication", "reset", "--config"])
        .arg(&a.config)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "reset 1 account(s)");
    let known = r#"relay_replication_items_total{outcome="known"}"#;
    let known_before = cb.metric(known).await.unwrap_or(0.0);
    a.restart();

    // relay-b is sent the whole history again (registration, two sends and
    // their results, one receipt) and finds every item known.
    wait_metric_at_least(&cb, known, known_before + 4.0).await;
    assert_eq!(conversation(&alice_b.sync_all(&cb, 0).await), before, "no record added");
    assert_eq!(alice.sync_all(&Client::new(&a.url), 0).await.len(), 3);
    assert_eq!(bob.sync_all(&cc, 0).await.len(), 2, "bob got nothing twice");
    let delivered_after = cc.metric(r#"relay_requests_total{method="relay/message.deliver",code="ok"}"#).await;
    assert_eq!(delivered_after, delivered, "nothing delivered again");
}

#[actix_rt::test]
async fn a_home_added_by_a_route_update_gets_the_account_and_its_history() {
    let (_dir, cluster, [a, b, c]) = three_relays();
    let (ca, cb, cc) = (Client::new(&a.url), Client::new(&b.url), Client::new(&c.url));
    let alice = User::register(&ca, "relay-a", ALICE, true).await;
    let bob = User::register(&cc, "relay-c", BOB, true).await;
    let st = cc.ok("message.send", bob.token(0), &bob.send_params(&alice, &mid(1), false)).await;
    assert_eq!(st["status"], "target_accepted", "{st}");

    // Alice's route gains relay-b: it gets her account and her history.
    let two = alice.account.route(2, &homes(&cluster), now());
    ca.ok("route.update", alice.token(0), &json!({ "route": two })).await;
    let alice_b = alice.at_other_home(&cb, "relay-b", REPLICATED).await;
    assert_eq!(message_ids(&wait_records(&alice_b, &cb, 1).await), [mid(1)]);
    let route = cb.ok("route.get", alice_b.token(0), &json!({"account_id": alice.id()})).await;
    assert_eq!(route["revision"], 2, "{route}");
}
