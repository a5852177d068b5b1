//! Cluster mode: one relay on several machines (README, "When one machine
//! is not enough"). Every node runs this; one of them, the lease holder,
//! serves the relay, and the others stand by to take over.
//!
//! 1. **Store**: the event store is a NATS JetStream stream
//!    (`store::jetstream`: file storage, `sync_interval: always`, R3), so
//!    an acknowledged commit survives the loss of any one machine.
//! 2. **Lease**: a key of a JetStream KV bucket whose entries expire after
//!    `cluster.lease_ttl`; its value is the owner's name, the address it
//!    serves the relay on (`cluster.internal_listen`) and a per-process
//!    nonce. The rules are in `relay_core::lease`, the task that follows
//!    them in `lease.rs`; the creation revision is the owner's epoch,
//!    written as a fence into the stream before it serves.
//! 3. **Front**: every node accepts connections on `relay.listen` and
//!    pipes each, bytes both ways, to the current owner (HTTP, keep-alive
//!    and WebSocket alike). While no owner is known a connection waits up
//!    to [`FRONT_WAIT`] for one. The per-address connection cap
//!    (`http.max_connections_per_ip`) is applied here, since the owner sees
//!    every connection come from a front.
//! 4. **Takeover**: when the owner stops renewing (killed, cut off), its key
//!    expires, a standby creates it, fences the stream, replays it and
//!    serves; deliveries resume from their stored due times. An owner
//!    whose renewal is refused, who cannot renew for two thirds of the
//!    ttl, or whose store failed, stops serving at once and exits.
//!
//! The relay's id, key and VAPID key are the cluster's: every node is
//! configured with the same `relay.id`, `relay.key_file` and
//! `push.vapid_key_file` (files every node reads: the same contents on
//! each machine), so peers and clients see one relay, and push
//! subscriptions outlive a takeover. One stream holds the whole relay (one
//! shard): the cluster survives machines, but one node at a time does the
//! work.
//!
//! Why a byte pipe and not NATS request/reply: a WebSocket session and a
//! keep-alive connection pass through as they are, and a standby adds one
//! copy per byte (about 40 µs per send, `scripts/cluster-bench.sh`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use relay_actors::store::{JetStreamConfig, JetStreamEngine, Store};
use tokio::sync::watch;

use crate::config::{ClusterSection, Config};

mod lease;
pub mod up;

/// A connection at a front waits this long for an owner to reach.
pub const FRONT_WAIT: Duration = Duration::from_secs(15);

/// How often a node reads who owns the relay.
const OWNER_POLL: Duration = Duration::from_millis(100);

/// Between two tries to open the store after taking the lease.
const OPEN_RETRY: Duration = Duration::from_millis(500);

/// The lease key of the relay's one shard.
pub(crate) const LEASE_KEY: &str = "shard-0";

/// The shard's stream for this cluster.
pub fn shard(cfg: &Config) -> Option<JetStreamConfig> {
    let c = cfg.cluster.as_ref()?;
    let shard = JetStreamConfig::shard(c.nats_urls.clone(), &c.name(&cfg.relay.id), 0, c.replicas);
    Some(JetStreamConfig { snapshot_bytes: c.snapshot_bytes, ..shard })
}

fn bucket(c: &ClusterSection, relay_id: &str) -> String {
    format!("RELAY_{}_LEASES", c.name(relay_id))
}

