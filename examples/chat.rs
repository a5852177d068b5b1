//! A terminal chat that speaks the web client's language: `relay-e2e/v1`
//! messages (PROTOCOL §8), contact links (a signed ContactInvite in the URL
//! fragment, the same links the web client shows and reads), and a
//! ContactGrant inside each message so the other side can answer.
//!
//! ```text
//! cargo run --example chat -- http://127.0.0.1:7801 relay-a $(printf 'c3%.0s' {1..32})
//! ```
//!
//! It prints the account id and its contact link, then reads commands:
//! `/add LINK` (a contact link, e.g. from the web client), `/to ACCOUNT_ID`,
//! `/help`; any other line is sent to the current contact (`//text` sends
//! `/text`; an unknown `/command` is refused, not sent). Received messages
//! print as `ACCOUNT_ID: text`; delivery changes as SHiNE's ticks.
//! The seed (64 hex chars) is the account key; the device "chat" and its box
//! secret derive from it. Contacts and grants live in memory only.

use awc::ws::{Frame, Message};
use futures_util::{SinkExt, StreamExt};
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::e2e;
use relay_schemas::encoding::{b64_decode, b64_decode_array, b64_encode};
use relay_schemas::ids::account_id_of;
use relay_schemas::sign::{parse_public_key, verify_object, Tag};
use serde_json::{json, Value};
use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

type Socket = actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>;

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

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

