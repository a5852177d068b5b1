//! A small client: registers two accounts on a running relay, opens a
//! device session for each, sends an end-to-end encrypted message
//! (`relay-e2e/v1`, PROTOCOL §8) from Alice to Bob, and prints Bob's
//! timeline, the text Bob decrypts from it and Alice's delivery status.
//! Given a second relay, Bob lives there and the message goes across (the
//! relays must be peers).
//!
//! ```text
//! cargo run --release -- serve --config config/default.toml            # in one terminal
//! cargo run --release --example hello -- http://127.0.0.1:7801 relay-a  # in another
//! cargo run --release --example hello -- http://127.0.0.1:7801 relay-a http://127.0.0.1:7802 relay-b
//! ```

use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::e2e;
use relay_schemas::encoding::b64_encode;
use relay_schemas::sign::parse_public_key;
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
    let phone = Device::with_box_secret("phone", rand::random(), rand::random());
    let bob = Account::from_seed(rand::random());
    let laptop = Device::with_box_secret("laptop", rand::random(), rand::random());
    let alice_token = rpc.register(&relay_id, &alice, &phone, false).await?;
    let bob_token = bob_rpc.register(&bob_relay_id, &bob, &laptop, true).await?;
    println!("alice {}\nbob   {}", alice.id, bob.id);

    // One content key for the message, boxed to Bob's laptop and to Alice's
    // own phone (so her other devices could read what she sent).
    let message_id = b64_encode(&rand::random::<[u8; 16]>());
    let random = e2e::Randomness {
        content_key: rand::random(),
        nonce: rand::random(),
        boxes: &[(rand::random(), rand::random()), (rand::random(), rand::random())],
    };
    let sealed = e2e::encrypt(
        &message_id,
        &e2e::text("hello, bob"),
        &[(&laptop.id, laptop.box_key), (&phone.id, phone.box_key)],
        &random,
    )
    .map_err(|e| e.to_string())?;
    let envelope = phone.envelope(&alice.id, &bob.id, &message_id, now(), &sealed.ciphertext);
    let params = json!({
        "envelope": envelope,
        "recipient_boxes": [key_box(&sealed.boxes[0].0, &sealed.boxes[0].1)],
        "sender_boxes": [key_box(&sealed.boxes[1].0, &sealed.boxes[1].1)],
    });
    let status = rpc.call("message.send", Some(&alice_token), params).await?;
    println!("message.send -> {status}");

    let page = bob_rpc.call("message.timeline.sync", Some(&bob_token), json!({"after": 0})).await?;
    println!("bob's timeline -> {}", serde_json::to_string_pretty(&page).unwrap_or_default());
    // Bob checks the envelope against Alice's device certificate, then opens
    // his box: the relay only ever held ciphertext.
    let devices = bob_rpc.call("account.devices.get", Some(&bob_token), json!({"account_id": alice.id})).await?;
    let cert = devices["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["device_id"] == phone.id.as_str())
        .ok_or("alice's phone has no certificate")?;
    let key =
        parse_public_key("device_key", cert["device_key"].as_str().unwrap_or_default()).map_err(|e| e.to_string())?;
    let secret = laptop.box_secret.ok_or("no box secret")?;
    let plaintext = e2e::open_record(&page["records"][0], &key, &laptop.id, &secret).map_err(|e| e.to_string())?;
    println!("bob reads -> {:?}", e2e::read_text(&plaintext).map_err(|e| e.to_string())?);
    let status = rpc.call("message.delivery.status", Some(&alice_token), json!({"message_id": message_id})).await?;
    println!("message.delivery.status -> {status}");
    Ok(())
}
