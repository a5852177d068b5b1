//! Serving one relay core: opens the store, starts the supervisor, the
//! peer client, push, replication and checkpoints, and the HTTP server on
//! them (`run`); a standalone relay ([`serve`]) or each shard of a
//! cluster node (`crate::cluster`) runs it.

use crate::{
    app, backup, checkpoint, cluster, config, fds, http, keys, limits, peer_batch, peer_rpc, peers, push, replication,
};
use actix_web::dev::Service;
use actix_web::middleware::{from_fn, Condition};
use actix_web::{web, App, HttpServer};
use futures_util::future::Either;
use relay_actors::Supervisor;
use relay_core::clock::SystemClock;
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;

/// Everything the relay creates (data dir, store files, key) is for its
/// own user only: files 0600, directories 0700.
pub(crate) fn private_files() {
    // SAFETY: umask only sets the process's file mode mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}
use std::sync::Arc;

/// Runs a relay until SIGINT/SIGTERM (actix-web stops accepting, finishes
/// in-flight requests), then flushes the store. Prints one line
/// `relay <id> listening on http://<addr>` (`https://` with
/// `http.tls_cert_file`) on stdout once it accepts
/// connections, so a parent process can find a port chosen with `:0`.
pub async fn serve(cfg: config::Config) -> Result<(), String> {
    private_files();
    prepare_data_dir(&cfg.relay.data_dir)?;
    let store = cfg.open_store()?;
    let listener = TcpListener::bind(&cfg.relay.listen).map_err(|e| format!("listen {}: {e}", cfg.relay.listen))?;
    // Removed (its file too) when the relay stops.
    let _admin = backup::listen(store.clone(), backup::Sources::of(&cfg))?;
    run(cfg, store, listener, Announce::Yes, Shard::Standalone, std::future::pending::<Stop>()).await
}

/// What [`run`] serves: a standalone relay, or one shard of a cluster.
pub(crate) enum Shard {
    /// A standalone relay.
    Standalone,
    /// A cluster shard's core.
    Clustered {
        /// Its shard in a cluster of several (its tokens name the shard,
        /// its siblings are reached and trusted under the relay's id);
        /// `None` with one shard.
        place: Option<cluster::place::ShardPlace>,
        /// The shard's lease, without which no request is answered.
        serving: cluster::lease::Serving,
        /// Where the node's front finds the cores it calls in process.
        local: cluster::local::LocalCores,
    },
}

/// The one line on stdout a parent process waits for (tests, `relay
/// cluster up`): `relay <id> listening on http://<addr>` (`https` with TLS).
pub(crate) fn announce_listening(relay_id: &str, scheme: &str, addr: std::net::SocketAddr) {
    println!("relay {relay_id} listening on {scheme}://{addr}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
}

/// Whether [`run`] prints the `listening on` line (a cluster node prints
/// its own, for the address clients use).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    Yes,
    No,
}

/// Why [`run`] stops before a signal (cluster mode).
pub(crate) enum Stop {
    /// At once, writing nothing more (the lease is lost, the store fenced
    /// or unreachable): `run` returns the reason as an error.
    Now(String),
    /// Gracefully, as on SIGTERM (requests in flight finish, the store is
    /// flushed): the shard is handed over, or the node stops on a signal.
    Gracefully(&'static str),
}

/// Serves the relay on `store` and `listener` until SIGINT/SIGTERM, or
/// until `stop` resolves (a cluster node's shard lost or handed over).
/// `shard`: what a cluster shard's core is given ([`Shard`]).
pub(crate) async fn run(
    cfg: config::Config,
    store: relay_actors::store::Store,
    listener: TcpListener,
    announce: Announce,
    shard: Shard,
    stop: impl std::future::Future<Output = Stop>,
) -> Result<(), String> {
    let (place, serving, local) = match shard {
        Shard::Standalone => (None, None, None),
        Shard::Clustered { place, serving, local } => (place, Some(serving), Some(local)),
    };
    let h = &cfg.http;
    let workers = if h.workers > 0 { h.workers } else { std::thread::available_parallelism().map_or(1, |n| n.get()) };
    let peer_connections = cfg.peers.len() * cfg.limits.max_in_flight_per_destination;
    fds::ensure(
        fds::needed(h.max_connections, workers, peer_connections),
        &format!("http.max_connections ({}) × http.workers ({workers})", h.max_connections),
    )?;
    let key = keys::load_or_generate(&cfg.relay.key_file)?;
    let vapid = Arc::new(push::Vapid::load_or_generate(&cfg.vapid_key_file(), cfg.vapid_subject())?);
    let mut policy = cfg.policy();
    if let Some(place) = &place {
        policy.token_prefix = relay_core::shard::token_prefix(place.index);
    }
    let clock: relay_core::clock::SharedClock = Arc::new(SystemClock);
    let tls = Arc::new(http::tls::client_config(h.tls_extra_roots.as_deref())?);
    let peers = peers::PeerClient::new(
        &cfg.relay.id,
        key.clone(),
        &cfg.peers,
        peers::Connect {
            timeout: cfg.delivery.attempt_timeout,
            tls,
            batching: peer_batch::Batching::from_config(&cfg),
        },
        clock.clone(),
        &policy,
        place.clone(),
    );
    let mut peer_keys: std::collections::HashMap<_, _> = cfg
        .peers
        .iter()
        .map(|p| Ok((p.id.clone(), relay_schemas::sign::parse_public_key("peers.public_key", &p.public_key)?)))
        .collect::<Result<_, relay_schemas::RelayError>>()
        .map_err(|e| e.message)?;
    if place.is_some() {
        // Sibling shards call under the relay's own id, signed with its key.
        peer_keys.insert(cfg.relay.id.clone(), key.verifying_key());
    }
    let rates = cfg.rates();
    let window_cap = peer_rpc::replay_window_cap(
        peer_keys.len(),
        u64::from(rates.peer.0) + u64::from(rates.peer_lookup.0),
        policy.clock_tolerance,
    );
    let peer_keys = peer_rpc::PeerKeys::new(&cfg.relay.id, peer_keys, policy.clock_tolerance, window_cap);
    let observer = web::Data::from(peers.observer().clone());
    let sup = Supervisor::new(store.clone(), policy, clock, Arc::new(peers.clone()));
    observer.register(sup.metrics());
    let restored = sup.start().map_err(|e| format!("restoring deliveries: {e}"))?;
    if cfg.push.enabled {
        sup.set_push_sink(push::PushHandle::start(&sup, vapid.clone(), push::Settings::from_config(&cfg)));
    }
    if let Some(place) = &place {
        actix_web::rt::spawn(wake_on_new_owners(sup.clone(), place.owners.clone()));
    }
    let limits = limits::RateLimits::new(cfg.rates());
    actix_web::rt::spawn(sweep_sessions(sup.clone(), cfg.sessions.sweep_interval));
    let push_info = app::PushInfo {
        vapid_public_key: vapid.public_key().to_owned(),
        allow_http: cfg.push.allow_http_endpoints,
        allow_private: cfg.push.allow_private_endpoints,
    };
    let replicator =
        replication::Replicator::start(sup.clone(), peers.clone(), replication::Settings::from_config(&cfg));
    // A standalone relay checkpoints its store and witnesses its peers'
    // (PROTOCOL §10); a cluster shard's store is JetStream's (not here).
    let checkpoints = match &place {
        None => Some(start_checkpoints(&cfg, &store, &key, &sup, &peers)?),
        Some(_) => None,
    };
    // After the checkpoint writer is installed: the sweep asks it first.
    actix_web::rt::spawn(relay_actors::retention::run(sup.clone(), cfg.limits.retention_sweep));
    let relay = app::App::new(sup, cfg.limits.max_body_bytes, peers, peer_keys, limits);
    let mut relay = relay.with_push(push_info).with_replicator(replicator);
    if let Some(checkpoints) = checkpoints {
        relay = relay.with_checkpoints(checkpoints);
    }
    if let Some(serving) = serving {
        relay = relay.with_lease(serving);
    }
    let relay = web::Data::new(relay);

    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let scheme = if cfg.http.tls().is_some() { "https" } else { "http" };
    // Several cores of one node cannot share one metrics address: each
    // serves its own at its internal `/metrics`.
    let metrics_listener = match cfg.metrics.listen.as_ref().filter(|_| place.is_none()) {
        Some(at) => Some(TcpListener::bind(at).map_err(|e| format!("metrics.listen {at}: {e}"))?),
        None => None,
    };
    let websocket = web::Data::new(cfg.websocket.clone());
    let cors = web::Data::new(http::webapp::Cors::new(&cfg.relay.public_url, &cfg.http.cors_origins));
    let client = web::Data::new(http::webapp::ClientInfo {
        relay_id: cfg.relay.id.clone(),
        public_url: cfg.relay.public_url.clone(),
    });
    let h = &cfg.http;
    let (access, with_metrics) = (cfg.log.access, metrics_listener.is_none());
    let body_timeout = http::BodyTimeout(h.body_timeout);
    // In cluster mode every connection comes from a node's front, which
    // applies the per-address cap itself (`cluster::front`).
    let proxies = h.trusted_proxies();
    let per_ip = http::conn::PerIp::new(match cfg.cluster {
        Some(_) => usize::MAX,
        None => h.max_connections_per_ip,
    })
    .exempting(proxies.clone());
    let clients = http::Clients {
        proxies: proxies.clone(),
        proxied_websockets: http::conn::PerIp::new(h.max_connections_per_ip),
    };
    // A cluster shard's core listens on its internal address: with the
    // cluster's secret, only a holder of its key is answered (`cluster/hop.rs`).
    let hop = match cfg.cluster.as_ref().and_then(|c| c.secret.as_ref()) {
        Some(secret) => Some(cluster::hop::Hop::from_secret(secret.0.as_bytes())?),
        None => None,
    };
    // Sibling shards call unsigned over it (`cluster::hop::SIBLING_HEADER`).
    let over_hop = hop.is_some() && place.is_some() && h.tls().is_none();
    let count = per_ip.on_connect();
    let on_connect = move |conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions| {
        count(conn, ext);
        if over_hop {
            cluster::hop::mark_verified(conn, ext);
        }
    };
    let (for_app, observed) = (relay.clone(), observer.clone());
    let mut server = HttpServer::new(move || {
        // Runs once on each worker thread: account actors spread over them.
        for_app.supervisor().add_arbiter(actix::Arbiter::current());
        App::new()
            .wrap(actix_web::middleware::from_fn(http::webapp::cors))
            .app_data(cors.clone())
            .app_data(client.clone())
            .configure(http::webapp::configure)
            .wrap_fn(|req, srv| match http::over_connection_cap(req.request()) {
                Some(refused) => Either::Left(std::future::ready(Ok(req.into_response(refused)))),
                None => Either::Right(srv.call(req)),
            })
            .wrap(Condition::new(access, from_fn(http::access_log)))
            .configure(http::configure(
                for_app.clone(),
                websocket.clone(),
                observer.clone(),
                body_timeout,
                clients.clone(),
                with_metrics,
            ))
    })
    .on_connect(on_connect)
    .max_connections(h.max_connections)
    .client_request_timeout(h.request_timeout)
    .keep_alive(h.keep_alive)
    .shutdown_timeout(h.shutdown_timeout.as_secs());
    if h.workers > 0 {
        server = server.workers(h.workers);
    }
    // A cluster node stops its shards' servers itself: actix's own signal
    // handling stops the whole actix system once one server is done, which
    // would cut the node's other shards short.
    let clustered = cfg.cluster.is_some();
    if clustered {
        server = server.disable_signals();
    }
    let cert = match h.tls() {
        Some((cert, key)) => Some(Arc::new(http::tls::Certificate::load(cert, key)?)),
        None => None,
    };
    // One handler for the process: a cluster node runs a core per shard (and no TLS).
    if place.is_none() {
        actix_web::rt::spawn(http::tls::on_sighup(cert.clone()));
    }
    let server = match (cert, hop) {
        (Some(cert), _) => server.listen_rustls_0_23(listener, http::tls::Certificate::server_config(cert)?),
        (None, Some(hop)) => server.listen_rustls_0_23(listener, (*hop.server).clone()),
        (None, None) => server.listen(listener),
    };
    let server = server.map_err(|e| e.to_string())?.run();
    let metrics_server = match metrics_listener {
        Some(listener) => {
            let at = listener.local_addr().map_err(|e| e.to_string())?;
            let relay = relay.clone();
            let mut server = HttpServer::new(move || {
                App::new()
                    .wrap(Condition::new(access, from_fn(http::access_log)))
                    .configure(http::configure_metrics(relay.clone()))
            })
            .workers(1)
            .shutdown_timeout(1);
            if clustered {
                server = server.disable_signals();
            }
            let server = server.listen(listener).map_err(|e| e.to_string())?.run();
            Some((at, server.handle(), actix_web::rt::spawn(server)))
        }
        None => None,
    };
    // The server starts (workers, and its SIGTERM/SIGINT handlers) on its
    // first poll: let that happen before announcing it, so a signal sent
    // right after the announcement already means a graceful stop.
    let handle = server.handle();
    let running = actix_web::rt::spawn(server);
    actix_web::rt::task::yield_now().await;
    let r = &cfg.relay;
    let metrics_at = match &metrics_server {
        Some((at, _, _)) => format!("http://{at}/metrics"),
        None => format!("{scheme}://{addr}/metrics"),
    };
    tracing::info!(relay = %r.id, listen = %addr, public_url = %r.public_url, public_key = %keys::public_key(&key),
        store = %r.data_dir.join("store").display(), peers = cfg.peers.len(), restored, metrics = %metrics_at,
        "relay started");
    for p in &cfg.peers {
        tracing::info!(peer = %p.id, url = %p.url, public_key = %p.public_key, "peer configured");
    }
    if cfg.peers.is_empty() {
        tracing::info!("no [[peers]] configured: this relay delivers only to its own accounts");
    }
    if announce == Announce::Yes {
        announce_listening(&cfg.relay.id, scheme, addr);
    }
    // This node's front calls the core in process from now on, as if from
    // the address its connections to the internal one come from.
    let in_process = match &local {
        Some(local) => {
            let peer = if addr.ip().is_unspecified() { std::net::Ipv4Addr::LOCALHOST.into() } else { addr.ip() };
            let core = cluster::local::InProcess::new(relay.clone(), observed, proxies, peer);
            Some(local.serve(place.as_ref().map_or(0, |p| p.index), core))
        }
        None => None,
    };
    let withdraw = |within| async move {
        if let Some(in_process) = in_process {
            in_process.withdraw(within).await;
        }
    };
    let stop = std::pin::pin!(stop);
    let stopped = match futures_util::future::select(running, stop).await {
        Either::Left((ran, _)) => {
            withdraw(std::time::Duration::ZERO).await;
            ran.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        }
        Either::Right((Stop::Now(why), running)) => {
            tracing::error!(reason = %why, "stopping at once");
            withdraw(std::time::Duration::ZERO).await;
            handle.stop(false).await;
            let _ = running.await;
            // Nothing more is written: the store is fenced or unreachable.
            // Closed now, not when the last of its users lets it go: a
            // cluster node's local copy is then free for its next open.
            let closing = store.clone();
            let _ = actix_web::rt::task::spawn_blocking(move || closing.close()).await;
            return Err(why);
        }
        Either::Right((Stop::Gracefully(why), running)) => {
            tracing::info!(why, "stopping gracefully: finishing requests in flight");
            withdraw(cfg.http.shutdown_timeout).await;
            handle.stop(true).await;
            running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())
        }
    };
    if let Some((_, metrics, running)) = metrics_server {
        // Stopped with the main server (a signal may have stopped it
        // already); its result adds nothing then.
        metrics.stop(true).await;
        let _ = running.await;
    }
    stopped?;
    store.flush().map_err(|e| format!("final flush: {e}"))?;
    tracing::info!(relay = %r.id, "relay stopped");
    Ok(())
}

/// Starts the checkpoint writer (at once, every `audit.checkpoint_interval`,
/// and for the retention sweep before it prunes) and the witness of the
/// peers' checkpoints (every `audit.witness_interval`).
fn start_checkpoints(
    cfg: &config::Config,
    store: &relay_actors::store::Store,
    key: &ed25519_dalek::SigningKey,
    sup: &Supervisor,
    peers: &peers::PeerClient,
) -> Result<Arc<checkpoint::Checkpoints>, String> {
    let data_dir = &cfg.relay.data_dir;
    let clock = sup.clock().clone();
    let writer = checkpoint::Checkpoints::open(store.clone(), key.clone(), &cfg.relay.id, data_dir, clock.clone())?;
    let writer = Arc::new(writer);
    sup.set_checkpointer(writer.clone());
    writer.start_timer(cfg.audit.checkpoint_interval);
    let keys = cfg
        .peers
        .iter()
        .map(|p| Ok((p.id.clone(), relay_schemas::sign::parse_public_key("peers.public_key", &p.public_key)?)))
        .collect::<Result<Vec<_>, relay_schemas::RelayError>>()
        .map_err(|e| e.message)?;
    let tolerance = cfg.limits.clock_tolerance.as_secs();
    let witness = checkpoint::witness::Witness::open(data_dir, keys, peers.clone(), clock, tolerance)?;
    Arc::new(witness).start(cfg.audit.witness_interval);
    Ok(writer)
}

/// Creates `relay.data_dir` if needed and checks that this process can
/// write there, so the error names the setting rather than a file inside.
pub(crate) fn prepare_data_dir(dir: &std::path::Path) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("relay.data_dir {}: {e}", dir.display());
    // Only the relay's user may read its data (see `private_files`).
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(fail)?;
    let probe = dir.join(".write-check");
    std::fs::write(&probe, b"").map_err(|e| format!("relay.data_dir {} is not writable: {e}", dir.display()))?;
    std::fs::remove_file(&probe).map_err(fail)
}

/// A sibling shard got a new owner: deliveries waiting for this relay (its
/// sibling shards' accounts) are tried again now, not at their next due time.
async fn wake_on_new_owners(sup: Supervisor, mut owners: cluster::place::Owners) {
    while owners.changed().await.is_ok() {
        sup.peer_seen(&sup.policy().relay_id);
    }
}

/// Drops expired sessions from memory and the store every `every` (off the
/// event loop: the sweep reads every stored session).
async fn sweep_sessions(sup: Supervisor, every: std::time::Duration) {
    let mut tick = actix_web::rt::time::interval(every);
    loop {
        tick.tick().await;
        let (sessions, now) = (sup.sessions().clone(), sup.clock().now());
        match actix_web::rt::task::spawn_blocking(move || sessions.sweep(now)).await {
            Ok(Ok(n)) => {
                sup.metrics().sessions_swept.inc_by(n as u64);
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "session sweep"),
            Err(e) => tracing::warn!(error = %e, "session sweep"),
        }
    }
}
