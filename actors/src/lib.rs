//! # relay-actors
//!
//! The event-sourced shells of the relay: actors, store, supervisor. No
//! HTTP here, and no rules: those are pure functions in `relay-core`
//! (`actors/core`), named by their one path (`relay_core::account::…`,
//! `relay_core::delivery::…`, `relay_core::{clock, policy, push}`). The
//! crate root only declares modules; shared types live in leaf modules
//! (`store::types`, `shell`), so the modules import one way.
//!
//! - [`store`]: the sled event store: append-only, hash-chained streams,
//!   group commit, snapshots and a kv space for projections and indexes;
//! - [`account`]: the AccountActor: it decides every command through the
//!   core's `Aggregate`, persists, runs the effects, and reaches
//!   the rest of the relay only through `account::Env` and `account::Ports`;
//! - [`delivery`]: the DeliveryActor, its core (the seed's error table and
//!   deadlines), the retry timetable, and the narrow ports it reaches
//!   accounts and timers through;
//! - `supervisor` ([`Supervisor`]): creates and passivates account actors, carries out
//!   the process manager of `message.send` (accept → receipt → settle,
//!   whose rules are the core's `account::method::message_send`), owns the
//!   timetable's timers and restores them on start, and implements the
//!   actors' ports (the actors never call it by name);
//! - [`sessions`]: device session tokens;
//! - [`notify`]: realtime notifications to connected devices;
//! - [`metrics`]: Prometheus metrics of the core;
//! - [`retention`]: the sweep that deletes what is past its retention;
//! - [`routes`]: the route book (best known signed route per account).

pub mod account;
pub mod crash;
pub mod delivery;
pub mod metrics;
pub mod nats_server;
pub mod notify;
pub mod retention;
pub mod routes;
pub mod sessions;
pub mod shell;
pub mod store;
mod supervisor;
pub mod upcast;

pub use supervisor::{Checkpointer, Scheduler, Sent, Supervisor};
