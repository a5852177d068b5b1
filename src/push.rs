//! Web Push (PROTOCOL §9): the relay's VAPID key and the push sender.
//!
//! Accounts decide who gets a push (a device that may read the new record,
//! has a subscription and no open WebSocket) and hand a [`PushJob`] to the
//! [`PushHandle`] once the record is durable. The handle passes it, without
//! waiting, to the [`PushSender`] actor, which runs on an arbiter (thread)
//! of its own under an actix `Supervisor` (restarted if it stops), and which
//! the handle starts again should it die (a panic): the sender is part of
//! the relay, not a side task. The sender keeps the pure queue of
//! `relay_actors::push` (bounded, coalescing per device, one push per
//! device per `push.min_interval`), and per push:
//!
//! 1. encrypts the payload `{"type":"timeline.changed","account_id",
//!    "sequence"}` for the subscription with RFC 8291 `aes128gcm`
//!    (`web-push-native`, on RustCrypto's p256/aes-gcm/hkdf);
//! 2. signs a VAPID JWT (RFC 8292: ES256 by the relay's P-256 key, `aud` the
//!    endpoint's origin, `exp` 12 h ahead, `sub` = `push.subject`) and sends
//!    `Authorization: vapid t=…, k=…`;
//! 3. POSTs it with `TTL` (`push.ttl`), `Urgency: high`, a timeout
//!    (`push.timeout`) and no redirects followed;
//! 4. by the answer ([`relay_actors::push::judge`]): 2xx sent; 404/410 the
//!    subscription is dropped (an account event); 429/5xx/no answer retried
//!    at `Retry-After` (else a doubling backoff) up to `push.max_attempts`;
//!    anything else rejected. Each ends in `relay_push_sent_total{outcome}`.

use crate::config::Config;
use actix::prelude::*;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use relay_actors::account::AccountCmd;
use relay_actors::metrics::OutcomeLabels;
use relay_actors::push::{judge, parse_retry_after, Offered, PushJob, PushQueue, PushSink, Verdict};
use relay_actors::Supervisor;
use relay_schemas::encoding::{b64_decode, b64_encode};
use relay_schemas::methods::{PushPayload, PushSubscribeParams};
use relay_schemas::{RelayError, UnixMillis};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use p256::ecdsa::signature::Signer;

/// How long a VAPID JWT is valid (RFC 8292 allows at most 24 h).
const JWT_LIFETIME: u64 = 12 * 3600;

/// The relay's VAPID key pair (RFC 8292) and its `sub` contact.
pub struct Vapid {
    key: p256::ecdsa::SigningKey,
    /// The 65-byte uncompressed public key, base64url (`push.vapid_key`).
    public_key: String,
    subject: String,
}

impl Vapid {
    fn from_key(key: p256::ecdsa::SigningKey, subject: String) -> Self {
        let point = key.verifying_key().to_encoded_point(false);
        Vapid { public_key: b64_encode(point.as_bytes()), key, subject }
    }

    /// The key at `path` (a base64url P-256 scalar, 0600), generated on
    /// first start like the relay key.
    pub fn load_or_generate(path: &Path, subject: String) -> Result<Self, String> {
        let key = if path.exists() {
            let text = crate::keys::read_private(path)?;
            let bytes = b64_decode("key", text.trim()).map_err(|_| format!("{}: not a VAPID key", path.display()))?;
            p256::ecdsa::SigningKey::from_slice(&bytes).map_err(|_| format!("{}: not a P-256 key", path.display()))?
        } else {
            // A random scalar; the rare value outside the group order is drawn again.
            let key = loop {
                if let Ok(k) = p256::ecdsa::SigningKey::from_slice(&rand::random::<[u8; 32]>()) {
                    break k;
                }
            };
            crate::keys::write_private(path, &b64_encode(&key.to_bytes()))?;
            key
        };
        Ok(Self::from_key(key, subject))
    }

    pub fn public_key(&self) -> &str {
        &self.public_key
    }

