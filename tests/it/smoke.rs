use crate::common;

use common::client::{mid, Client, User};
use common::relay::RelayProc;
use common::schema::assert_valid;
use serde_json::json;

#[actix_rt::test]
async fn two_accounts_exchange_a_message_on_one_relay() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let status = c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_valid("DeliveryStatus.schema.json", &status);
    assert_eq!(status["status"], "target_accepted", "{status}");
    let records = bob.sync_all(&c, 0).await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["direction"], "received");
    let sent = alice.sync_all(&c, 0).await;
    assert_eq!(sent[0]["delivery"]["status"], "target_accepted");
    let st = c.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await;
    assert_eq!(st, status);
}