/// Opens a session, registering the account on first use (no public
/// discovery: only holders of its contact link or a grant may write).
async fn open_session(base: &str, relay_id: &str, account: &Account, device: &Device) -> Result<String, String> {
    let ask = json!({"account_id": account.id, "device_id": device.id});
    let ch = match http(base, "session.challenge", ask.clone()).await {
        Ok(ch) => ch,
        Err(e) if e["code"] == "not_found" => {
            let route = account.route(1, &[(relay_id, base)], now());
            let cert = account.certificate(device, now(), None);
            let reg = account.register_params(&route, &cert, relay_id, false, now());
            http(base, "account.register", reg).await.map_err(|e| format!("account.register: {e}"))?;
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

/// Requests with ids over the socket; notifications met on the way wait.
struct Ws {
    socket: Socket,
    next_id: u64,
    pending: VecDeque<Value>,
}

impl Ws {
    async fn frame(&mut self) -> Result<Value, String> {
        loop {
            match self.socket.next().await {
                Some(Ok(Frame::Text(b))) => return serde_json::from_slice(&b).map_err(|e| format!("frame: {e}")),
                Some(Ok(Frame::Ping(b))) => self.socket.send(Message::Pong(b)).await.map_err(|e| e.to_string())?,
                Some(Ok(Frame::Close(reason))) => return Err(format!("closed by the relay: {reason:?}")),
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

    async fn notification(&mut self) -> Result<Value, String> {
        match self.pending.pop_front() {
            Some(n) => Ok(n),
            None => self.frame().await,
        }
    }
}

#[derive(Default)]
struct Contact {
    invite: Option<Value>,
    grant_from_them: Option<Value>,
    my_grant: Option<Value>,
}

struct Chat {
    ws: Ws,
    account: Account,
    device: Device,
    contacts: HashMap<String, Contact>,
    /// Verified account keys, from signed routes.
    keys: HashMap<String, ed25519_dalek::VerifyingKey>,
    to: Option<String>,
    cursor: u64,
}

impl Chat {
    async fn account_key(&mut self, account_id: &str) -> Result<ed25519_dalek::VerifyingKey, String> {
        if let Some(k) = self.keys.get(account_id) {
            return Ok(*k);
        }
        let route = self.ws.call("route.get", json!({"account_id": account_id})).await?;
        let key = parse_public_key("account_key", route["account_key"].as_str().unwrap_or_default())
            .map_err(|e| e.message)?;
        let map = route.as_object().ok_or("route: not an object")?;
        if account_id_of(key.as_bytes()) != account_id || verify_object(Tag::Route, map, &key).is_err() {
            return Err(format!("the route of {account_id} does not verify"));
        }
        self.keys.insert(account_id.to_owned(), key);
        Ok(key)
    }

    /// The receiving devices of an account, certificates checked.
    async fn devices(&mut self, account_id: &str) -> Result<Vec<Value>, String> {
        let key = self.account_key(account_id).await?;
        let d = self.ws.call("account.devices.get", json!({"account_id": account_id})).await?;
        let revoked: Vec<&Value> = d["revocations"].as_array().into_iter().flatten().map(|r| &r["device_id"]).collect();
        Ok(d["certificates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| !revoked.contains(&&c["device_id"]))
            .filter(|c| c.as_object().is_some_and(|m| verify_object(Tag::DeviceCertificate, m, &key).is_ok()))
            .cloned()
            .collect())
    }

    fn contact(&mut self, account_id: &str) -> &mut Contact {
        let grant_id = b64_encode(&rand::random::<[u8; 16]>());
        let c = self.contacts.entry(account_id.to_owned()).or_default();
        if c.my_grant.is_none() {
            c.my_grant = Some(self.account.grant(&grant_id, account_id, now(), None));
        }
        c
    }

    fn link(&self, base: &str) -> String {
        let invite = self.account.invite(&b64_encode(&rand::random::<[u8; 16]>()), now(), now() + 30 * 86400);
        format!("{}/#contact={}", base.trim_end_matches('/'), b64_encode(invite.to_string().as_bytes()))
    }

    async fn add(&mut self, link: &str) -> Result<(), String> {
        let code = link.split("#contact=").nth(1).ok_or("not a contact link")?;
        let invite: Value = serde_json::from_slice(&b64_decode("link", code.trim()).map_err(|e| e.message)?)
            .map_err(|e| format!("link: {e}"))?;
        let issuer = invite["issuer"].as_str().ok_or("link: no issuer")?.to_owned();
        let key = self.account_key(&issuer).await?;
        let map = invite.as_object().ok_or("link: not an object")?;
        verify_object(Tag::ContactInvite, map, &key).map_err(|_| "the invite does not verify")?;
        self.contact(&issuer).invite = Some(invite);
        self.to = Some(issuer.clone());
        println!("talking to {issuer}");
        Ok(())
    }

    async fn send(&mut self, text: &str) -> Result<(), String> {
        let to = self.to.clone().ok_or("no contact: /add LINK or /to ACCOUNT_ID first")?;
        let mut targets = Vec::new();
        for cert in self.devices(&to).await? {
            let box_key: [u8; 32] =
                b64_decode_array("box_key", cert["box_key"].as_str().unwrap_or_default()).map_err(|e| e.message)?;
            targets.push((cert["device_id"].as_str().unwrap_or_default().to_owned(), box_key));
        }
        let theirs = targets.len();
        targets.push((self.device.id.clone(), self.device.box_key));
        let c = self.contact(&to);
        let grant = c.my_grant.clone();
        let authorization = match (&c.grant_from_them, &c.invite) {
            (Some(g), _) => Some(json!({"contact_grant": g})),
            (None, Some(i)) => Some(json!({"contact_invite": i})),
            (None, None) => None,
        };
        let message_id = b64_encode(&rand::random::<[u8; 16]>());
        let plaintext = e2e::text_with(text, json!({"grant": grant}));
        let ephemeral: Vec<([u8; 32], [u8; 24])> = targets.iter().map(|_| (rand::random(), rand::random())).collect();
        let random = e2e::Randomness { content_key: rand::random(), nonce: rand::random(), boxes: &ephemeral };
        let devices: Vec<(&str, [u8; 32])> = targets.iter().map(|(id, k)| (id.as_str(), *k)).collect();
        let sealed = e2e::encrypt(&message_id, &plaintext, &devices, &random).map_err(|e| e.message)?;
        let boxes: Vec<Value> = sealed.boxes.iter().map(|(id, b)| key_box(id, b)).collect();
        let envelope = self.device.envelope(&self.account.id, &to, &message_id, now(), &sealed.ciphertext);
        let mut params = json!({"envelope": envelope, "recipient_boxes": boxes[..theirs],
                                "sender_boxes": boxes[theirs..]});
        if let Some(a) = authorization {
            params["authorization"] = a;
        }
        let status = self.ws.call("message.send", params).await?;
        println!("sent {message_id} {}", ticks(&status));
        Ok(())
    }

    /// Syncs from the cursor: prints received messages, keeps grants.
    async fn catch_up(&mut self) -> Result<(), String> {
        loop {
            let page = self.ws.call("message.timeline.sync", json!({"after": self.cursor, "limit": 100})).await?;
            for r in page["records"].as_array().cloned().unwrap_or_default() {
                if r["direction"] == "received" {
                    let from = r["envelope"]["from"].as_str().unwrap_or_default().to_owned();
                    match self.read(&r, &from).await {
                        Ok(text) => println!("{from}: {text}"),
                        Err(e) => println!("{from}: [cannot be shown: {e}]"),
                    }
                }
            }
            let next = page["next"].as_u64().unwrap_or(self.cursor);
            if next > self.cursor {
                self.ws.call("message.timeline.ack", json!({"through": next})).await?;
                self.cursor = next;
            }
            if page["has_more"] != true {
                return Ok(());
            }
        }
    }

    async fn read(&mut self, record: &Value, from: &str) -> Result<String, String> {
        let env = &record["envelope"];
        let cert = self.devices(from).await?.into_iter().find(|c| c["device_id"] == env["from_device_id"]);
        let cert = cert.ok_or("no certificate for the sending device")?;
        let key =
            parse_public_key("device_key", cert["device_key"].as_str().unwrap_or_default()).map_err(|e| e.message)?;
        let secret = self.device.box_secret.ok_or("no box secret")?;
        let plaintext = e2e::open_record(record, &key, &self.device.id, &secret).map_err(|e| e.message)?;
        let message: Value = serde_json::from_slice(&plaintext).map_err(|e| e.to_string())?;
        let grant = &message["grant"];
        if grant["grantor"] == from && grant["grantee"] == self.account.id.as_str() {
            let account_key = self.account_key(from).await?;
            if grant.as_object().is_some_and(|m| verify_object(Tag::ContactGrant, m, &account_key).is_ok()) {
                self.contact(from).grant_from_them = Some(grant.clone());
            }
        }
        Ok(e2e::read_text(&plaintext).map_err(|e| e.message)?.unwrap_or_else(|| "[unsupported message type]".into()))
    }
}

fn ticks(status: &Value) -> String {
    match status["status"].as_str() {
        Some("delivering") => "accepted ✓".into(),
        Some("target_accepted") => "delivered ✓✓".into(),
        Some("failed") => format!("failed ✗ {}", status["error"]["code"].as_str().unwrap_or("?")),
        _ => format!("{status}"),
    }
}

const HELP: &str = "commands: /add LINK, /to ACCOUNT_ID, /help; any other line is sent (//text sends /text)";

/// What a line typed at the prompt asks for. A line starting with `/` is a
/// command, never sent: a mistyped command must not reach the contact.
#[derive(Debug, PartialEq)]
enum Input<'a> {
    Add(&'a str),
    To(&'a str),
    Help,
    /// A `/` line that is no command (or lacks its argument).
    Unknown(&'a str),
    Send(&'a str),
    Nothing,
}

impl Input<'_> {
    fn parse(line: &str) -> Input<'_> {
        let line = line.trim();
        let Some(command) = line.strip_prefix('/') else {
            return if line.is_empty() { Input::Nothing } else { Input::Send(line) };
        };
        if command.starts_with('/') {
            return Input::Send(command);
        }
        match command.split_once(' ').map_or((command, ""), |(name, arg)| (name, arg.trim())) {
            ("add", link) if !link.is_empty() => Input::Add(link),
            ("to", id) if !id.is_empty() => Input::To(id),
            ("help", "") => Input::Help,
            _ => Input::Unknown(command),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Input;

    #[test]
    fn slash_lines_are_commands_and_unknown_ones_are_not_sent() {
        assert_eq!(Input::parse("/add https://x/#c=1"), Input::Add("https://x/#c=1"));
        assert_eq!(Input::parse(" /to  abc "), Input::To("abc"));
        assert_eq!(Input::parse("/help"), Input::Help);
        assert_eq!(Input::parse("/msg hi"), Input::Unknown("msg hi"));
        assert_eq!(Input::parse("/to"), Input::Unknown("to"));
        assert_eq!(Input::parse("/"), Input::Unknown(""));
        assert_eq!(Input::parse("hello /there"), Input::Send("hello /there"));
        assert_eq!(Input::parse("//shrug"), Input::Send("/shrug"));
        assert_eq!(Input::parse("   "), Input::Nothing);
    }
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [base, relay_id, seed] = args.as_slice() else { return Err("usage: chat RELAY_URL RELAY_ID SEED_HEX".into()) };
    let seed: [u8; 32] = hex::decode(seed).ok().and_then(|s| s.try_into().ok()).ok_or("SEED_HEX: 64 hex chars")?;
    let account = Account::from_seed(seed);
    let derive = |what: &[u8]| *blake3::hash(&[what, &seed].concat()).as_bytes();
    let device = Device::with_box_secret("chat", derive(b"chat device"), derive(b"chat box"));
    let token = open_session(base, relay_id, &account, &device).await?;

    let url = format!("{}/v1/ws", base.replacen("http", "ws", 1));
    let (_, socket) = awc::Client::new().ws(url).max_frame_size(16 << 20).connect().await.map_err(|e| e.to_string())?;
    let mut ws = Ws { socket, next_id: 0, pending: VecDeque::new() };
    ws.call("session.attach", json!({"token": token})).await?;
    let mut chat = Chat { ws, account, device, contacts: HashMap::new(), keys: HashMap::new(), to: None, cursor: 0 };
    println!("account {}", chat.account.id);
    println!("contact link: {}", chat.link(base));
    println!("{HELP}");

    // Lines from stdin arrive on a channel, so the socket is read meanwhile.
    let (tx, mut lines) = tokio::sync::mpsc::unbounded_channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    chat.catch_up().await?;
    loop {
        tokio::select! {
            line = lines.recv() => {
                let Some(line) = line else { return Ok(()) };
                let done = match Input::parse(&line) {
                    Input::Add(link) => chat.add(link).await,
                    Input::To(id) => {
                        chat.to = Some(id.to_owned());
                        Ok(())
                    }
                    Input::Send(text) => chat.send(text).await,
                    Input::Help => {
                        println!("{HELP}");
                        Ok(())
                    }
                    Input::Unknown(what) => {
                        println!("unknown command /{what} (nothing sent); {HELP}");
                        Ok(())
                    }
                    Input::Nothing => Ok(()),
                };
                if let Err(e) = done {
                    println!("error: {e}");
                }
            }
            n = chat.ws.notification() => {
                let n = n?;
                match n["method"].as_str() {
                    Some("message.timeline.changed") => chat.catch_up().await?,
                    Some("message.delivery.changed") => {
                        println!("{} {}", n["params"]["message_id"].as_str().unwrap_or("?"), ticks(&n["params"]));
                    }
                    _ => {}
                }
            }
        }
    }
}