    /// The `Authorization` header for a push to `endpoint` at `now`:
    /// `vapid t=<JWT>, k=<public key>` (RFC 8292 §3).
    pub fn authorization(&self, endpoint: &str, now: u64) -> Result<String, String> {
        let aud = origin(endpoint)?;
        let header = b64_encode(br#"{"typ":"JWT","alg":"ES256"}"#);
        let claims = serde_json::json!({ "aud": aud, "exp": now + JWT_LIFETIME, "sub": self.subject });
        let claims = b64_encode(claims.to_string().as_bytes());
        let signing_input = format!("{header}.{claims}");
        // ES256: ECDSA P-256 over SHA-256, the signature as r ‖ s (RFC 7518 §3.4).
        let signature: p256::ecdsa::Signature = self.key.sign(signing_input.as_bytes());
        Ok(format!("vapid t={signing_input}.{}, k={}", b64_encode(&signature.to_bytes()), self.public_key))
    }
}

/// The origin (`scheme://host[:port]`) of an endpoint URL, the JWT's `aud`.
fn origin(endpoint: &str) -> Result<String, String> {
    let uri: actix_web::http::Uri = endpoint.parse().map_err(|e| format!("endpoint: {e}"))?;
    let scheme = uri.scheme_str().ok_or("endpoint has no scheme")?;
    let host = uri.host().ok_or("endpoint has no host")?;
    let default_port = match scheme {
        "https" => 443,
        "http" => 80,
        _ => return Err("endpoint is not http(s)".into()),
    };
    Ok(match uri.port_u16() {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
}

/// The checks of `push.subscribe` params beyond their shape: the endpoint
/// parses as a URL and `p256dh` is a point on P-256.
pub fn check_subscription(p: &PushSubscribeParams, allow_http: bool, allow_private: bool) -> Result<(), RelayError> {
    p.check(allow_http, allow_private)?;
    origin(&p.endpoint).map_err(RelayError::invalid_params)?;
    let point = b64_decode("keys.p256dh", &p.keys.p256dh)?;
    p256::PublicKey::from_sec1_bytes(&point)
        .map_err(|_| RelayError::invalid_params("keys.p256dh is not a point on P-256"))?;
    Ok(())
}

/// The RFC 8291 `aes128gcm` body of a push of `payload` to `job`'s
/// subscription (a fresh sender key and salt each time).
fn encrypt(job: &PushJob, payload: &[u8]) -> Result<Vec<u8>, String> {
    let s = &job.subscription;
    let point = b64_decode("p256dh", &s.p256dh).map_err(|e| e.message)?;
    let ua_public = p256::PublicKey::from_sec1_bytes(&point).map_err(|_| "p256dh is not a P-256 point".to_owned())?;
    let auth = b64_decode("auth", &s.auth).map_err(|e| e.message)?;
    if auth.len() != 16 {
        return Err("auth is not 16 bytes".into());
    }
    let auth = web_push_native::Auth::clone_from_slice(&auth);
    web_push_native::encrypt(payload.to_vec(), &ua_public, &auth).map_err(|e| e.to_string())
}

/// The sender's HTTP client: TLS (rustls with the webpki roots: push
/// services are https), `timeout` for connecting and for the whole
/// request, at most `limit` connections, no redirects followed (a push
/// service answers; it does not send the relay elsewhere).
fn http_client(timeout: Duration, limit: usize) -> awc::Client {
    awc::Client::builder()
        .timeout(timeout)
        .disable_redirects()
        .connector(awc::Connector::new().timeout(timeout).limit(limit))
        .finish()
}

/// The push settings the sender works with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub min_interval: Duration,
    pub ttl: Duration,
    pub timeout: Duration,
    pub queue: usize,
    pub concurrency: usize,
    pub max_attempts: u32,
    pub backoff: Duration,
    pub max_retry_after: Duration,
}

impl Settings {
    pub fn from_config(cfg: &Config) -> Self {
        let p = &cfg.push;
        Settings {
            min_interval: p.min_interval,
            ttl: p.ttl,
            timeout: p.timeout,
            queue: p.queue,
            concurrency: p.concurrency,
            max_attempts: p.max_attempts,
            backoff: p.backoff,
            max_retry_after: p.max_retry_after,
        }
    }
}

/// The sender's metrics.
#[derive(Clone)]
struct PushMetrics {
    /// `relay_push_sent_total{outcome}`: sent, retry, gone, rejected,
    /// failed (gave up after `max_attempts`), coalesced (folded into a
    /// waiting push of the device), dropped (queue full).
    outcomes: Family<OutcomeLabels, Counter>,
    /// `relay_push_queue`: devices whose push waits.
    waiting: Gauge,
    /// `relay_push_sender_restarts_total`.
    restarts: Counter,
}

impl PushMetrics {
    fn count(&self, outcome: &str) {
        self.outcomes.get_or_create(&OutcomeLabels { outcome: outcome.into() }).inc();
    }
}

/// A wake-up for the sender.
#[derive(Message)]
#[rtype(result = "()")]
struct Offer(PushJob);

/// The push sender: an actor with the queue, the HTTP client and the key.
pub struct PushSender {
    sup: Supervisor,
    vapid: Arc<Vapid>,
    settings: Settings,
    queue: PushQueue,
    client: Option<awc::Client>,
    /// The armed timer and the due time it is armed for.
    timer: Option<(UnixMillis, SpawnHandle)>,
    metrics: PushMetrics,
}

impl PushSender {
    fn new(sup: Supervisor, vapid: Arc<Vapid>, settings: Settings, metrics: PushMetrics) -> Self {
        let queue = PushQueue::new(settings.queue, settings.min_interval.as_millis() as u64);
        PushSender { sup, vapid, settings, queue, client: None, timer: None, metrics }
    }

    fn now_ms(&self) -> UnixMillis {
        self.sup.clock().now_ms()
    }

    fn client(&mut self) -> awc::Client {
        let (t, n) = (self.settings.timeout, self.settings.concurrency);
        self.client.get_or_insert_with(|| http_client(t, n)).clone()
    }

    /// Starts every due push there is room for, then arms the timer.
    fn pump(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        while self.queue.in_flight() < self.settings.concurrency {
            let Some(job) = self.queue.pop_due(now) else { break };
            self.start(job, ctx);
        }
        self.metrics.waiting.set(self.queue.len() as i64);
        // With every slot taken, an answer pumps again.
        if self.queue.in_flight() >= self.settings.concurrency {
            return;
        }
        let Some(next) = self.queue.next_due() else { return };
        match self.timer {
            Some((at, _)) if at <= next => return,
            Some((_, handle)) => {
                ctx.cancel_future(handle);
            }
            None => {}
        }
        let delay = Duration::from_millis(next.since(now).max(1));
        let handle = ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.pump(ctx);
        });
        self.timer = Some((next, handle));
    }

