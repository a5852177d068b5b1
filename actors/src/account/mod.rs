//! The account: one actor per account, state folded from
//! `account/{account_id}`.

pub mod actor;
pub mod decide;
pub mod events;
pub mod ledger;
pub mod state;
pub mod timeline;
mod upgrade;

pub use actor::{Acceptance, AccountActor, AccountCmd, Reply, Settlement};
pub use events::{AccountEvent, PushSubscription, Record};
pub use ledger::{Ledger, ReceiptEntry, SendEntry};
pub use state::AccountState;

pub fn stream_id(account_id: &str) -> String {
    format!("account/{account_id}")
}
#[cfg(test)]
mod tests;
