//! # relay
//!
//! A relay for end-to-end encrypted messages between accounts. This crate
//! is the binary's wiring; the protocol vocabulary is in `relay-schemas`
//! and the event-sourced core in `relay-actors`.
//!
//! # Layout
//! - [`config`]: TOML configuration with `RELAY__SECTION__KEY` overrides;
//! - [`keys`]: the relay's own key file;
//! - [`rpc`]: the client methods, independent of transport;
//! - [`relay_rpc`]: the relay methods peers call, and their authentication;
//! - [`limits`]: per-session and per-peer rate limits;
//! - [`peers`]: the signed relay-to-relay client (the delivery transport);
//! - [`http`]: the actix-web transport (`/v1/rpc`, `/v1/relay`, `/healthz`);
//! - [`bench`]: `relay bench`, the load generator;
//! - [`serve`]: opens the store, starts the supervisor and the HTTP server.

pub mod audit;
pub mod bench;
pub mod config;
pub mod http;
pub mod keys;
pub mod limits;
pub mod peers;
pub mod relay_rpc;
pub mod rpc;

use actix_web::{web, App, HttpServer};
use relay_actors::{Supervisor, SystemClock};
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;

/// Everything the relay creates (data dir, store files, key) is for its
/// own user only: files 0600, directories 0700.
fn private_files() {
    // SAFETY: umask only sets the process's file mode mask; it cannot fail.
    unsafe {
        libc::umask(0o077);
    }
}
use std::sync::Arc;

/// Runs a relay until SIGINT/SIGTERM (actix-web stops accepting, finishes
/// in-flight requests), then flushes the store. Prints one line
/// `relay <id> listening on http://<addr>` on stdout once it accepts
/// connections, so a parent process can find a port chosen with `:0`.
pub async fn serve(cfg: config::Config) -> Result<(), String> {
    private_files();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&cfg.relay.data_dir)
        .map_err(|e| format!("{}: {e}", cfg.relay.data_dir.display()))?;
    let key = keys::load_or_generate(&cfg.relay.key_file)?;
    let store = cfg.open_store()?;
    let policy = cfg.policy();
    let clock: relay_actors::SharedClock = Arc::new(SystemClock);
    let peers = peers::PeerClient::new(
        &cfg.relay.id,
        key.clone(),
        &cfg.peers,
        cfg.delivery.attempt_timeout,
        clock.clone(),
        policy.clock_tolerance,
    );
    let peer_keys = cfg
        .peers
        .iter()
        .map(|p| Ok((p.id.clone(), relay_schemas::sign::parse_public_key("peers.public_key", &p.public_key)?)))
        .collect::<Result<_, relay_schemas::RelayError>>()
        .map_err(|e| e.message)?;
    let peer_keys = relay_rpc::PeerKeys::new(&cfg.relay.id, peer_keys, policy.clock_tolerance);
    let sup = Supervisor::new(store.clone(), policy, clock, Arc::new(peers.clone()));
    let restored = sup.start().map_err(|e| format!("restoring deliveries: {e}"))?;
    let limits = limits::RateLimits::new(cfg.rates());
    let relay = web::Data::new(rpc::Relay::new(sup, cfg.limits.max_body_bytes, peers, peer_keys, limits));

    let listener = TcpListener::bind(&cfg.relay.listen).map_err(|e| format!("listen {}: {e}", cfg.relay.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let websocket = web::Data::new(cfg.websocket.clone());
    let cors = web::Data::new(http::webapp::Cors::new(&cfg.relay.public_url, &cfg.http.cors_origins));
    let client = web::Data::new(http::webapp::ClientInfo {
        relay_id: cfg.relay.id.clone(),
        public_url: cfg.relay.public_url.clone(),
    });
    let h = &cfg.http;
    let mut server = HttpServer::new(move || {
        // Runs once on each worker thread: account actors spread over them.
        relay.supervisor().add_arbiter(actix::Arbiter::current());
        App::new()
            .wrap(actix_web::middleware::from_fn(http::webapp::cors))
            .app_data(cors.clone())
            .app_data(client.clone())
            .configure(http::webapp::configure)
            .configure(http::configure(relay.clone(), websocket.clone()))
    })
    .max_connections(h.max_connections)
    .client_request_timeout(h.request_timeout)
    .keep_alive(h.keep_alive)
    .shutdown_timeout(h.shutdown_timeout.as_secs());
    if h.workers > 0 {
        server = server.workers(h.workers);
    }
    let server = server.listen(listener).map_err(|e| e.to_string())?.run();
    // The server starts (workers, and its SIGTERM/SIGINT handlers) on its
    // first poll: let that happen before announcing it, so a signal sent
    // right after the announcement already means a graceful stop.
    let running = actix_web::rt::spawn(server);
    actix_web::rt::task::yield_now().await;
    tracing::info!(relay = %cfg.relay.id, %addr, restored, public_key = %keys::public_key(&key), "relay started");
    println!("relay {} listening on http://{addr}", cfg.relay.id);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    running.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
    store.flush().map_err(|e| format!("final flush: {e}"))?;
    tracing::info!("relay stopped");
    Ok(())
}
