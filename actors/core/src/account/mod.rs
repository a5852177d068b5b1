//! An account's rules: its events, the state they fold into, the ledger
//! of idempotent results and the timeline index, and `decide` for every
//! command.

pub mod command;
pub mod decide;
pub mod events;
pub mod ledger;
pub mod replica;
pub mod session;
pub mod state;
pub mod sync;
pub mod timeline;

pub use command::{Acceptance, AccountCmd, Decision, Effect, Reads, Reply};
pub use events::{AccountEvent, PushSubscription, Record};
pub use ledger::{Ledger, ReceiptEntry, SendEntry};
pub use state::AccountState;
