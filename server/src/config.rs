//! Configuration (PROTOCOL §7): a TOML file, every key overridable by an
//! environment variable `RELAY__SECTION__KEY` (e.g. `RELAY__LIMITS__MAX_BOXES=16`,
//! `RELAY__DELIVERY__RETRY_TIMETABLE=0s,1s,5s`).

use relay_core::policy::Policy;
use serde::{Deserialize, Deserializer};
use std::path::{Path, PathBuf};
use std::time::Duration;

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(&s).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}")))
}

fn durations<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Duration>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|s| humantime::parse_duration(s.trim()).map_err(|e| serde::de::Error::custom(format!("{s:?}: {e}"))))
        .collect()
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub relay: RelaySection,
    #[serde(default)]
    pub peers: Vec<Peer>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub delivery: Delivery,
    #[serde(default)]
    pub sessions: Sessions,
    #[serde(default)]
    pub actors: Actors,
    #[serde(default)]
    pub websocket: Websocket,
    #[serde(default)]
    pub http: Http,
    #[serde(default)]
    pub store: StoreSection,
    #[serde(default)]
    pub log: LogSection,
    #[serde(default)]
    pub metrics: MetricsSection,
    #[serde(default)]
    pub push: PushSection,
    #[serde(default)]
    pub replication: ReplicationSection,
    #[serde(default)]
    pub audit: AuditSection,
    /// Cluster mode (`store.engine = "jetstream"`): `crate::cluster`.
    pub cluster: Option<ClusterSection>,
}

/// One relay on several machines: the store on NATS JetStream, one node
/// serving at a time through a lease, every node accepting connections.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// This node's name, unique in the cluster (shown in the lease and logs).
    pub node: String,
    /// NATS servers, e.g. ["nats://127.0.0.1:4222", ...].
    pub nats_urls: Vec<String>,
    /// Names the cluster's streams and lease bucket (default: `relay.id`).
    #[serde(default)]
    pub name: Option<String>,
    /// Copies JetStream keeps of every stream (3 on three servers).
    #[serde(default = "default_replicas")]
    pub replicas: usize,
    /// The owner's lease expires this long after its last renewal; a
    /// standby takes over after it.
    #[serde(default = "default_lease_ttl", deserialize_with = "duration")]
    pub lease_ttl: Duration,
    /// Where this node serves the relay while it owns it; the other nodes
    /// connect here, so it must be reachable from them.
    #[serde(default = "default_internal_listen")]
    pub internal_listen: String,
    /// When set, this node's own `/metrics` (owner or standby, front
    /// connections) on this address; the relay's metrics stay at the
    /// relay's `/metrics`, served by the owner.
    #[serde(default)]
    pub metrics_listen: Option<String>,
    /// A checkpoint of a shard's local copy is written (and its stream
    /// trimmed) after this many bytes of commits: bounds what a node
    /// without a copy replays, and the stream's size.
    #[serde(default = "default_snapshot_bytes")]
    pub snapshot_bytes: u64,
    /// The memory a shard's local copy (`<data_dir>/shards/<stream>`, on
    /// disk) may hold as page cache, per shard this node serves.
    #[serde(default = "default_shard_cache_bytes")]
    pub shard_cache_bytes: u64,
    /// Accounts are hashed into this many shards, each its own stream and
    /// lease, so the nodes share the work. Fixed for the cluster's life:
    /// another count would look for accounts in streams without them.
    #[serde(default = "default_shards")]
    pub shards: u32,
    /// The user this node connects to the nats-servers as (with
    /// `nats_password_file`): nats-server's `authorization`.
    #[serde(default)]
    pub nats_user: Option<String>,
    /// A file whose first line is `nats_user`'s password.
    #[serde(default)]
    pub nats_password_file: Option<PathBuf>,
    /// The nats-servers' CA (PEM): connections to them use TLS and check
    /// their certificates against it.
    #[serde(default)]
    pub nats_ca_file: Option<PathBuf>,
    /// Read from `nats_password_file` when the config is loaded.
    #[serde(skip)]
    pub nats_password: Option<Secret>,
    /// A file whose first line is the cluster's secret (at least 32
    /// characters, the same on every node): fronts, owners and sibling
    /// shards authenticate each other with it and encrypt what passes
    /// between them (`src/cluster/hop.rs`). Required unless
    /// `internal_listen` is a loopback address.
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// Read from `secret_file` when the config is loaded.
    #[serde(skip)]
    pub secret: Option<Secret>,
}

/// The shortest cluster secret accepted, in bytes of its text (e.g. 128
/// random bits in hex).
pub const MIN_CLUSTER_SECRET: usize = 32;

/// A secret read from a file: never printed (`Debug` says only that it
/// is there).
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn default_shards() -> u32 {
    1
}

fn default_snapshot_bytes() -> u64 {
    relay_actors::store::SNAPSHOT_BYTES
}

fn default_shard_cache_bytes() -> u64 {
    relay_actors::store::SHARD_CACHE_BYTES
}

/// Each shard a node owns runs its own relay core (threads, connections):
/// a bound that keeps a node's share of them sane.
pub const MAX_SHARDS: u32 = 64;

fn default_replicas() -> usize {
    3
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(3)
}

fn default_internal_listen() -> String {
    "127.0.0.1:0".into()
}

impl ClusterSection {
    /// Reads `nats_password_file` and `secret_file` (their first lines).
    fn read_secrets(&mut self) -> Result<(), Bad> {
        if let Some(path) = &self.nats_password_file {
            self.nats_password = Some(first_line("cluster.nats_password_file", path, "no password in it", 1, false)?);
        }
        if let Some(path) = &self.secret_file {
            let short = "shorter than 32 characters";
            self.secret = Some(first_line("cluster.secret_file", path, short, MIN_CLUSTER_SECRET, true)?);
        }
        Ok(())
    }

    /// How this node authenticates to the nats-servers and checks them.
    pub fn nats_auth(&self) -> relay_actors::store::NatsAuth {
        relay_actors::store::NatsAuth {
            user: self.nats_user.clone().zip(self.nats_password.as_ref().map(|p| p.0.clone())),
            ca_file: self.nats_ca_file.clone(),
        }
    }

    /// The cluster's name as it appears in stream and bucket names.
    pub fn name<'a>(&'a self, relay_id: &'a str) -> String {
        let raw = self.name.as_deref().unwrap_or(relay_id);
        raw.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect()
    }
}

/// `timeline.replicate` between an account's two home relays
/// (`crate::replication`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationSection {
    /// Every two-home account is pulled from its partner this often (and
    /// once at start), besides the pulls its own writes trigger.
    #[serde(deserialize_with = "duration")]
    pub interval: Duration,
    /// Items per `timeline.replicate` page (1..=500).
    pub page: u32,
    /// Pulls running at once.
    pub concurrency: usize,
    /// Pulls waiting at most; more are left to the next round.
    pub queue: usize,
}

impl Default for ReplicationSection {
    fn default() -> Self {
        ReplicationSection { interval: Duration::from_secs(10), page: 100, concurrency: 8, queue: 4096 }
    }
}

