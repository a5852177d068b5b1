//! # relay-actors
//!
//! The event-sourced shells of the relay: actors, store, supervisor. No
//! HTTP here, and no rules: those are pure functions in `relay-core`
//! (`actors/core`). The account's are re-exported at the paths below
//! (`account::command`, `account::method`, `push`, `clock`, `policy`); the
//! delivery's are named by their one path, `relay_core::delivery::…`.
//!
//! - [`store`]: the sled event store: append-only, hash-chained streams,
//!   group commit, snapshots and a kv space for projections and indexes;
//! - [`account`]: the AccountActor: it decides every command through the
//!   core's `Aggregate` (`account::command::decide`), persists, runs the effects, and reaches
//!   the rest of the relay only through `account::Env` and `account::Ports`;
//! - [`delivery`]: the DeliveryActor, its core (the seed's error table and
//!   deadlines), the retry timetable, and the narrow ports it reaches
//!   accounts and timers through;
//! - [`send`]: the process manager of `message.send` (accept → receipt →
//!   settle, and which commits that takes);
//! - [`supervisor`]: creates and passivates account actors, owns the
//!   timetable's timers and restores them on start, and implements the
//!   actors' ports (the actors never call it by name);
//! - [`sessions`]: device session tokens;
//! - [`notify`]: realtime notifications to connected devices;
//! - [`push`]: the Web Push sender's pure core (its queue, coalescing and
//!   retry rules); the HTTP shell is in the binary;
//! - [`metrics`]: Prometheus metrics of the core;
//! - [`retention`]: the sweep that deletes what is past its retention;
//! - [`routes`]: the route book (best known signed route per account);
//! - [`clock`] and [`policy`]: injected time and configured limits.

pub mod account;
pub mod crash;
pub mod delivery;
pub mod metrics;
pub mod nats_server;
pub mod notify;
pub mod retention;
pub mod routes;
pub mod send;
pub mod sessions;
pub mod shell;
pub mod store;
pub mod supervisor;
pub mod upcast;

// Pure modules of the core crate, at the paths the actors have always used.
pub use clock::{Clock, ManualClock, SharedClock, SystemClock};
pub use policy::Policy;
pub use relay_core::{clock, policy, push};
pub use supervisor::Supervisor;

/// Any error as `internal`: for failures a caller cannot act on (the
/// store, encoding), told with their text.
pub(crate) fn internal(e: &dyn std::fmt::Display) -> relay_schemas::RelayError {
    relay_schemas::RelayError::internal(format!("{e}"))
}