/// Runs a cluster node until SIGINT/SIGTERM or until it loses the lease.
pub async fn serve(cfg: Config) -> Result<(), String> {
    let c = cfg.cluster.clone().ok_or("cluster mode needs a [cluster] section")?;
    crate::private_files();
    crate::prepare_data_dir(&cfg.relay.data_dir)?;
    let shard = shard(&cfg).ok_or("cluster mode needs a [cluster] section")?;
    let bucket = bucket(&c, &cfg.relay.id);
    let leases = lease::lease_bucket(&c, &bucket).await?;

    // Bound before the lease is taken: the lease names this address.
    let internal = std::net::TcpListener::bind(&c.internal_listen)
        .map_err(|e| format!("cluster.internal_listen {}: {e}", c.internal_listen))?;
    let internal_addr = internal.local_addr().map_err(|e| e.to_string())?;
    let front_listener = tokio::net::TcpListener::bind(&cfg.relay.listen)
        .await
        .map_err(|e| format!("listen {}: {e}", cfg.relay.listen))?;
    let front_addr = front_listener.local_addr().map_err(|e| e.to_string())?;

    let metrics = NodeMetrics::new(&c.node);
    if let Some(at) = &c.metrics_listen {
        metrics.serve(at)?;
    }
    let (owner_tx, owner_rx) = watch::channel(None);
    actix_web::rt::spawn(watch_owner(leases, owner_tx));
    let per_ip = crate::http::conn::PerIp::new(cfg.http.max_connections_per_ip);
    let slots = Arc::new(tokio::sync::Semaphore::new(cfg.http.max_connections));
    actix_web::rt::spawn(front(front_listener, owner_rx, per_ip, slots, metrics.clone()));
    tracing::info!(relay = %cfg.relay.id, node = %c.node, listen = %front_addr, internal = %internal_addr,
        stream = %shard.stream, "cluster node started; standing by");
    crate::announce_listening(&cfg.relay.id, front_addr);

    // The value names this node, where it serves and this process (a node
    // started again does not take its previous run's lease for its own).
    let value = format!("{} {internal_addr} {:016x}", c.node, rand::random::<u64>());
    let lease = lease::start(&c, bucket, value)?;
    let started = Instant::now();
    let epoch = tokio::select! {
        owner = lease.owner => owner.map_err(|_| "the lease task ended".to_string())??,
        signal = stop_signal() => {
            tracing::info!(signal, node = %c.node, "stopped while standing by");
            return Ok(());
        }
    };
    metrics.epoch.set(epoch as i64);
    tracing::info!(node = %c.node, epoch, "took the lease: fencing and replaying the store");
    let mut lost_rx = lease.lost;
    // JetStream may be electing a leader right now (it answers nothing
    // then): try again while the lease holds.
    let took_at = Instant::now();
    let opened = loop {
        let shard = shard.clone();
        let opening = actix_web::rt::task::spawn_blocking(move || JetStreamEngine::open(shard, epoch));
        match opening.await.map_err(|e| e.to_string())? {
            Ok(engine) => break engine,
            Err(e @ relay_actors::store::StoreError::Flush(_)) => return Err(format!("open the JetStream store: {e}")),
            Err(e) => tracing::warn!(error = %e, "could not open the JetStream store yet; trying again"),
        }
        if !matches!(lost_rx.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty)) {
            return Err("cluster: lost the lease while opening the store".into());
        }
        actix_web::rt::time::sleep(OPEN_RETRY).await;
    };
    let store = Store::with_engine(Arc::new(opened)).map_err(|e| e.to_string())?;
    store.set_group_commit_window(cfg.store.group_commit_window);
    tracing::info!(node = %c.node, epoch, took_ms = took_at.elapsed().as_millis() as u64,
        standing_by_ms = (took_at - started).as_millis() as u64, "serving the relay");
    metrics.owner.set(1);
    let lost = async move { lost_rx.await.unwrap_or_else(|_| "the lease task ended".into()) };
    // A failed store (an append fenced out, or JetStream unreachable past
    // the engine's retries) takes no more commits: the node gives the
    // relay up and a standby takes over with a fresh one.
    let failed = store.failure();
    let stop = async move {
        tokio::select! {
            why = lost => why,
            why = failed => format!("cluster: the store failed: {why}"),
        }
    };
    crate::run(cfg, store, internal, crate::Announce::No, stop).await
}

/// SIGTERM or SIGINT (a standby has no HTTP server to catch them).
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

/// Publishes the owner's internal address whenever the lease changes.
async fn watch_owner(leases: kv::Store, owner: watch::Sender<Option<SocketAddr>>) {
    loop {
        let now = match leases.entry(LEASE_KEY).await {
            Ok(Some(entry)) if entry.operation == kv::Operation::Put => {
                std::str::from_utf8(&entry.value).ok().and_then(|v| v.split(' ').nth(1)).and_then(|a| a.parse().ok())
            }
            Ok(_) => None,
            // Unreachable: keep the last known owner; a dead one fails to connect.
            Err(_) => *owner.borrow(),
        };
        owner.send_if_modified(|was| std::mem::replace(was, now) != now);
        actix_web::rt::time::sleep(OWNER_POLL).await;
    }
}

/// This node's own metrics (`cluster.metrics_listen`).
#[derive(Clone)]
struct NodeMetrics {
    registry: Arc<prometheus_client::registry::Registry>,
    /// 1 while this node serves the relay (owns shard 0).
    owner: Gauge,
    /// The lease epoch this node serves under (0: standby).
    epoch: Gauge,
    /// Connections the front is piping now.
    connections: Gauge,
    /// Front connections that ended in an error (no owner reachable
    /// within FRONT_WAIT, or a broken pipe).
    unserved: prometheus_client::metrics::counter::Counter,
}

