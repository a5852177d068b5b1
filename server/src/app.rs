//! The app state every method reads ([`App`]: the supervisor, peers,
//! limits, push, replication, checkpoints, a cluster shard's lease) and the
//! plumbing the methods share (params parsing, sessions, rate limits,
//! metrics, result mapping, commands to local accounts). Each method's
//! handler is its own file in [`crate::method`]; [`crate::rpc`] dispatches
//! to them.

use crate::limits::RateLimits;
use crate::peer_rpc::PeerKeys;
use crate::peers::PeerClient;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use relay_actors::account::{AccountCmd, Reply};
use relay_actors::sessions::Session;
use relay_actors::Supervisor;
use relay_schemas::encoding::jcs_digest;
use relay_schemas::ids::check_account_id;
use relay_schemas::methods::Method;
use relay_schemas::objects::DeliveryStatus;
use relay_schemas::{ErrorCode, RelayError};
use serde::de::DeserializeOwned;
use std::time::Instant;

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

pub struct App {
    sup: Supervisor,
    max_body_bytes: usize,
    peers: PeerClient,
    peer_keys: PeerKeys,
    limits: RateLimits,
    push: PushInfo,
    replicator: Option<std::sync::Arc<crate::replication::Replicator>>,
    /// The checkpoint writer (`audit.checkpoint`), when running.
    checkpoints: Option<std::sync::Arc<crate::checkpoint::Checkpoints>>,
    /// Remote homes' device lists, kept briefly for clients asking again.
    remote_reads: crate::remote_reads::RemoteReads,
    /// A cluster shard's lease: no answer without it ([`App::under_lease`]).
    lease: Option<crate::cluster::lease::Serving>,
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
    relay_schemas::ijson::parse_checked(|| serde_json::from_str(text)).map_err(invalid)
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
pub fn parse_with_digest<T: DeserializeOwned>(body: &[u8]) -> Result<(T, String), RelayError> {
    let text = object_text(body)?;
    let value = relay_schemas::ijson::value(text).map_err(invalid)?;
    let digest = hex::encode(jcs_digest(&value)?);
    let params = relay_schemas::ijson::parse_checked(|| serde_json::from_str(text)).map_err(invalid)?;
    Ok((params, digest))
}

pub(crate) fn status_json(st: &DeliveryStatus) -> Result<String, RelayError> {
    serde_json::to_string(st).map_err(|e| RelayError::internal(e.to_string()))
}

impl App {
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
        let push = PushInfo::default();
        let remote_reads = Default::default();
        App {
            sup,
            max_body_bytes,
            peers,
            peer_keys,
            limits,
            push,
            replicator: None,
            checkpoints: None,
            remote_reads,
            lease: None,
            requests,
            latency,
        }
    }

    /// A cluster shard's core: answers only while `lease` holds.
    pub(crate) fn with_lease(mut self, lease: crate::cluster::lease::Serving) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Whether this core answers now: outside cluster mode always, a
    /// cluster shard's core while its lease holds.
    pub(crate) fn serves(&self) -> bool {
        self.lease.as_ref().is_none_or(|l| l.live())
    }

    /// Runs `call` only under a live lease (cluster mode), and gives its
    /// answer only if the lease still held once the call had read what it
    /// answers (`relay_core::lease::may_answer`): an owner paused past its
    /// lease answers nothing stale on waking, the client tries again and
    /// reaches the next owner. Outside cluster mode, `call` as it is.
    pub(crate) async fn under_lease(
        &self,
        call: impl std::future::Future<Output = Result<String, RelayError>>,
    ) -> Result<String, RelayError> {
        let Some(lease) = &self.lease else { return call.await };
        let lost = || RelayError::unavailable("this node no longer serves this account's shard; try again");
        if !lease.live() {
            return Err(lost());
        }
        let answer = call.await;
        if !lease.live() {
            return Err(lost());
        }
        answer
    }

    /// The push methods' settings.
    pub fn with_push(mut self, push: PushInfo) -> Self {
        self.push = push;
        self
    }

    /// Keeps two-home accounts in step with their other home.
    pub fn with_replicator(mut self, replicator: std::sync::Arc<crate::replication::Replicator>) -> Self {
        self.replicator = Some(replicator);
        self
    }

