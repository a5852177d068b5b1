//! Durability across crashes, restarts and passivation (seed: "Concurrent
//! requests, lost responses, and relay restarts do not alter these
//! requirements"; "The source's responsibility ... survives relay
//! restarts"; DESIGN: persist before effect, passivation and rehydration
//! from snapshot + tail, the in-flight index).
//!
//! Store inspection opens the relay's sled store from the test, so it is
//! only done while the relay process is stopped.

use crate::common;

use common::client::{mid, now, Client, User};
use common::relay::RelayProc;
use common::schema::assert_valid;
use common::wait::eventually;
use relay_actors::store::Store;
use relay_schemas::client::key_box;
use serde_json::{json, Value};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant};

// ---- messages and expectations ---------------------------------------------

/// One `message.send` request: who sends to whom, its exact body bytes and
/// the reply it got (if any).
#[derive(Clone, Debug)]
struct Msg {
    n: u64,
    from: usize,
    to: usize,
    sender_boxes: bool,
    body: Vec<u8>,
    reply: Option<Value>,
}

impl Msg {
    fn id(&self) -> String {
        mid(self.n)
    }
}

/// Messages `first..first+count` between users 0 and 1, cycling through
/// cross-account with sender boxes (both directions), self-delivery (both
/// accounts) and cross-account without sender boxes.
fn plan(users: &[User; 2], first: u64, count: u64) -> Vec<Msg> {
    (first..first + count)
        .map(|n| {
            let (from, to, sender_boxes) = match n % 5 {
                0 => (0, 1, true),
                1 => (1, 0, true),
                2 => (0, 0, false),
                3 => (1, 1, false),
                _ => (0, 1, false),
            };
            let p = users[from].send_params(&users[to], &mid(n), sender_boxes);
            Msg { n, from, to, sender_boxes, body: serde_json::to_vec(&p).unwrap(), reply: None }
        })
        .collect()
}

/// The (direction, message_id) pairs user `u`'s timeline must hold.
fn expected(msgs: &[Msg], u: usize) -> Vec<(String, String)> {
    let mut want: Vec<(String, String)> = msgs
        .iter()
        .filter_map(|m| {
            if m.from == u && m.to == u {
                Some(("received".to_string(), m.id()))
            } else if m.from == u && m.sender_boxes {
                Some(("sent".to_string(), m.id()))
            } else if m.to == u && m.from != u {
                Some(("received".to_string(), m.id()))
            } else {
                None
            }
        })
        .collect();
    want.sort();
    want
}

/// Sends every message, `parallel` at a time; every reply must be 200.
async fn send_all(c: &Client, users: &[User; 2], msgs: &mut [Msg], parallel: usize) {
    for chunk in msgs.chunks_mut(parallel) {
        let handles: Vec<_> = chunk
            .iter()
            .map(|m| {
                let (c, token, body) = (c.clone(), users[m.from].tokens[0].clone(), m.body.clone());
                actix_rt::spawn(async move { c.raw("message.send", Some(&token), body).await })
            })
            .collect();
        for (m, h) in chunk.iter_mut().zip(handles) {
            let (code, v) = h.await.expect("send task");
            assert_eq!(code, 200, "{}: {v}", m.id());
            assert_valid("DeliveryStatus.schema.json", &v);
            m.reply = Some(v);
        }
    }
}

/// The user's whole timeline: exactly the expected records, each once,
/// sequences strictly increasing from 1 without gaps.
async fn check_timeline(c: &Client, user: &User, want: &[(String, String)]) -> Vec<Value> {
    let records = user.sync_all(c, 0).await;
    let seqs: Vec<u64> = records.iter().map(|r| r["sequence"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=records.len() as u64).collect::<Vec<_>>(), "sequences of {}", user.id());
    let mut got: Vec<(String, String)> = records
        .iter()
        .map(|r| {
            (r["direction"].as_str().unwrap().to_string(), r["envelope"]["message_id"].as_str().unwrap().to_string())
        })
        .collect();
    got.sort();
    assert_eq!(got.len(), want.len(), "record count of {}", user.id());
    assert_eq!(got, want, "records of {}", user.id());
    records
}

async fn check_timelines(c: &Client, users: &[User; 2], msgs: &[Msg]) -> [Vec<Value>; 2] {
    [check_timeline(c, &users[0], &expected(msgs, 0)).await, check_timeline(c, &users[1], &expected(msgs, 1)).await]
}

