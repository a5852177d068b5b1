//! A test client: HTTP calls and ready-made accounts with sessions.

use relay_schemas::client::{key_box, Account, Device};
use serde_json::{json, Value};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

#[derive(Clone)]
pub struct Client {
    http: awc::Client,
    pub base: String,
}

impl Client {
    pub fn new(base: &str) -> Self {
        Client::with_timeout(base, Duration::from_secs(30))
    }

    /// A client whose requests give up after `timeout`.
    pub fn with_timeout(base: &str, timeout: Duration) -> Self {
        Client::with_http(base, awc::Client::builder().timeout(timeout).finish())
    }

    /// A client making its requests with `http` (its own TLS roots, say).
    pub fn with_http(base: &str, http: awc::Client) -> Self {
        Client { http, base: base.to_string() }
    }

    /// POSTs raw bytes to `/v1/rpc/{method}`: the HTTP status and JSON
    /// answer, or why there is no answer (the request may or may not have
    /// arrived: the relay died under it, the answer was lost or unreadable).
    pub async fn try_raw(&self, method: &str, token: Option<&str>, body: &[u8]) -> Result<(u16, Value), String> {
        let mut req = self.http.post(format!("{}/v1/rpc/{method}", self.base)).content_type("application/json");
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let mut resp = req.send_body(body.to_vec()).await.map_err(|e| format!("send: {e}"))?;
        let status = resp.status().as_u16();
        let bytes = resp.body().limit(64 << 20).await.map_err(|e| format!("body: {e}"))?;
        let v = serde_json::from_slice(&bytes).map_err(|e| {
            format!("HTTP {status} with an unreadable body ({e}): {:?}", String::from_utf8_lossy(&bytes))
        })?;
        Ok((status, v))
    }

    /// POSTs raw bytes; returns (HTTP status, JSON body).
    pub async fn raw(&self, method: &str, token: Option<&str>, body: Vec<u8>) -> (u16, Value) {
        self.try_raw(method, token, &body).await.unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    /// A call whose request may fail (the relay dies under it): `Err` then.
    pub async fn try_call(&self, method: &str, token: Option<&str>, params: &Value) -> Result<(u16, Value), String> {
        self.try_raw(method, token, &serde_json::to_vec(params).unwrap()).await
    }

    pub async fn call(&self, method: &str, token: Option<&str>, params: &Value) -> (u16, Value) {
        self.raw(method, token, serde_json::to_vec(params).unwrap()).await
    }

    /// A call that must succeed.
    pub async fn ok(&self, method: &str, token: Option<&str>, params: &Value) -> Value {
        let (status, v) = self.call(method, token, params).await;
        assert_eq!(status, 200, "{method} failed: {v}");
        v
    }

    /// A call that must fail; returns the error code (and checks the status
    /// matches it).
    pub async fn err(&self, method: &str, token: Option<&str>, params: &Value) -> String {
        let (status, v) = self.call(method, token, params).await;
        assert_ne!(status, 200, "{method} unexpectedly succeeded: {v}");
        super::schema::assert_valid("ErrorResponse.schema.json", &v);
        let code = v["error"]["code"].as_str().unwrap().to_string();
        assert_eq!(status, http_status(&code), "{code}");
        code
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        self.try_get(path).await.expect("GET")
    }

    /// Like [`Client::get`], for a server that may be down.
    pub async fn try_get(&self, path: &str) -> Result<(u16, String), String> {
        let mut resp = self.http.get(format!("{}{path}", self.base)).send().await.map_err(|e| e.to_string())?;
        let body = resp.body().await.map_err(|e| e.to_string())?;
        Ok((resp.status().as_u16(), String::from_utf8_lossy(&body).into_owned()))
    }

    /// The first sample in `/metrics` whose line starts with `prefix`.
    pub async fn metric(&self, prefix: &str) -> Option<f64> {
        let (status, m) = self.get("/metrics").await;
        assert_eq!(status, 200, "{m}");
        m.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// A relay method at this relay (`target`), signed as relay `caller`
    /// with `key`: what a peer sends.
    pub async fn relay_call(
        &self,
        target: &str,
        caller: &str,
        key: &ed25519_dalek::SigningKey,
        method: &str,
        params: &Value,
    ) -> (u16, Value) {
        let body = serde_json::to_vec(params).unwrap();
        let ts = now();
        let sig = relay_schemas::sign::sign_relay_request(key, method, target, ts, &body);
        let mut resp = self
            .http
            .post(format!("{}/v1/relay/{method}", self.base))
            .content_type("application/json")
            .insert_header(("Relay-Id", caller))
            .insert_header(("Relay-Timestamp", ts.to_string()))
            .insert_header(("Relay-Signature", sig))
            .send_body(body)
            .await
            .expect("relay request");
        let status = resp.status().as_u16();
        let bytes = resp.body().await.expect("body");
        let v =
            serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("non-JSON {:?}", String::from_utf8_lossy(&bytes)));
        (status, v)
    }
}

pub fn http_status(code: &str) -> u16 {
    relay_schemas::ErrorCode::parse(code).expect("known code").http_status()
}

/// An account registered on a relay, with devices and their sessions.
pub struct User {
    pub account: Account,
    pub devices: Vec<Device>,
    pub tokens: Vec<String>,
    pub relay_id: String,
}

impl User {
    pub fn id(&self) -> &str {
        &self.account.id
    }

