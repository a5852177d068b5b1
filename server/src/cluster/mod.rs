//! Cluster mode: one relay on several machines (docs/cluster.md).
//! Accounts are hashed into `cluster.shards` shards (`relay_core::shard`);
//! every node runs this, serves the shards whose leases it holds, each
//! with a relay core of its own, and stands by for the others.
//!
//! 1. **Store**: each shard's event store is a NATS JetStream stream
//!    (`store::jetstream`: file storage, `sync_interval: always`, R3), so
//!    an acknowledged commit survives the loss of any one machine; reads
//!    come from the node's local copy of the shard
//!    (`<data_dir>/shards/<stream>`), which follows the stream.
//! 2. **Lease**: per shard, a key of a JetStream KV bucket of its own
//!    (so one nats-server lost stops at most the shards whose buckets it
//!    led), whose entries expire after `cluster.lease_ttl`; its value is
//!    the owner's name, the address it serves the shard on
//!    (`cluster.internal_listen`, + k, listening only while it serves it)
//!    and a nonce per try. The rules are in `relay_core::lease`, the task
//!    that follows them in `lease.rs`; the creation revision, counted
//!    above the cluster's base ([`epoch_base`]), is the owner's epoch,
//!    written as a fence into the stream before it serves.
//! 3. **Balance** (`Balance`): nodes write presence keys in a bucket of
//!    their own (`RELAY_<id>_LEASES`, where an earlier release kept every
//!    lease); the least loaded take free shards first, and a node with two
//!    shards more than the least loaded hands one over (a graceful stop,
//!    then the key deleted).
//! 4. **Front**: every node accepts connections on `relay.listen`, and
//!    `router.rs` routes each request to its account's shard (with one
//!    shard, every request to it): to the shard's core in process when
//!    this node serves it, else to the owner over HTTP. It waits up to
//!    [`FRONT_WAIT`](place::FRONT_WAIT) for an owner, and applies the
//!    per-address connection cap (`http.max_connections_per_ip`), since
//!    owners see every connection come from a front. With
//!    `cluster.secret_file` a front reaches an owner, and a shard its
//!    siblings, over TLS with the cluster's key (`hop.rs`): an internal
//!    address serves no one else.
//! 5. **Siblings**: a shard's core reaches the others ([`ShardPlace`]) as
//!    peers under the relay's own id: a send to an account of another
//!    shard is a `message.deliver` to that shard's owner.
//! 6. **Takeover**: when an owner stops renewing (killed, cut off), its key
//!    expires, another node creates it, fences the stream, catches its copy
//!    up (or bootstraps it: `store::jetstream`; a standby holding a copy
//!    has kept it following the stream, `store::Follower`) and serves;
//!    deliveries resume from their stored due times. An owner whose
//!    renewal is refused, who cannot renew for two thirds of the ttl, or
//!    whose store failed, stops serving that shard at once and
//!    stands by for it again; its other shards serve on. Its core answers
//!    a request only while its own clock says the lease holds
//!    (`lease::Serving`), so an owner paused past its lease answers nothing
//!    stale on waking.
//!
//! The relay's id, key and VAPID key are the cluster's: every node is
//! configured with the same `relay.id`, `relay.key_file` and
//! `push.vapid_key_file` (files every node reads: the same contents on
//! each machine), so peers and clients see one relay, and push
//! subscriptions outlive a takeover.
//!
//! Why HTTP between a front and an owner, and not NATS request/reply: a
//! WebSocket session passes through as it is, and the owner answers with
//! the same handlers and limits as a standalone relay. One shard is routed
//! like several (it used to be a byte pipe to the owner): the front of the
//! owner's own node then answers method calls in process, with no hop.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{kv, Context as JetStream};
use relay_actors::store::{Engine, Follower, JetStreamConfig, JetStreamEngine, SledEngine, Store, StoreError};
use tokio::sync::watch;

use crate::config::{ClusterSection, Config};
use metrics::NodeMetrics;
use place::{Owners, ShardPlace, OWNER_POLL};

pub mod hop;
pub(crate) mod lease;
pub mod local;
mod metrics;
pub mod place;
mod router;
pub mod up;

/// Between two tries to open the store after taking the lease.
const OPEN_RETRY: Duration = Duration::from_millis(500);

/// How long a node that holds a shard's lease goes on failing to open its
/// store before it gives the lease up (issue 40: a node whose copy stayed
/// locked renewed the lease for minutes and the shard was never served).
/// Longer than JetStream's leader elections, which fail opens for seconds.
const OPEN_PATIENCE: Duration = Duration::from_secs(30);

