//! # relay
//!
//! A relay for end-to-end encrypted messages between accounts: the server
//! library (package `relay`, folder `server/`). The protocol vocabulary is
//! in `relay-schemas`, the rules in `relay-core`, the event-sourced shells
//! and the store in `relay-actors`. The tools are crates of their own that
//! use this one and that it never uses: `relay-audit` (`audit/`) and
//! `relay-bench` (`bench/`); the `relay` binary (the root package,
//! `src/main.rs`) makes the server and the tools subcommands of one
//! program. The library is a crate apart so that the binary may depend on
//! the tools and the tools on the server: cargo refuses a package whose
//! binary depends on a crate that depends on its own library.
//!
//! # Layout
//! Modules import one way: settings and leaves (`config`, `keys`,
//! `limits`, `observe`, `http::reply`, `cluster::place`), then the app
//! state ([`app`]), the methods ([`method`]), their dispatch ([`rpc`]),
//! the transport ([`http`]) and the servers that start it all ([`server`],
//! [`cluster`], [`serve`]). The layering test (`tests/it/layering.rs`)
//! fails on an import cycle.
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
//! - [`backup`]: `relay backup` (over the admin socket of a running relay)
//!   and `relay restore`;
//! - [`observe`]: peer request metrics and WARN lines, `process_*` metrics;
//! - [`cluster`]: cluster mode: the JetStream store, the lease, the front;
//! - [`server`]: one relay core: opens the store, starts the supervisor and
//!   the HTTP server ([`serve`] runs it standalone, or [`cluster`] per shard).

pub mod app;
pub mod backup;
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