    pub fn token(&self, device: usize) -> Option<&str> {
        Some(self.tokens[device].as_str())
    }

    /// Registers account `seed` with device "phone" on `relay_id`, then opens
    /// a session for it.
    pub async fn register(c: &Client, relay_id: &str, seed: u8, public_discovery: bool) -> User {
        let account = Account::from_seed([seed; 32]);
        let phone = Device::from_seed("phone", [seed.wrapping_add(100); 32]);
        let route = account.route(1, &[(relay_id, c.base.as_str())], now());
        let cert = account.certificate(&phone, now(), None);
        let res = c
            .ok("account.register", None, &account.register_params(&route, &cert, relay_id, public_discovery, now()))
            .await;
        assert_eq!(res["account_id"], account.id);
        let mut user = User { account, devices: vec![phone], tokens: vec![], relay_id: relay_id.into() };
        let token = user.open_session(c, 0).await;
        user.tokens.push(token);
        user
    }

    /// Adds device `name` (certificate via `device.add`) and opens its session.
    pub async fn add_device(&mut self, c: &Client, name: &str, seed: u8) -> usize {
        let device = Device::from_seed(name, [seed; 32]);
        let cert = self.account.certificate(&device, now(), None);
        c.ok("device.add", self.token(0), &json!({"device_certificate": cert})).await;
        self.devices.push(device);
        let i = self.devices.len() - 1;
        let token = self.open_session(c, i).await;
        self.tokens.push(token);
        i
    }

    /// Registers account `seed` with device "phone" at `homes[0]` under a
    /// route naming both `homes` (relay id, url); the phone's session is at
    /// `homes[0]`.
    pub async fn register_two_homes(c: &Client, seed: u8, homes: [(&str, &str); 2], public_discovery: bool) -> User {
        let account = Account::from_seed([seed; 32]);
        let phone = Device::from_seed("phone", [seed.wrapping_add(100); 32]);
        let route = account.route(1, &homes, now());
        let cert = account.certificate(&phone, now(), None);
        let params = account.register_params(&route, &cert, homes[0].0, public_discovery, now());
        let res = c.ok("account.register", None, &params).await;
        assert_eq!(res["account_id"], account.id);
        let mut user = User { account, devices: vec![phone], tokens: vec![], relay_id: homes[0].0.into() };
        let token = user.open_session(c, 0).await;
        user.tokens.push(token);
        user
    }

    /// The same account's devices with sessions at its other home
    /// `relay_id` (`c`), once the account has arrived there by replication
    /// (waits up to `limit`).
    pub async fn at_other_home(&self, c: &Client, relay_id: &str, limit: Duration) -> User {
        let (account, devices) = (self.account.clone(), self.devices.clone());
        let mut other = User { account, devices, tokens: vec![], relay_id: relay_id.into() };
        for device in 0..other.devices.len() {
            let what = format!("a session of {} at {relay_id}", other.id());
            let token = super::wait::eventually(&what, limit, || other.try_open_session(c, device)).await;
            other.tokens.push(token);
        }
        other
    }