    /// Answers `audit.checkpoint` with the latest of `checkpoints`.
    pub fn with_checkpoints(mut self, checkpoints: std::sync::Arc<crate::checkpoint::Checkpoints>) -> Self {
        self.checkpoints = Some(checkpoints);
        self
    }

    pub(crate) fn checkpoints(&self) -> Option<&crate::checkpoint::Checkpoints> {
        self.checkpoints.as_deref()
    }

    /// Has the replicator pull `account_id` from `peer` (a `notify`).
    pub(crate) fn pull_from(&self, account_id: &str, peer: &str) {
        if let Some(r) = &self.replicator {
            r.pull(account_id, peer, false);
        }
    }

    /// Counts a call and its latency under its method (and result code).
    pub(crate) fn observe(&self, method: &str, started: Instant, result: &Result<String, RelayError>) {
        // Methods get their own metric labels; anything else is "unknown", so
        // a caller cannot grow the label set.
        let known = Method::from_client_wire(method).is_some()
            || method.strip_prefix("relay/").is_some_and(|m| Method::from_relay_wire(m).is_some());
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

    pub(crate) fn remote_reads(&self) -> &crate::remote_reads::RemoteReads {
        &self.remote_reads
    }

    pub(crate) fn peers(&self) -> &PeerClient {
        &self.peers
    }

    pub(crate) fn push(&self) -> &PushInfo {
        &self.push
    }

    pub(crate) fn json_of(reply: Reply) -> Result<String, RelayError> {
        match reply {
            Reply::Json(s) => Ok(s),
            Reply::Status(st) | Reply::Accepted { status: st, .. } | Reply::Settled { status: st, .. } => {
                status_json(&st)
            }
            Reply::Accept(_) => Err(RelayError::internal("a send decided and not written")),
            Reply::Backlog(_) => Err(RelayError::internal("a backlog is not a method's result")),
            Reply::Replica(_) => Err(RelayError::internal("a replication outcome is not a method's result")),
        }
    }

    pub fn supervisor(&self) -> &Supervisor {
        &self.sup
    }

    pub fn max_body_bytes(&self) -> usize {
        self.max_body_bytes
    }

    pub(crate) fn session(&self, token: Option<&str>) -> Result<Session, RelayError> {
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
    pub(crate) async fn own(
        &self,
        token: Option<&str>,
        cmd: impl FnOnce(String) -> AccountCmd,
    ) -> Result<String, RelayError> {
        let s = self.session(token)?;
        Self::json_of(self.sup.ask(&s.account_id, cmd(s.device_id)).await?)
    }

    /// A method on a local account named in params; unknown accounts get
    /// `unknown` (their route lives elsewhere, or nowhere).
    pub(crate) async fn local(
        &self,
        account_id: &str,
        unknown: ErrorCode,
        cmd: AccountCmd,
    ) -> Result<String, RelayError> {
        check_account_id("account_id", account_id)?;
        if !self.sup.account_exists(account_id)? {
            return Err(RelayError::new(unknown, format!("account {account_id} is not known here")));
        }
        Self::json_of(self.sup.ask(account_id, cmd).await?)
    }

    /// Where an account this relay does not serve lives now: `route_stale`
    /// with the newer route when one is known, else `target_not_local`.
    fn not_served_here(&self, account_id: &str) -> RelayError {
        relay_core::account::not_served_here(self.supervisor().routes().get(account_id).ok().flatten().as_ref())
    }

    /// A command to a local account named by a peer; an account not served
    /// here gets where it lives now.
    pub(crate) async fn on_local(&self, account_id: &str, cmd: AccountCmd) -> Result<Reply, RelayError> {
        check_account_id("account_id", account_id)?;
        if self.peers().in_sibling_shard(account_id) {
            // Reached through an owner address that changed hands: not a
            // statement about the account, so nothing the caller acts on.
            return Err(RelayError::unavailable("the account's shard is not served here now"));
        }
        if !self.supervisor().account_exists(account_id)? {
            return Err(self.not_served_here(account_id));
        }
        self.supervisor().ask(account_id, cmd).await
    }
}