type Gauge = prometheus_client::metrics::gauge::Gauge;

impl NodeMetrics {
    fn new(node: &str) -> NodeMetrics {
        let mut registry = prometheus_client::registry::Registry::with_labels(
            [(std::borrow::Cow::Borrowed("node"), std::borrow::Cow::Owned(node.to_owned()))].into_iter(),
        );
        let m = NodeMetrics {
            registry: Arc::default(),
            owner: Gauge::default(),
            epoch: Gauge::default(),
            connections: Gauge::default(),
            unserved: Default::default(),
        };
        let shard = registry.sub_registry_with_label(("shard".into(), "0".into()));
        shard.register("relay_cluster_shard_owned", "1 while this node serves the shard", m.owner.clone());
        shard.register(
            "relay_cluster_shard_epoch",
            "The lease epoch this node serves the shard under",
            m.epoch.clone(),
        );
        registry.register(
            "relay_cluster_front_connections",
            "Connections piped to the owner now",
            m.connections.clone(),
        );
        registry.register(
            "relay_cluster_front_unserved",
            "Front connections that ended in an error",
            m.unserved.clone(),
        );
        NodeMetrics { registry: Arc::new(registry), ..m }
    }

    fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    fn serve(&self, at: &str) -> Result<(), String> {
        let metrics = self.clone();
        let server = actix_web::HttpServer::new(move || {
            let metrics = metrics.clone();
            actix_web::App::new().route(
                "/metrics",
                actix_web::web::get().to(move || {
                    let body = metrics.encode();
                    async move {
                        actix_web::HttpResponse::Ok()
                            .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
                            .body(body)
                    }
                }),
            )
        })
        .workers(1)
        .shutdown_timeout(1)
        // The node handles SIGTERM itself (standing by) or through the relay's server.
        .disable_signals()
        .bind(at)
        .map_err(|e| format!("cluster.metrics_listen {at}: {e}"))?
        .run();
        actix_web::rt::spawn(server);
        Ok(())
    }
}

/// Accepts connections and pipes each to the owner (module doc, 3).
async fn front(
    listener: tokio::net::TcpListener,
    owner: watch::Receiver<Option<SocketAddr>>,
    per_ip: crate::http::conn::PerIp,
    slots: Arc<tokio::sync::Semaphore>,
    metrics: NodeMetrics,
) {
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (conn, from) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors, most likely: let some close first.
                tracing::warn!(error = %e, "front: accept failed");
                actix_web::rt::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Counted like the relay's own connections (`http::conn`).
        let guard = per_ip.open(from.ip());
        if !guard.within {
            tracing::debug!(from = %from.ip(), "front: over http.max_connections_per_ip");
            actix_web::rt::spawn(async move {
                refuse(conn).await;
                drop((guard, slot))
            });
            continue;
        }
        let (owner, metrics) = (owner.clone(), metrics.clone());
        actix_web::rt::spawn(async move {
            metrics.connections.inc();
            if let Err(e) = pipe(conn, owner).await {
                metrics.unserved.inc();
                tracing::debug!(error = %e, "front: connection ended");
            }
            metrics.connections.dec();
            drop((guard, slot));
        });
    }
}

/// Answers a connection over the per-address cap as the relay itself
/// would (`rate_limited`, 429), then closes it.
async fn refuse(mut conn: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = crate::http::over_cap().to_body().to_string();
    let answer = format!(
        "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.write_all(answer.as_bytes())).await;
}

async fn pipe(mut conn: tokio::net::TcpStream, mut owner: watch::Receiver<Option<SocketAddr>>) -> std::io::Result<()> {
    let deadline = tokio::time::Instant::now() + FRONT_WAIT;
    let mut upstream = loop {
        let at = *owner.borrow_and_update();
        if let Some(at) = at {
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(1), tokio::net::TcpStream::connect(at)).await {
                break s;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(std::io::Error::other("no owner reachable"));
        }
        // A new owner, or a moment for the lease to change.
        let _ = tokio::time::timeout(OWNER_POLL, owner.changed()).await;
    };
    conn.set_nodelay(true)?;
    upstream.set_nodelay(true)?;
    tokio::io::copy_bidirectional(&mut conn, &mut upstream).await.map(|_| ())
}