/// `message.delivery.status` once the status is terminal (bounded poll).
async fn terminal_status(c: &Client, user: &User, message_id: &str) -> Value {
    eventually(&format!("{message_id} terminal"), Duration::from_secs(20), || async {
        let st = c.ok("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await;
        assert_valid("DeliveryStatus.schema.json", &st);
        if st["status"] != "delivering" {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await
}

/// `relay_deliveries_in_flight` is 0: no delivery is armed (set at start
/// from the due-time index, so a wrongly re-armed delivery shows at once).
async fn assert_nothing_in_flight(c: &Client) {
    assert_eq!(c.metric("relay_deliveries_in_flight").await, Some(0.0), "a delivery is armed");
}

/// Every message's status: equal to its reply if that was terminal,
/// otherwise `target_accepted` with the reply's `accepted_at`.
async fn check_statuses(c: &Client, users: &[User; 2], msgs: &[Msg]) -> Vec<Value> {
    let mut out = Vec::with_capacity(msgs.len());
    for m in msgs {
        let st = terminal_status(c, &users[m.from], &m.id()).await;
        let reply = m.reply.as_ref().expect("replied");
        if reply["status"] == "delivering" {
            assert_eq!(st["accepted_at"], reply["accepted_at"], "{}", m.id());
        } else {
            assert_eq!(&st, reply, "{}: status changed across the restart", m.id());
        }
        assert_eq!(st["status"], "target_accepted", "{}: {st}", m.id());
        out.push(st);
    }
    out
}

/// Re-sends every original request byte for byte: each answers its current
/// status (unchanged `accepted_at`).
async fn check_resend(c: &Client, users: &[User; 2], msgs: &[Msg], statuses: &[Value]) {
    for (m, st) in msgs.iter().zip(statuses) {
        let (code, v) = c.raw("message.send", users[m.from].token(0), m.body.clone()).await;
        assert_eq!(code, 200, "{}: {v}", m.id());
        assert_eq!(&v, st, "{}: duplicate answered differently", m.id());
    }
}

/// A fresh self-delivery for `user`; returns its sequence.
async fn probe_sequence(c: &Client, user: &User, message_id: &str) -> u64 {
    let d = &user.devices[0];
    let env = d.envelope(user.id(), user.id(), message_id, now(), b"probe");
    let p = json!({"envelope": env, "recipient_boxes": [key_box(&d.id, b"probe")]});
    let st = c.ok("message.send", user.token(0), &p).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    let records = user.sync_all(c, 0).await;
    let found: Vec<_> = records.iter().filter(|r| r["envelope"]["message_id"] == message_id).collect();
    assert_eq!(found.len(), 1, "{records:?}");
    found[0]["sequence"].as_u64().unwrap()
}

async fn register_pair(c: &Client) -> [User; 2] {
    [User::register(c, "relay-a", 1, true).await, User::register(c, "relay-a", 2, true).await]
}

// ---- store inspection (relay stopped) --------------------------------------

struct StoreView {
    /// In-flight index entries (`due/…`): stream ids.
    due: Vec<String>,
    /// Event types of every delivery stream.
    deliveries: BTreeMap<String, Vec<String>>,
    /// Per account stream: (head seq, snapshot seq).
    accounts: BTreeMap<String, (u64, Option<u64>)>,
}

fn inspect(data_dir: &Path) -> StoreView {
    let store = Store::open(&data_dir.join("store")).expect("open the stopped relay's store");
    let due = store
        .kv_scan_prefix(relay_actors::delivery::DUE_PREFIX)
        .map(|kv| relay_actors::delivery::parse_due_key(&kv.unwrap().0).expect("due key").1)
        .collect();
    let mut deliveries = BTreeMap::new();
    let mut accounts = BTreeMap::new();
    for stream in store.streams() {
        let stream = stream.unwrap();
        if stream.starts_with("delivery/") {
            let types = store.read(&stream, 0).map(|e| e.unwrap().event_type).collect();
            deliveries.insert(stream, types);
        } else if stream.starts_with("account/") {
            let head = store.head(&stream).unwrap().seq;
            let snap = store.load_snapshot(&stream).unwrap().map(|s| s.seq);
            accounts.insert(stream, (head, snap));
        }
    }
    store.close().unwrap();
    StoreView { due, deliveries, accounts }
}

fn account_stream(user: &User) -> String {
    relay_actors::account::stream_id(user.id())
}

// ---- tests -----------------------------------------------------------------

/// Persist before effect: every reply the relay gave describes durable
/// state, so a SIGKILL right after the last reply loses nothing.
#[actix_rt::test]
async fn sigkill_right_after_replies_loses_no_accepted_message() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 200);
    let t0 = Instant::now();
    send_all(&c, &users, &mut msgs, 10).await;
    relay.kill9();
    eprintln!("200 sends in {:?}", t0.elapsed());
    relay.restart();
    let c = Client::new(&relay.url);

    // Sessions survived (the same tokens are used from here on).
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines, "duplicates changed a timeline");
    for (u, user) in users.iter().enumerate() {
        assert_eq!(probe_sequence(&c, user, &mid(1000 + u as u64)).await, timelines[u].len() as u64 + 1);
    }
}

/// Responsibility survives restarts without re-delivery: after a SIGKILL
/// with every delivery finished, the restarted relay ends with an empty
/// in-flight index, exactly one attempt per delivery and unchanged
/// timelines, also after a second restart.
#[actix_rt::test]
async fn sigkill_after_deliveries_leaves_no_in_flight_work_and_nothing_redelivers() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 40);
    send_all(&c, &users, &mut msgs, 8).await;
    relay.kill9();
    let cross: Vec<&Msg> = msgs.iter().filter(|m| m.from != m.to).collect();
    let view = inspect(&relay.data_dir);
    assert!(!cross.is_empty());
    // Every recipient is an account of this relay: each delivery ended at
    // acceptance, so nothing was left in flight (no delivery stream, no
    // index entry) for a restart to re-arm.
    assert!(view.deliveries.is_empty(), "local deliveries need no stream: {:?}", view.deliveries.keys());
    assert!(view.due.is_empty(), "nothing in flight: {:?}", view.due);

    relay.restart();
    let c = Client::new(&relay.url);
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;
    // No delivery was re-armed (the gauge starts from the due-time index).
    assert_nothing_in_flight(&c).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    let status = relay.terminate();
    assert!(status.success(), "SIGTERM exit: {status:?}");

    let view = inspect(&relay.data_dir);
    assert!(view.due.is_empty(), "in-flight index not empty after restart: {:?}", view.due);
    assert!(view.deliveries.is_empty(), "a restart started a delivery: {:?}", view.deliveries.keys());

    relay.restart();
    let c = Client::new(&relay.url);
    assert_nothing_in_flight(&c).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    for (m, st) in msgs.iter().zip(&statuses) {
        let now_st = c.ok("message.delivery.status", users[m.from].token(0), &json!({"message_id": m.id()})).await;
        assert_eq!(&now_st, st, "{}", m.id());
    }
    check_resend(&c, &users, &msgs, &statuses).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
}

