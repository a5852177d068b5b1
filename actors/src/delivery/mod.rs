//! Deliveries: one event stream and one short-lived actor per accepted
//! cross-account message, until a terminal state. The actor reaches the rest
//! of the relay only through [`Env`] and [`Ports`], so this module depends
//! on neither the accounts nor whoever starts it. This file only declares
//! and re-exports: what the actor and its callers share is in `shared.rs`.

pub(crate) mod actor;
mod shared;

pub use self::actor::{Env, Ports};
pub use self::shared::{
    count_attempt, due_key, encode, finished, parse_due_key, stream_id, Ids, LocalFuture, NoPeers, Recorded,
    ReportOutcome, Settlement, Transport, DUE_PREFIX,
};
