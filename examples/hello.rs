//! A small client: registers two accounts on a running relay, opens a
//! device session for each, sends a message from Alice to Bob and prints
//! Bob's timeline and Alice's delivery status. Given a second relay, Bob
//! lives there and the message goes across (the relays must be peers).
//!
//! ```text
//! cargo run --release -- serve --config config/default.toml            # in one terminal
//! cargo run --release --example hello -- http://127.0.0.1:7801 relay-a  # in another
//! cargo run --release --example hello -- http://127.0.0.1:7801 relay-a http://127.0.0.1:7802 relay-b
//! ```

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

struct Rpc {
    http: awc::Client,
    base: String,
}

impl Rpc {
    async fn call(&self, method: &str, token: Option<&str>, params: Value) -> Result<Value, String> {
        let mut req = self.http.post(format!("{}/v1/rpc/{method}", self.base));
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let mut resp = req.send_json(&params).await.map_err(|e| format!("{method}: {e}"))?;
        let body: Value = resp.json().limit(16 << 20).await.map_err(|e| format!("{method}: {e}"))?;
        if resp.status().is_success() {
            Ok(body)
        } else {
            Err(format!("{method}: {}", body["error"]))
        }
    }

    /// Registers the account with one device and opens a session for it.
    async fn register(
        &self,
        relay_id: &str,
        account: &Account,
        device: &Device,
        public: bool,
    ) -> Result<String, String> {
        let now = now();
        let route = account.route(1, &[(relay_id, &self.base)], now);
        let cert = account.certificate(device, now, None);
        self.call("account.register", None, account.register_params(&route, &cert, relay_id, public, now)).await?;
        let ch =
            self.call("session.challenge", None, json!({"account_id": account.id, "device_id": device.id})).await?;
        let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
        let signature = device.session_proof(&account.id, challenge, relay_id);
        let s = self
            .call(
                "session.open",
                None,
                json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": signature}),
            )
            .await?;
        Ok(s["token"].as_str().ok_or("no token")?.to_string())
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| "http://127.0.0.1:7801".into());
    let relay_id = args.next().unwrap_or_else(|| "relay-a".into());
    let rpc = Rpc { http: awc::Client::default(), base: base.clone() };
    // Bob's relay: the same one unless a second URL and relay id are given.
    let bob_base = args.next().unwrap_or(base);
    let bob_relay_id = args.next().unwrap_or_else(|| relay_id.clone());
    let bob_rpc = Rpc { http: awc::Client::default(), base: bob_base };

    // Fresh keys each run, so the example can run again on the same relay.
    let alice = Account::from_seed(rand::random());
    let phone = Device::from_seed("phone", rand::random());
    let bob = Account::from_seed(rand::random());
    let laptop = Device::from_seed("laptop", rand::random());
    let alice_token = rpc.register(&relay_id, &alice, &phone, false).await?;
    let bob_token = bob_rpc.register(&bob_relay_id, &bob, &laptop, true).await?;
    println!("alice {}\nbob   {}", alice.id, bob.id);

    // The ciphertext and boxes are opaque to the relay; a real client
    // encrypts to the devices' box keys.
    let message_id = relay_schemas::encoding::b64_encode(&rand::random::<[u8; 16]>());
    let envelope = phone.envelope(&alice.id, &bob.id, &message_id, now(), b"hello, bob");
    let params = json!({
        "envelope": envelope,
        "recipient_boxes": [key_box(&laptop.id, b"key for bob's laptop")],
        "sender_boxes": [key_box(&phone.id, b"key for alice's phone")],
    });
    let status = rpc.call("message.send", Some(&alice_token), params).await?;
    println!("message.send -> {status}");

    let page = bob_rpc.call("message.timeline.sync", Some(&bob_token), json!({"after": 0})).await?;
    println!("bob's timeline -> {}", serde_json::to_string_pretty(&page).unwrap_or_default());
    let status = rpc.call("message.delivery.status", Some(&alice_token), json!({"message_id": message_id})).await?;
    println!("message.delivery.status -> {status}");
    Ok(())
}