/// Seed: "A timeout, disconnection, or lost response does not prove
/// rejection. A retry MUST submit the unchanged request"; with the relay
/// killed while sends are in flight, unchanged retries after the restart
/// converge on exactly one record per message, and every acknowledged
/// message keeps its `accepted_at`.
#[actix_rt::test]
async fn sigkill_during_sends_then_unchanged_retries_converge() {
    stop_during_sends_then_retry(false).await;
}

/// SIGTERM while sends are in flight: the relay exits with status 0, every
/// request answered 200 is durable, none is answered with a rejection it
/// did not make, and unchanged retries of the rest converge.
#[actix_rt::test]
async fn sigterm_during_sends_keeps_every_acknowledged_message() {
    stop_during_sends_then_retry(true).await;
}

/// Fires 150 sends at once, stops the relay (SIGTERM if `graceful`, else
/// SIGKILL) after the 50th reply, restarts it and retries unanswered
/// requests unchanged.
async fn stop_during_sends_then_retry(graceful: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 150);

    let http = awc::Client::builder().timeout(Duration::from_secs(20)).finish();
    let done = Rc::new(Cell::new(0usize));
    let handles: Vec<_> = msgs
        .iter()
        .map(|m| {
            let req = http
                .post(format!("{}/v1/rpc/message.send", relay.url))
                .content_type("application/json")
                .insert_header(("Authorization", format!("Bearer {}", users[m.from].tokens[0])));
            let (body, done) = (m.body.clone(), done.clone());
            actix_rt::spawn(async move {
                let mut resp = req.send_body(body).await.map_err(|e| e.to_string())?;
                let bytes = resp.body().await.map_err(|e| e.to_string())?;
                let v: Value = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
                done.set(done.get() + 1);
                Ok::<_, String>((resp.status().as_u16(), v))
            })
        })
        .collect();
    eventually("50 replies", Duration::from_secs(60), || async {
        (done.get() >= 50).then_some(()).ok_or_else(|| format!("{} replies", done.get()))
    })
    .await;
    if graceful {
        let status = relay.terminate();
        assert_eq!(status.code(), Some(0), "SIGTERM during sends: {status:?}");
    } else {
        relay.kill9();
    }
    let (mut acked, mut refused, mut lost) = (0, BTreeMap::<u16, usize>::new(), 0);
    for (m, h) in msgs.iter_mut().zip(handles) {
        match h.await.expect("send task") {
            Ok((200, v)) => {
                m.reply = Some(v);
                acked += 1;
            }
            Ok((code, v)) => {
                // Shutting down may refuse work, but only with a code that
                // tells the client to retry, never a rejection.
                assert!([500, 502, 503].contains(&code), "{}: {code} {v}", m.id());
                *refused.entry(code).or_default() += 1;
            }
            Err(_) => lost += 1,
        }
    }
    eprintln!(
        "{}: {acked} of {} sends answered 200, refused {refused:?}, {lost} without answer",
        if graceful { "SIGTERM" } else { "SIGKILL" },
        msgs.len()
    );

    relay.restart();
    let c = Client::new(&relay.url);
    // Before any retry: every acknowledged message is known with its accepted_at.
    let mut known = vec![None; msgs.len()];
    for (i, m) in msgs.iter().enumerate() {
        let (code, v) = c.call("message.delivery.status", users[m.from].token(0), &json!({"message_id": m.id()})).await;
        match code {
            200 => known[i] = Some(v["accepted_at"].clone()),
            404 => assert!(m.reply.is_none(), "{}: acknowledged but unknown after restart: {v}", m.id()),
            _ => panic!("{}: {code} {v}", m.id()),
        }
        if let Some(r) = &m.reply {
            assert_eq!(known[i].as_ref(), Some(&r["accepted_at"]), "{}", m.id());
        }
    }
    let unanswered_known = (0..msgs.len()).filter(|&i| msgs[i].reply.is_none() && known[i].is_some()).count();
    eprintln!("{unanswered_known} unanswered sends were accepted before the stop");
    // Unchanged retries of everything.
    for (i, m) in msgs.iter_mut().enumerate() {
        let (code, v) = c.raw("message.send", users[m.from].token(0), m.body.clone()).await;
        assert_eq!(code, 200, "{}: {v}", m.id());
        if let Some(at) = &known[i] {
            assert_eq!(&v["accepted_at"], at, "{}: retry changed accepted_at", m.id());
        }
        if m.reply.is_none() {
            m.reply = Some(v);
        }
    }
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    for (u, user) in users.iter().enumerate() {
        assert_eq!(probe_sequence(&c, user, &mid(1000 + u as u64)).await, timelines[u].len() as u64 + 1);
    }
}

