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
//! device per `push.min_interval`, at most `push.per_account` slots per
//! account and `push.per_origin` per endpoint origin, accounts served
//! round-robin), and per push:
//!
//! 1. encrypts the payload `{"type":"timeline.changed","account_id",
//!    "sequence"}` for the subscription with RFC 8291 `aes128gcm`
//!    (`web-push-native`, on RustCrypto's p256/aes-gcm/hkdf);
//! 2. signs a VAPID JWT (RFC 8292: ES256 by the relay's P-256 key, `aud` the
//!    endpoint's origin, `exp` 12 h ahead, `sub` = `push.subject`) and sends
//!    `Authorization: vapid t=…, k=…`;
//! 3. POSTs it with `TTL` (`push.ttl`), `Urgency: high`, the whole attempt
//!    within `push.timeout` (connecting within `push.connect_timeout`),
//!    no redirects followed, and only to public addresses: the connector
//!    (`Egress`) checks each address after resolution, unless
//!    `push.allow_private_endpoints`;
//! 4. by the answer ([`relay_core::push::judge`]): 2xx sent; 404/410 the
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
use relay_actors::Supervisor;
use relay_core::push::{judge, parse_retry_after, Offered, PushJob, PushQueue, PushSink, Verdict};
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
    ///
    /// Signed here, not by `web-push-native`'s `vapid` feature: its
    /// `VapidSignature::sign` (0.5.0, the newest) sets `aud` to
    /// `scheme://host` and drops the endpoint's port, so a push service on
    /// a non-default port (RFC 8292 §2: `aud` is the origin) refuses the
    /// token; it also reads the wall clock (`now` could not be injected)
    /// and brings in `jwt-simple` with its own crypto stack. Ours is a JSON
    /// object and one p256 signature, tested against RFC 8292's format.
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
/// services are https), connecting through [`Egress`] within
/// `connect_timeout` (TCP, then the TLS handshake), the whole request within
/// `timeout`, at most `limit` connections, no redirects followed (a push
/// service answers; it does not send the relay elsewhere).
fn http_client(connect_timeout: Duration, timeout: Duration, limit: usize, allow_private: bool) -> awc::Client {
    awc::Client::builder()
        .timeout(timeout)
        .disable_redirects()
        .connector(
            awc::Connector::new()
                .connector(Egress { allow_private })
                .timeout(connect_timeout)
                .handshake_timeout(connect_timeout)
                .limit(limit),
        )
        .finish()
}

/// The push sender's TCP connector. A subscriber names the endpoint, so
/// it could aim the relay at the operator's own network: the endpoint's
/// text is checked at `push.subscribe`, but a host can be spelt in ways a
/// strict parse does not read as an address (`127.1`, `2130706433`,
/// `0x7f000001`, `0177.0.0.1`, `0` all reach loopback through
/// getaddrinfo) and a name can resolve to a private address. So the check
/// that holds is here, on the addresses about to be connected to, after
/// resolution: unless `push.allow_private_endpoints`, only public unicast
/// addresses ([`relay_schemas::methods::is_public_address`]) are tried.
#[derive(Clone, Copy)]
struct Egress {
    allow_private: bool,
}

/// Why [`Egress`] refused: no address of the host may be connected to.
#[derive(Debug)]
struct NotPublic(String);

impl std::fmt::Display for NotPublic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "push endpoint host {} has no public address (push.allow_private_endpoints is off)", self.0)
    }
}

impl std::error::Error for NotPublic {}

impl actix_web::dev::Service<actix_tls::connect::ConnectInfo<awc::http::Uri>> for Egress {
    type Response = actix_tls::connect::Connection<awc::http::Uri, actix_web::rt::net::TcpStream>;
    type Error = actix_tls::connect::ConnectError;
    type Future = futures_util::future::LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    actix_web::dev::always_ready!();

    fn call(&self, req: actix_tls::connect::ConnectInfo<awc::http::Uri>) -> Self::Future {
        use actix_tls::connect::{ConnectError, Connection};
        let allow_private = self.allow_private;
        let (host, port, preset) = (req.hostname().to_owned(), req.port(), req.addrs().collect::<Vec<_>>());
        let uri = req.request().clone();
        Box::pin(async move {
            let bare = host.trim_start_matches('[').trim_end_matches(']');
            let found: Vec<std::net::SocketAddr> = if !preset.is_empty() {
                preset
            } else if let Ok(ip) = bare.parse::<std::net::IpAddr>() {
                vec![(ip, port).into()]
            } else {
                // getaddrinfo, as any client would: it reads `127.1` as 127.0.0.1.
                tokio::net::lookup_host((bare, port)).await.map_err(|e| ConnectError::Resolver(Box::new(e)))?.collect()
            };
            let allowed: Vec<_> = found
                .into_iter()
                .filter(|a| allow_private || relay_schemas::methods::is_public_address(a.ip()))
                .collect();
            if allowed.is_empty() {
                return Err(ConnectError::Resolver(Box::new(NotPublic(host))));
            }
            let mut last = None;
            for addr in allowed {
                match actix_web::rt::net::TcpStream::connect(addr).await {
                    Ok(stream) => return Ok(Connection::new(uri, stream)),
                    Err(e) => last = Some(e),
                }
            }
            Err(ConnectError::Io(last.unwrap_or_else(|| std::io::Error::other("no address"))))
        })
    }
}

