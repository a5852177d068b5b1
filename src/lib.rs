//! # relay
//!
//! A relay for end-to-end encrypted messages between accounts. This crate
//! is the binary's wiring; the protocol vocabulary is in `relay-schemas`
//! and the event-sourced core in `relay-actors`.
//!
//! # Layout
//! - [`config`]: TOML configuration with `RELAY__SECTION__KEY` overrides;
//! - [`keys`]: the relay's own key file;
//! - [`method`]: one file per protocol method, named after it
//!   (`message.send` is `method/message_send.rs`): its handler and caller;
//! - [`app`]: the app state the methods read, and their shared plumbing
//!   (params, sessions, commands to local accounts, metrics);
//! - [`rpc`]: client and relay calls, independent of transport: rate
//!   limits, the cluster lease, dispatch to [`method`];
//! - [`peer_rpc`]: peer authentication of relay calls;
//! - [`limits`]: per-session and per-peer rate limits;
//! - [`peers`]: the signed relay-to-relay client (the delivery transport);
//! - [`checkpoint`]: signed checkpoints of the store (written on a timer
//!   and before pruning, answered by `audit.checkpoint`) and the witness
//!   of the peers' checkpoints;
//! - [`push`]: Web Push: the VAPID key and the supervised push sender;
//! - [`http`]: the actix-web transport (`/v1/rpc`, `/v1/relay`, `/v1/ws`, `/healthz`),
//!   its TLS ([`http::tls`]) and the client address behind trusted proxies
//!   ([`http::client_addr`]);
//! - [`fds`]: the open-file limit checked against the connection limits;
//! - [`bench`]: `relay bench`, the load generator;
//! - [`backup`]: `relay backup` (over the admin socket of a running relay)
//!   and `relay restore`;
//! - [`observe`]: peer request metrics and WARN lines, `process_*` metrics;
//! - [`cluster`]: cluster mode: the JetStream store, the lease, the front;
//! - [`server`]: one relay core: opens the store, starts the supervisor and
//!   the HTTP server ([`serve`] runs it standalone, or [`cluster`] per shard).

pub mod app;
pub mod audit;
pub mod backup;
pub mod bench;
pub mod checkpoint;
pub mod cluster;
pub mod config;
pub mod fds;
pub mod http;
pub mod keys;
pub mod limits;
pub mod method;
pub mod observe;
pub mod peer_batch;
pub mod peer_rpc;
pub mod peers;
pub mod push;
pub mod remote_reads;
pub mod replication;
pub mod rpc;
pub mod server;

/// Runs a relay until SIGINT/SIGTERM: standalone on its own store, or as a
/// cluster node (`store.engine = "jetstream"`).
pub async fn serve(cfg: config::Config) -> Result<(), String> {
    match cfg.store.engine {
        config::StoreEngine::Jetstream => cluster::serve(cfg).await,
        config::StoreEngine::Sled => server::serve(cfg).await,
    }
}