const PASSIVATE: &str = "[actors]\npassivate_after = \"200ms\"\nsnapshot_every = 5\n";

/// Waits until every account actor has passivated (200 ms idle, checked
/// every 100 ms): `relay_account_actors_resident` is 0.
async fn idle(c: &Client) {
    eventually("every account actor passivated", Duration::from_secs(10), || async {
        match c.metric("relay_account_actors_resident").await {
            Some(0.0) => Ok(()),
            n => Err(format!("relay_account_actors_resident {n:?}")),
        }
    })
    .await
}

/// DESIGN: account actors are passivated when idle and rehydrated from
/// snapshot + tail; state, idempotency results and sequences survive.
#[actix_rt::test]
async fn passivated_accounts_rehydrate_from_snapshot_and_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", PASSIVATE);
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 23);
    send_all(&c, &users, &mut msgs, 1).await;
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;

    idle(&c).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines, "sync after passivation");
    idle(&c).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    idle(&c).await;
    for m in &msgs {
        let st = c.ok("message.delivery.status", users[m.from].token(0), &json!({"message_id": m.id()})).await;
        assert_eq!(st["accepted_at"], m.reply.as_ref().unwrap()["accepted_at"]);
    }
    idle(&c).await;
    // New sends continue the sequences (no reuse).
    let mut more = plan(&users, 24, 12);
    send_all(&c, &users, &mut more, 1).await;
    msgs.extend(more);
    let after = check_timelines(&c, &users, &msgs).await;
    for u in 0..2 {
        assert_eq!(after[u][..timelines[u].len()], timelines[u][..], "old records changed");
    }
    // A new session after passivation; old tokens still work (used above).
    idle(&c).await;
    let token = users[0].open_session(&c, 0).await;
    c.ok("message.timeline.sync", Some(&token), &json!({"after": 0})).await;

    // Crash without passivation: the next load is snapshot + tail.
    let mut more = plan(&users, 36, 7);
    send_all(&c, &users, &mut more, 1).await;
    msgs.extend(more);
    relay.kill9();
    let view = inspect(&relay.data_dir);
    for u in &users {
        let (head, snap) = view.accounts[&account_stream(u)];
        eprintln!("after SIGKILL {}: head {head}, snapshot {snap:?}", u.id());
        assert!(snap.is_some(), "no snapshot with snapshot_every = 5");
    }
    relay.restart();
    let c = Client::new(&relay.url);
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    idle(&c).await;
    let mut more = plan(&users, 43, 6);
    send_all(&c, &users, &mut more, 2).await;
    msgs.extend(more);
    let after = check_timelines(&c, &users, &msgs).await;
    for u in 0..2 {
        assert_eq!(after[u][..timelines[u].len()], timelines[u][..], "old records changed");
    }

    // Idle again, then stop: a passivated actor leaves its snapshot at its head.
    idle(&c).await;
    assert!(relay.terminate().success());
    let view = inspect(&relay.data_dir);
    for u in &users {
        let (head, snap) = view.accounts[&account_stream(u)];
        assert_eq!(snap, Some(head), "{}: no snapshot at the head after passivation", u.id());
    }
}

