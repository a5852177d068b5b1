//! Responsibility survives crashes: a source relay killed with SIGKILL while
//! hundreds of deliveries wait for a down destination resumes them all,
//! with the deadlines and attempt counts fixed before the crash.

use crate::common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use relay_actors::store::Store;
use relay_core::delivery::aggregate::DeliveryEvent;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

/// Per delivery stream: (deadline, attempt numbers in order).
fn deliveries(data_dir: &Path) -> BTreeMap<String, (u64, Vec<u32>)> {
    let store = Store::open(&data_dir.join("store")).unwrap();
    let mut out = BTreeMap::new();
    for stream in store.streams() {
        let stream = stream.unwrap();
        if !stream.starts_with("delivery/") {
            continue;
        }
        let (mut deadline, mut attempts) = (0, vec![]);
        for ev in store.read(&stream, 0) {
            match serde_json::from_str::<DeliveryEvent>(ev.unwrap().data.get()).unwrap() {
                DeliveryEvent::Accepted { deadline: d, .. } => deadline = d.0,
                DeliveryEvent::AttemptStarted { attempt, .. } => attempts.push(attempt),
                _ => {}
            }
        }
        out.insert(stream, (deadline, attempts));
    }
    out
}

#[actix_rt::test]
async fn sigkill_with_hundreds_pending_loses_nothing_and_delivers_each_once() {
    const N: u64 = 300;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let timetable = "[delivery]\nretry_timetable = [\"0s\", \"1s\"]\nretry_then_every = \"1s\"\nattempt_timeout = \"1s\"\n[limits]\ndelivery_age_limit = \"10m\"\n";
    let mut a = cluster.start("relay-a", timetable);
    let mut b = cluster.start("relay-b", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&Client::new(&b.url), "relay-b", 2, true).await;
    ca.ok("route.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    b.kill9();

    for n in 0..N {
        let st = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), true)).await;
        assert_eq!(st["status"], "delivering");
    }
    a.kill9();
    let before = deliveries(&a.data_dir);
    assert_eq!(before.len(), N as usize);
    assert!(before.values().all(|(_, attempts)| !attempts.is_empty()));

    a.restart();
    b.restart();
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    common::wait::eventually("all delivered", std::time::Duration::from_secs(60), || async {
        let sent = alice.sync_all(&ca, 0).await;
        assert_eq!(sent.len(), N as usize);
        let done = sent.iter().filter(|r| r["delivery"]["status"] == "target_accepted").count();
        if done == sent.len() {
            Ok(())
        } else {
            Err(format!("{done} of {} target_accepted", sent.len()))
        }
    })
    .await;
    let received = bob.sync_all(&cb, 0).await;
    let ids: std::collections::BTreeSet<String> =
        received.iter().map(|r| r["envelope"]["message_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(received.len(), N as usize, "each message exactly once");
    assert_eq!(ids.len(), N as usize);

    a.kill9();
    let after = deliveries(&a.data_dir);
    for (stream, (deadline, attempts)) in &before {
        let (deadline_after, attempts_after) = &after[stream];
        assert_eq!(deadline_after, deadline, "{stream}: the deadline fixed at acceptance");
        assert!(attempts_after.starts_with(attempts), "{stream}: attempts resume, never restart");
        assert!(attempts_after.windows(2).all(|w| w[1] == w[0] + 1), "{stream}: {attempts_after:?}");
    }
}
