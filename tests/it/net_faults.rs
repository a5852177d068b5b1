//! Network faults between two real relays: relay-a's `[[peers]]` url for
//! relay-b points at a fault-injecting proxy (`tests/it/common/proxy.rs`) that
//! forwards to the real relay-b. Whatever the fault, the message ends
//! `target_accepted` and relay-b holds exactly one record of it. For the
//! faults that leave receipt unknown (reset after the request was sent,
//! reset before the response, a response trickled slower than
//! `attempt_timeout`), the source confirms with the same target even though
//! it knows a higher-revision route naming relay-c, and relay-c receives
//! nothing for that message (seed: "When a timeout, disconnection, or lost
//! response leaves receipt unknown, the source confirms with the original
//! target … It MUST NOT deliver an unknown-result message to another relay
//! merely because the original target is temporarily unreachable").

use crate::common;

use common::client::{mid, now, Client, User};
use common::cluster::Cluster;
use common::proxy::{Entry, Fault, Proxy};
use common::relay::RelayProc;
use common::torture::FAST_TIMETABLE;
use common::wait::eventually;
use relay_actors::store::Store;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

struct Net {
    _dir: tempfile::TempDir,
    cluster: Cluster,
    a: RelayProc,
    _b: RelayProc,
    _c: Option<RelayProc>,
    proxy: Proxy,
    ca: Client,
    cb: Client,
    alice: User,
    bob: User,
}

/// relay-a (source, reaching relay-b only through the proxy), relay-b
/// (bob's home) and, if `with_c`, relay-c; relay-a already knows bob's
/// route revision 1.
async fn setup(with_c: bool) -> Net {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b", "relay-c"]);
    let b = cluster.start("relay-b", FAST_TIMETABLE);
    let c = with_c.then(|| cluster.start("relay-c", FAST_TIMETABLE));
    let proxy = Proxy::start(cluster.url("relay-b"));
    let a = cluster.start_via("relay-a", ("relay-b", &proxy.url), FAST_TIMETABLE);
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let route = ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    assert_eq!(route["revision"], 1, "{route}");
    Net { _dir: dir, cluster, a, _b: b, _c: c, proxy, ca, cb, alice, bob }
}

