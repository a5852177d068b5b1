//! An account's rules: its events, the state they fold into, the ledger
//! of idempotent results and the timeline index, and one file per
//! protocol method under [`method`] holding that method's decision;
//! [`command::decide`] forwards every command to its method.

pub mod command;
pub mod decision;
pub mod events;
pub mod ledger;
pub mod method;
#[cfg(test)]
mod model;
pub mod session;
pub mod shared;
pub mod state;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod timeline;

pub use command::{AccountCmd, AccountEnv};
pub use decision::{Acceptance, AsDecided, Decision, Effect, Reads, Reply, Written};
pub use events::{AccountEvent, PushSubscription, Record};
pub use ledger::{Ledger, ReceiptEntry, SendEntry};
pub use shared::Ctx;
pub use state::AccountState;
