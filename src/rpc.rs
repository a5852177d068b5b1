//! The client methods of PROTOCOL §4, independent of transport: a method
//! name, an optional session token and the params bytes in; the result
//! object's JSON or a `RelayError` out. HTTP (and later WebSocket) call
//! [`Relay::call`].

use crate::limits::RateLimits;
use crate::peers::{CallError, PeerClient};
use crate::relay_rpc::PeerKeys;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use relay_actors::account::decide::{self, Ctx};
use relay_actors::account::{AccountCmd, Reply};
use relay_actors::sessions::Session;
use relay_actors::Supervisor;
use relay_schemas::encoding::jcs_digest;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::*;
use relay_schemas::{DeliveryStatus, ErrorCode, Method, RelayError};
use serde::de::DeserializeOwned;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// The client methods a stranger may call without a session: rate limited
/// per client address.
const SESSIONLESS: &[&str] = &["account.register", "session.challenge", "session.open", "route.get", "push.vapid_key"];

/// What the push methods need to know (PROTOCOL §9).
#[derive(Clone, Debug, Default)]
pub struct PushInfo {
    /// The relay's VAPID public key, base64url (`push.vapid_key`).
    pub vapid_public_key: String,
    /// `push.allow_http_endpoints`.
    pub allow_http: bool,
    /// `push.allow_private_endpoints`.
    pub allow_private: bool,
}

pub struct Relay {
    sup: Supervisor,
    max_body_bytes: usize,
    peers: PeerClient,
    peer_keys: PeerKeys,
    limits: RateLimits,
    push: PushInfo,
    requests: Family<RequestLabels, Counter>,
    latency: Family<MethodLabels, Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    method: String,
    code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabels {
    method: String,
}

/// Parses params, mapping any JSON or type error to `invalid_params`.
/// Params are a JSON object: serde would also take a positional array.
/// I-JSON anywhere in the body (no member twice, safe integers): a repeated
/// unknown member would otherwise be merged before the idempotency digest.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, RelayError> {
    let text = object_text(body)?;
    relay_schemas::ijson::check(text).map_err(invalid)?;
    serde_json::from_str(text).map_err(invalid)
}

/// The body as text, if it can be a JSON object.
fn object_text(body: &[u8]) -> Result<&str, RelayError> {
    if body.trim_ascii_start().first() != Some(&b'{') {
        return Err(RelayError::invalid_params("params must be a JSON object"));
    }
    std::str::from_utf8(body).map_err(|_| RelayError::invalid_params("params: not UTF-8"))
}

fn invalid(e: serde_json::Error) -> RelayError {
    RelayError::invalid_params(format!("params: {e}"))
}

/// The params and blake3 of the JCS of the complete params object (the
/// idempotency comparison of the seed: unknown members, array order and
/// optional members all count). The text is I-JSON-checked and read into
/// the digest's value in one pass, then into the typed params.
pub(crate) fn parse_with_digest<T: DeserializeOwned>(body: &[u8]) -> Result<(T, String), RelayError> {
    let text = object_text(body)?;
    let value = relay_schemas::ijson::value(text).map_err(invalid)?;
    let digest = hex::encode(jcs_digest(&value)?);
    let params = serde_json::from_str(text).map_err(invalid)?;
    Ok((params, digest))
}

fn status_json(st: &DeliveryStatus) -> Result<String, RelayError> {
    serde_json::to_string(st).map_err(|e| RelayError::internal(e.to_string()))
}

