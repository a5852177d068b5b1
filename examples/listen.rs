//! A realtime device: opens a session for an account (registering it on
//! first use), attaches a WebSocket to `GET /v1/ws`, and prints what
//! arrives: each `message.timeline.changed` as the records it syncs
//! (decrypted with `relay-e2e/v1`, PROTOCOL §8, after checking the
//! envelope's signature), each `message.delivery.changed` as it is; it acks
//! what it printed.
//!
//! ```text
//! cargo run --release -- serve --config config/default.toml                 # terminal 1
//! cargo run --example listen -- http://127.0.0.1:7801 relay-a $(printf 'a1%.0s' {1..32})   # terminal 2
//! cargo run --example listen -- http://127.0.0.1:7801 relay-a $(printf 'b2%.0s' {1..32}) \
//!     send <the first account_id> "hello"                                   # terminal 3
//! ```
//!
//! The seed (64 hex chars) is the account's Ed25519 key; the device
//! "listen" gets its key from `blake3("listen device" || seed)` and its
//! X25519 box secret from `blake3("listen box" || seed)`. With
//! `send TO TEXT` it first sends TEXT to account TO (encrypted, one key box
//! for each of TO's devices, a sender box for itself) over the socket, then
//! listens like the other.
//! The cursor lives in memory (a real client stores it): after a restart the
//! first notification prints the timeline again from the start.

use awc::ws::{Frame, Message};
use futures_util::{SinkExt, StreamExt};
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::e2e;
use relay_schemas::encoding::{b64_decode_array, b64_encode};
use relay_schemas::sign::parse_public_key;
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

type Socket = actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `POST /v1/rpc/{method}`: the result, or the error object.
async fn http(base: &str, method: &str, params: Value) -> Result<Value, Value> {
    let mut resp = awc::Client::default()
        .post(format!("{base}/v1/rpc/{method}"))
        .send_json(&params)
        .await
        .map_err(|e| json!({"message": format!("{method}: {e}")}))?;
    let body: Value = resp.json().limit(16 << 20).await.map_err(|e| json!({"message": format!("{method}: {e}")}))?;
    if resp.status().is_success() {
        Ok(body)
    } else {
        Err(body["error"].clone())
    }
}

/// Opens a session for the device, registering the account first if the
/// relay does not know it (public discovery on, so anyone may write to it).
async fn open_session(base: &str, relay_id: &str, account: &Account, device: &Device) -> Result<String, String> {
    let ask = json!({"account_id": account.id, "device_id": device.id});
    let ch = match http(base, "session.challenge", ask.clone()).await {
        Ok(ch) => ch,
        Err(e) if e["code"] == "not_found" => {
            let route = account.route(1, &[(relay_id, base)], now());
            let cert = account.certificate(device, now(), None);
            let reg = account.register_params(&route, &cert, relay_id, true, now());
            http(base, "account.register", reg).await.map_err(|e| format!("account.register: {e}"))?;
            println!("registered account {}", account.id);
            http(base, "session.challenge", ask).await.map_err(|e| format!("session.challenge: {e}"))?
        }
        Err(e) => return Err(format!("session.challenge: {e}")),
    };
    let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
    let signature = device.session_proof(&account.id, challenge, relay_id);
    let open =
        json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": signature});
    let s = http(base, "session.open", open).await.map_err(|e| format!("session.open: {e}"))?;
    Ok(s["token"].as_str().ok_or("no token")?.to_string())
}

/// A WebSocket device: requests with ids; notifications that arrive while
/// it waits for an answer are kept for later, in order.
struct Ws {
    socket: Socket,
    next_id: u64,
    pending: VecDeque<Value>,
}

enum Event {
    Notification(Value),
    Closed(String),
}