/// The push settings the sender works with.
#[derive(Clone, Debug)]
pub struct Settings {
    pub min_interval: Duration,
    pub ttl: Duration,
    pub timeout: Duration,
    pub connect_timeout: Duration,
    pub queue: usize,
    pub concurrency: usize,
    pub per_account: usize,
    pub per_origin: usize,
    pub max_attempts: u32,
    pub backoff: Duration,
    pub max_retry_after: Duration,
    /// `push.allow_private_endpoints`: the connector may reach any address.
    pub allow_private: bool,
}

impl Settings {
    pub fn from_config(cfg: &Config) -> Self {
        let p = &cfg.push;
        Settings {
            min_interval: p.min_interval,
            ttl: p.ttl,
            timeout: p.timeout,
            connect_timeout: p.connect_timeout,
            queue: p.queue,
            concurrency: p.concurrency,
            per_account: p.per_account,
            per_origin: p.per_origin,
            max_attempts: p.max_attempts,
            backoff: p.backoff,
            max_retry_after: p.max_retry_after,
            allow_private: p.allow_private_endpoints,
        }
    }
}

/// The sender's pure queue with the settings' bounds and shares.
fn queue(s: &Settings) -> PushQueue {
    PushQueue::new(s.queue, s.min_interval.as_millis() as u64).with_shares(s.per_account, s.per_origin)
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
        let queue = queue(&settings);
        PushSender { sup, vapid, settings, queue, client: None, timer: None, metrics }
    }

    fn now_ms(&self) -> UnixMillis {
        self.sup.clock().now_ms()
    }

    fn client(&mut self) -> awc::Client {
        let s = &self.settings;
        let (c, t, n, p) = (s.connect_timeout, s.timeout, s.concurrency, s.allow_private);
        self.client.get_or_insert_with(|| http_client(c, t, n, p)).clone()
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
        // awc's timeout ends with the response head: the whole attempt,
        // body read included, runs under `push.timeout`, or a service
        // stalling its body would hold this device's slot (and one of
        // `push.concurrency`) for longer.
        let limit = self.settings.timeout;
        let answer = async move {
            let deadline = tokio::time::Instant::now() + limit;
            match tokio::time::timeout_at(deadline, request.send_body(body)).await {
                Ok(Ok(mut resp)) => {
                    let retry_after =
                        resp.headers().get("Retry-After").and_then(|v| v.to_str().ok()).map(str::to_owned);
                    // Read (a little of) the body so the connection can be reused.
                    let _ = tokio::time::timeout_at(deadline, resp.body().limit(4096)).await;
                    (Some(resp.status().as_u16()), retry_after, None)
                }
                Ok(Err(e)) => (None, None, Some(e.to_string())),
                Err(_) => (None, None, Some(format!("no answer within {limit:?}"))),
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
        self.queue = queue(&self.settings);
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
        let result = http_client(Duration::from_millis(500), Duration::from_secs(5), 4, true)
            .post(format!("https://127.0.0.1:{port}/push"))
            .send_body("x")
            .await;
        assert!(result.is_err());
        assert!(started.elapsed() < Duration::from_secs(1), "timed out after {:?}", started.elapsed());
        assert_eq!(first.join().unwrap(), 0x16, "a TLS handshake record");
    }

    /// Whatever the spelling of a loopback host, the connector resolves it
    /// and refuses before any connection is made; with
    /// `allow_private_endpoints` it connects.
    #[actix_rt::test]
    async fn the_push_connector_never_connects_to_a_non_public_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let client = http_client(Duration::from_millis(500), Duration::from_secs(2), 4, false);
        for host in [
            "127.0.0.1",
            "127.1",
            "2130706433",
            "0x7f000001",
            "0177.0.0.1",
            "0x7f.1",
            "127.0.1",
            "0",
            "localhost",
            "[::ffff:127.0.0.1]",
        ] {
            let result = client.post(format!("https://{host}:{port}/push")).send_body("x").await;
            let error = result.expect_err(host).to_string();
            assert!(listener.accept().is_err(), "{host}: the relay connected ({error})");
        }
        // The same connector with private endpoints allowed does connect.
        let allowed = http_client(Duration::from_millis(500), Duration::from_millis(500), 4, true);
        let _ = allowed.post(format!("https://127.1:{port}/push")).send_body("x").await;
        assert!(listener.accept().is_ok(), "allow_private_endpoints connects");
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

    /// Why the JWT is not `web-push-native`'s: its `aud` is `scheme://host`
    /// for every endpoint, which a push service on another port refuses.
    #[test]
    fn the_vapid_audience_keeps_a_non_default_port_and_drops_a_default_one() {
        for (endpoint, aud) in [
            ("https://push.example.net:8443/wpush/abc", "https://push.example.net:8443"),
            ("https://push.example.net:443/wpush/abc", "https://push.example.net"),
            ("https://push.example.net/wpush/abc", "https://push.example.net"),
            ("http://127.0.0.1:8080/push", "http://127.0.0.1:8080"),
            ("http://127.0.0.1:80/push", "http://127.0.0.1"),
            ("https://[::1]:8443/push", "https://[::1]:8443"),
        ] {
            assert_eq!(origin(endpoint).unwrap(), aud, "{endpoint}");
        }
        assert!(origin("ftp://push.example.net/x").is_err());
        assert!(origin("/relative/only").is_err());
    }
}
