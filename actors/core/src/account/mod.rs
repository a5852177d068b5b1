//! An account's rules: its events, the state they fold into, the ledger
//! of idempotent results and the timeline index, and one file per
//! protocol method under [`method`] holding that method's decision;
//! [`decide`] forwards every command to its method.
//!
//! One path per item: the modules whose items are re-exported here
//! (`command`, `decision`, `events`, `shared`, `state`) are the crate's
//! own; the ones named from outside (`ledger`, `method`, `session`,
//! `timeline`) re-export nothing here.

pub(crate) mod command;
pub(crate) mod decision;
pub(crate) mod events;
pub mod ledger;
pub mod method;
#[cfg(test)]
mod model;
pub mod session;
pub(crate) mod shared;
pub(crate) mod state;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
pub mod timeline;

pub use command::{decide, AccountCmd, AccountEnv};
pub use decision::{Acceptance, AsDecided, Decision, Effect, Outcome, Reads, Reply, Token, Written};
pub use events::{AccountEvent, PushSubscription, Record};
pub use shared::{not_served_here, Ctx};
pub use state::{contact_key, AccountState, Device, Replica, SmallMap};