/// Signed checkpoints and witnesses (PROTOCOL §10; `crate::checkpoint`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditSection {
    /// A signed checkpoint of the whole store is written at start, this
    /// often, and before the retention sweep prunes anything.
    #[serde(deserialize_with = "duration")]
    pub checkpoint_interval: Duration,
    /// Every peer's latest checkpoint is fetched this often (the first soon
    /// after start) and kept in the witness log.
    #[serde(deserialize_with = "duration")]
    pub witness_interval: Duration,
}

impl Default for AuditSection {
    fn default() -> Self {
        AuditSection { checkpoint_interval: Duration::from_secs(3600), witness_interval: Duration::from_secs(3600) }
    }
}

/// Web Push (PROTOCOL §9): waking devices that have no open WebSocket.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PushSection {
    /// Off: the push methods answer as usual (subscriptions are kept), but
    /// nothing is sent.
    pub enabled: bool,
    /// The relay's VAPID P-256 key (RFC 8292), generated on first start
    /// (0600). Default: `vapid.key` in `relay.data_dir`.
    pub vapid_key_file: Option<PathBuf>,
    /// The VAPID `sub` claim: a `mailto:` or `https:` contact for the push
    /// services. Default: `relay.public_url`.
    pub subject: Option<String>,
    /// At most one push per device this often; records in between are
    /// coalesced into the next push (which names the latest).
    #[serde(deserialize_with = "duration")]
    pub min_interval: Duration,
    /// The `TTL` header: how long a push service keeps an undelivered push.
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    /// Whole-request timeout of one push (connect, send, answer and its body).
    #[serde(deserialize_with = "duration")]
    pub timeout: Duration,
    /// Time to open the TCP connection and, apart, to finish the TLS
    /// handshake with a push service: short, so an endpoint that does not
    /// answer gives its slot back soon.
    #[serde(deserialize_with = "duration")]
    pub connect_timeout: Duration,
    /// Devices whose push may wait at once; past that new ones are dropped
    /// (counted as `outcome="dropped"`).
    pub queue: usize,
    /// Pushes in flight at once.
    pub concurrency: usize,
    /// Pushes of one account in flight at once (of `concurrency`): the
    /// devices of one account cannot take every slot; accounts with pushes
    /// due are served round-robin.
    pub per_account: usize,
    /// Pushes to one endpoint origin (scheme, host, port) in flight at once:
    /// a push service that holds connections and never answers holds at
    /// most this many slots.
    pub per_origin: usize,
    /// Attempts of one push on 429/5xx/no answer before it is given up.
    pub max_attempts: u32,
    /// The wait before a retry without `Retry-After`, doubled per attempt.
    #[serde(deserialize_with = "duration")]
    pub backoff: Duration,
    /// The longest wait a `Retry-After` (or the backoff) may impose.
    #[serde(deserialize_with = "duration")]
    pub max_retry_after: Duration,
    /// Accept `http://` endpoints in `push.subscribe` (tests, a push service
    /// on a private network). Off: only `https://`.
    pub allow_http_endpoints: bool,
    /// Accept endpoints whose host is `localhost` or a loopback, private,
    /// link-local or unique-local address (tests, a push service on a
    /// private network). Off: a subscriber cannot make the relay probe the
    /// operator's own network: checked on the endpoint's text at subscribe
    /// and on every address the sender connects to.
    pub allow_private_endpoints: bool,
}

impl Default for PushSection {
    fn default() -> Self {
        PushSection {
            enabled: true,
            vapid_key_file: None,
            subject: None,
            min_interval: Duration::from_secs(10),
            ttl: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(3),
            queue: 10_000,
            concurrency: 16,
            per_account: 4,
            per_origin: 8,
            max_attempts: 5,
            backoff: Duration::from_secs(2),
            max_retry_after: Duration::from_secs(3600),
            allow_http_endpoints: false,
            allow_private_endpoints: false,
        }
    }
}

impl Config {
    /// `push.vapid_key_file`, or `vapid.key` in the data dir.
    pub fn vapid_key_file(&self) -> PathBuf {
        self.push.vapid_key_file.clone().unwrap_or_else(|| self.relay.data_dir.join("vapid.key"))
    }

    /// `push.subject`, or the relay's public URL.
    pub fn vapid_subject(&self) -> String {
        self.push.subject.clone().unwrap_or_else(|| self.relay.public_url.clone())
    }
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// One INFO line per HTTP request (method, path, status, duration).
    pub access: bool,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// When set, `/metrics` is served on this address only (not on
    /// `relay.listen`), so it can stay off the public network.
    pub listen: Option<String>,
}

/// Which engine holds the event store.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreEngine {
    /// sled in `relay.data_dir/store`: the embedded default.
    #[default]
    Sled,
    /// NATS JetStream, in cluster mode (needs `[cluster]`).
    Jetstream,
}

/// The event store.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    pub engine: StoreEngine,
    /// sled's page cache, in bytes (its own default is 1 GiB).
    pub cache_bytes: u64,
    /// Flushes start at most this often; a lone commit someone waits for is
    /// flushed at once, one nobody waits for yet within this long.
    #[serde(deserialize_with = "duration")]
    pub group_commit_window: Duration,
}

impl Config {
    /// Opens the relay's event store (`<data_dir>/store`) with the `[store]`
    /// settings: what `relay serve` runs on, and what `relay bench
    /// --population` seeds.
    pub fn open_store(&self) -> Result<relay_actors::store::Store, String> {
        if self.store.engine == StoreEngine::Jetstream {
            return Err("this command works on the embedded sled store; a cluster's store opens only \
                        in `relay serve` (which holds the lease) or read-only in `relay audit`"
                .into());
        }
        let dir = self.relay.data_dir.join("store");
        let store = relay_actors::store::Store::open_with_cache(&dir, self.store.cache_bytes).map_err(|e| {
            if store_in_use(&e) {
                format!("relay.data_dir {} is in use by a running relay; stop it first", self.relay.data_dir.display())
            } else {
                format!("store {}: {e}", dir.display())
            }
        })?;
        store.set_group_commit_window(self.store.group_commit_window);
        Ok(store)
    }
}