    fn start(&mut self, job: PushJob, ctx: &mut Context<Self>) {
        let payload = PushPayload::timeline_changed(&job.account_id, job.sequence);
        let body = serde_json::to_vec(&payload).map_err(|e| e.to_string()).and_then(|p| encrypt(&job, &p));
        let now = self.sup.clock().now();
        let auth = self.vapid.authorization(&job.subscription.endpoint, now.0);
        let (body, auth) = match (body, auth) {
            (Ok(b), Ok(a)) => (b, a),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(account = %job.account_id, device = %job.device_id, error = %e, "push not sent");
                self.queue.done(&job);
                self.metrics.count("rejected");
                return;
            }
        };
        let request = self
            .client()
            .post(&job.subscription.endpoint)
            .insert_header(("TTL", self.settings.ttl.as_secs().to_string()))
            .insert_header(("Urgency", "high"))
            .insert_header(("Content-Encoding", "aes128gcm"))
            .insert_header(("Content-Type", "application/octet-stream"))
            .insert_header(("Authorization", auth));
        // awc's timeout ends with the response head: the body read has its
        // own, or a service stalling its body would hold this device's slot
        // (and one of `push.concurrency`) forever.
        let limit = self.settings.timeout;
        let answer = async move {
            match request.send_body(body).await {
                Ok(mut resp) => {
                    let retry_after =
                        resp.headers().get("Retry-After").and_then(|v| v.to_str().ok()).map(str::to_owned);
                    // Read (a little of) the body so the connection can be reused.
                    let _ = tokio::time::timeout(limit, resp.body().limit(4096)).await;
                    (Some(resp.status().as_u16()), retry_after, None)
                }
                Err(e) => (None, None, Some(e.to_string())),
            }
        };
        ctx.spawn(answer.into_actor(self).map(move |(status, retry_after, error), act, ctx| {
            act.answered(job, status, retry_after, error);
            act.pump(ctx);
        }));
    }

    fn answered(&mut self, job: PushJob, status: Option<u16>, retry_after: Option<String>, error: Option<String>) {
        let (now_ms, now) = (self.now_ms(), self.sup.clock().now());
        let attempt = job.attempt + 1;
        let retry_after = retry_after.and_then(|v| parse_retry_after(&v, now));
        let s = &self.settings;
        let verdict = judge(
            status,
            retry_after,
            attempt,
            s.max_attempts,
            s.backoff.as_millis() as u64,
            s.max_retry_after.as_millis() as u64,
            now_ms,
        );
        let (account, device) = (job.account_id.clone(), job.device_id.clone());
        let status_text = status.map_or_else(|| "none".to_owned(), |s| s.to_string());
        match verdict {
            Verdict::Sent => {
                tracing::debug!(%account, %device, sequence = job.sequence, "push sent");
                self.queue.sent(&job, now_ms);
                self.metrics.count("sent");
            }
            Verdict::Retry { at_ms } => {
                tracing::info!(%account, %device, status = %status_text, error = error.as_deref().unwrap_or(""),
                    attempt, retry_in_ms = at_ms.since(now_ms), "push to be retried");
                self.queue.retry(PushJob { attempt, ..job }, at_ms);
                self.metrics.count("retry");
            }
            Verdict::Gone => {
                tracing::info!(%account, %device, status = %status_text, "push subscription gone: dropped");
                self.queue.done(&job);
                self.metrics.count("gone");
                let sup = self.sup.clone();
                let endpoint = job.subscription.endpoint;
                actix::spawn(async move {
                    let cmd = AccountCmd::PushGone { device_id: device.clone(), endpoint };
                    if let Err(e) = sup.ask(&account, cmd).await {
                        tracing::warn!(%account, %device, error = %e.message, "dropping a gone push subscription");
                    }
                });
            }
            Verdict::Rejected => {
                tracing::warn!(%account, %device, status = %status_text, "push refused by the push service");
                self.queue.done(&job);
                self.metrics.count("rejected");
            }
            Verdict::GaveUp => {
                tracing::warn!(%account, %device, status = %status_text, error = error.as_deref().unwrap_or(""),
                    attempt, "push given up");
                self.queue.done(&job);
                self.metrics.count("failed");
            }
        }
    }
}