impl Relay {
    pub fn new(
        sup: Supervisor,
        max_body_bytes: usize,
        peers: PeerClient,
        peer_keys: PeerKeys,
        limits: RateLimits,
    ) -> Self {
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<MethodLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_1, 2.0, 16))
        });
        {
            let mut r = sup.metrics().registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register("requests", "Requests by method and result code", requests.clone());
            r.register("request_seconds", "Request latency by method", latency.clone());
        }
        Relay { sup, max_body_bytes, peers, peer_keys, limits, push: PushInfo::default(), requests, latency }
    }

    /// The push methods' settings.
    pub fn with_push(mut self, push: PushInfo) -> Self {
        self.push = push;
        self
    }

    /// Counts a call and its latency under its method (and result code).
    pub(crate) fn observe(&self, method: &str, started: Instant, result: &Result<String, RelayError>) {
        // Methods get their own metric labels; anything else is "unknown", so
        // a caller cannot grow the label set.
        let known = CLIENT_METHODS.contains(&method)
            || method.strip_prefix("relay/").is_some_and(|m| RELAY_METHODS.contains(&m));
        let method = if known { method } else { "unknown" }.to_owned();
        let code = match result {
            Ok(_) => "ok".to_owned(),
            Err(e) => e.code.as_str().to_owned(),
        };
        self.latency.get_or_create(&MethodLabels { method: method.clone() }).observe(started.elapsed().as_secs_f64());
        self.requests.get_or_create(&RequestLabels { method, code }).inc();
    }

    pub(crate) fn limits(&self) -> &RateLimits {
        &self.limits
    }

    pub fn peer_keys(&self) -> &PeerKeys {
        &self.peer_keys
    }

    pub(crate) fn json_of(reply: Reply) -> Result<String, RelayError> {
        match reply {
            Reply::Json(s) => Ok(s),
            Reply::Status(st) | Reply::Accepted { status: st, .. } | Reply::Settled { status: st, .. } => {
                status_json(&st)
            }
            Reply::Accept(_) => Err(RelayError::internal("a send decided and not written")),
        }
    }

    pub fn supervisor(&self) -> &Supervisor {
        &self.sup
    }

    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    fn session(&self, token: Option<&str>) -> Result<Session, RelayError> {
        let token =
            token.ok_or_else(|| RelayError::unauthorized("this method needs a session (Authorization: Bearer)"))?;
        let session = self
            .sup
            .sessions()
            .lookup(token, self.sup.clock().now())
            .ok_or_else(|| RelayError::unauthorized("unknown or expired session"))?;
        self.limits.session(&session.account_id, &session.device_id)?;
        Ok(session)
    }

    /// A method on the session's own account.
    async fn own(&self, token: Option<&str>, cmd: impl FnOnce(String) -> AccountCmd) -> Result<String, RelayError> {
        let s = self.session(token)?;
        Self::json_of(self.sup.ask(&s.account_id, cmd(s.device_id)).await?)
    }

    /// A method on a local account named in params; unknown accounts get
    /// `unknown` (their route lives elsewhere, or nowhere).
    async fn local(&self, account_id: &str, unknown: ErrorCode, cmd: AccountCmd) -> Result<String, RelayError> {
        check_account_id("account_id", account_id)?;
        if !self.sup.account_exists(account_id)? {
            return Err(RelayError::new(unknown, format!("account {account_id} is not known here")));
        }
        Self::json_of(self.sup.ask(account_id, cmd).await?)
    }

    /// One client call. `ip` is the caller's address: methods without a
    /// session are rate limited per address.
    pub async fn call(
        &self,
        method: &str,
        token: Option<&str>,
        ip: Option<IpAddr>,
        body: &[u8],
    ) -> Result<String, RelayError> {
        let started = Instant::now();
        let result = match SESSIONLESS.contains(&method) {
            true => self.limits.anonymous(ip),
            false => Ok(()),
        };
        let result = match result {
            Ok(()) => self.dispatch(method, token, body).await,
            Err(e) => Err(e),
        };
        self.observe(method, started, &result);
        result
    }

    async fn dispatch(&self, method: &str, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
        match method {
            "account.register" => {
                let (params, digest): (RegisterParams, _) = parse_with_digest(body)?;
                check_account_id("route.account_id", &params.route.account_id)?;
                // Every stateless check before an actor exists for the account.
                let policy = self.sup.policy();
                decide::check_register(&params, Ctx { now: self.sup.clock().now(), policy: &policy })?;
                let account_id = params.route.account_id.clone();
                // The highest revision known here or at the peers.
                let known = self.sup.resolve_route(&account_id, true).await;
                Self::json_of(self.sup.ask(&account_id, AccountCmd::AccountRegister { params, digest, known }).await?)
            }
            "session.challenge" => {
                let p: ChallengeParams = parse(body)?;
                self.local(
                    &p.account_id.clone(),
                    ErrorCode::NotFound,
                    AccountCmd::SessionChallenge { device_id: p.device_id },
                )
                .await
            }
            "session.open" => {
                let params: SessionOpenParams = parse(body)?;
                self.local(&params.account_id.clone(), ErrorCode::NotFound, AccountCmd::SessionOpen { params }).await
            }
            "session.attach" => Err(RelayError::invalid_params("session.attach is a WebSocket method")),
            "device.add" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::DeviceAdd { device, params }).await
            }
            "device.revoke" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::DeviceRevoke { device, params }).await
            }
            "account.devices.get" => {
                let s = self.session(token)?;
                let p: AccountIdParams = parse(body)?;
                // The caller's own session must still be valid.
                self.sup.ask(&s.account_id, AccountCmd::CheckSession { device: s.device_id }).await?;
                check_account_id("account_id", &p.account_id)?;
                if self.sup.account_exists(&p.account_id)? {
                    return self.local(&p.account_id, ErrorCode::NotFound, AccountCmd::AccountDevicesGet).await;
                }
                self.remote_devices(&p.account_id, body).await
            }
            "account.settings.update" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::AccountSettingsUpdate { device, params }).await
            }
            "route.get" => {
                let p: AccountIdParams = parse(body)?;
                check_account_id("account_id", &p.account_id)?;
                // Strangers get what this relay knows; only a device with a
                // session here makes it ask its peers.
                let route = match token.map(|t| self.session(Some(t))).transpose()? {
                    Some(_) => self.sup.resolve_route(&p.account_id, false).await,
                    None => self.sup.routes().get(&p.account_id).map_err(|e| RelayError::internal(e.to_string()))?,
                };
                let route = route
                    .ok_or_else(|| RelayError::new(ErrorCode::RouteNotFound, "no route known for this account"))?;
                Ok(route.raw().get().to_owned())
            }
            "route.update" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::RouteUpdate { device, params }).await
            }
            "contact.revoke" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::ContactRevoke { device, params }).await
            }
            "message.send" => self.send(token, body).await,
            "message.delivery.status" => {
                let p: MessageIdParams = parse(body)?;
                self.own(token, |device| AccountCmd::MessageDeliveryStatus { device, message_id: p.message_id }).await
            }
            "message.timeline.sync" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::MessageTimelineSync { device, params }).await
            }
            "message.timeline.ack" => {
                let params = parse(body)?;
                self.own(token, |device| AccountCmd::MessageTimelineAck { device, params }).await
            }
            "push.vapid_key" => {
                let _: serde_json::Value = parse(body)?;
                if self.push.vapid_public_key.is_empty() {
                    return Err(RelayError::unavailable("this relay has no VAPID key"));
                }
                serde_json::to_string(&VapidKeyResult { public_key: self.push.vapid_public_key.clone() })
                    .map_err(|e| RelayError::internal(e.to_string()))
            }
            "push.subscribe" => {
                let s = self.session(token)?;
                let params: PushSubscribeParams = parse(body)?;
                crate::push::check_subscription(&params, self.push.allow_http, self.push.allow_private)?;
                Self::json_of(
                    self.sup.ask(&s.account_id, AccountCmd::PushSubscribe { device: s.device_id, params }).await?,
                )
            }
            "push.unsubscribe" => {
                let _: serde_json::Value = parse(body)?;
                self.own(token, |device| AccountCmd::PushUnsubscribe { device }).await
            }
            _ => Err(RelayError::not_found(format!("unknown method {method:?}"))),
        }
    }

    /// `account.devices.get` for an account served elsewhere: asked of its
    /// home relay (the first of its route that answers).
    async fn remote_devices(&self, account_id: &str, body: &[u8]) -> Result<String, RelayError> {
        let route = self.sup.resolve_route(account_id, false).await;
        let route = route.ok_or_else(|| RelayError::not_found(format!("account {account_id} is not known")))?;
        let mut last = RelayError::new(ErrorCode::BadGateway, "no home relay answered");
        for relay in route.relays.iter() {
            match self.peers.call(&relay.id, Method::RelayAccountDevicesGet, body.to_vec()).await {
                Ok(bytes) => {
                    return String::from_utf8(bytes.to_vec())
                        .map_err(|_| RelayError::new(ErrorCode::BadGateway, "non-UTF-8 answer"))
                }
                Err(CallError::Answered { error, .. }) => return Err(error),
                Err(CallError::NotSent(e) | CallError::Unknown(e)) => last = e,
            }
        }
        Err(RelayError::new(ErrorCode::BadGateway, last.message))
    }

    /// `message.send`: accepted at the sender's account; for another account
    /// the answer waits for the first delivery attempt (local delivery is
    /// immediate), so the client usually gets the terminal status at once.
    async fn send(&self, token: Option<&str>, body: &[u8]) -> Result<String, RelayError> {
        let s = self.session(token)?;
        let (params, digest): (SendParams, _) = parse_with_digest(body)?;
        let sent = self.sup.message_send(&s.account_id, s.device_id, params, digest).await?;
        let status = match sent.first_attempt {
            Some(first_attempt) => {
                let wait = Duration::from_millis(self.sup.policy().attempt_timeout_ms + 1000);
                match tokio::time::timeout(wait, first_attempt).await {
                    Ok(Ok(after_attempt)) => after_attempt,
                    _ => sent.status,
                }
            }
            None => sent.status,
        };
        status_json(&status)
    }
}
