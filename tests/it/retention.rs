//! PROTOCOL §10 *Retention* and the seed's *Delivery Result Retention
//! Rules*, against real relays: what is past its retention is deleted by
//! the sweep (records, statuses, ledger entries, delivery streams, the
//! stream's prefix), sequences keep their gaps, a retry or a status query
//! afterwards is answered `message_expired`, and account state stays.
//! Retention is 2 s and the sweep runs every second; every wait polls what
//! it waits for, bounded.

use crate::common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use common::relay::RelayProc;
use common::wait::eventually;
use relay_actors::store::Store;
use serde_json::{json, Value};
use std::time::Duration;

const SHORT: &str = "[limits]\nmessage_retention = \"2s\"\nretention_sweep = \"1s\"\n";
const LIMIT: Duration = Duration::from_secs(30);

async fn status(c: &Client, user: &User, message_id: &str) -> (u16, Value) {
    c.call("message.delivery.status", user.token(0), &json!({ "message_id": message_id })).await
}

fn sequences(records: &[Value]) -> Vec<u64> {
    records.iter().map(|r| r["sequence"].as_u64().unwrap()).collect()
}

/// Waits until the sweep has taken `message_id`'s traces: gone from both
/// timelines, its status `message_expired`, and the relay's count of swept
/// messages at 2 (alice's send, bob's receipt; a status past retention
/// answers `message_expired` before the sweep too).
async fn swept(c: &Client, alice: &User, bob: &User, message_id: &str) {
    eventually("the sweep took the message", LIMIT, || async {
        let (bob_sees, alice_sees) = (bob.sync_all(c, 0).await, alice.sync_all(c, 0).await);
        let (_, st) = status(c, alice, message_id).await;
        let count = c.metric("relay_retention_swept_total").await.unwrap_or(0.0);
        let gone = bob_sees.is_empty() && alice_sees.is_empty() && st["error"]["code"] == "message_expired";
        if gone && count >= 2.0 {
            Ok(())
        } else {
            Err(format!("bob {} records, alice {}, status {st}, swept {count}", bob_sees.len(), alice_sees.len()))
        }
    })
    .await;
}

#[actix_rt::test]
async fn a_record_past_retention_is_gone_from_sync_and_its_sequence_stays_a_gap() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", SHORT);
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let first = alice.send_params(&bob, &mid(1), true);
    c.ok("message.send", alice.token(0), &first).await;
    // A local send may answer before the receipt is written.
    eventually("bob has the record", LIMIT, || async {
        let seen = sequences(&bob.sync_all(&c, 0).await);
        (seen == [1]).then_some(()).ok_or(format!("{seen:?}"))
    })
    .await;

    swept(&c, &alice, &bob, &mid(1)).await;

    // The next record takes the next sequence: the swept one leaves a gap.
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(2), true)).await;
    eventually("bob has the next record", LIMIT, || async {
        let seen = sequences(&bob.sync_all(&c, 0).await);
        (seen == [2]).then_some(()).ok_or(format!("{seen:?}"))
    })
    .await;
    let page = c.ok("message.timeline.sync", bob.token(0), &json!({"after": 0})).await;
    assert_eq!((page["next"].as_u64(), page["has_more"].as_bool()), (Some(2), Some(false)), "{page}");
}

/// Seed: "It may also return `message_expired` if it can determine that
/// retention has ended and the result is unavailable." A swept entry keeps
/// only that until no retry could pass the age check, so a client's late
/// retry is not taken as a second message.
#[actix_rt::test]
async fn a_retry_or_status_query_after_the_sweep_answers_message_expired() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", SHORT);
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 3, false).await;
    let bob = User::register(&c, "relay-a", 4, true).await;
    let params = alice.send_params(&bob, &mid(7), false);
    c.ok("message.send", alice.token(0), &params).await;
    swept(&c, &alice, &bob, &mid(7)).await;

    let (code, again) = c.call("message.send", alice.token(0), &params).await;
    assert_eq!((code, again["error"]["code"].as_str()), (422, Some("message_expired")), "{again}");
    let (code, st) = status(&c, &alice, &mid(7)).await;
    assert_eq!((code, st["error"]["code"].as_str()), (422, Some("message_expired")), "{st}");
    assert!(bob.sync_all(&c, 0).await.is_empty(), "the retry added no record");
}