impl Actor for PushSender {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // A bounded mailbox: offers beyond it are dropped by the handle.
        ctx.set_mailbox_capacity(self.settings.queue.clamp(16, 4096));
    }
}

impl actix::Supervised for PushSender {
    /// Restarted after it stopped: the wake-ups it held are lost (their
    /// devices catch up from their cursor when they next connect).
    fn restarting(&mut self, _ctx: &mut Context<Self>) {
        self.metrics.restarts.inc();
        self.queue = PushQueue::new(self.settings.queue, self.settings.min_interval.as_millis() as u64);
        self.timer = None;
        self.client = None;
    }
}

impl Handler<Offer> for PushSender {
    type Result = ();

    fn handle(&mut self, msg: Offer, ctx: &mut Self::Context) {
        match self.queue.offer(msg.0, self.now_ms()) {
            Offered::Queued => {}
            Offered::Coalesced => self.metrics.count("coalesced"),
            Offered::Dropped => self.metrics.count("dropped"),
        }
        self.pump(ctx);
    }
}

/// Where accounts hand their wake-ups: forwards them to the sender without
/// waiting, and starts a new sender if the running one died.
pub struct PushHandle {
    addr: Mutex<Addr<PushSender>>,
    start: Box<dyn Fn() -> Addr<PushSender> + Send + Sync>,
    metrics: PushMetrics,
}