/// Opens with `open` until it succeeds; gives up (the reason) when fenced
/// by a newer owner, when `lost` says the lease is gone, or when opens
/// have kept failing for `patience` since the first failure.
async fn open_or_give_up<T, F, Fut>(
    k: u32,
    patience: Duration,
    lost: &mut tokio::sync::oneshot::Receiver<String>,
    mut open: F,
) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut failing_since = None;
    loop {
        match open().await {
            Ok(opened) => return Ok(opened),
            // Fenced by a newer owner: the lease is someone else's.
            Err(e @ StoreError::Flush(_)) => return Err(format!("open the JetStream store of shard {k}: {e}")),
            Err(e) => {
                let since = *failing_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= patience {
                    return Err(format!("could not open the JetStream store of shard {k} for {patience:?}: {e}"));
                }
                tracing::warn!(shard = k, error = %e, "could not open the JetStream store yet; trying again");
            }
        }
        if !matches!(lost.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)) {
            return Err(format!("lost the lease of shard {k} while opening its store"));
        }
        tokio::time::sleep(OPEN_RETRY).await;
    }
}

/// The lease key of shard `k`.
fn lease_key(k: u32) -> String {
    format!("shard-{k}")
}

/// Shard `k`'s lease bucket: one per shard, each stream with a leader of
/// its own (placed by nats-server), so that losing one nats-server stops
/// at most the shards whose buckets it led.
fn lease_bucket(c: &ClusterSection, relay_id: &str, k: u32) -> String {
    format!("RELAY_{}_LEASE_S{k}", c.name(relay_id))
}

/// The key of the cluster's settings holding the epoch base.
const EPOCH_BASE: &str = "epoch-base";