/// Polls `message.delivery.status` until it is terminal (bounded).
async fn wait_terminal(c: &Client, user: &User, message_id: &str, secs: u64) -> Value {
    eventually(&format!("{message_id} terminal"), Duration::from_secs(secs), || async {
        let st = c.ok("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await;
        if st["status"] != "delivering" {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await
}

/// How many records of `message_id` the timeline of `token`'s device holds.
async fn records_of(c: &Client, token: &str, message_id: &str) -> usize {
    let page = c.ok("message.timeline.sync", Some(token), &json!({"after": 0, "limit": 500})).await;
    assert_eq!(page["has_more"], false, "{page}");
    page["records"].as_array().unwrap().iter().filter(|r| r["envelope"]["message_id"] == message_id).count()
}

/// Every request of a delivery carried the same bytes.
fn assert_same_bodies(what: &str, entries: &[Entry]) {
    assert!(!entries.is_empty(), "{what}: no request");
    for e in entries {
        assert_eq!(e.body, entries[0].body, "{what}: request {} differs from the first", e.seq);
    }
}

/// The targets of every attempt of `(from, message_id)` in a stopped
/// relay's store (and of every route refresh).
fn attempt_targets(data_dir: &std::path::Path, from: &str, message_id: &str) -> Vec<Vec<String>> {
    let store = Store::open(&data_dir.join("store")).unwrap();
    let stream = relay_actors::delivery::stream_id(from, message_id);
    let mut out = vec![];
    for ev in store.read(&stream, 0) {
        let ev = ev.unwrap();
        let v: Value = serde_json::from_str(ev.data.get()).unwrap();
        let body = v.get(&ev.event_type).cloned().unwrap_or(v);
        if ev.event_type == "attempt_failed" {
            eprintln!("{message_id}: attempt failed: {body}");
        }
        let ids = match ev.event_type.as_str() {
            "attempt_started" => {
                body["targets"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().into()).collect()
            }
            "route_refreshed" => {
                body["relays"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().into()).collect()
            }
            _ => continue,
        };
        out.push(ids);
    }
    store.close().unwrap();
    out
}

// ---- faults with a known outcome -------------------------------------------

#[actix_rt::test]
async fn delay_between_relays_still_delivers_each_message_once() {
    let net = setup(false).await;
    // 250 ms each way on every request: 500 ms added, under the 1 s attempt timeout.
    net.proxy.fault_all(Fault::Delay(Duration::from_millis(250)));
    let ids: Vec<String> = (1..=3).map(mid).collect();
    for id in &ids {
        net.ca.ok("message.send", net.alice.token(0), &net.alice.send_params(&net.bob, id, true)).await;
    }
    for id in &ids {
        let st = wait_terminal(&net.ca, &net.alice, id, 20).await;
        assert_eq!(st["status"], "target_accepted", "{id}: {st}");
        let d = net.proxy.deliveries(id);
        assert_eq!(d.len(), 1, "{id}: one attempt, answered within the timeout: {d:#?}");
        assert_eq!(d[0].fault, Fault::Delay(Duration::from_millis(250)));
        assert_eq!(d[0].upstream_status, Some(200), "{id}");
        assert_eq!(records_of(&net.cb, net.bob.token(0).unwrap(), id).await, 1, "{id}: exactly one record at relay-b");
    }
}

/// The proxy accepts the connection, reads the request and closes without
/// forwarding it: receipt is unknown (or, for a client that could tell, not
/// attempted); either way the retries go to relay-b, unchanged.
#[actix_rt::test]
async fn dropped_connection_without_forwarding_is_retried_unchanged_and_delivered_once() {
    let net = setup(false).await;
    let m = mid(1);
    net.proxy.fault_delivery(&m, Fault::Drop, Some(2));
    net.ca.ok("message.send", net.alice.token(0), &net.alice.send_params(&net.bob, &m, true)).await;
    let st = wait_terminal(&net.ca, &net.alice, &m, 20).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    let d = net.proxy.deliveries(&m);
    assert!(d.len() >= 3, "two dropped attempts, then a delivered one: {d:#?}");
    assert!(d[..2].iter().all(|e| e.fault == Fault::Drop && !e.forwarded), "{d:#?}");
    assert_same_bodies("drop", &d);
    assert_eq!(records_of(&net.cb, net.bob.token(0).unwrap(), &m).await, 1, "exactly one record at relay-b");
    let mut a = net.a;
    a.kill9();
    let targets = attempt_targets(&a.data_dir, net.alice.id(), &m);
    assert!(targets.iter().all(|t| t == &["relay-b".to_string()]), "{targets:?}");
}

// ---- faults that leave receipt unknown ----------------------------------------

/// relay-b commits the delivery of m1 but relay-a cannot learn it (`fault`
/// on every attempt until released). Meanwhile bob registers at relay-c
/// with route revision 2 and a second message teaches relay-a that route
/// (it is delivered at relay-c). After at least one more faulted attempt at
/// relay-b with revision 2 known, the fault is lifted: m1 must be confirmed
/// at relay-b (`target_accepted`, one record there) and never sent to
/// relay-c.
async fn unknown_result_is_confirmed_with_relay_b(fault: Fault) {
    let kind = fault.name();
    let mut net = setup(true).await;
    let cc = Client::new(net.cluster.url("relay-c"));
    let (m1, m2) = (mid(1), mid(2));
    net.proxy.fault_delivery(&m1, fault.clone(), None);
    let first = net.ca.ok("message.send", net.alice.token(0), &net.alice.send_params(&net.bob, &m1, true)).await;
    assert_eq!(first["status"], "delivering", "{kind}: the first attempt's answer was lost: {first}");
    // relay-b did commit it: its answer to the first attempt was 200.
    let log = net.proxy.wait_for("relay-b's answer to m1", Duration::from_secs(10), |log| {
        log.iter().any(|e| e.message_id.as_deref() == Some(m1.as_str()) && e.upstream_status.is_some())
    });
    let committed = log.iter().find(|e| e.message_id.as_deref() == Some(m1.as_str())).unwrap();
    assert_eq!(committed.upstream_status, Some(200), "{kind}: {committed:#?}");
    assert_eq!(committed.fault, fault);

    // bob moves to relay-c (revision 2) and tells relay-b. A new message's
    // first attempt uses the route relay-a knows (revision 1): relay-b
    // refuses it with the newer route, which relay-a learns; m2's next
    // attempt goes to relay-c.
    let route2 = net.bob.account.route(2, &[("relay-c", net.cluster.url("relay-c"))], now());
    let cert = net.bob.account.certificate(&net.bob.devices[0], now(), None);
    cc.ok("account.register", None, &net.bob.account.register_params(&route2, &cert, "relay-c", true, now())).await;
    net.cb.ok("route.update", net.bob.token(0), &json!({"route": route2})).await;
    net.ca.ok("message.send", net.alice.token(0), &net.alice.send_params(&net.bob, &m2, true)).await;
    let st2 = wait_terminal(&net.ca, &net.alice, &m2, 20).await;
    assert_eq!(st2["status"], "target_accepted", "{kind}: {st2}");
    let d2 = net.proxy.deliveries(&m2);
    assert!(d2.iter().all(|e| e.upstream_status != Some(200)), "{kind}: relay-b never took m2: {d2:#?}");
    let known = net.ca.ok("route.get", net.alice.token(0), &json!({"account_id": net.bob.id()})).await;
    assert_eq!(known["revision"], 2, "{kind}: relay-a knows revision 2: {known}");

    // At least one more (faulted) attempt at relay-b while revision 2 is known.
    let t_known = Instant::now();
    net.proxy.wait_for("an m1 attempt after revision 2 was known", Duration::from_secs(15), |log| {
        log.iter().any(|e| e.message_id.as_deref() == Some(m1.as_str()) && e.at > t_known)
    });
    net.proxy.clear();
    let st1 = wait_terminal(&net.ca, &net.alice, &m1, 30).await;
    assert_eq!(st1["status"], "target_accepted", "{kind}: {st1}");
    assert_eq!(st1["accepted_at"], first["accepted_at"]);

    let d = net.proxy.deliveries(&m1);
    assert!(d.len() >= 3, "{kind}: {d:#?}");
    assert_same_bodies(kind, &d);
    assert!(d.iter().any(|e| e.fault == Fault::Pass && e.upstream_status == Some(200)), "{kind}: confirmed: {d:#?}");
    assert_eq!(records_of(&net.cb, net.bob.token(0).unwrap(), &m1).await, 1, "{kind}: exactly one m1 at relay-b");
    // relay-c: m2 once, m1 never.
    net.bob.relay_id = "relay-c".into();
    let token_c = net.bob.open_session(&cc, 0).await;
    assert_eq!(records_of(&cc, &token_c, &m2).await, 1, "{kind}: m2 at relay-c");
    assert_eq!(records_of(&cc, &token_c, &m1).await, 0, "{kind}: m1 must never reach relay-c");
    // The source's own log: every attempt of m1 targeted relay-b only.
    net.a.kill9();
    let targets = attempt_targets(&net.a.data_dir, net.alice.id(), &m1);
    assert!(targets.len() >= 3, "{kind}: {targets:?}");
    assert!(targets.iter().all(|t| t == &["relay-b".to_string()]), "{kind}: m1 switched target: {targets:?}");
}

#[actix_rt::test]
async fn reset_after_the_request_was_forwarded_is_confirmed_with_the_same_target() {
    unknown_result_is_confirmed_with_relay_b(Fault::ResetAfterRequest).await;
}

#[actix_rt::test]
async fn reset_before_the_response_is_confirmed_with_the_same_target() {
    unknown_result_is_confirmed_with_relay_b(Fault::ResetBeforeResponse).await;
}

#[actix_rt::test]
async fn response_trickled_slower_than_the_attempt_timeout_is_confirmed_with_the_same_target() {
    // ~200 bytes at 50 ms a byte: ~10 s, far beyond attempt_timeout (1 s).
    unknown_result_is_confirmed_with_relay_b(Fault::SlowBytes(Duration::from_millis(50))).await;
}