impl PushHandle {
    /// Starts the sender on an arbiter of its own, its metrics registered
    /// with the supervisor's.
    pub fn start(sup: &Supervisor, vapid: Arc<Vapid>, settings: Settings) -> Arc<Self> {
        let metrics =
            PushMetrics { outcomes: Family::default(), waiting: Gauge::default(), restarts: Counter::default() };
        {
            let mut r = sup.metrics().registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register("push_sent", "Web Push wake-ups by outcome", metrics.outcomes.clone());
            r.register("push_queue", "Devices whose Web Push waits", metrics.waiting.clone());
            r.register("push_sender_restarts", "Times the Web Push sender was restarted", metrics.restarts.clone());
        }
        let arbiter = actix::Arbiter::new().handle();
        let (sup2, m2) = (sup.clone(), metrics.clone());
        let start = move || {
            let (sup, vapid, settings, metrics) = (sup2.clone(), vapid.clone(), settings.clone(), m2.clone());
            actix::Supervisor::start_in_arbiter(&arbiter, move |_| PushSender::new(sup, vapid, settings, metrics))
        };
        let addr = start();
        Arc::new(PushHandle { addr: Mutex::new(addr), start: Box::new(start), metrics })
    }
}

impl PushSink for PushHandle {
    fn offer(&self, job: PushJob) {
        let mut addr = self.addr.lock().unwrap_or_else(|e| e.into_inner());
        match addr.try_send(Offer(job)) {
            Ok(()) => {}
            Err(SendError::Full(_)) => self.metrics.count("dropped"),
            Err(SendError::Closed(Offer(job))) => {
                tracing::error!("push sender died: starting it again");
                self.metrics.restarts.inc();
                *addr = (self.start)();
                if addr.try_send(Offer(job)).is_err() {
                    self.metrics.count("dropped");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Verifier;

    /// Push services are https: the client speaks TLS (its first bytes are
    /// a TLS handshake record), and gives up on a silent server in time.
    #[actix_rt::test]
    async fn the_push_client_speaks_tls_and_times_out() {
        use std::io::Read;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let first = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            let mut byte = [0u8; 1];
            conn.read_exact(&mut byte).unwrap();
            std::thread::sleep(Duration::from_secs(1)); // never answers
            byte[0]
        });
        let started = std::time::Instant::now();
        let result = http_client(Duration::from_millis(500), 4)
            .post(format!("https://127.0.0.1:{port}/push"))
            .send_body("x")
            .await;
        assert!(result.is_err());
        assert!(started.elapsed() < Duration::from_secs(1), "timed out after {:?}", started.elapsed());
        assert_eq!(first.join().unwrap(), 0x16, "a TLS handshake record");
    }

    #[test]
    fn the_vapid_key_is_generated_private_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("vapid.key");
        let a = Vapid::load_or_generate(&path, "mailto:ops@example.org".into()).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let b = Vapid::load_or_generate(&path, "mailto:ops@example.org".into()).unwrap();
        assert_eq!(a.public_key(), b.public_key());
        assert_eq!(b64_decode("k", a.public_key()).unwrap().len(), 65);
    }

    #[test]
    fn the_vapid_header_is_an_es256_jwt_for_the_endpoint_origin() {
        let dir = tempfile::tempdir().unwrap();
        let v = Vapid::load_or_generate(&dir.path().join("k"), "mailto:ops@example.org".into()).unwrap();
        let header = v.authorization("https://push.example.net:8443/wpush/abc?x=1", 1_000).unwrap();
        let rest = header.strip_prefix("vapid t=").unwrap();
        let (jwt, k) = rest.split_once(", k=").unwrap();
        assert_eq!(k, v.public_key());
        let parts: Vec<&str> = jwt.split('.').collect();
        let claims: serde_json::Value = serde_json::from_slice(&b64_decode("c", parts[1]).unwrap()).unwrap();
        assert_eq!(claims["aud"], "https://push.example.net:8443");
        assert_eq!(claims["exp"], 1_000 + JWT_LIFETIME);
        assert_eq!(claims["sub"], "mailto:ops@example.org");
        let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&b64_decode("k", k).unwrap()).unwrap();
        let sig = p256::ecdsa::Signature::from_slice(&b64_decode("s", parts[2]).unwrap()).unwrap();
        key.verify(format!("{}.{}", parts[0], parts[1]).as_bytes(), &sig).unwrap();
        assert_eq!(origin("https://fcm.googleapis.com:443/fcm/send/x").unwrap(), "https://fcm.googleapis.com");
    }
}