/// What epochs are counted above (`relay_core::lease::epoch`), written
/// once in the cluster's settings by its first node of this release: the
/// last revision of the presence bucket, where an earlier release kept
/// every shard's lease (its fences carry those revisions), or 0 on a new
/// cluster. The two releases do not see each other's leases, so this
/// waits for that bucket's shard leases to expire (every node of the
/// earlier release stopped: a cluster is upgraded stopped, not rolling)
/// and refuses to start while one is still renewed.
async fn epoch_base(js: &JetStream, c: &ClusterSection, relay_id: &str) -> Result<u64, String> {
    let shared = presence_bucket(c, relay_id);
    let deadline = Instant::now() + c.lease_ttl * 2;
    let reached = loop {
        let (held, reached) =
            lease::patiently("the earlier release's leases", || shared_leases(js, &shared, c.shards)).await?;
        if held.is_empty() {
            break reached;
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "cluster: {} of bucket {shared} still renewed: a node of the earlier release (one bucket for every \
                 shard's lease) serves; stop all of its nodes before starting this release",
                held.join(", ")
            ));
        }
        tracing::warn!(leases = %held.join(", "), bucket = %shared, "an earlier release's leases are live; waiting for them to expire");
        actix_web::rt::time::sleep(c.lease_ttl / 3).await;
    };
    let settings = lease::bucket(js, c, &settings_bucket(c, relay_id), Duration::ZERO).await?;
    let ours = reached.to_string();
    lease::patiently("cluster settings", || async {
        match settings.create(EPOCH_BASE, ours.clone().into()).await {
            Ok(_) => Ok(reached),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let theirs = settings.get(EPOCH_BASE).await.map_err(|e| e.to_string())?;
                theirs
                    .and_then(|v| std::str::from_utf8(&v).ok()?.parse().ok())
                    .ok_or_else(|| "no epoch base".to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

/// The shard leases live in bucket `shared` (an earlier release's), and
/// the last revision it reached (none: no such bucket).
async fn shared_leases(js: &JetStream, shared: &str, shards: u32) -> Result<(Vec<String>, u64), String> {
    let stream = match js.get_stream(format!("KV_{shared}")).await {
        Ok(stream) => stream,
        Err(e)
            if matches!(e.kind(), async_nats::jetstream::context::GetStreamErrorKind::JetStream(ref e)
                if e.error_code() == async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            return Ok((Vec::new(), 0))
        }
        Err(e) => return Err(e.to_string()),
    };
    let reached = stream.cached_info().state.last_sequence;
    let bucket = js.get_key_value(shared).await.map_err(|e| e.to_string())?;
    let mut held = Vec::new();
    for k in 0..shards {
        let entry = bucket.entry(lease_key(k)).await.map_err(|e| e.to_string())?;
        if entry.is_some_and(|e| e.operation == kv::Operation::Put) {
            held.push(lease_key(k));
        }
    }
    Ok((held, reached))
}

/// Shard `k`'s stream for this cluster (`None` outside cluster mode).
pub fn shard(cfg: &Config, k: u32) -> Option<JetStreamConfig> {
    let c = cfg.cluster.as_ref()?;
    let shard = JetStreamConfig::shard(c.nats_urls.clone(), &c.name(&cfg.relay.id), k, c.replicas);
    Some(JetStreamConfig {
        snapshot_bytes: c.snapshot_bytes,
        auth: c.nats_auth(),
        copy_dir: Some(cfg.relay.data_dir.join("shards").join(&shard.stream)),
        cache_bytes: c.shard_cache_bytes,
        node: c.node.clone(),
        ..shard
    })
}

/// Every shard's stream, in shard order (empty outside cluster mode).
pub fn shards(cfg: &Config) -> Vec<JetStreamConfig> {
    let n = cfg.cluster.as_ref().map_or(0, |c| c.shards);
    (0..n).filter_map(|k| shard(cfg, k)).collect()
}

/// The nodes' presence keys (an earlier release kept every lease here too).
fn presence_bucket(c: &ClusterSection, relay_id: &str) -> String {
    format!("RELAY_{}_LEASES", c.name(relay_id))
}

fn settings_bucket(c: &ClusterSection, relay_id: &str) -> String {
    format!("RELAY_{}_CLUSTER", c.name(relay_id))
}

/// Removes the copies under `dir` (`<data_dir>/shards`) of streams not in
/// `ours`: another cluster's (a `cluster.name` or `relay.id` changed), so
/// never opened or followed again. Safe: a copy holds nothing its stream
/// does not (the stream makes commits durable; a copy is only where they
/// are read), and one is removed only if it opens here, so no process
/// holds it. Copies of this cluster's shards are kept, whoever owns them:
/// they follow their streams while this node stands by (`store::Follower`).
fn remove_stale_copies(dir: &std::path::Path, ours: &[String]) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let (name, path) = (entry.file_name().to_string_lossy().into_owned(), entry.path());
        if ours.contains(&name) || !path.is_dir() {
            continue;
        }
        let removed = SledEngine::open(&path, Some(1 << 20)).and_then(|copy| copy.close()).map_err(|e| e.to_string());
        match removed.and_then(|()| std::fs::remove_dir_all(&path).map_err(|e| e.to_string())) {
            Ok(()) => tracing::info!(copy = %name, "removed the copy of a stream this cluster does not have"),
            Err(e) => tracing::warn!(copy = %name, error = %e, "kept the copy of a stream this cluster does not have"),
        }
    }
}

/// The shard count is the cluster's for its whole life: the first node
/// to start writes it (bucket `RELAY_<id>_CLUSTER`, no expiry), and a node
/// configured with another count refuses to start, since it would look
/// for accounts in streams that do not hold them.
async fn check_shard_count(js: &JetStream, c: &ClusterSection, relay_id: &str) -> Result<(), String> {
    let settings = lease::bucket(js, c, &settings_bucket(c, relay_id), Duration::ZERO).await?;
    let ours = c.shards.to_string();
    let theirs = lease::patiently("cluster settings", || async {
        match settings.create("shards", ours.clone().into()).await {
            Ok(_) => Ok(None),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let theirs = settings.get("shards").await.map_err(|e| e.to_string())?;
                Ok(Some(theirs.ok_or("the shard count is missing")))
            }
            Err(e) => Err(e.to_string()),
        }
    })
    .await?;
    match theirs {
        None => Ok(()),
        Some(Ok(theirs)) if theirs == ours.as_bytes() => Ok(()),
        Some(Ok(theirs)) => Err(format!(
            "cluster.shards = {ours}, but this cluster was created with {} shards: the count cannot change",
            String::from_utf8_lossy(&theirs)
        )),
        Some(Err(missing)) => Err(format!("cluster settings: {missing}")),
    }
}

/// Runs a cluster node until SIGINT/SIGTERM. A shard whose lease is lost
/// or whose store fails is given up and stood by for again; the node exits
/// only on errors no shard can serve through (its listeners, its config).
pub async fn serve(cfg: Config) -> Result<(), String> {
    let c = cfg.cluster.clone().ok_or("cluster mode needs a [cluster] section")?;
    crate::server::private_files();
    crate::server::prepare_data_dir(&cfg.relay.data_dir)?;
    let ours: Vec<String> = shards(&cfg).into_iter().map(|s| s.stream).collect();
    remove_stale_copies(&cfg.relay.data_dir.join("shards"), &ours);
    // One connection for the node's own reads (each lease has its own).
    let js = lease::connect(&c).await?;
    check_shard_count(&js, &c, &cfg.relay.id).await?;
    let epoch_base = epoch_base(&js, &c, &cfg.relay.id).await?;
    let present = lease::lease_bucket(&js, &c, &presence_bucket(&c, &cfg.relay.id)).await?;
    // Every bucket before any shard is taken: a fresh cluster's first
    // start waits here for their leaders.
    let mut leases = Vec::with_capacity(c.shards as usize);
    for k in 0..c.shards {
        leases.push(lease::lease_bucket(&js, &c, &lease_bucket(&c, &cfg.relay.id, k)).await?);
    }
    // Created (if missing) once, before the shards' cores read them.
    crate::keys::load_or_generate(&cfg.relay.key_file)?;
    crate::push::Vapid::load_or_generate(&cfg.vapid_key_file(), cfg.vapid_subject())?;

    let front_listener =
        std::net::TcpListener::bind(&cfg.relay.listen).map_err(|e| format!("listen {}: {e}", cfg.relay.listen))?;
    let front_addr = front_listener.local_addr().map_err(|e| e.to_string())?;
    let metrics = NodeMetrics::new(&c.node, c.shards);
    if let Some(at) = &c.metrics_listen {
        metrics.serve(at)?;
    }
    // The hop's client side; each shard's core makes its server side.
    let hop = match &c.secret {
        Some(secret) => Some(hop::Hop::from_secret(secret.0.as_bytes())?.client),
        None => None,
    };
    let (owners_tx, owners) = watch::channel(Arc::new(vec![None; c.shards as usize]));
    // The cores this node serves, which its front calls in process.
    let local = local::LocalCores::new(c.shards);
    let balance = Arc::new(Balance { live: AtomicUsize::new(1), ..Default::default() });
    let presence = Presence { node: c.node.clone(), every: c.lease_ttl / 3, balance: balance.clone() };
    actix_web::rt::spawn(watch_owners(leases, present, owners_tx, presence));
    let to = router::Owned { owners: owners.clone(), local: local.clone(), hop: hop.clone() };
    actix_web::rt::spawn(router::start(front_listener, to, c.shards, &cfg, metrics.clone())?);
    tracing::info!(relay = %cfg.relay.id, node = %c.node, listen = %front_addr, shards = c.shards,
        "cluster node started; standing by");
    crate::server::announce_listening(&cfg.relay.id, "http", front_addr);

    // Nodes started together count each other before taking shards.
    if c.shards > 1 {
        actix_web::rt::time::sleep(c.lease_ttl / 2).await;
    }
    // Each shard: stand by for its lease, then serve it until it is lost.
    let (for_claims, shards, ttl) = (balance.clone(), c.shards, c.lease_ttl);
    let claims = Arc::new(lease::Claims::new(move |held| for_claims.patience(held, shards, ttl)));
    let (stopping_tx, stopping) = watch::channel(false);
    let mut tasks = futures_util::stream::FuturesUnordered::new();
    for k in 0..c.shards {
        let shard = Shard {
            cfg: cfg.clone(),
            k,
            bucket: lease_bucket(&c, &cfg.relay.id, k),
            epoch_base,
            balance: balance.clone(),
            claims: claims.clone(),
            owners: owners.clone(),
            hop: hop.clone(),
            local: local.clone(),
            metrics: metrics.clone(),
        };
        tasks.push(actix_web::rt::spawn(shard.run(stopping.clone())));
    }
    use futures_util::StreamExt;
    let mut signal = std::pin::pin!(stop_signal());
    loop {
        tokio::select! {
            signal = &mut signal, if !*stopping_tx.borrow() => {
                // Serving shards stop gracefully, standing-by ones at once.
                tracing::info!(signal, node = %c.node, "stopping");
                let _ = stopping_tx.send(true);
            }
            done = tasks.next() => match done {
                None => return Ok(()),
                Some(Ok(Ok(()))) => {}
                Some(Ok(Err(why))) => return Err(why),
                Some(Err(e)) => return Err(format!("a shard task ended: {e}")),
            },
        }
    }
}

/// What a node knows of the balance of shards over the nodes.
#[derive(Default)]
struct Balance {
    /// Nodes alive (their presence keys).
    live: AtomicUsize,
    /// This node serves at least two shards more than the least loaded
    /// live node: it should hand one over.
    surplus: AtomicBool,
    /// One of this node's shards is being handed over (one at a time, so
    /// that the counts catch up before the next).
    handing: AtomicBool,
}

impl Balance {
    /// How long this node, serving `held` shards, waits before taking a
    /// free one (`relay_core::shard::patience_ms`).
    fn patience(&self, held: usize, shards: u32, ttl: Duration) -> Duration {
        let live = self.live.load(Relaxed);
        Duration::from_millis(relay_core::shard::patience_ms(held, live, shards, ttl.as_millis() as u64))
    }
}

/// How a shard's service ended.
enum Served {
    /// Handed over to a less loaded node: stand by for it again.
    HandedOver,
    /// SIGTERM/SIGINT: the node stops.
    Stopped,
    /// Given up (the lease lost, the store failed or fenced by a newer
    /// owner): the core stopped at once; stand by for it again.
    Lost(String),
}

/// One shard on this node: its lease, then its relay core, again after
/// each hand-over.
struct Shard {
    cfg: Config,
    k: u32,
    /// The shard's lease bucket.
    bucket: String,
    /// Epochs are counted above this ([`epoch_base`]).
    epoch_base: u64,
    balance: Arc<Balance>,
    claims: Arc<lease::Claims>,
    owners: Owners,
    /// The hop's client side, for calls to sibling shards.
    hop: Option<Arc<rustls::ClientConfig>>,
    /// Where this node's front finds the cores it serves.
    local: local::LocalCores,
    metrics: NodeMetrics,
}

impl Shard {
    async fn run(self, mut stopping: watch::Receiver<bool>) -> Result<(), String> {
        loop {
            let Some(lease) = self.stand_by(&mut stopping).await? else { return Ok(()) };
            match self.serve(lease, stopping.clone()).await? {
                Served::Stopped => return Ok(()),
                Served::HandedOver => {
                    // Let the lease and the counts settle before another.
                    actix_web::rt::time::sleep(self.cluster()?.lease_ttl * 2).await;
                    self.balance.handing.store(false, Relaxed);
                }
                // This shard only: the node's other shards serve on, and
                // this one is stood by for again (taken back once free).
                Served::Lost(why) => {
                    let node = &self.cluster()?.node;
                    tracing::warn!(node = %node, shard = self.k, reason = %why, "gave the shard up; standing by for it");
                }
            }
        }
    }

    fn cluster(&self) -> Result<&ClusterSection, String> {
        self.cfg.cluster.as_ref().ok_or_else(|| "cluster mode needs a [cluster] section".to_string())
    }

    /// Until this node holds the shard's lease (None: stopping first).
    async fn stand_by(&self, stopping: &mut watch::Receiver<bool>) -> Result<Option<Held>, String> {
        let (c, k) = (self.cluster()?, self.k);
        // A fixed port is the first shard's; shard k listens k ports up.
        let mut at: SocketAddr = c.internal_listen.parse().map_err(|e| format!("cluster.internal_listen: {e}"))?;
        if at.port() != 0 {
            at.set_port(at.port().checked_add(k as u16).ok_or("cluster.internal_listen: port out of range")?);
        }
        // Bound before the lease is taken (the lease names the address),
        // but listening only once the shard is served: until then a front
        // that connects (to a previous run's lease, say) is refused at once
        // and tries again, instead of waiting in an accept queue nobody serves.
        let internal = reserve(at).await?;
        let internal_addr = internal.local_addr().map_err(|e| e.to_string())?;
        // The value names this node, where it serves and this try: a node
        // started again, or standing by after losing the lease, never takes
        // an earlier lease of its own, whose ttl runs from an earlier write.
        let value = format!("{} {internal_addr} {:016x}", c.node, rand::random::<u64>());
        let lease = lease::start(c, self.bucket.clone(), lease_key(k), value, self.claims.clone(), self.epoch_base)?;
        tracing::info!(node = %c.node, shard = k, internal = %internal_addr, "standing by for the shard");
        let follower = self.follow().await;
        let taken = tokio::select! {
            owner = lease.owner => Some(owner),
            _ = stopping.wait_for(|s| *s) => None,
        };
        // The copy is let go (between two of its batches) before the owner opens it.
        if let Some(follower) = follower {
            match actix_web::rt::task::spawn_blocking(move || follower.stop()).await {
                Ok(Ok(at)) => tracing::info!(shard = k, at, "the copy stopped following the log"),
                Ok(Err(e)) => tracing::warn!(shard = k, error = %e, "the copy did not stop cleanly"),
                Err(e) => tracing::warn!(shard = k, error = %e, "the copy did not stop cleanly"),
            }
        }
        let Some(owner) = taken else { return Ok(None) };
        let epoch = owner.map_err(|_| "the lease task ended".to_string())??;
        Ok(Some(Held {
            epoch,
            internal,
            lost: lease.lost,
            release: lease.release,
            serving: lease.serving,
            since: Instant::now(),
        }))
    }

    /// While standing by, this node's copy of the shard follows the log
    /// (`store::Follower`), so that a takeover reads only the last moments.
    /// A node without a copy makes one here: the follower bootstraps it
    /// from the newest checkpoint (or reads the log from its start), so
    /// every node that may serve the shard keeps one, and no takeover
    /// waits for a whole copy to be laid (a first one did, until this was
    /// so: its time grew with the shard's data).
    async fn follow(&self) -> Option<Follower> {
        let stream = shard(&self.cfg, self.k)?;
        let k = self.k;
        match actix_web::rt::task::spawn_blocking(move || Follower::start(stream)).await {
            Ok(Ok(follower)) => {
                tracing::info!(shard = k, at = follower.applied(), "the copy follows the log");
                Some(follower)
            }
            Ok(Err(e)) => {
                tracing::warn!(shard = k, error = %e, "the copy cannot follow the log");
                None
            }
            Err(e) => {
                tracing::warn!(shard = k, error = %e, "the copy cannot follow the log");
                None
            }
        }
    }

    /// Serves the shard under `held` until it is lost, handed over or
    /// stopped; whatever way it ends, this node no longer counts it.
    async fn serve(&self, held: Held, stopping: watch::Receiver<bool>) -> Result<Served, String> {
        let (owned, epoch_gauge) = &self.metrics.shards[self.k as usize];
        epoch_gauge.set(held.epoch as i64);
        let served = self.fence_and_serve(held, stopping).await;
        owned.set(0);
        epoch_gauge.set(0);
        self.claims.held.fetch_sub(1, Relaxed);
        served
    }

    /// Fences and replays the shard's stream, then serves it on a thread
    /// of its own (an arbiter stopped afterwards, taking the core's actors
    /// and tasks with it).
    async fn fence_and_serve(&self, held: Held, mut stopping: watch::Receiver<bool>) -> Result<Served, String> {
        let (c, k) = (self.cluster()?, self.k);
        let Held { epoch, internal, mut lost, release, serving, since } = held;
        tracing::info!(node = %c.node, shard = k, epoch, "took the lease: fencing and replaying the shard");
        // JetStream may be electing a leader right now (it answers nothing
        // then): try again while the lease holds, for `OPEN_PATIENCE` at
        // most. A replay that stops making progress fails
        // (`store::jetstream`) and is tried again.
        let took_at = Instant::now();
        let open = || {
            let stream = shard(&self.cfg, k);
            async move {
                let stream = stream.ok_or(StoreError::Io("cluster mode needs a [cluster] section".into()))?;
                let opening = actix_web::rt::task::spawn_blocking(move || JetStreamEngine::open(stream, epoch));
                opening.await.map_err(|e| StoreError::Io(format!("the open ended: {e}")))?
            }
        };
        let opened = match open_or_give_up(k, OPEN_PATIENCE, &mut lost, open).await {
            Ok(engine) => engine,
            Err(why) => {
                // Free the key (expecting our revision, so never a
                // successor's): another node may open the store.
                let _ = release.send(());
                return Ok(Served::Lost(why));
            }
        };
        let store = Store::with_engine(Arc::new(opened)).map_err(|e| e.to_string())?;
        store.set_group_commit_window(self.cfg.store.group_commit_window);
        let at = internal.local_addr().map_err(|e| e.to_string())?;
        let internal = match internal.listen(INTERNAL_BACKLOG).and_then(|l| l.into_std()) {
            Ok(listener) => listener,
            Err(e) => {
                let _ = release.send(());
                return Err(format!("cluster.internal_listen {at}: {e}"));
            }
        };
        tracing::info!(node = %c.node, shard = k, epoch, took_ms = took_at.elapsed().as_millis() as u64,
            standing_by_ms = (took_at - since).as_millis() as u64, "serving the shard");
        self.metrics.shards[k as usize].0.set(1);

        let (cfg, balance, every) = (self.cfg.clone(), self.balance.clone(), c.lease_ttl);
        let handed = Arc::new(AtomicBool::new(false));
        let handing = handed.clone();
        // Why the core stopped at once, when it did: the shard is given up.
        let gave_up = Arc::new(std::sync::Mutex::new(None::<String>));
        let giving_up = gave_up.clone();
        let place = (c.shards > 1).then(|| ShardPlace {
            index: k,
            shards: c.shards,
            owners: self.owners.clone(),
            hop: self.hop.clone(),
        });
        let shard = crate::server::Shard::Clustered { place, serving, local: self.local.clone() };
        let (done_tx, done) = tokio::sync::oneshot::channel();
        let closing = store.clone();
        let arbiter = actix::Arbiter::new();
        arbiter.spawn_fn(move || {
            actix_web::rt::spawn(async move {
                // A failed store (an append fenced out, or JetStream
                // unreachable past the engine's retries) takes no more
                // commits: the node gives the shard up.
                let failed = store.failure();
                let stop = async move {
                    let why = tokio::select! {
                        why = lost => why.unwrap_or_else(|_| "the lease task ended".into()),
                        why = failed => format!("cluster: the store of shard {k} failed: {why}"),
                        () = hand_over_when_due(balance, every) => {
                            handing.store(true, Relaxed);
                            return crate::server::Stop::Gracefully("handing the shard over");
                        }
                        _ = stopping.wait_for(|s| *s) => return crate::server::Stop::Gracefully("the node stops"),
                    };
                    *giving_up.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                    crate::server::Stop::Now(why)
                };
                let ran = crate::server::run(cfg, store, internal, crate::server::Announce::No, shard, stop).await;
                let _ = done_tx.send(ran);
            });
        });
        let ran = done.await.unwrap_or_else(|_| Err(format!("shard {k}: its relay core ended")));
        arbiter.stop();
        // Closed before the lease is let go, however the core stopped: this
        // node's local copy of the shard is then free (sled's lock) for its
        // next open, should the lease come back here at once. Waiting for
        // the last user of the store to drop it took longer than that.
        let _ = actix_web::rt::task::spawn_blocking(move || closing.close()).await;
        if let Some(why) = gave_up.lock().unwrap_or_else(|e| e.into_inner()).take() {
            // After a store failure the lease task still renews: free the
            // key (expecting our revision, so never a successor's).
            let _ = release.send(());
            return Ok(Served::Lost(why));
        }
        ran?;
        if handed.load(Relaxed) {
            // Stopped gracefully and flushed: free the key for the next owner.
            let _ = release.send(());
            tracing::info!(node = %c.node, shard = k, "handed the shard over");
            return Ok(Served::HandedOver);
        }
        Ok(Served::Stopped)
    }
}

/// Connections an owner's internal address queues before its core accepts.
const INTERNAL_BACKLOG: u32 = 1024;

/// A socket bound to `at` and not listening (module doc, 4: a shard's
/// internal port listens only while the shard is served). Tried again for
/// a moment: a previous core's listener on it may still be closing.
async fn reserve(at: SocketAddr) -> Result<tokio::net::TcpSocket, String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let socket = if at.is_ipv4() { tokio::net::TcpSocket::new_v4() } else { tokio::net::TcpSocket::new_v6() };
        let bound = socket.and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(at)?;
            Ok(s)
        });
        match bound {
            Ok(socket) => return Ok(socket),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, %at, "cluster.internal_listen: busy; trying again");
                actix_web::rt::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(format!("cluster.internal_listen {at}: {e}")),
        }
    }
}