/// With snapshots only from passivation (snapshot_every default 1000), an
/// idle account is snapshotted at its head and answers from it afterwards.
#[actix_rt::test]
async fn idle_account_is_passivated_with_a_snapshot_at_its_head() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "[actors]\npassivate_after = \"200ms\"\n");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 7);
    send_all(&c, &users, &mut msgs, 1).await;
    let timelines = check_timelines(&c, &users, &msgs).await;
    idle(&c).await;
    assert!(relay.terminate().success());
    let view = inspect(&relay.data_dir);
    for u in &users {
        let (head, snap) = view.accounts[&account_stream(u)];
        assert!(head > 1);
        assert_eq!(snap, Some(head), "{}: idle account was not passivated", u.id());
    }
    relay.restart();
    let c = Client::new(&relay.url);
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    let statuses = check_statuses(&c, &users, &msgs).await;
    check_resend(&c, &users, &msgs, &statuses).await;
}

/// SIGTERM stops the relay cleanly (exit status 0) and a restart keeps
/// everything: timelines, results, idempotency and sessions.
#[actix_rt::test]
async fn sigterm_exits_zero_and_restart_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 30);
    send_all(&c, &users, &mut msgs, 5).await;
    let timelines = check_timelines(&c, &users, &msgs).await;
    let t0 = Instant::now();
    let status = relay.terminate();
    eprintln!("SIGTERM to exit: {:?}", t0.elapsed());
    assert_eq!(status.code(), Some(0), "{status:?}");
    let view = inspect(&relay.data_dir);
    assert!(view.due.is_empty(), "in-flight index after a clean stop: {:?}", view.due);

    relay.restart();
    let c = Client::new(&relay.url);
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    let statuses = check_statuses(&c, &users, &msgs).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    for (u, user) in users.iter().enumerate() {
        assert_eq!(probe_sequence(&c, user, &mid(1000 + u as u64)).await, timelines[u].len() as u64 + 1);
    }
    // And it stops cleanly again.
    assert_eq!(relay.terminate().code(), Some(0));
}