    /// A session for `device` here, or why not (no panic).
    pub async fn try_open_session(&self, c: &Client, device: usize) -> Result<String, String> {
        let d = &self.devices[device];
        let params = json!({"account_id": self.id(), "device_id": d.id});
        let ch = match c.try_call("session.challenge", None, &params).await? {
            (200, ch) => ch,
            (_, e) => return Err(format!("session.challenge: {e}")),
        };
        let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
        let sig = d.session_proof(self.id(), challenge, &self.relay_id);
        let open = json!({"account_id": self.id(), "device_id": d.id, "challenge": challenge, "signature": sig});
        match c.try_call("session.open", None, &open).await? {
            (200, s) => s["token"].as_str().map(str::to_owned).ok_or_else(|| format!("no token: {s}")),
            (_, e) => Err(format!("session.open: {e}")),
        }
    }

    pub async fn open_session(&self, c: &Client, device: usize) -> String {
        let d = &self.devices[device];
        let ch = c.ok("session.challenge", None, &json!({"account_id": self.id(), "device_id": d.id})).await;
        let challenge = ch["challenge"].as_str().unwrap();
        let sig = d.session_proof(self.id(), challenge, &self.relay_id);
        let s = c
            .ok(
                "session.open",
                None,
                &json!({"account_id": self.id(), "device_id": d.id, "challenge": challenge, "signature": sig}),
            )
            .await;
        s["token"].as_str().unwrap().to_string()
    }

    /// `message.send` params from device 0 to `to`, with a box for each of
    /// `to`'s devices and (if `sender_boxes`) for each of ours.
    pub fn send_params(&self, to: &User, message_id: &str, sender_boxes: bool) -> Value {
        let env = self.devices[0].envelope(self.id(), to.id(), message_id, now(), b"ciphertext bytes");
        let rb: Vec<Value> =
            to.devices.iter().map(|d| key_box(&d.id, format!("box for {}", d.id).as_bytes())).collect();
        let mut p = json!({"envelope": env, "recipient_boxes": rb});
        if sender_boxes {
            let sb: Vec<Value> = self.devices.iter().map(|d| key_box(&d.id, b"sender box")).collect();
            p["sender_boxes"] = json!(sb);
        }
        p
    }

