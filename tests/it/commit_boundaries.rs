//! A crash at each commit boundary of the write path (see
//! `Supervisor::message_send`): the relay aborts at a crash point
//! (`RELAY_CRASH_AT`, `actors/src/crash.rs`) once what it committed before
//! is durable, restarts, and the message ends delivered exactly once, with
//! the client's unchanged retry answered as for the first request.

use crate::common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use common::relay::RelayProc;
use common::wait::eventually;
use serde_json::{json, Value};
use std::time::Duration;

const EXIT: Duration = Duration::from_secs(20);

/// Records on `user`'s timeline (device 0) carrying `message_id`.
async fn records_of(c: &Client, user: &User, message_id: &str) -> usize {
    let records = user.sync_all(c, 0).await;
    records.iter().filter(|r| r["envelope"]["message_id"] == message_id).count()
}

/// Polls `message.delivery.status` until it is terminal (bounded).
async fn terminal(c: &Client, user: &User, message_id: &str) -> Value {
    eventually(&format!("{message_id} terminal"), Duration::from_secs(20), || async {
        let st = c.ok("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await;
        if st["status"] != "delivering" {
            Ok(st)
        } else {
            Err(st.to_string())
        }
    })
    .await
}

/// Local send, crash after the receipt (commit 1) and before the
/// acceptance (commit 2): the client got no answer; the recipient holds the
/// record; the sender knows nothing of the message. A send of other params
/// under that id gets the recipient's `state_conflict` and writes nothing.
/// The unchanged retry is accepted, the recipient answers its duplicate,
/// the sender settles: `target_accepted`, one record on each side.
#[actix_rt::test]
async fn a_crash_between_receipt_and_acceptance_is_repaired_by_the_unchanged_retry() {
    let dir = tempfile::tempdir().unwrap();
    let config = common::relay::write_config(dir.path(), "relay-a", "");
    let mut relay = RelayProc::start_config("relay-a", config.clone(), dir.path().join("relay-a"), "warn");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    relay.terminate();
    let data = dir.path().join("relay-a");
    let mut relay =
        RelayProc::start_config_env("relay-a", config, data, "warn", &[("RELAY_CRASH_AT", "send.after_receipt")]);
    let c = Client::new(&relay.url);
    let (alice, bob) = (reopen(&c, alice).await, reopen(&c, bob).await);
    let m = mid(1);
    let params = alice.send_params(&bob, &m, true);
    let first = c.try_call("message.send", alice.token(0), &params).await;
    assert!(first.is_err(), "the relay died before answering: {first:?}");
    assert!(!relay.wait_exit(EXIT).success());

    relay.restart();
    let c = Client::new(&relay.url);
    let (alice, bob) = (reopen(&c, alice).await, reopen(&c, bob).await);
    assert_eq!(records_of(&c, &bob, &m).await, 1, "the receipt was durable");
    let unknown = c.err("message.delivery.status", alice.token(0), &json!({ "message_id": m })).await;
    assert_eq!(unknown, "not_found", "the acceptance was not written");

    // Other params under the id the recipient holds are refused as they
    // are, and write nothing at the sender: the unchanged retry still gets
    // its own answer below, not this one's.
    let mut other = params.clone();
    other["recipient_boxes"][0]["box"] = json!(relay_schemas::encoding::b64_encode(b"another box"));
    assert_eq!(c.err("message.send", alice.token(0), &other).await, "state_conflict");
    let still = c.err("message.delivery.status", alice.token(0), &json!({ "message_id": m })).await;
    assert_eq!(still, "not_found", "the refused send wrote nothing at the sender");

    let retry = c.ok("message.send", alice.token(0), &params).await;
    assert_eq!(retry["status"], "target_accepted", "{retry}");
    assert_eq!(records_of(&c, &bob, &m).await, 1, "no second record at the recipient");
    assert_eq!(records_of(&c, &alice, &m).await, 1, "one sent record");
    assert_eq!(c.ok("message.send", alice.token(0), &params).await, retry, "a later retry: the same answer");
}

/// Opens a fresh session for `user` on a (re)started relay.
async fn reopen(c: &Client, mut user: User) -> User {
    user.tokens = vec![user.open_session(c, 0).await];
    user
}

/// Two relays; relay-a (the source) runs with the crash point `point` armed
/// and is restarted after it aborts. Returns (relay-a client, relay-b
/// client, alice, bob, message id, the send params) after the restart.
async fn remote_crash(
    point: &str,
) -> (tempfile::TempDir, RelayProc, RelayProc, Client, Client, User, User, String, Value) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let b = cluster.start("relay-b", "");
    let cb = Client::new(&b.url);
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let mut a = cluster.start_env("relay-a", "", "warn", &[("RELAY_CRASH_AT", point)]);
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let m = mid(1);
    let params = alice.send_params(&bob, &m, true);
    let first = ca.try_call("message.send", alice.token(0), &params).await;
    assert!(first.is_err(), "{point}: the relay died before answering: {first:?}");
    assert!(!a.wait_exit(EXIT).success());
    a.restart();
    let ca = Client::new(&a.url);
    let alice = reopen(&ca, alice).await;
    (dir, a, b, ca, cb, alice, bob, m, params)
}

/// Remote send, crash once the acceptance (with the first attempt) is
/// durable and before the request leaves: the restarted relay resumes the
/// delivery from its index and delivers it once.
#[actix_rt::test]
async fn a_crash_after_acceptance_before_the_first_request_delivers_once_after_restart() {
    let (_dir, _a, _b, ca, cb, alice, bob, m, params) = remote_crash("deliver.before_send").await;
    let st = terminal(&ca, &alice, &m).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    assert_eq!(records_of(&cb, &bob, &m).await, 1);
    assert_eq!(ca.ok("message.send", alice.token(0), &params).await, st, "the retry answers the result");
    assert_eq!(records_of(&ca, &alice, &m).await, 1, "one sent record");
}

/// Remote send, crash after relay-b took the message and before relay-a
/// wrote the outcome: after the restart the attempt left in flight is
/// confirmed with relay-b, whose idempotent receipt answers without a
/// second record.
#[actix_rt::test]
async fn a_crash_before_the_outcome_is_written_is_confirmed_without_a_second_record() {
    let (_dir, _a, _b, ca, cb, alice, bob, m, params) = remote_crash("deliver.before_outcome").await;
    assert_eq!(records_of(&cb, &bob, &m).await, 1, "relay-b took it before the crash");
    let st = terminal(&ca, &alice, &m).await;
    assert_eq!(st["status"], "target_accepted", "{st}");
    assert_eq!(records_of(&cb, &bob, &m).await, 1, "confirmed, not delivered twice");
    assert_eq!(ca.ok("message.send", alice.token(0), &params).await, st);
}