impl Ws {
    /// The next frame that is JSON, answering pings on the way.
    async fn frame(&mut self) -> Result<Value, String> {
        loop {
            match self.socket.next().await {
                Some(Ok(Frame::Text(b))) => return serde_json::from_slice(&b).map_err(|e| format!("frame: {e}")),
                Some(Ok(Frame::Ping(b))) => self.socket.send(Message::Pong(b)).await.map_err(|e| e.to_string())?,
                Some(Ok(Frame::Close(reason))) => {
                    return Err(match reason {
                        Some(r) => format!("closed by the relay: {} {:?}", u16::from(r.code), r.description),
                        None => "closed by the relay".into(),
                    })
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(format!("socket: {e}")),
                None => return Err("connection lost".into()),
            }
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let frame = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket.send(Message::Text(frame.into())).await.map_err(|e| e.to_string())?;
        loop {
            let f = self.frame().await?;
            if f["id"] == id {
                return match f.get("error") {
                    Some(e) => Err(format!("{method}: {e}")),
                    None => Ok(f["result"].clone()),
                };
            }
            self.pending.push_back(f);
        }
    }

    async fn next(&mut self) -> Event {
        if let Some(n) = self.pending.pop_front() {
            return Event::Notification(n);
        }
        match self.frame().await {
            Ok(n) => Event::Notification(n),
            Err(e) => Event::Closed(e),
        }
    }
}

/// The devices of an account that may receive: `(device_id, certificate)`
/// for every certificate without a revocation.
async fn devices(ws: &mut Ws, account_id: &str) -> Result<Vec<(String, Value)>, String> {
    let d = ws.call("account.devices.get", json!({"account_id": account_id})).await?;
    let revoked: Vec<&Value> = d["revocations"].as_array().into_iter().flatten().map(|r| &r["device_id"]).collect();
    Ok(d["certificates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| !revoked.contains(&&c["device_id"]))
        .map(|c| (c["device_id"].as_str().unwrap_or_default().to_owned(), c.clone()))
        .collect())
}

/// What a record says, for printing: the text, or why it cannot be shown.
async fn read(ws: &mut Ws, keys: &mut HashMap<String, Vec<(String, Value)>>, me: &Device, r: &Value) -> String {
    let env = &r["envelope"];
    let from = env["from"].as_str().unwrap_or_default();
    if !keys.contains_key(from) {
        match devices(ws, from).await {
            Ok(d) => keys.insert(from.to_owned(), d),
            Err(e) => return format!("[sender's devices unavailable: {e}]"),
        };
    }
    let cert = keys[from].iter().find(|(id, _)| env["from_device_id"] == id.as_str()).map(|(_, c)| c);
    let Some(key) = cert.and_then(|c| parse_public_key("device_key", c["device_key"].as_str()?).ok()) else {
        return "[unverified: no certificate for the sending device]".into();
    };
    let secret = me.box_secret.unwrap_or_default();
    match e2e::open_record(r, &key, &me.id, &secret).and_then(|p| e2e::read_text(&p)) {
        Ok(Some(text)) => format!("{text:?}"),
        Ok(None) => "[unsupported message type]".into(),
        Err(e) => format!("[cannot read: {}]", e.message),
    }
}

/// Syncs and prints every record after `cursor`, acks them; the new cursor.
async fn catch_up(ws: &mut Ws, me: &Device, mut cursor: u64) -> Result<u64, String> {
    let mut keys = HashMap::new();
    loop {
        let page = ws.call("message.timeline.sync", json!({"after": cursor, "limit": 100})).await?;
        for r in page["records"].as_array().into_iter().flatten() {
            let env = &r["envelope"];
            let text = read(ws, &mut keys, me, r).await;
            println!(
                "record {:>5} {:<8} from {} message_id {}{}: {text}",
                r["sequence"].as_u64().unwrap_or(0),
                r["direction"].as_str().unwrap_or("?"),
                env["from"].as_str().unwrap_or("?"),
                env["message_id"].as_str().unwrap_or("?"),
                r["delivery"]["status"].as_str().map(|s| format!(" delivery {s}")).unwrap_or_default(),
            );
        }
        let next = page["next"].as_u64().unwrap_or(cursor);
        if next > cursor {
            ws.call("message.timeline.ack", json!({"through": next})).await?;
            cursor = next;
        }
        if page["has_more"] != true {
            return Ok(cursor);
        }
    }
}

/// Encrypts `text` to every device of `to` and to this device, and sends it.
async fn send(ws: &mut Ws, account: &Account, me: &Device, to: &str, text: &str) -> Result<(), String> {
    let mut targets = Vec::new();
    for (id, cert) in devices(ws, to).await? {
        let box_key: [u8; 32] =
            b64_decode_array("box_key", cert["box_key"].as_str().unwrap_or_default()).map_err(|e| e.message)?;
        targets.push((id, box_key));
    }
    targets.push((me.id.clone(), me.box_key));
    let message_id = b64_encode(&rand::random::<[u8; 16]>());
    let ephemeral: Vec<([u8; 32], [u8; 24])> = targets.iter().map(|_| (rand::random(), rand::random())).collect();
    let random = e2e::Randomness { content_key: rand::random(), nonce: rand::random(), boxes: &ephemeral };
    let devices: Vec<(&str, [u8; 32])> = targets.iter().map(|(id, k)| (id.as_str(), *k)).collect();
    let mut sealed = e2e::encrypt(&message_id, &e2e::text(text), &devices, &random).map_err(|e| e.message)?;
    let (_, own) = sealed.boxes.pop().expect("this device's box is last");
    let boxes: Vec<Value> = sealed.boxes.iter().map(|(id, b)| key_box(id, b)).collect();
    let envelope = me.envelope(&account.id, to, &message_id, now(), &sealed.ciphertext);
    let params = json!({"envelope": envelope, "recipient_boxes": boxes, "sender_boxes": [key_box(&me.id, &own)]});
    let status = ws.call("message.send", params).await?;
    println!("message.send {message_id} -> {status}");
    Ok(())
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: listen RELAY_URL RELAY_ID SEED_HEX [send TO_ACCOUNT_ID TEXT]";
    let [base, relay_id, seed, rest @ ..] = args.as_slice() else { return Err(usage.into()) };
    let seed: [u8; 32] = hex::decode(seed).ok().and_then(|s| s.try_into().ok()).ok_or("SEED_HEX: 64 hex chars")?;
    let account = Account::from_seed(seed);
    let derive = |what: &[u8]| *blake3::hash(&[what, &seed].concat()).as_bytes();
    let device = Device::with_box_secret("listen", derive(b"listen device"), derive(b"listen box"));
    let token = open_session(base, relay_id, &account, &device).await?;
    println!("account {} device {}", account.id, device.id);

    let url = format!("{}/v1/ws", base.replacen("http", "ws", 1));
    let (_, socket) = awc::Client::new().ws(url).max_frame_size(16 << 20).connect().await.map_err(|e| e.to_string())?;
    let mut ws = Ws { socket, next_id: 0, pending: VecDeque::new() };
    // Browsers cannot set headers: the first frame attaches the session.
    ws.call("session.attach", json!({"token": token})).await?;
    println!("attached; listening (Ctrl-C to stop)");

    if let [cmd, to, text] = rest {
        if cmd != "send" {
            return Err(usage.into());
        }
        send(&mut ws, &account, &device, to, text).await?;
    } else if !rest.is_empty() {
        return Err(usage.into());
    }

    let mut cursor = 0;
    loop {
        match ws.next().await {
            Event::Notification(n) => match n["method"].as_str() {
                Some("message.timeline.changed") => {
                    if n["params"]["sequence"].as_u64().is_some_and(|s| s > cursor) {
                        cursor = catch_up(&mut ws, &device, cursor).await?;
                    }
                }
                Some("message.delivery.changed") => println!("delivery {}", n["params"]),
                _ => println!("? {n}"),
            },
            Event::Closed(reason) => {
                // 4001: the session expired; 4002: slow consumer (reconnect
                // and sync from the cursor) or device revoked.
                println!("{reason}");
                return Ok(());
            }
        }
    }
}