    /// All records device `device` can sync, following pagination.
    pub async fn sync_all(&self, c: &Client, device: usize) -> Vec<Value> {
        let token = self.token(device);
        let pages = sync_pages(|after| async move {
            let page = c.ok("message.timeline.sync", token, &json!({"after": after, "limit": 500})).await;
            super::schema::assert_valid("methods/message.timeline.sync.result.schema.json", &page);
            Ok(page)
        });
        pages.await.unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Every timeline record from the start, following pagination: `fetch`
/// gets the `message.timeline.sync` page after a cursor. Err: a page failed
/// or is malformed, or the cursor does not advance.
pub async fn sync_pages<F, Fut>(mut fetch: F) -> Result<Vec<Value>, String>
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = Result<Value, String>>,
{
    let mut out = vec![];
    let mut after = 0u64;
    for _ in 0..100_000 {
        let page = fetch(after).await?;
        out.extend(page["records"].as_array().ok_or("records missing")?.iter().cloned());
        let next = page["next"].as_u64().ok_or("next missing")?;
        if !page["has_more"].as_bool().ok_or("has_more missing")? {
            return Ok(out);
        }
        if next <= after {
            return Err(format!("timeline sync does not advance: after {after}, next {next}"));
        }
        after = next;
    }
    Err("timeline sync did not end".into())
}

/// A message id unique within a test.
pub fn mid(n: u64) -> String {
    format!("msg-{n:016}")
}

// ---- helpers for the methods and bad_input tests ----------------------------

impl Client {
    /// A call that must fail; returns the whole `{"error":…}` body after the
    /// same checks as [`Client::err`] (ErrorResponse schema, HTTP status of
    /// the code).
    pub async fn err_body(&self, method: &str, token: Option<&str>, params: &Value) -> Value {
        self.raw_err_body(method, token, serde_json::to_vec(params).unwrap()).await
    }

    /// Raw bytes that must fail; returns the whole `{"error":…}` body.
    pub async fn raw_err_body(&self, method: &str, token: Option<&str>, body: Vec<u8>) -> Value {
        let (status, v) = self.raw(method, token, body).await;
        assert_ne!(status, 200, "{method} unexpectedly succeeded: {v}");
        super::schema::assert_valid("ErrorResponse.schema.json", &v);
        let code = v["error"]["code"].as_str().unwrap().to_string();
        assert_eq!(status, http_status(&code), "{code}: {v}");
        v
    }

    /// Raw bytes that must fail; returns the error code.
    pub async fn raw_err(&self, method: &str, token: Option<&str>, body: Vec<u8>) -> String {
        let v = self.raw_err_body(method, token, body).await;
        v["error"]["code"].as_str().unwrap().to_string()
    }

    /// `GET /healthz` answers 200 `{"status":"ok"}` (the process is alive).
    pub async fn assert_healthy(&self) {
        let (status, body) = self.get("/healthz").await;
        assert_eq!(status, 200, "healthz: {body}");
        let v: Value = serde_json::from_str(&body).expect("healthz JSON");
        super::schema::assert_valid("methods/healthz.result.schema.json", &v);
    }
}

impl User {
    /// `message.send` params from device `from_device` of this account to
    /// account `to`, created at `created_at`, with one recipient box per
    /// name in `recipient_devices` and, if given, one sender box per name in
    /// `sender_devices`.
    pub fn params_to(
        &self,
        from_device: usize,
        to: &str,
        message_id: &str,
        created_at: u64,
        recipient_devices: &[&str],
        sender_devices: Option<&[&str]>,
    ) -> Value {
        let env = self.devices[from_device].envelope(self.id(), to, message_id, created_at, b"ciphertext bytes");
        let rb: Vec<Value> = recipient_devices.iter().map(|d| key_box(d, format!("box for {d}").as_bytes())).collect();
        let mut p = json!({"envelope": env, "recipient_boxes": rb});
        if let Some(sd) = sender_devices {
            let sb: Vec<Value> = sd.iter().map(|d| key_box(d, format!("sender box for {d}").as_bytes())).collect();
            p["sender_boxes"] = json!(sb);
        }
        p
    }

    /// Self-delivery params from device 0 with boxes for `devices`.
    pub fn self_params(&self, message_id: &str, devices: &[&str]) -> Value {
        self.params_to(0, self.id(), message_id, now(), devices, None)
    }
}

/// Re-signs a signed object (`signature` replaced) with `tag` and `key`.
pub fn resign(tag: relay_schemas::sign::Tag, object: &Value, key: &ed25519_dalek::SigningKey) -> Value {
    let mut m = object.as_object().expect("an object").clone();
    relay_schemas::sign::sign_object(tag, &mut m, key);
    Value::Object(m)
}

/// The `message_id`s of timeline records, in order.
pub fn message_ids(records: &[Value]) -> Vec<String> {
    records.iter().map(|r| r["envelope"]["message_id"].as_str().unwrap().to_string()).collect()
}

/// POST `body` to relay method `method` at `url` with `headers` (the relay
/// authentication ones, signed or not): (HTTP status, JSON answer).
pub async fn relay_post(url: &str, method: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let http = awc::Client::builder().timeout(Duration::from_secs(10)).finish();
    let mut req = http.post(format!("{url}/v1/relay/{method}")).content_type("application/json");
    for (n, v) in headers {
        req = req.insert_header((*n, v.as_str()));
    }
    let mut resp = req.send_body(body.to_vec()).await.expect("request");
    let bytes = resp.body().await.expect("body");
    let v = serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("non-JSON {:?}", String::from_utf8_lossy(&bytes)));
    (resp.status().as_u16(), v)
}
