//! One account on two home relays (SHiNE's access-server pair): Alice's
//! route names relay-a and relay-b; she registers at relay-a, and relay-b
//! learns her account by `timeline.replicate` (PROTOCOL §5). Bob, at
//! relay-a, writes to her; she reads the message at both homes and answers
//! from relay-b. The relays must be peers (docs/guide/two-relays.md).
//!
//! ```text
//! cargo run --release --example two_homes -- http://127.0.0.1:7801 relay-a http://127.0.0.1:7802 relay-b
//! ```

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

struct Rpc {
    http: awc::Client,
    base: String,
    relay_id: String,
}

impl Rpc {
    fn new(base: String, relay_id: String) -> Self {
        Rpc { http: awc::Client::default(), base, relay_id }
    }

    async fn call(&self, method: &str, token: Option<&str>, params: Value) -> Result<Value, String> {
        let mut req = self.http.post(format!("{}/v1/rpc/{method}", self.base));
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let mut resp = req.send_json(&params).await.map_err(|e| format!("{method}: {e}"))?;
        let body: Value = resp.json().limit(16 << 20).await.map_err(|e| format!("{method}: {e}"))?;
        match resp.status().is_success() {
            true => Ok(body),
            false => Err(format!("{method}: {}", body["error"])),
        }
    }

    /// A session for `device` of `account` at this relay.
    async fn session(&self, account: &Account, device: &Device) -> Result<String, String> {
        let ask = json!({"account_id": account.id, "device_id": device.id});
        let ch = self.call("session.challenge", None, ask).await?;
        let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
        let signature = device.session_proof(&account.id, challenge, &self.relay_id);
        let open =
            json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": signature});
        let s = self.call("session.open", None, open).await?;
        Ok(s["token"].as_str().ok_or("no token")?.to_string())
    }

    /// Registers `account` here under `homes` (this relay first) and opens a session.
    async fn register(&self, account: &Account, device: &Device, homes: &[(&str, &str)]) -> Result<String, String> {
        let route = account.route(1, homes, now());
        let cert = account.certificate(device, now(), None);
        let params = account.register_params(&route, &cert, &self.relay_id, true, now());
        self.call("account.register", None, params).await?;
        self.session(account, device).await
    }

    /// `from`'s text message to `to` (boxes are placeholders here; `hello`
    /// shows the real `relay-e2e/v1` encryption).
    async fn send(
        &self,
        token: &str,
        from: (&Account, &Device),
        to: (&Account, &Device),
        text: &str,
    ) -> Result<Value, String> {
        let id = format!("two-homes-{:032x}", rand::random::<u128>());
        let envelope = from.1.envelope(&from.0.id, &to.0.id, &id, now(), text.as_bytes());
        let params = json!({"envelope": envelope, "recipient_boxes": [key_box(&to.1.id, b"box")],
                            "sender_boxes": [key_box(&from.1.id, b"box")]});
        self.call("message.send", Some(token), params).await
    }

    /// `(sequence, direction, message_id)` of the device's timeline here.
    async fn timeline(&self, token: &str) -> Result<Vec<(u64, String, String)>, String> {
        let page = self.call("message.timeline.sync", Some(token), json!({"after": 0, "limit": 500})).await?;
        let records = page["records"].as_array().cloned().unwrap_or_default();
        let line = |r: &Value| {
            let (seq, dir) = (r["sequence"].as_u64().unwrap_or(0), r["direction"].as_str().unwrap_or("").to_owned());
            (seq, dir, r["envelope"]["message_id"].as_str().unwrap_or("").to_owned())
        };
        Ok(records.iter().map(line).collect())
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Retries `f` every 100 ms for up to 10 s (replication is asynchronous).
async fn within_10s<T, F: std::future::Future<Output = Result<T, String>>>(
    mut f: impl FnMut() -> F,
) -> Result<T, String> {
    let mut last = String::new();
    for _ in 0..100 {
        match f().await {
            Ok(v) => return Ok(v),
            Err(e) => last = e,
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not within 10 s: {last}"))
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url_a, id_a, url_b, id_b] = <[String; 4]>::try_from(args).map_err(|_| "usage: URL_A ID_A URL_B ID_B")?;
    let (a, b) = (Rpc::new(url_a.clone(), id_a.clone()), Rpc::new(url_b.clone(), id_b.clone()));
    let (alice, phone) = (Account::from_seed(rand::random()), Device::from_seed("phone", rand::random()));
    let (bob, laptop) = (Account::from_seed(rand::random()), Device::from_seed("laptop", rand::random()));

    let alice_at_a = a.register(&alice, &phone, &[(&id_a, &url_a), (&id_b, &url_b)]).await?;
    let bob_token = a.register(&bob, &laptop, &[(&id_a, &url_a)]).await?;
    println!("alice {} (homes {id_a}, {id_b})\nbob   {} (home {id_a})", alice.id, bob.id);
    let alice_at_b = within_10s(|| b.session(&alice, &phone)).await?;
    println!("alice has a session at {id_b} too");

    let st = a.send(&bob_token, (&bob, &laptop), (&alice, &phone), "hi alice").await?;
    println!("bob -> alice: {st}");
    let reply = b.send(&alice_at_b, (&alice, &phone), (&bob, &laptop), "hi bob, from my other home").await?;
    println!("alice (at {id_b}) -> bob: {reply}");

    let both = |t: &Vec<(u64, String, String)>| t.len() == 2;
    let at_a = within_10s(|| async {
        a.timeline(&alice_at_a).await.and_then(|t| if both(&t) { Ok(t) } else { Err(format!("{t:?}")) })
    })
    .await?;
    let at_b = within_10s(|| async {
        b.timeline(&alice_at_b).await.and_then(|t| if both(&t) { Ok(t) } else { Err(format!("{t:?}")) })
    })
    .await?;
    println!("alice's timeline at {id_a}: {at_a:?}\nalice's timeline at {id_b}: {at_b:?}");
    let ids = |t: &[(u64, String, String)]| {
        let mut ids: Vec<_> = t.iter().map(|r| (r.2.clone(), r.1.clone())).collect();
        ids.sort();
        ids
    };
    if ids(&at_a) != ids(&at_b) {
        return Err("the two homes disagree".into());
    }
    println!("the same records at both homes");
    Ok(())
}
