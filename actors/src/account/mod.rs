//! The account: one actor per account, state folded from
//! `account/{account_id}`.

pub mod actor;
mod reads;
mod upgrade;

// The rules live in the core crate; their paths stay `account::decide` etc.
pub use relay_core::account::{command, decide, events, ledger, session, state, sync, timeline};
pub use relay_core::account::{Acceptance, Reads};

pub use actor::{AccountActor, AccountCmd, Reply, Settlement};
pub use events::{AccountEvent, PushSubscription, Record};
pub use ledger::{Ledger, ReceiptEntry, SendEntry};
pub use state::AccountState;

pub fn stream_id(account_id: &str) -> String {
    format!("account/{account_id}")
}
#[cfg(test)]
mod tests;