/// sled holds an exclusive file lock on its store while a relay runs;
/// opening it again fails with this.
pub fn store_in_use(e: &relay_actors::store::StoreError) -> bool {
    matches!(e, relay_actors::store::StoreError::InUse(_))
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            engine: StoreEngine::Sled,
            cache_bytes: 256 << 20,
            group_commit_window: Duration::from_micros(500),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelaySection {
    pub id: String,
    pub public_url: String,
    pub listen: String,
    pub data_dir: PathBuf,
    /// Generated on first start if absent.
    pub key_file: PathBuf,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    pub id: String,
    pub url: String,
    pub public_key: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    #[serde(deserialize_with = "duration")]
    pub clock_tolerance: Duration,
    #[serde(deserialize_with = "duration")]
    pub delivery_age_limit: Duration,
    #[serde(deserialize_with = "duration")]
    pub message_retention: Duration,
    /// How often the retention sweep runs: what is past its retention is
    /// deleted within this after it (PROTOCOL §10).
    #[serde(deserialize_with = "duration")]
    pub retention_sweep: Duration,
    pub max_ciphertext_bytes: usize,
    pub max_boxes: usize,
    /// Bytes of canonical JSON one signed object (certificate, revocation,
    /// route, registration, grant, invite) may have; larger ones get
    /// `payload_too_large` (PROTOCOL §1).
    pub max_object_bytes: usize,
    /// Device certificates one account may hold, revoked ones included
    /// (PROTOCOL §1); one more `device.add` gets `payload_too_large`.
    pub max_devices: usize,
    /// Grants and invites one account may revoke (`contact.revoke`): the
    /// ids are kept for good; one more gets `payload_too_large`.
    pub max_revoked_contacts: usize,
    /// Largest accepted request body; larger ones get `payload_too_large`.
    pub max_body_bytes: usize,
    /// Requests per second one session may make (sustained), and its burst;
    /// past that: `rate_limited` with `data.retry_after`.
    pub session_rate: u32,
    pub session_burst: u32,
    /// The same for each peer relay's calls.
    pub peer_rate: u32,
    pub peer_burst: u32,
    /// The same for each peer's `route.get` lookups (their own budget, so a
    /// flood of lookups cannot spend what the peer's deliveries need).
    pub peer_lookup_rate: u32,
    pub peer_lookup_burst: u32,
    /// The same for each peer's `account.devices.get`, which a peer passes
    /// on for its clients (their own budget: a stranger's loop of them
    /// cannot spend what the peer's deliveries need).
    pub peer_read_rate: u32,
    pub peer_read_burst: u32,
    /// The same for each partner home's `timeline.replicate` pulls.
    pub peer_replicate_rate: u32,
    pub peer_replicate_burst: u32,
    /// The same for the methods without a session (`account.register`,
    /// `session.challenge`, `session.open`, `route.get`), per client address.
    pub anonymous_rate: u32,
    pub anonymous_burst: u32,
    /// Account actors resident in memory at most; past this some are
    /// passivated at once (they load again on their next request).
    pub max_resident_accounts: usize,
    /// Delivery attempts in flight at once to one destination relay; more
    /// wait their turn, so one dead relay cannot tie up the others'.
    pub max_in_flight_per_destination: usize,
    /// Bytes of records in one `message.timeline.sync` page; past that the
    /// page ends early with `has_more` (it always holds at least one record).
    pub max_page_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            clock_tolerance: Duration::from_secs(300),
            delivery_age_limit: Duration::from_secs(90 * 60),
            message_retention: Duration::from_secs(30 * 24 * 3600),
            retention_sweep: Duration::from_secs(3600),
            max_ciphertext_bytes: 65536,
            max_boxes: 64,
            max_object_bytes: relay_schemas::objects::MAX_OBJECT_BYTES,
            max_devices: 32,
            max_revoked_contacts: 1024,
            max_body_bytes: 1 << 20,
            session_rate: 100,
            session_burst: 200,
            peer_rate: 2000,
            peer_burst: 4000,
            peer_lookup_rate: 200,
            peer_lookup_burst: 400,
            // A caller keeps a remote device list briefly, so one peer asks
            // once per account per few seconds: lookups' budget fits.
            peer_read_rate: 200,
            peer_read_burst: 400,
            // One pull per two-home account per `replication.interval`
            // (10s), and one per change: 10 000 shared accounts at 1 000/s,
            // a whole round of 5 000 in one burst; a pull refused is retried
            // next round.
            peer_replicate_rate: 1000,
            peer_replicate_burst: 5000,
            anonymous_rate: 20,
            anonymous_burst: 100,
            max_resident_accounts: 100_000,
            max_in_flight_per_destination: 64,
            max_page_bytes: 4 << 20,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Delivery {
    #[serde(deserialize_with = "durations")]
    pub retry_timetable: Vec<Duration>,
    #[serde(deserialize_with = "duration")]
    pub retry_then_every: Duration,
    #[serde(deserialize_with = "duration")]
    pub attempt_timeout: Duration,
    /// A peer heard from again (an authenticated request from it, or an
    /// answer to an attempt) makes its pending deliveries due now, at most
    /// this often per peer.
    #[serde(deserialize_with = "duration")]
    pub wake_min_interval: Duration,
    /// Pending deliveries' timers held in memory at most (the earliest);
    /// the rest wait in the store's due index and are read back in order.
    pub timers_in_memory: usize,
    /// Calls under way to one peer before further deliveries to it queue
    /// and go together in one `message.deliver.batch` when one ends; 0
    /// sends every delivery alone (see `peer_batch`).
    pub batches_in_flight: usize,
}

impl Default for Delivery {
    fn default() -> Self {
        Delivery {
            retry_timetable: [0, 30, 300, 1500, 3600].map(Duration::from_secs).to_vec(),
            retry_then_every: Duration::from_secs(3600),
            attempt_timeout: Duration::from_secs(10),
            wake_min_interval: Duration::from_secs(10),
            timers_in_memory: 262_144,
            batches_in_flight: 4,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Sessions {
    #[serde(deserialize_with = "duration")]
    pub ttl: Duration,
    #[serde(deserialize_with = "duration")]
    pub challenge_ttl: Duration,
    /// Sessions one device may hold; opening one more drops its oldest.
    pub max_per_device: usize,
    /// How often expired sessions are dropped from memory and the store.
    #[serde(deserialize_with = "duration")]
    pub sweep_interval: Duration,
    /// Sessions kept in memory at most; a lookup that misses reads the store.
    pub cache_entries: usize,
}

impl Default for Sessions {
    fn default() -> Self {
        Sessions {
            ttl: Duration::from_secs(24 * 3600),
            challenge_ttl: Duration::from_secs(300),
            max_per_device: 16,
            sweep_interval: Duration::from_secs(60),
            cache_entries: 65_536,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Actors {
    pub snapshot_every: u64,
    #[serde(deserialize_with = "duration")]
    pub passivate_after: Duration,
}

impl Default for Actors {
    fn default() -> Self {
        Actors { snapshot_every: 1000, passivate_after: Duration::from_secs(600) }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Websocket {
    /// How often the relay pings an open connection.
    #[serde(deserialize_with = "duration")]
    pub ping_interval: Duration,
    /// A connection that sends nothing (not even a pong) this long is closed.
    #[serde(deserialize_with = "duration")]
    pub idle_timeout: Duration,
    /// Notifications that may wait for one connection; past that it is
    /// closed as a slow consumer (its device reconnects and syncs).
    pub queue: usize,
    /// Largest accepted frame.
    pub max_frame_bytes: usize,
    /// A frame the socket does not take within this, or a flow ping not
    /// answered this long while `max_unread_bytes` are outstanding, closes
    /// the connection as a slow consumer.
    #[serde(deserialize_with = "duration")]
    pub write_timeout: Duration,
    /// Bytes written to one connection and not yet proven read (by a pong);
    /// past that it starts no request and takes no notification.
    pub max_unread_bytes: usize,
    /// Requests read from one connection and not yet answered; one more
    /// closes it.
    pub max_requests_in_flight: usize,
    /// A connection that attaches no session within this is closed.
    #[serde(deserialize_with = "duration")]
    pub attach_timeout: Duration,
}

impl Default for Websocket {
    fn default() -> Self {
        Websocket {
            ping_interval: Duration::from_secs(20),
            idle_timeout: Duration::from_secs(60),
            queue: 256,
            max_frame_bytes: 1 << 20,
            write_timeout: Duration::from_secs(10),
            max_unread_bytes: 8 << 20,
            max_requests_in_flight: 32,
            attach_timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Http {
    /// HTTP worker threads (0 = one per core).
    pub workers: usize,
    /// Open connections per worker; more wait in the listen backlog.
    /// `max_connections × workers` must fit the open-file limit.
    pub max_connections: usize,
    /// Open connections from one IP address; a request on one more is
    /// refused (`rate_limited`) and that connection closed.
    pub max_connections_per_ip: usize,
    /// Time a client has to send a whole `/v1/rpc` or `/v1/relay` body.
    #[serde(deserialize_with = "duration")]
    pub body_timeout: Duration,
    /// Time a client has to send a request's head (slow-loris guard).
    #[serde(deserialize_with = "duration")]
    pub request_timeout: Duration,
    /// Idle keep-alive connections are closed after this.
    #[serde(deserialize_with = "duration")]
    pub keep_alive: Duration,
    /// On SIGTERM/SIGINT, in-flight requests get this long to finish.
    #[serde(deserialize_with = "duration")]
    pub shutdown_timeout: Duration,
    /// Browser origins besides the relay's own (`relay.public_url`) that may
    /// call the client API (CORS); `"*"` allows any.
    pub cors_origins: Vec<String>,
    /// PEM certificate chain (leaf first) and private key: with both, the
    /// listener speaks only HTTPS; SIGHUP reads them again.
    pub tls_cert_file: Option<PathBuf>,
    pub tls_key_file: Option<PathBuf>,
    /// PEM certificates the relay-to-relay client trusts besides webpki's
    /// roots (a private CA of the peers).
    pub tls_extra_roots: Option<PathBuf>,
    /// Addresses or CIDR blocks of reverse proxies whose forwarding header
    /// names the client (`crate::http::client_addr`); their connections are
    /// not counted against `max_connections_per_ip`.
    pub trusted_proxies: Vec<String>,
    /// The header those proxies write: `"x-forwarded-for"` or `"forwarded"`.
    pub forwarded_header: crate::http::client_addr::ForwardedHeader,
}

impl Http {
    /// The parsed `trusted_proxies` (checked at load).
    pub fn trusted_proxies(&self) -> crate::http::client_addr::TrustedProxies {
        let cidrs = self.trusted_proxies.iter().filter_map(|c| c.parse().ok()).collect();
        crate::http::client_addr::TrustedProxies::new(cidrs, self.forwarded_header)
    }

    /// The certificate and key files, when TLS is on.
    pub fn tls(&self) -> Option<(&Path, &Path)> {
        Some((self.tls_cert_file.as_deref()?, self.tls_key_file.as_deref()?))
    }
}

impl Default for Http {
    fn default() -> Self {
        Http {
            workers: 0,
            max_connections: 8192,
            max_connections_per_ip: 256,
            body_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(5),
            keep_alive: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(10),
            cors_origins: Vec::new(),
            tls_cert_file: None,
            tls_key_file: None,
            tls_extra_roots: None,
            trusted_proxies: Vec::new(),
            forwarded_header: Default::default(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// `origin` is `config PATH`, or `environment variable RELAY__…` when
    /// the bad value came from one.
    #[error("{origin}: {source}")]
    Load { origin: String, source: config::ConfigError },
    #[error("{origin}: {what}")]
    Invalid { origin: String, what: String },
}

/// The `RELAY__…` variable that set config key `key` (`limits.max_boxes`),
/// if one is set. config-rs matches names case-insensitively.
fn env_var_for(key: &str) -> Option<String> {
    let want = format!("relay__{}", key.replace('.', "__")).to_ascii_lowercase();
    std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()).find(|k| k.to_ascii_lowercase() == want)
}

/// Where the value of `key` came from, for an error message.
fn origin(path: &str, key: Option<&str>) -> String {
    match key.and_then(env_var_for) {
        Some(var) => format!("environment variable {var}"),
        None => format!("config {path}"),
    }
}

/// The config key a config-rs error is about, if it says.
fn error_key(e: &config::ConfigError) -> Option<&str> {
    match e {
        config::ConfigError::Type { key, .. } | config::ConfigError::At { key, .. } => key.as_deref(),
        _ => None,
    }
}

/// A failed check: the key it is about (to tell file from environment) and what is wrong.
type Bad = (Option<&'static str>, String);

fn bad(key: &'static str, what: impl Into<String>) -> Bad {
    (Some(key), what.into())
}

/// The first line of the file at `path` (trimmed), refused when shorter
/// than `min` bytes, and when `private` and others may read the file (as
/// a key file is).
fn first_line(key: &'static str, path: &Path, short: &str, min: usize, private: bool) -> Result<Secret, Bad> {
    let shown = path.display();
    let text = match private {
        true => crate::keys::read_private(path).map_err(|e| bad(key, format!("{key} {e}")))?,
        false => std::fs::read_to_string(path).map_err(|e| bad(key, format!("{key} {shown}: {e}")))?,
    };
    let line = text.lines().next().unwrap_or_default().trim();
    if line.len() < min.max(1) {
        return Err(bad(key, format!("{key} {shown}: {short}")));
    }
    Ok(Secret(line.to_owned()))
}

impl Config {
    /// The request budgets of [`crate::limits::RateLimits`].
    pub fn rates(&self) -> crate::limits::Rates {
        let l = &self.limits;
        crate::limits::Rates {
            session: (l.session_rate, l.session_burst),
            peer: (l.peer_rate, l.peer_burst),
            peer_lookup: (l.peer_lookup_rate, l.peer_lookup_burst),
            peer_read: (l.peer_read_rate, l.peer_read_burst),
            peer_replicate: (l.peer_replicate_rate, l.peer_replicate_burst),
            anonymous: (l.anonymous_rate, l.anonymous_burst),
        }
    }

    /// Loads `path`, then applies `RELAY__SECTION__KEY` overrides, resolves
    /// relative paths (`Config::resolve_paths`), then checks.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let shown = path.display().to_string();
        let load =
            |source: config::ConfigError| ConfigError::Load { origin: origin(&shown, error_key(&source)), source };
        let mut cfg: Config = config::Config::builder()
            .add_source(config::File::from(path).format(config::FileFormat::Toml))
            .add_source(
                config::Environment::with_prefix("RELAY")
                    .prefix_separator("__")
                    .separator("__")
                    .try_parsing(true)
                    .list_separator(",")
                    .with_list_parse_key("delivery.retry_timetable")
                    .with_list_parse_key("http.trusted_proxies"),
            )
            .build()
            .map_err(load)?
            .try_deserialize()
            .map_err(load)?;
        cfg.resolve_paths(path.parent().unwrap_or(Path::new("")));
        cfg.check().map_err(|(key, what)| ConfigError::Invalid { origin: origin(&shown, key), what })?;
        if let Some(c) = cfg.cluster.as_mut() {
            c.read_secrets().map_err(|(key, what)| ConfigError::Invalid { origin: origin(&shown, key), what })?;
        }
        Ok(cfg)
    }

    /// A relative path written in the file is relative to the file's
    /// folder, so the relay finds the same data and key whatever directory
    /// it is started from (a service manager's is `/`). One set in the
    /// environment is relative to the working directory, like a path given
    /// on the command line.
    fn resolve_paths(&mut self, config_dir: &Path) {
        let in_file = |var: &str| std::env::var_os(var).is_none();
        if in_file("RELAY__RELAY__DATA_DIR") {
            self.relay.data_dir = config_dir.join(&self.relay.data_dir);
        }
        if in_file("RELAY__RELAY__KEY_FILE") {
            self.relay.key_file = config_dir.join(&self.relay.key_file);
        }
        let h = &mut self.http;
        if let Some(c) = self.cluster.as_mut() {
            for (path, var) in [
                (&mut c.nats_password_file, "RELAY__CLUSTER__NATS_PASSWORD_FILE"),
                (&mut c.nats_ca_file, "RELAY__CLUSTER__NATS_CA_FILE"),
                (&mut c.secret_file, "RELAY__CLUSTER__SECRET_FILE"),
            ] {
                if let Some(path) = path.as_mut().filter(|_| in_file(var)) {
                    *path = config_dir.join(&*path);
                }
            }
        }
        for (path, var) in [
            (&mut self.push.vapid_key_file, "RELAY__PUSH__VAPID_KEY_FILE"),
            (&mut h.tls_cert_file, "RELAY__HTTP__TLS_CERT_FILE"),
            (&mut h.tls_key_file, "RELAY__HTTP__TLS_KEY_FILE"),
            (&mut h.tls_extra_roots, "RELAY__HTTP__TLS_EXTRA_ROOTS"),
        ] {
            if let Some(path) = path.as_mut().filter(|_| in_file(var)) {
                *path = config_dir.join(&*path);
            }
        }
    }

    fn check(&self) -> Result<(), Bad> {
        relay_schemas::ids::check_relay_id("relay.id", &self.relay.id).map_err(|e| bad("relay.id", e.message))?;
        self.relay
            .listen
            .parse::<std::net::SocketAddr>()
            .map_err(|e| bad("relay.listen", format!("relay.listen {:?}: {e}", self.relay.listen)))?;
        if let Some(listen) = &self.metrics.listen {
            listen
                .parse::<std::net::SocketAddr>()
                .map_err(|e| bad("metrics.listen", format!("metrics.listen {listen:?}: {e}")))?;
        }
        match (self.store.engine, &self.cluster) {
            (StoreEngine::Jetstream, None) => {
                return Err(bad("store.engine", "store.engine = \"jetstream\" needs a [cluster] section"))
            }
            (StoreEngine::Sled, Some(_)) => {
                return Err(bad("cluster", "[cluster] needs store.engine = \"jetstream\""));
            }
            (StoreEngine::Jetstream, Some(c)) => {
                if c.nats_urls.is_empty() {
                    return Err(bad("cluster.nats_urls", "cluster.nats_urls must name at least one server"));
                }
                if c.lease_ttl < Duration::from_secs(1) {
                    return Err(bad("cluster.lease_ttl", "cluster.lease_ttl must be at least 1s"));
                }
                if !(1..=5).contains(&c.replicas) {
                    return Err(bad("cluster.replicas", "cluster.replicas must be 1 to 5"));
                }
                if !(1..=MAX_SHARDS).contains(&c.shards) {
                    return Err(bad("cluster.shards", format!("cluster.shards must be 1 to {MAX_SHARDS}")));
                }
                if c.shard_cache_bytes == 0 {
                    return Err(bad("cluster.shard_cache_bytes", "cluster.shard_cache_bytes must be positive"));
                }
                relay_schemas::ids::check_relay_id("cluster.node", &c.node)
                    .map_err(|e| bad("cluster.node", e.message))?;
                if let Some(at) = &c.metrics_listen {
                    at.parse::<std::net::SocketAddr>()
                        .map_err(|e| bad("cluster.metrics_listen", format!("cluster.metrics_listen {at:?}: {e}")))?;
                }
                let internal: std::net::SocketAddr = c.internal_listen.parse().map_err(|e| {
                    bad("cluster.internal_listen", format!("cluster.internal_listen {:?}: {e}", c.internal_listen))
                })?;
                if c.secret_file.is_none() && !internal.ip().is_loopback() {
                    return Err(bad(
                        "cluster.secret_file",
                        format!(
                            "cluster.internal_listen {internal} is reachable from other machines: set \
                             cluster.secret_file, so that only the cluster's nodes reach its owners"
                        ),
                    ));
                }
                if c.nats_user.is_some() != c.nats_password_file.is_some() {
                    return Err(bad(
                        "cluster.nats_user",
                        "cluster.nats_user and cluster.nats_password_file go together",
                    ));
                }
            }
            (StoreEngine::Sled, None) => {}
        }
        let mut seen = std::collections::HashSet::new();
        for p in &self.peers {
            relay_schemas::ids::check_relay_id("peers.id", &p.id).map_err(|e| (None, e.message))?;
            let at = format!("peer {:?}", p.id);
            if p.id == self.relay.id {
                return Err((None, format!("{at}: a relay cannot be its own peer")));
            }
            if !seen.insert(&p.id) {
                return Err((None, format!("{at} is listed twice in [[peers]]")));
            }
            relay_schemas::sign::parse_public_key("public_key", &p.public_key)
                .map_err(|e| (None, format!("{at}: {}", e.message)))?;
            check_peer_url(&p.url).map_err(|why| (None, format!("{at}: url {:?}: {why}", p.url)))?;
        }
        if self.delivery.retry_timetable.is_empty() {
            return Err(bad("delivery.retry_timetable", "delivery.retry_timetable must have at least one entry"));
        }
        if self.delivery.retry_timetable.windows(2).any(|w| w[0] > w[1]) {
            return Err(bad("delivery.retry_timetable", "delivery.retry_timetable must be in increasing order"));
        }
        if self.delivery.retry_then_every.is_zero() {
            return Err(bad("delivery.retry_then_every", "delivery.retry_then_every must be positive"));
        }
        if self.limits.max_boxes == 0 || self.limits.max_ciphertext_bytes == 0 {
            return Err((None, "limits.max_boxes and limits.max_ciphertext_bytes must be positive".into()));
        }
        let w = &self.websocket;
        if w.ping_interval.is_zero() || w.idle_timeout.is_zero() || w.queue == 0 {
            return Err((None, "websocket.ping_interval, idle_timeout and queue must be positive".into()));
        }
        if w.write_timeout.is_zero()
            || w.attach_timeout.is_zero()
            || w.max_unread_bytes == 0
            || w.max_requests_in_flight == 0
        {
            return Err((
                None,
                "websocket.write_timeout, attach_timeout, max_unread_bytes and max_requests_in_flight must be positive"
                    .into(),
            ));
        }
        let h = &self.http;
        if h.max_connections == 0 || h.max_connections_per_ip == 0 || h.body_timeout.is_zero() {
            return Err((
                None,
                "http.max_connections, max_connections_per_ip and body_timeout must be positive".into(),
            ));
        }
        self.check_tls()?;
        if self.cluster.is_some() && !h.trusted_proxies.is_empty() {
            return Err(bad("http.trusted_proxies", "http.trusted_proxies is not supported in cluster mode yet"));
        }
        for c in &h.trusted_proxies {
            c.parse::<crate::http::client_addr::Cidr>()
                .map_err(|e| bad("http.trusted_proxies", format!("http.trusted_proxies: {e}")))?;
        }
        if self.limits.retention_sweep.is_zero() {
            return Err((None, "limits.retention_sweep must be positive".into()));
        }
        if self.sessions.max_per_device == 0
            || self.sessions.sweep_interval.is_zero()
            || self.sessions.cache_entries == 0
        {
            return Err((
                None,
                "sessions.max_per_device, sessions.sweep_interval and sessions.cache_entries must be positive".into(),
            ));
        }
        let p = &self.push;
        if p.queue == 0 || p.concurrency == 0 || p.max_attempts == 0 || p.timeout.is_zero() || p.ttl.is_zero() {
            return Err((None, "push.queue, concurrency, max_attempts, timeout and ttl must be positive".into()));
        }
        if p.per_account == 0 || p.per_origin == 0 || p.connect_timeout.is_zero() {
            return Err((None, "push.per_account, per_origin and connect_timeout must be positive".into()));
        }
        if let Some(sub) = &p.subject {
            if !(sub.starts_with("mailto:") || sub.starts_with("https://")) {
                return Err(bad("push.subject", "push.subject must be a mailto: or https: URL (RFC 8292)"));
            }
        }
        if self.audit.checkpoint_interval.is_zero() {
            return Err(bad("audit.checkpoint_interval", "audit.checkpoint_interval must be positive"));
        }
        if self.audit.witness_interval.is_zero() {
            return Err(bad("audit.witness_interval", "audit.witness_interval must be positive"));
        }
        if self.store.cache_bytes == 0 {
            return Err(bad("store.cache_bytes", "store.cache_bytes must be positive"));
        }
        let l = &self.limits;
        let rates = [
            l.session_rate,
            l.session_burst,
            l.peer_rate,
            l.peer_burst,
            l.peer_lookup_rate,
            l.peer_lookup_burst,
            l.peer_read_rate,
            l.peer_read_burst,
            l.peer_replicate_rate,
            l.peer_replicate_burst,
            l.anonymous_rate,
            l.anonymous_burst,
        ];
        for (key, value) in [
            ("limits.max_object_bytes", l.max_object_bytes),
            ("limits.max_devices", l.max_devices),
            ("limits.max_revoked_contacts", l.max_revoked_contacts),
        ] {
            if value == 0 {
                return Err(bad(key, format!("{key} must be positive")));
            }
        }
        if rates.contains(&0)
            || l.max_in_flight_per_destination == 0
            || l.max_resident_accounts == 0
            || l.max_page_bytes == 0
        {
            return Err((
                None,
                "limits: rates, bursts, max_in_flight_per_destination, max_resident_accounts and max_page_bytes \
                 must be positive"
                    .into(),
            ));
        }
        Ok(())
    }

    /// TLS needs both files, loadable and matching; the extra roots must
    /// load too. A cluster node's clients reach it through its front, whose
    /// TLS a proxy terminates.
    fn check_tls(&self) -> Result<(), Bad> {
        let h = &self.http;
        match (&h.tls_cert_file, &h.tls_key_file) {
            (Some(cert), Some(key)) => {
                if self.cluster.is_some() {
                    return Err(bad(
                        "http.tls_cert_file",
                        "http.tls_cert_file: a cluster node does not terminate TLS; put a proxy in front \
                         (docs/deploy/tls-and-proxies.md)",
                    ));
                }
                crate::http::tls::load_certified_key(cert, key)
                    .map_err(|e| bad("http.tls_cert_file", format!("http.tls_cert_file/tls_key_file: {e}")))?;
            }
            (None, None) => {}
            _ => return Err(bad("http.tls_cert_file", "http.tls_cert_file and http.tls_key_file go together")),
        }
        if let Some(roots) = &h.tls_extra_roots {
            crate::http::tls::client_config(Some(roots))
                .map_err(|e| bad("http.tls_extra_roots", format!("http.tls_extra_roots: {e}")))?;
        }
        Ok(())
    }

    pub fn policy(&self) -> Policy {
        let ms = |d: Duration| d.as_millis() as u64;
        Policy {
            relay_id: self.relay.id.clone().into(),
            clock_tolerance: self.limits.clock_tolerance.as_secs(),
            delivery_age_limit: self.limits.delivery_age_limit.as_secs(),
            message_retention: self.limits.message_retention.as_secs(),
            max_ciphertext_bytes: self.limits.max_ciphertext_bytes,
            max_boxes: self.limits.max_boxes,
            max_object_bytes: self.limits.max_object_bytes,
            max_devices: self.limits.max_devices,
            max_revoked_contacts: self.limits.max_revoked_contacts,
            session_ttl: self.sessions.ttl.as_secs(),
            challenge_ttl: self.sessions.challenge_ttl.as_secs(),
            retry_timetable_ms: self.delivery.retry_timetable.iter().copied().map(ms).collect(),
            retry_then_every_ms: ms(self.delivery.retry_then_every),
            attempt_timeout_ms: ms(self.delivery.attempt_timeout),
            wake_min_interval_ms: ms(self.delivery.wake_min_interval),
            timers_in_memory: self.delivery.timers_in_memory.max(2),
            snapshot_every: self.actors.snapshot_every.max(1),
            passivate_after_ms: ms(self.actors.passivate_after),
            notify_queue: self.websocket.queue.max(1),
            max_in_flight_per_destination: self.limits.max_in_flight_per_destination,
            max_resident_accounts: self.limits.max_resident_accounts,
            max_page_bytes: self.limits.max_page_bytes,
            max_sessions_per_device: self.sessions.max_per_device,
            session_cache_entries: self.sessions.cache_entries,
            token_prefix: String::new(),
        }
    }
}

/// A peer URL must be an absolute `http://` or `https://` URL with a host:
/// the relay appends `/v1/relay/{method}` to it.
fn check_peer_url(url: &str) -> Result<(), String> {
    let uri: actix_web::http::Uri = url.parse().map_err(|e| format!("not a URL ({e})"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err("must start with http:// or https://".into());
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if uri.query().is_some() {
        return Err("must not have a query".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, body: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join("relay.toml");
        std::fs::write(&p, body).unwrap();
        p
    }

    const MINIMAL: &str = r#"
[relay]
id = "relay-a"
public_url = "http://127.0.0.1:7801"
listen = "127.0.0.1:7801"
data_dir = "data/relay-a"
key_file = "data/relay-a/relay.key"
"#;

    #[test]
    fn default_config_file_loads_with_protocol_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/default.toml");
        let cfg = Config::load(&path).unwrap();
        let p = cfg.policy();
        assert_eq!(p.clock_tolerance, 300);
        assert_eq!(p.delivery_age_limit, 5400);
        assert_eq!(p.message_retention, 30 * 24 * 3600);
        assert_eq!(p.retry_timetable_ms, vec![0, 30_000, 300_000, 1_500_000, 3_600_000]);
        assert_eq!(p.retry_then_every_ms, 3_600_000);
        assert_eq!(p.attempt_timeout_ms, 10_000);
        assert_eq!(cfg.store.cache_bytes, StoreSection::default().cache_bytes);
        assert_eq!(cfg.store.group_commit_window, StoreSection::default().group_commit_window);
        assert_eq!(cfg.audit.checkpoint_interval, Duration::from_secs(3600));
        assert_eq!(cfg.audit.witness_interval, Duration::from_secs(3600));
    }

    #[test]
    fn the_audit_intervals_are_read_and_must_be_positive() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!("{MINIMAL}\n[audit]\ncheckpoint_interval = \"10m\"\nwitness_interval = \"250ms\"\n");
        let a = Config::load(&write(dir.path(), &body)).unwrap().audit;
        assert_eq!((a.checkpoint_interval, a.witness_interval), (Duration::from_secs(600), Duration::from_millis(250)));
        for key in ["checkpoint_interval", "witness_interval"] {
            let body = format!("{MINIMAL}\n[audit]\n{key} = \"0s\"\n");
            let err = Config::load(&write(dir.path(), &body)).unwrap_err().to_string();
            assert!(err.contains(&format!("audit.{key} must be positive")), "{err}");
        }
    }

    #[test]
    fn the_size_bounds_have_protocol_defaults_and_must_be_positive() {
        let dir = tempfile::tempdir().unwrap();
        let p = Config::load(&write(dir.path(), MINIMAL)).unwrap().policy();
        assert_eq!((p.max_object_bytes, p.max_devices, p.max_revoked_contacts), (16384, 32, 1024));
        let set = format!("{MINIMAL}\n[limits]\nmax_object_bytes = 4096\nmax_devices = 3\nmax_revoked_contacts = 9\n");
        let p = Config::load(&write(dir.path(), &set)).unwrap().policy();
        assert_eq!((p.max_object_bytes, p.max_devices, p.max_revoked_contacts), (4096, 3, 9));
        for key in ["max_object_bytes", "max_devices", "max_revoked_contacts"] {
            let body = format!("{MINIMAL}\n[limits]\n{key} = 0\n");
            let err = Config::load(&write(dir.path(), &body)).unwrap_err().to_string();
            assert!(err.contains(&format!("limits.{key} must be positive")), "{err}");
        }
    }

    #[test]
    fn durations_accept_ms_s_m_h_d() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!(
            "{MINIMAL}\n[limits]\nmessage_retention = \"30d\"\nclock_tolerance = \"250ms\"\n[delivery]\nretry_timetable = [\"0s\", \"5m\", \"1h\"]\n"
        );
        let p = Config::load(&write(dir.path(), &body)).unwrap().policy();
        assert_eq!(p.message_retention, 30 * 86400);
        assert_eq!(p.clock_tolerance, 0);
        assert_eq!(p.retry_timetable_ms, vec![0, 300_000, 3_600_000]);
    }

    // Environment overrides are process-global; one test covers them all so
    // parallel tests never see each other's variables.
    #[test]
    fn environment_overrides_section_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = write(dir.path(), MINIMAL);
        std::env::set_var("RELAY__LIMITS__MAX_BOXES", "7");
        std::env::set_var("RELAY__DELIVERY__RETRY_TIMETABLE", "0s,10ms,20ms");
        std::env::set_var("RELAY__RELAY__ID", "relay-z");
        let cfg = Config::load(&path);
        std::env::remove_var("RELAY__LIMITS__MAX_BOXES");
        std::env::remove_var("RELAY__DELIVERY__RETRY_TIMETABLE");
        std::env::remove_var("RELAY__RELAY__ID");
        let p = cfg.unwrap().policy();
        assert_eq!(p.max_boxes, 7);
        assert_eq!(p.retry_timetable_ms, vec![0, 10, 20]);
        assert_eq!(p.relay_id, "relay-z");

        // A bad value from the environment names the variable, not the file.
        for (var, value) in [
            ("RELAY__LIMITS__MAX_BOXES", "many"),
            ("RELAY__LIMITS__CLOCK_TOLERANCE", "soon"),
            ("RELAY__RELAY__LISTEN", "nowhere"),
        ] {
            std::env::set_var(var, value);
            let err = Config::load(&path).unwrap_err().to_string();
            std::env::remove_var(var);
            assert!(err.starts_with(&format!("environment variable {var}: ")), "{err}");
            assert!(!err.contains("relay.toml"), "{err}");
        }
    }

    #[test]
    fn trusted_proxies_are_cidr_blocks_also_listed_in_the_environment_and_not_for_a_cluster() {
        use crate::http::client_addr::ForwardedHeader;
        let dir = tempfile::tempdir().unwrap();
        let with = |http: &str| write(dir.path(), &format!("{MINIMAL}\n[http]\n{http}"));
        let cfg =
            Config::load(&with("trusted_proxies = [\"10.0.0.0/8\", \"::1\"]\nforwarded_header = \"forwarded\"\n"));
        let h = cfg.unwrap().http;
        assert_eq!(h.forwarded_header, ForwardedHeader::Forwarded);
        let proxies = h.trusted_proxies();
        assert!(proxies.trusts("10.9.0.1".parse().unwrap()) && proxies.trusts("::1".parse().unwrap()));
        assert!(!proxies.trusts("11.0.0.1".parse().unwrap()));
        for (http, needle) in [
            ("trusted_proxies = [\"10.0.0.0/40\"]\n", "http.trusted_proxies"),
            ("forwarded_header = \"x-real-ip\"\n", "x-real-ip"),
        ] {
            let err = Config::load(&with(http)).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
        let cluster = format!(
            "{MINIMAL}\n[store]\nengine = \"jetstream\"\n[cluster]\nnode = \"n1\"\n\
             nats_urls = [\"nats://127.0.0.1:4222\"]\n[http]\ntrusted_proxies = [\"10.0.0.0/8\"]\n"
        );
        let err = Config::load(&write(dir.path(), &cluster)).unwrap_err().to_string();
        assert!(err.contains("cluster mode"), "{err}");

        let path = write(dir.path(), MINIMAL);
        std::env::set_var("RELAY__HTTP__TRUSTED_PROXIES", "127.0.0.1,192.168.0.0/16");
        let cfg = Config::load(&path);
        std::env::remove_var("RELAY__HTTP__TRUSTED_PROXIES");
        assert_eq!(cfg.unwrap().http.trusted_proxies, ["127.0.0.1", "192.168.0.0/16"]);
    }

    #[test]
    fn relative_paths_in_the_file_are_relative_to_its_folder() {
        let dir = tempfile::tempdir().unwrap();
        let body = format!("{MINIMAL}\n[push]\nvapid_key_file = \"../keys/vapid.key\"\n");
        let cfg = Config::load(&write(&dir.path().join("etc"), &body)).unwrap();
        assert_eq!(cfg.relay.data_dir, dir.path().join("etc/data/relay-a"));
        assert_eq!(cfg.relay.key_file, dir.path().join("etc/data/relay-a/relay.key"));
        assert_eq!(cfg.vapid_key_file(), dir.path().join("etc/../keys/vapid.key"));
        // Absolute paths stay as written; the default VAPID key follows the data dir.
        let body = MINIMAL.replace("\"data/relay-a\"", "\"/var/lib/relay\"");
        let cfg = Config::load(&write(dir.path(), &body)).unwrap();
        assert_eq!(cfg.relay.data_dir, Path::new("/var/lib/relay"));
        assert_eq!(cfg.vapid_key_file(), Path::new("/var/lib/relay/vapid.key"));
        // A file named without a folder: the working directory is its folder.
        // (A path from the environment: tests/it/cli.rs, in a process of its own.)
        let mut bare = cfg.clone();
        bare.relay.data_dir = "data".into();
        bare.resolve_paths(Path::new("relay.toml").parent().unwrap());
        assert_eq!(bare.relay.data_dir, Path::new("data"));
        // The TLS files too (they are read at load, so set here).
        let mut tls = cfg.clone();
        tls.http.tls_cert_file = Some("tls/cert.pem".into());
        tls.http.tls_key_file = Some("tls/key.pem".into());
        tls.http.tls_extra_roots = Some("/etc/ssl/roots.pem".into());
        tls.resolve_paths(Path::new("/etc/relay"));
        assert_eq!(tls.http.tls_cert_file.as_deref(), Some(Path::new("/etc/relay/tls/cert.pem")));
        assert_eq!(tls.http.tls_key_file.as_deref(), Some(Path::new("/etc/relay/tls/key.pem")));
        assert_eq!(tls.http.tls_extra_roots.as_deref(), Some(Path::new("/etc/ssl/roots.pem")));
    }

    #[test]
    fn bad_config_gets_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            (MINIMAL.replace("relay-a\"\npublic", "Relay A\"\npublic"), "relay.id"),
            (format!("{MINIMAL}\n[limits]\nclock_tolerance = \"soon\"\n"), "soon"),
            (format!("{MINIMAL}\n[limits]\nmax_boxs = 3\n"), "max_boxs"),
            (MINIMAL.replace("127.0.0.1:7801\"\ndata", "nowhere\"\ndata"), "relay.listen"),
            ("[relay\n".to_string(), "relay.toml"),
            (format!("{MINIMAL}\n[metrics]\nlisten = \"here\"\n"), "metrics.listen"),
        ];
        for (body, needle) in cases {
            let err = Config::load(&write(dir.path(), &body)).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    #[test]
    fn a_bad_cluster_section_names_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = |extra: &str| {
            format!(
                "{MINIMAL}\n[store]\nengine = \"jetstream\"\n[cluster]\nnode = \"n1\"\n\
                 nats_urls = [\"nats://127.0.0.1:4222\"]\n{extra}"
            )
        };
        let good = Config::load(&write(dir.path(), &cluster("shards = 4\n"))).unwrap();
        assert_eq!(good.cluster.map(|c| c.shards), Some(4));
        for (extra, needle) in [
            ("shards = 0\n", "cluster.shards"),
            ("shards = 65\n", "cluster.shards"),
            ("replicas = 6\n", "cluster.replicas"),
            ("lease_ttl = \"500ms\"\n", "cluster.lease_ttl"),
            ("nats_user = \"relay\"\n", "cluster.nats_user"),
            ("nats_password_file = \"missing\"\nnats_user = \"relay\"\n", "cluster.nats_password_file"),
        ] {
            let err = Config::load(&write(dir.path(), &cluster(extra))).unwrap_err().to_string();
            assert!(err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }

    #[test]
    fn the_nats_password_is_read_from_its_file_next_to_the_config_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nats.password"), "s3cret-pw\n").unwrap();
        let body = format!(
            "{MINIMAL}\n[store]\nengine = \"jetstream\"\n[cluster]\nnode = \"n1\"\n\
             nats_urls = [\"nats://127.0.0.1:4222\"]\nnats_user = \"relay\"\nnats_password_file = \"nats.password\"\n"
        );
        let cfg = Config::load(&write(dir.path(), &body)).unwrap();
        let auth = cfg.cluster.unwrap().nats_auth();
        assert_eq!(auth.user, Some(("relay".to_owned(), "s3cret-pw".to_owned())));
        assert!(!format!("{auth:?}").contains("s3cret"), "{auth:?}");
    }

    #[test]
    fn an_internal_address_other_machines_reach_needs_the_cluster_secret_which_is_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = |extra: &str| {
            format!(
                "{MINIMAL}\n[store]\nengine = \"jetstream\"\n[cluster]\nnode = \"n1\"\n\
                 nats_urls = [\"nats://127.0.0.1:4222\"]\n{extra}"
            )
        };
        let secret = dir.path().join("cluster.secret");
        let write_secret = |text: &str, mode: u32| {
            std::fs::write(&secret, text).unwrap();
            std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
        };
        // Loopback only (one machine): the hop may be plain.
        Config::load(&write(dir.path(), &cluster("internal_listen = \"127.0.0.1:7900\"\n"))).unwrap();
        let reachable = "internal_listen = \"0.0.0.0:7900\"\n";
        let err = Config::load(&write(dir.path(), &cluster(reachable))).unwrap_err().to_string();
        assert!(err.contains("cluster.secret_file"), "{err}");
        let with_secret = cluster(&format!("{reachable}secret_file = \"cluster.secret\"\n"));
        write_secret("0123456789abcdef0123456789abcdef-cluster\n", 0o600);
        let cfg = Config::load(&write(dir.path(), &with_secret)).unwrap();
        assert!(!format!("{cfg:?}").contains("0123456789abcdef"), "the secret is printed");
        assert_eq!(cfg.cluster.unwrap().secret.unwrap().0, "0123456789abcdef0123456789abcdef-cluster");
        write_secret("too short\n", 0o600);
        let err = Config::load(&write(dir.path(), &with_secret)).unwrap_err().to_string();
        assert!(err.contains("shorter than 32"), "{err}");
        write_secret("0123456789abcdef0123456789abcdef-cluster\n", 0o644);
        let err = Config::load(&write(dir.path(), &with_secret)).unwrap_err().to_string();
        assert!(err.contains("readable by others"), "{err}");
    }

    fn peer(id: &str, url: &str, key: &str) -> String {
        format!("\n[[peers]]\nid = \"{id}\"\nurl = \"{url}\"\npublic_key = \"{key}\"\n")
    }

    const KEY: &str = "_XqsWUNkxUk0Q-1UclRxmiDk_gSE-6Kg1R3iQK_NGdE";

    #[test]
    fn a_bad_peer_entry_names_the_peer_and_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let good = peer("relay-b", "http://127.0.0.1:7802", KEY);
        assert!(Config::load(&write(dir.path(), &format!("{MINIMAL}{good}"))).is_ok());
        let cases = [
            (peer("relay-c", "http://127.0.0.1:7803", "not-a-key"), "peer \"relay-c\": public_key"),
            (peer("relay-c", "not a url", KEY), "peer \"relay-c\": url \"not a url\": not a URL"),
            (peer("relay-c", "127.0.0.1:7803", KEY), "must start with http://"),
            (peer("relay-c", "ftp://127.0.0.1:7803", KEY), "must start with http://"),
            (peer("relay-b", "http://127.0.0.1:7803", KEY), "peer \"relay-b\" is listed twice"),
            (peer("relay-a", "http://127.0.0.1:7803", KEY), "cannot be its own peer"),
        ];
        for (entry, needle) in cases {
            let err = Config::load(&write(dir.path(), &format!("{MINIMAL}{good}{entry}"))).unwrap_err().to_string();
            assert!(err.starts_with("config ") && err.contains(needle), "{err:?} should mention {needle:?}");
        }
    }
}