/// Account state is never deleted by retention: the events that made it
/// leave with the stream's prefix, their state stays in the marker, and
/// the account works on after a restart.
#[actix_rt::test]
async fn account_state_stays_when_its_stream_is_pruned_and_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", SHORT);
    let c = Client::new(&relay.url);
    let mut alice = User::register(&c, "relay-a", 5, false).await;
    alice.add_device(&c, "laptop", 55).await;
    let bob = User::register(&c, "relay-a", 6, true).await;
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    swept(&c, &alice, &bob, &mid(1)).await;
    relay.terminate();

    let store = Store::open(&relay.data_dir.join("store")).unwrap();
    let stream = relay_actors::account::stream_id(alice.id());
    let marker = store.pruned(&stream).unwrap().expect("alice's stream was pruned");
    let first_left = store.read(&stream, 0).next().map(|e| e.unwrap().seq);
    assert!(first_left.is_none_or(|seq| seq == marker.head.seq + 1), "{first_left:?} after {:?}", marker.head);
    assert!(store.read(&stream, 0).all(|e| e.unwrap().event_type != "registered"), "registration pruned");
    drop(store);
    // PROTOCOL §10: a checkpoint is written before any pruning, so one
    // kept covers alice's stream at least through what was pruned.
    let covered = std::fs::read_dir(relay.data_dir.join("checkpoints")).unwrap().any(|f| {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        text.lines().skip(1).any(|leaf| {
            let leaf: Value = serde_json::from_str(leaf).unwrap();
            leaf[0] == stream.as_str() && leaf[1].as_u64().unwrap() >= marker.head.seq
        })
    });
    assert!(covered, "no checkpoint covers what was pruned");

    relay.restart();
    let c = Client::new(&relay.url);
    alice.tokens = vec![alice.open_session(&c, 0).await, alice.open_session(&c, 1).await];
    let devices = c.ok("account.devices.get", alice.token(0), &json!({"account_id": alice.id()})).await;
    assert_eq!(devices["certificates"].as_array().map(Vec::len), Some(2), "{devices}");
    let mut bob = bob;
    bob.tokens = vec![bob.open_session(&c, 0).await];
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(2), true)).await;
    eventually("bob's sequences go on after the gap", LIMIT, || async {
        let seen = sequences(&bob.sync_all(&c, 0).await);
        (seen == [2]).then_some(()).ok_or(format!("{seen:?}"))
    })
    .await;
}

/// PROTOCOL §10: "a finished delivery's stream likewise once its sender's
/// status is past retention". Its marker stays (a checkpoint that listed it
/// is still extended), its events and snapshot go.
#[actix_rt::test]
async fn a_finished_delivery_stream_is_deleted_once_its_status_is_past_retention() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let mut a = cluster.start("relay-a", SHORT);
    let b = cluster.start("relay-b", SHORT);
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 7, false).await;
    let bob = User::register(&cb, "relay-b", 8, true).await;
    let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(3), false)).await;
    eventually("delivered", LIMIT, || async {
        let (_, st) = status(&ca, &alice, &mid(3)).await;
        (st["status"] == "target_accepted").then_some(()).ok_or(format!("{st}"))
    })
    .await;
    drop(st);
    // A status past retention answers `message_expired` before the sweep
    // too: relay-a's own count says when its sweep took the send.
    eventually("swept at both ends", LIMIT, || async {
        let (_, st) = status(&ca, &alice, &mid(3)).await;
        let bob_sees = bob.sync_all(&cb, 0).await;
        let swept = ca.metric("relay_retention_swept_total").await.unwrap_or(0.0);
        (st["error"]["code"] == "message_expired" && bob_sees.is_empty() && swept >= 1.0)
            .then_some(())
            .ok_or(format!("status {st}, bob {} records, relay-a swept {swept}", bob_sees.len()))
    })
    .await;
    a.terminate();

    let store = Store::open(&a.data_dir.join("store")).unwrap();
    let stream = relay_actors::delivery::stream_id(alice.id(), &mid(3));
    assert_eq!(store.read(&stream, 0).count(), 0, "its events are gone");
    assert!(store.load_snapshot(&stream).unwrap().is_none(), "and its snapshot");
    let marker = store.pruned(&stream).unwrap().expect("its marker stays");
    assert_eq!(store.head(&stream).unwrap(), marker.head);
    assert!(store.kv_scan_prefix(relay_actors::delivery::DUE_PREFIX).next().is_none(), "no due entry is left");
}
