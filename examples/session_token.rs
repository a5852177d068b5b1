//! Registers a fresh account on a running relay, appends one self-delivered
//! message to its timeline, and prints a session token for its device on
//! stdout: for tools that exercise the session methods, such as
//! `.ci/schemathesis.sh`.
//!
//! ```text
//! cargo run --example session_token -- http://127.0.0.1:7801 relay-a
//! ```

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

async fn call(
    http: &awc::Client,
    base: &str,
    method: &str,
    token: Option<&str>,
    params: Value,
) -> Result<Value, String> {
    let mut req = http.post(format!("{base}/v1/rpc/{method}"));
    if let Some(t) = token {
        req = req.insert_header(("Authorization", format!("Bearer {t}")));
    }
    let mut resp = req.send_json(&params).await.map_err(|e| format!("{method}: {e}"))?;
    let body: Value = resp.json().limit(1 << 20).await.map_err(|e| format!("{method}: {e}"))?;
    if resp.status().is_success() {
        Ok(body)
    } else {
        Err(format!("{method}: {}", body["error"]))
    }
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let base = args.next().unwrap_or_else(|| "http://127.0.0.1:7801".into());
    let relay_id = args.next().unwrap_or_else(|| "relay-a".into());
    let http = awc::Client::default();
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);

    let account = Account::from_seed(rand::random());
    let phone = Device::from_seed("phone", rand::random());
    let route = account.route(1, &[(relay_id.as_str(), base.as_str())], now);
    let cert = account.certificate(&phone, now, None);
    let params = account.register_params(&route, &cert, &relay_id, true, now);
    call(&http, &base, "account.register", None, params).await?;
    let ch =
        call(&http, &base, "session.challenge", None, json!({"account_id": account.id, "device_id": "phone"})).await?;
    let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
    let signature = phone.session_proof(&account.id, challenge, &relay_id);
    let params =
        json!({"account_id": account.id, "device_id": "phone", "challenge": challenge, "signature": signature});
    let session = call(&http, &base, "session.open", None, params).await?;
    let token = session["token"].as_str().ok_or("no token")?;

    let message_id = relay_schemas::encoding::b64_encode(&rand::random::<[u8; 16]>());
    let envelope = phone.envelope(&account.id, &account.id, &message_id, now, b"note to self");
    let params = json!({"envelope": envelope, "recipient_boxes": [key_box("phone", b"box")]});
    call(&http, &base, "message.send", Some(token), params).await?;
    println!("{token}");
    Ok(())
}
