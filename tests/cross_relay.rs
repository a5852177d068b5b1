//! Cross-relay delivery between real relays on loopback.

mod common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use common::schema::assert_valid;
use serde_json::json;

#[actix_rt::test]
async fn message_crosses_from_its_source_relay_to_the_recipients_home_relay() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;

    // A sender builds key boxes from the recipient's devices, fetched through its own relay.
    let devices = ca.ok("account.devices.get", alice.token(0), &json!({"account_id": bob.id()})).await;
    assert_valid("methods/account.devices.get.result.schema.json", &devices);
    assert_eq!(devices["certificates"][0]["device_id"], "phone");

    let status = ca.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
    let received = bob.sync_all(&cb, 0).await;
    assert_eq!(received.len(), 1);
    assert_eq!(received[0]["envelope"]["message_id"], mid(1));
    let sent = alice.sync_all(&ca, 0).await;
    assert_eq!(sent[0]["delivery"]["status"], "target_accepted");
}
