//! Realtime devices over real WebSocket connections.

mod common;

use common::client::{mid, Client, User};
use common::relay::RelayProc;
use common::ws::{WsClient, WAIT};
use serde_json::json;

#[actix_rt::test]
async fn recipient_device_is_notified_and_sender_sees_delivery_status() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    let mut bob_ws = WsClient::connect(&relay.url, bob.token(0)).await;
    let mut alice_ws = WsClient::attach(&relay.url, alice.token(0).unwrap()).await;

    let status = alice_ws.ok("message.send", alice.send_params(&bob, &mid(1), false)).await;
    assert_eq!(status["status"], "target_accepted");
    let n = bob_ws.notification(WAIT).await.expect("timeline notification");
    assert_eq!(n, json!({"method": "message.timeline.changed", "params": {"account_id": bob.id(), "sequence": 1}}));
    let page = bob_ws.ok("message.timeline.sync", json!({"after": 0})).await;
    assert_eq!(page["records"][0]["envelope"]["message_id"], mid(1));

    let d1 = alice_ws.notification(WAIT).await.unwrap();
    assert_eq!(d1["method"], "message.delivery.changed");
    assert_eq!(d1["params"]["status"], "delivering");
    let d2 = alice_ws.notification(WAIT).await.unwrap();
    assert_eq!(d2["params"], json!({"message_id": mid(1), "status": "target_accepted"}));
}
