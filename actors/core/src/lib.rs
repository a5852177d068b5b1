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
//! - [`lease`]: shard ownership in cluster mode (lease, epoch, renewal);
//! - [`peer_auth`]: relay request authentication and its replay window;
//! - [`push`]: the Web Push queue's coalescing and retry rules;
//! - [`resident`]: which resident account actors leave memory past the cap;
//! - [`shard`]: which cluster shard an account (or a session token) is in;
//! - [`clock`] and [`policy`]: injected time and configured limits.

pub mod account;
pub mod aggregate;
pub mod chain;
pub mod clock;
pub mod delivery;
pub mod lease;
pub mod peer_auth;
pub mod policy;
pub mod push;
pub mod resident;
pub mod retention;
pub mod shard;