/// Seed: "The source's responsibility continues until a terminal state or
/// delivery deadline and survives relay restarts"; PROTOCOL §6: "an
/// accepted delivery resumes after a crash with its fixed deadline, its
/// attempt count and its original params". A delivery is kept pending by
/// moving the recipient's route to an unreachable relay, the source is
/// killed, and after the restart (and the route moving back) the delivery
/// completes once.
#[actix_rt::test]
async fn sigkill_with_a_delivery_pending_resumes_it_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "[delivery]\nretry_timetable = [\"0s\", \"1s\", \"2s\", \"3s\"]\nretry_then_every = \"1s\"\n";
    let mut relay = RelayProc::start(dir.path(), "relay-a", extra);
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let [alice, bob] = &users;
    let away = bob.account.route(2, &[("relay-b", "http://127.0.0.1:9")], now());
    c.ok("route.update", bob.token(0), &json!({ "route": away })).await;

    let p = alice.send_params(bob, &mid(1), true);
    let st = c.ok("message.send", alice.token(0), &p).await;
    assert_eq!(st["status"], "delivering", "{st}");
    assert_eq!(c.ok("message.send", alice.token(0), &p).await, st, "duplicate while delivering");
    relay.kill9();
    let view = inspect(&relay.data_dir);
    let stream = relay_actors::delivery::stream_id(alice.id(), &mid(1));
    assert!(view.due.contains(&stream), "pending delivery missing from the in-flight index: {:?}", view.due);
    let before = view.deliveries[&stream].clone();
    eprintln!("before restart: {before:?}");

    relay.restart();
    let c = Client::new(&relay.url);
    let now_st = c.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await;
    assert_eq!(now_st["accepted_at"], st["accepted_at"]);
    let home = bob.account.route(3, &[("relay-a", relay.url.as_str())], now());
    c.ok("route.update", bob.token(0), &json!({ "route": home })).await;
    let done = terminal_status(&c, alice, &mid(1)).await;
    assert_eq!(done, json!({"status": "target_accepted", "accepted_at": st["accepted_at"]}));
    assert_eq!(c.ok("message.send", alice.token(0), &p).await, done);
    let b = bob.sync_all(&c, 0).await;
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(b[0]["envelope"], p["envelope"]);
    let a = alice.sync_all(&c, 0).await;
    assert_eq!(a.len(), 1, "{a:?}");
    assert_eq!(a[0]["delivery"], done);

    assert!(relay.terminate().success());
    let view = inspect(&relay.data_dir);
    assert!(view.due.is_empty(), "{:?}", view.due);
    let types = &view.deliveries[&stream];
    eprintln!("after: {types:?}");
    assert_eq!(types[..before.len()], before[..], "history rewritten");
    assert_eq!(types.iter().filter(|t| *t == "accepted").count(), 1);
    assert_eq!(types.last().map(String::as_str), Some("finished"));
}

/// Passivation racing with requests: with a 20 ms idle limit, requests
/// arrive while actors are passivating and rehydrating; nothing is lost,
/// duplicated or re-sequenced, and every duplicate answers its result.
#[actix_rt::test]
async fn passivation_racing_with_requests_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "[actors]\npassivate_after = \"20ms\"\nsnapshot_every = 3\n");
    let c = Client::new(&relay.url);
    let users = register_pair(&c).await;
    let mut msgs = plan(&users, 1, 60);
    for i in 0..msgs.len() {
        // Waits for the relay process's passivation timer: requests spaced around its idle limit, 0..=35 ms.
        actix_rt::time::sleep(Duration::from_millis((i as u64 * 7) % 36)).await;
        let m = msgs[i].clone();
        let dup = (i > 0).then(|| msgs[i - 1].clone());
        let (c1, c2) = (c.clone(), c.clone());
        let t1 = users[m.from].tokens[0].clone();
        let h = actix_rt::spawn(async move { c1.raw("message.send", Some(&t1), m.body.clone()).await });
        let h2 = dup.map(|d| {
            let t2 = users[d.from].tokens[0].clone();
            actix_rt::spawn(async move { (d.reply.clone(), c2.raw("message.send", Some(&t2), d.body.clone()).await) })
        });
        let (code, v) = h.await.unwrap();
        assert_eq!(code, 200, "{}: {v}", msgs[i].id());
        msgs[i].reply = Some(v);
        if let Some(h2) = h2 {
            let (prev, (code, v)) = h2.await.unwrap();
            assert_eq!(code, 200, "duplicate: {v}");
            assert_eq!(v["accepted_at"], prev.unwrap()["accepted_at"], "duplicate accepted_at");
        }
    }
    let timelines = check_timelines(&c, &users, &msgs).await;
    let statuses = check_statuses(&c, &users, &msgs).await;
    idle(&c).await;
    check_resend(&c, &users, &msgs, &statuses).await;
    assert_eq!(check_timelines(&c, &users, &msgs).await, timelines);
    for (u, user) in users.iter().enumerate() {
        assert_eq!(probe_sequence(&c, user, &mid(1000 + u as u64)).await, timelines[u].len() as u64 + 1);
    }
}
