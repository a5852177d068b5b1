//! The relay's integration tests, one test binary (`cargo test --test it`):
//! each module is one area, run against real relay processes on 127.0.0.1
//! (`CARGO_BIN_EXE_relay`); `common` holds the shared harness. Filter by
//! module: `cargo test --test it torture::`, `cargo nextest run -E
//! 'binary(it) & test(/^websocket::/)'`.

mod common;

mod audit;
mod backup;
mod bad_input;
mod behind_proxy;
mod bench;
mod browser;
mod checkpoints;
mod cli;
mod cluster_mode;
mod commit_boundaries;
mod cross_relay;
mod deliver_batch;
mod delivery_crash;
mod docs;
mod fake_peer;
mod hostile_account;
mod hostile_partner;
mod hostile_peer;
mod hostile_push;
mod hostile_ws;
mod idempotency;
mod layering;
mod limits;
mod methods;
mod net_faults;
mod operations;
mod outage;
mod properties;
mod push;
mod readme;
mod restart;
mod retention;
mod secrets;
mod security;
mod service;
mod smoke;
mod tls;
mod torture;
mod two_homes;
mod upgrade;
mod web;
mod websocket;
