//! The account: one actor per account, state folded from
//! `account/{account_id}`. The actor reaches the rest of the relay only
//! through [`Env`] and [`Ports`]: it never calls back into whoever starts
//! it, and what it does besides writing comes back as the effects of its
//! decisions.

pub mod actor;
pub mod sweep;
mod upgrade;

pub(crate) use actor::StoreReads;
pub use actor::{stream_id, AccountActor, AccountCmd, Env, Ports, ReplicaSink, Reply, Settlement};
pub use upgrade::stored_layout;

// The rules are relay-core's, named by their one path
// (`relay_core::account::…`); relay-audit still names these here.
pub use relay_core::account::{ledger, AccountEvent, AccountState, Ledger, ReceiptEntry, Record, SendEntry};

#[cfg(test)]
mod tests;