/// A lease this node holds, and what it serves the shard on.
struct Held {
    epoch: u64,
    /// Bound, listening once the shard is served.
    internal: tokio::net::TcpSocket,
    lost: tokio::sync::oneshot::Receiver<String>,
    release: tokio::sync::oneshot::Sender<()>,
    serving: lease::Serving,
    since: Instant,
}

/// Resolves when this node should hand a shard over (it has a surplus and
/// no other hand-over of its own is under way): checked every `every`.
async fn hand_over_when_due(balance: Arc<Balance>, every: Duration) {
    loop {
        actix_web::rt::time::sleep(every).await;
        if balance.surplus.load(Relaxed) && !balance.handing.swap(true, Relaxed) {
            return;
        }
    }
}

/// SIGTERM or SIGINT.
async fn stop_signal() -> &'static str {
    use actix_web::rt::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    }
}

/// A node's presence in the presence bucket (`node-<name>`, expiring a
/// ttl after its last write), and what it learns of the balance.
struct Presence {
    node: String,
    every: Duration,
    balance: Arc<Balance>,
}

/// Publishes every shard's owner's internal address whenever a lease
/// changes. With several shards, also keeps this node's presence written
/// and, from the presence keys and the leases' values, counts the live
/// nodes and whether this one serves two shards more than the least
/// loaded (then it hands one over: `hand_over_when_due`).
async fn watch_owners(
    leases: Vec<kv::Store>,
    present: kv::Store,
    owners: watch::Sender<Arc<Vec<Option<SocketAddr>>>>,
    presence: Presence,
) {
    let shards = leases.len();
    let mut present_at: Option<Instant> = None;
    loop {
        let mut now = Vec::with_capacity(shards);
        let mut load: std::collections::HashMap<String, usize> = Default::default();
        for (k, leases) in (0..).zip(&leases) {
            now.push(match leases.entry(lease_key(k)).await {
                Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                    let value = String::from_utf8_lossy(&entry.value).into_owned();
                    let mut fields = value.split(' ');
                    let node = fields.next().unwrap_or_default().to_owned();
                    *load.entry(node).or_default() += 1;
                    fields.next().and_then(|a| a.parse().ok())
                }
                Ok(_) => None,
                // Unreachable: keep the last known owner; a dead one fails to connect.
                Err(_) => owners.borrow().get(k as usize).copied().flatten(),
            });
        }
        owners.send_if_modified(|was| {
            let changed = **was != now;
            if changed {
                *was = Arc::new(now);
            }
            changed
        });
        if shards > 1 && present_at.is_none_or(|t| t.elapsed() >= presence.every) {
            if present.put(format!("node-{}", presence.node), Vec::new().into()).await.is_ok() {
                present_at = Some(Instant::now());
            }
            if let Ok(keys) = present.keys().await {
                use futures_util::StreamExt;
                let live: Vec<String> = keys
                    .filter_map(|k| std::future::ready(k.ok().and_then(|k| Some(k.strip_prefix("node-")?.to_owned()))))
                    .collect()
                    .await;
                let b = &presence.balance;
                b.live.store(live.len().max(1), Relaxed);
                let mine = load.get(&presence.node).copied().unwrap_or(0);
                let loads = live.iter().map(|n| load.get(n).copied().unwrap_or(0));
                b.surplus.store(relay_core::shard::should_hand_over(mine, loads), Relaxed);
            }
        }
        actix_web::rt::time::sleep(OWNER_POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 40: a node whose store cannot be opened (its copy locked)
    /// gives the lease up after `OPEN_PATIENCE` instead of holding it.
    #[tokio::test(start_paused = true)]
    async fn a_node_that_cannot_open_its_store_gives_the_lease_up_after_its_patience() {
        let (_lease, mut lost) = tokio::sync::oneshot::channel::<String>();
        let started = tokio::time::Instant::now();
        let mut tries = 0;
        let never = || {
            tries += 1;
            async { Err::<(), _>(StoreError::Io("could not acquire lock (WouldBlock)".into())) }
        };
        let why = open_or_give_up(1, OPEN_PATIENCE, &mut lost, never).await.unwrap_err();
        assert!(why.contains("could not open the JetStream store of shard 1 for 30s"), "{why}");
        assert!(why.contains("WouldBlock"), "{why}");
        let took = started.elapsed();
        assert!(took >= OPEN_PATIENCE && took <= OPEN_PATIENCE + OPEN_RETRY, "{took:?}");
        assert_eq!(tries, 1 + OPEN_PATIENCE.as_millis() / OPEN_RETRY.as_millis());

        // Failures for less than the patience, then an open: served.
        let mut failures = 3;
        let late = || {
            failures -= 1;
            let result = if failures >= 0 { Err(StoreError::Io("no leader".into())) } else { Ok(7) };
            async move { result }
        };
        assert_eq!(open_or_give_up(1, OPEN_PATIENCE, &mut lost, late).await, Ok(7));

        // Fenced by a newer owner, or the lease lost: given up at once.
        let started = tokio::time::Instant::now();
        let fenced = || async { Err::<(), _>(StoreError::Flush("fenced by a newer owner".into())) };
        assert!(open_or_give_up(1, OPEN_PATIENCE, &mut lost, fenced).await.unwrap_err().contains("fenced"));
        let (lease, mut lost) = tokio::sync::oneshot::channel::<String>();
        lease.send("renewal refused".into()).unwrap();
        let failing = || async { Err::<(), _>(StoreError::Io("no leader".into())) };
        let why = open_or_give_up(1, OPEN_PATIENCE, &mut lost, failing).await.unwrap_err();
        assert!(why.contains("lost the lease of shard 1"), "{why}");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[test]
    fn only_copies_of_streams_the_cluster_does_not_have_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["RELAY_c_S0", "RELAY_c_S1", "RELAY_old_S0"] {
            SledEngine::open(&dir.path().join(name), Some(1 << 20)).unwrap().close().unwrap();
        }
        std::fs::write(dir.path().join("note"), b"not a copy").unwrap();
        // Held by a process (this one): kept.
        let held = SledEngine::open(&dir.path().join("RELAY_held_S0"), Some(1 << 20)).unwrap();
        remove_stale_copies(dir.path(), &["RELAY_c_S0".into(), "RELAY_c_S1".into()]);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["RELAY_c_S0", "RELAY_c_S1", "RELAY_held_S0", "note"]);
        drop(held);
    }
}
