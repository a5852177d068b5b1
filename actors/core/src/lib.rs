//! # relay-core
//!
//! Every rule of the relay as a pure function of state, command and
//! context: time comes in as a number or a [`clock::Clock`], randomness as
//! bytes. No actix, sled, tokio, dashmap or prometheus here, and Cargo
//! enforces it: this crate does not depend on them. The actors in
//! `relay-actors` load state, call these, persist what they return and run
//! the effects.
//!
//! - [`aggregate`]: the one shape of an aggregate (decide/apply), which
//!   accounts and deliveries both have;
//! - [`account`]: an account's events, state (`apply`), ledger and
//!   timeline index, and one file per protocol method (`account::method`;
//!   `message_send` holds the send's process manager too);
//! - [`chain`]: the hash chain of a stored stream (an event's body and
//!   its hash), as the store writes it;
//! - [`delivery`]: a delivery's events and state, the seed's error table
//!   and deadlines, and the retry timetable;
//! - [`flow`]: what one client's connections may hold (per-IP cap, requests
//!   read ahead, a write's deadline, a WebSocket's byte budget);
//! - [`lease`]: shard ownership in cluster mode (lease, epoch, renewal);
//! - [`peer_auth`]: relay request authentication and its replay window;
//! - [`push`]: the Web Push queue's coalescing and retry rules;
//! - [`rate`]: what a call costs against the request rate limits;
//! - [`remote_read`]: how long and how much of a remote home's answers is kept;
//! - [`resident`]: which resident account actors leave memory past the cap;
//! - [`shard`]: which cluster shard an account (or a session token) is in;
//! - [`witness`]: what a peer's checkpoint is judged by before it is witnessed;
//! - [`clock`] and [`policy`]: injected time and configured limits.

pub mod account;
pub mod aggregate;
pub mod chain;
pub mod clock;
pub mod delivery;
pub mod flow;
pub mod lease;
pub mod peer_auth;
pub mod policy;
pub mod push;
pub mod rate;
pub mod remote_read;
pub mod resident;
pub mod retention;
pub mod shard;
pub mod witness;
